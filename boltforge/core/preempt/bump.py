"""Bumping inside a class: a waiting job that needs far less time than a running job of its
own class still has left may take that job's GPUs.

Shortest-first ordering serves the least work first among the jobs that wait; a job that
started long ago holds its GPUs however long it still runs. Bumping extends the rule to the
running jobs, as shortest-remaining-time-first does, without trusting estimates too far: a
running job is bumped only when its time left is at least ``BumpRule.gain`` times what the
waiting job needs plus the time the bumped job loses (work since its last checkpoint and its
restart). The time a job has left (``shortest.runtime_left``) comes from what it was expected
to run less what it already ran; a job past its estimate, or with none, is expected to run
about as long again as it already has, so long runners become victims whether or not anyone
knew their runtime.

Jobs are compared by *standing* (``victims.Standing``): ``(class, tier)``, the tier the
power of two of the seconds left, so a job may only bump jobs with at least as much time
left, and the test above (``worth_bumping``) decides. The usual protections hold: a job
inside its minimum runtime, bumped within the cooldown, or beyond the churn budget is left
alone (``victims.refusal``, ``choose.find_victims``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from boltforge.core.model.workload import Job, Running
from boltforge.core.preempt.text import gpu_hours, span
from boltforge.core.queueing.shortest import runtime_left

TIERS = 64  # tiers a class holds: powers of two of seconds, far beyond any runtime


@dataclass(frozen=True, slots=True)
class BumpRule:
    """When a waiting job may bump a running job of its class: ``gain`` is how many times the
    waiting job's need plus the victim's loss the victim's time left must be."""

    gain: float = 4.0

    def __post_init__(self) -> None:
        if not self.gain >= 1.0:
            raise ValueError(f"gain must be at least 1 (got {self.gain})")


def ran_s(job: Job, now: float, started: float | None = None) -> float:
    """Seconds ``job`` has run at its full size: its attained service over its GPUs, plus
    its time since ``started`` when it runs now."""
    ran = job.attained_gpu_seconds / max(job.gpus, 1)
    return ran + (max(now - started, 0.0) if started is not None else 0.0)


def tier(left_s: float) -> int:
    """The tier of a job with ``left_s`` seconds left: the power of two below it."""
    return min(TIERS - 1, max(0, int(math.log2(max(left_s, 1.0)))))


def standing(job: Job, now: float, started: float | None = None) -> tuple[int, int]:
    """``job``'s standing: its class and the tier of its time left (``started``: when it
    started its current run, None while it waits)."""
    return (job.priority, tier(runtime_left(job, ran_s(job, now, started))))


def worth_bumping(
    victims: Sequence[Running], job: Job, now: float, rule: BumpRule
) -> tuple[bool, str]:
    """Whether bumping ``victims`` (running jobs of ``job``'s class) for ``job`` pays: each
    has at least ``rule.gain`` times ``job``'s need plus its own loss (work since its last
    checkpoint and its restart, per GPU) left. Returns the decision and the arithmetic for the
    first victim that fails, or for the closest call when all pass."""
    need = runtime_left(job, ran_s(job, now))
    closest: tuple[float, str] | None = None
    for run in victims:
        left = runtime_left(run.job, ran_s(run.job, now, run.start_time))
        lost = run.lost_gpu_seconds(now)
        cost = need + lost / max(run.gpus, 1)
        margin = left / max(cost, 1.0)
        words = (
            f"{run.job.id} has ~{span(left)} left; this job needs ~{span(need)} and bumping "
            f"{run.job.id} loses {gpu_hours(lost)} GPU-hours since its checkpoint"
        )
        if margin < rule.gain:
            return False, f"{words}: less than {rule.gain:g}x, so it keeps its GPUs"
        if closest is None or margin < closest[0]:
            closest = (margin, words)
    if closest is None:
        return True, "nothing of its class to bump"
    return True, f"{closest[1]}: {closest[0]:.1f}x, at least {rule.gain:g}x, so it is bumped"

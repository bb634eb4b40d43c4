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
from collections.abc import Container, Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import NamedTuple

import numpy as np

from boltforge.core.model.topology import BoolArray, FloatArray, IntArray
from boltforge.core.model.workload import Job, Running
from boltforge.core.preempt.text import gpu_hours, span
from boltforge.core.preempt.victims import PreemptRules, open_to_bumps, saved_within
from boltforge.core.queueing.shortest import runtime_left, runtimes_left

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
    """The tier of a job with ``left_s`` seconds left: the power of two at or below it (read
    off the float's exponent, exact on every machine)."""
    return min(TIERS - 1, max(0, math.frexp(max(left_s, 1.0))[1] - 1))


def tiers(left_s: FloatArray) -> IntArray:
    """``tier`` of each of ``left_s`` at once."""
    exponents = np.frexp(np.maximum(left_s, 1.0))[1].astype(np.int64)
    out: IntArray = np.clip(exponents - 1, 0, TIERS - 1)
    return out


def standing(job: Job, now: float, started: float | None = None) -> tuple[int, int]:
    """``job``'s standing: its class and the tier of its time left (``started``: when it
    started its current run, None while it waits)."""
    return (job.priority, tier(runtime_left(job, ran_s(job, now, started))))


def needs_s(job: Job, now: float) -> float:
    """Seconds waiting ``job`` is expected to need (``shortest.runtime_left``)."""
    return runtime_left(job, ran_s(job, now))


def time_left(run: Running, now: float) -> float:
    """Seconds running ``run`` is expected to need still (``shortest.runtime_left``)."""
    return runtime_left(run.job, ran_s(run.job, now, run.start_time))


def times_left(runs: Sequence[Running], now: float) -> FloatArray:
    """``time_left`` of each of ``runs`` at once, figure for figure."""
    n, jobs = len(runs), [r.job for r in runs]
    nan = math.nan
    gpus = np.fromiter((j.gpus for j in jobs), np.float64, n)
    attained = np.fromiter((j.attained_gpu_seconds for j in jobs), np.float64, n)
    started = np.fromiter((r.start_time for r in runs), np.float64, n)
    typical = np.fromiter((nan if j.typical is None else j.typical for j in jobs), np.float64, n)
    bound = np.fromiter(
        (nan if (b := j.expected_runtime()) is None else b for j in jobs), np.float64, n
    )
    ran = attained / np.maximum(gpus, 1.0) + np.maximum(now - started, 0.0)
    return runtimes_left(typical, bound, ran)


class _Columns(NamedTuple):
    """The running jobs, one entry each, as ``Margins.room`` reads them."""

    ids: list[str]
    classes: IntArray
    gpus: IntArray
    left: FloatArray  # seconds left (``time_left``)
    lost_per_gpu: FloatArray  # seconds of work lost per GPU if displaced now
    open: BoolArray  # some job may displace it now (``victims.open_to_bumps``)
    saved: BoolArray  # inside the peer window (``PreemptRules.peer_window_s``), if any
    elastic: BoolArray


class Margins:
    """The running jobs of a pass (``runs``) at ``now`` under preemption ``rules``: each
    one's ``time_left`` by job id (``left``, made at once), and what ``refusal`` and
    ``worth_bumping`` read of them as columns, made at the first ``room``, which totals what
    a bump could take for a waiting job at once."""

    def __init__(self, runs: Iterable[Running], now: float, rules: PreemptRules) -> None:
        self.runs, self.now, self.rules = list(runs), now, rules
        self.seconds = times_left(self.runs, now)  # in the order of ``runs``
        self.left = dict(zip((r.job.id for r in self.runs), self.seconds.tolist(), strict=True))

    def standing(self) -> dict[str, tuple[int, ...]]:
        """Each running job's standing by job id (``standing``): its class and the tier of
        its time left."""
        classes = (r.job.priority for r in self.runs)
        marks = zip(classes, tiers(self.seconds).tolist(), strict=True)
        return dict(zip(self.left, marks, strict=True))

    @cached_property
    def _columns(self) -> _Columns:
        runs, now, rules, n = self.runs, self.now, self.rules, len(self.runs)
        window = rules.peer_window_s
        gpus = np.fromiter((r.gpus for r in runs), np.int64, n)
        lost = np.fromiter((r.lost_gpu_seconds(now) for r in runs), np.float64, n)
        return _Columns(
            list(self.left),
            np.fromiter((r.job.priority for r in runs), np.int64, n),
            gpus,
            self.seconds,
            lost / np.maximum(gpus, 1),
            np.fromiter((open_to_bumps(r, rules, now) for r in runs), np.bool_, n),
            np.fromiter((window is None or saved_within(r, now, window) for r in runs), bool, n),
            np.fromiter((r.job.elastic is not None for r in runs), np.bool_, n),
        )

    def holding(self, allocations: Container[str]) -> BoolArray:
        """Which of the jobs still hold an allocation in ``allocations``."""
        return np.fromiter((i in allocations for i in self.left), np.bool_, len(self.left))

    def room(
        self, job: Job, need_s: float, rule: BumpRule, owed: frozenset[str], among: BoolArray
    ) -> tuple[int, int]:
        """How many of the jobs ``among`` could be victims of ``job`` (needing ``need_s``)
        in a bump that pays, and their GPUs. Such a job is open to bumps
        (``victims.open_to_bumps``) and is named in ``owed`` (reclaimed from its queue), or of
        a less important class, or a peer inside the peer window that is elastic (a shrink
        is not bump-ruled) or has at least ``rule.gain`` times ``need_s`` plus its loss per
        GPU left, as ``worth_bumping`` asks. Every other job is refused (``refusal``) or
        makes ``worth_bumping`` say no."""
        c = self._columns
        pays = c.left / np.maximum(need_s + c.lost_per_gpu, 1.0) >= rule.gain
        take = (c.classes > job.priority) | (
            (c.classes == job.priority) & c.saved & (c.elastic | pays)
        )
        if owed:
            take |= np.fromiter((i in owed for i in c.ids), np.bool_, len(c.ids))
        take &= c.open & among
        return int(take.sum()), int(c.gpus[take].sum())


def worth_bumping(
    victims: Sequence[Running], job: Job, now: float, rule: BumpRule
) -> tuple[bool, str]:
    """Whether bumping ``victims`` (running jobs of ``job``'s class) for ``job`` pays: each
    has at least ``rule.gain`` times ``job``'s need plus its own loss (work since its last
    checkpoint and its restart, per GPU) left. Returns the decision and the arithmetic for the
    first victim that fails, or for the closest call when all pass."""
    need = needs_s(job, now)
    closest: tuple[float, str] | None = None
    for run in victims:
        left = time_left(run, now)
        lost = run.lost_gpu_seconds(now)
        times = left / max(need + lost / max(run.gpus, 1), 1.0)
        words = (
            f"{run.job.id} has ~{span(left)} left; this job needs ~{span(need)} and bumping "
            f"{run.job.id} loses {gpu_hours(lost)} GPU-hours since its checkpoint"
        )
        if times < rule.gain:
            return False, f"{words}: less than {rule.gain:g}x, so it keeps its GPUs"
        if closest is None or times < closest[0]:
            closest = (times, words)
    if closest is None:
        return True, "nothing of its class to bump"
    return True, f"{closest[1]}: {closest[0]:.1f}x, at least {rule.gain:g}x, so it is bumped"

"""Waiting: why a job that does not start waits, and when it may start.

Contract. ``classify`` names the reason (RESERVATION, TOPOLOGY or CAPACITY) from the free
GPUs and the fenced hosts; ``estimate_start`` gives a when-and-where start for the first
``estimates_left`` waiting jobs (spending one each). ``hopeless`` and ``cannot_start`` tell,
without a look at a job, that it can only wait (used when nobody reads the reasons);
``has_own_path`` says whether a job takes a path of its own (a restart hold, an elastic start).
None of them allocates on ``work``.
"""

from __future__ import annotations

from boltforge.core.cycle.place import place
from boltforge.core.cycle.preempt import bumps_nobody
from boltforge.core.cycle.reserve import reservation_left
from boltforge.core.cycle.state import PassState, count_open_gpus
from boltforge.core.decisions import WaitReason
from boltforge.core.model.workload import Job
from boltforge.core.placement.modes import when_and_where
from boltforge.core.placement.place import Outcome
from boltforge.core.policy import Policy


def classify(p: PassState, job: Job, blocked: frozenset[int]) -> WaitReason:
    free = count_open_gpus(p)
    if blocked and free >= job.gpus:
        placement, _, _ = place(p, job.gang, frozenset())
        if placement is not None:
            return WaitReason.RESERVATION
    return WaitReason.TOPOLOGY if free >= job.gpus else WaitReason.CAPACITY


def estimate_start(p: PassState, job: Job) -> float | None:
    """When-and-where start for the first few waiting jobs (bounded work per pass)."""
    if p.estimates_left <= 0:
        return None
    p.estimates_left -= 1
    decision = when_and_where(p.work, job.gang, p.now, p.explain)
    return decision.start_time if decision.outcome == Outcome.LATER else None


def hopeless(p: PassState, job: Job, may_reserve: bool) -> bool:
    """Whether, in a pass nobody reads the reasons of, ``job`` can only wait and needs no
    look (``cannot_start``)."""
    if p.explain:
        return False
    return cannot_start(p, job.gpus, job.priority, has_own_path(p.policy, job), may_reserve)


def cannot_start(p: PassState, gpus: int, priority: int, own_path: bool, may_reserve: bool) -> bool:
    """Whether a job of ``gpus`` GPUs and class ``priority`` cannot start in this pass, known
    without a look at it: it wants more GPUs than are free on every host taking work
    together, so it cannot start or start smaller; it can bump nobody; no reservation is left
    to give; and it takes no path of its own (``has_own_path``)."""
    if own_path or gpus <= count_open_gpus(p):
        return False
    if p.policy.preemption is not None and not bumps_nobody(p, priority):
        return False
    return not (may_reserve and reservation_left(p))


def has_own_path(policy: Policy, job: Job) -> bool:
    """Whether ``job`` is placed by a path of its own: a restart on GPUs held for it, or an
    elastic start at a smaller size."""
    return job.held is not None or (policy.elastic is not None and job.elastic is not None)

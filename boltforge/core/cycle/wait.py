"""Waiting: why a job that does not start waits, and when it may start.

Contract. ``_classify`` names the reason (RESERVATION, TOPOLOGY or CAPACITY) from the free
GPUs and the fenced hosts; ``_estimate`` gives a when-and-where start for the first
``estimates_left`` waiting jobs (spending one each). ``_hopeless`` and ``_cannot_start`` tell,
without a look at a job, that it can only wait (used when nobody reads the reasons);
``_own_path`` says whether a job takes a path of its own (a restart hold, an elastic start).
None of them allocates on ``work``.
"""

from __future__ import annotations

from boltforge.core.cycle.place import _place
from boltforge.core.cycle.preempt import _bumps_nobody
from boltforge.core.cycle.reserve import _may_reserve
from boltforge.core.cycle.state import PassState, _open_gpus
from boltforge.core.decisions import WaitReason
from boltforge.core.model.workload import Job
from boltforge.core.placement.modes import when_and_where
from boltforge.core.placement.place import Outcome
from boltforge.core.policy import Policy


def _classify(p: PassState, job: Job, blocked: frozenset[int]) -> WaitReason:
    free = _open_gpus(p)
    if blocked and free >= job.gpus:
        placement, _, _ = _place(p, job.gang, frozenset())
        if placement is not None:
            return WaitReason.RESERVATION
    return WaitReason.TOPOLOGY if free >= job.gpus else WaitReason.CAPACITY


def _estimate(p: PassState, job: Job) -> float | None:
    """When-and-where start for the first few waiting jobs (bounded work per pass)."""
    if p.estimates_left <= 0:
        return None
    p.estimates_left -= 1
    decision = when_and_where(p.work, job.gang, p.now, p.explain)
    return decision.start_time if decision.outcome == Outcome.LATER else None


def _hopeless(p: PassState, job: Job, may_reserve: bool) -> bool:
    """Whether, in a pass nobody reads the reasons of, ``job`` can only wait and needs no
    look (``_cannot_start``)."""
    if p.explain:
        return False
    return _cannot_start(p, job.gpus, job.priority, _own_path(p.policy, job), may_reserve)


def _cannot_start(
    p: PassState, gpus: int, priority: int, own_path: bool, may_reserve: bool
) -> bool:
    """Whether a job of ``gpus`` GPUs and class ``priority`` cannot start in this pass, known
    without a look at it: it wants more GPUs than are free on every host taking work
    together, so it cannot start or start smaller; it can bump nobody; no reservation is left
    to give; and it takes no path of its own (``_own_path``)."""
    if own_path or gpus <= _open_gpus(p):
        return False
    if p.policy.preemption is not None and not _bumps_nobody(p, priority):
        return False
    return not (may_reserve and _may_reserve(p))


def _own_path(policy: Policy, job: Job) -> bool:
    """Whether ``job`` is placed by a path of its own: a restart on GPUs held for it, or an
    elastic start at a smaller size."""
    return job.held is not None or (policy.elastic is not None and job.elastic is not None)

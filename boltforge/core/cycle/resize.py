"""Elastic resizing: starting an elastic job smaller, and growing running ones.

Contract. ``start_smaller`` (elastic part on, the job elastic, the full size blocked) tries
sizes down from the request and binds the first that fits when that finishes sooner than
waiting for the full size; it returns whether it bound. ``grow_elastic`` runs once at the end of a
pass: when nobody waits it grows running elastic jobs (``core/elastic.py``) into what is left,
admitting and charging each growth, and returns the ``Resize`` decisions.
"""

from __future__ import annotations

from boltforge.core.cycle.admit import admit_placement, charge
from boltforge.core.cycle.place import bind, place
from boltforge.core.cycle.state import PassState
from boltforge.core.decisions import Resize
from boltforge.core.elastic import grow, growth_id
from boltforge.core.model.state import Allocation
from boltforge.core.model.workload import Job
from boltforge.core.placement.modes import when_and_where
from boltforge.core.placement.place import Outcome
from boltforge.core.preempt.text import span


def start_smaller(p: PassState, job: Job, position: int, blocked: frozenset[int]) -> bool:
    """Start an elastic job below its requested size when that finishes sooner than waiting.

    Sizes go down from the request to ``elastic[0]`` replicas; the first that fits now is
    compared with waiting for the full size (when-and-where): with runtime ``T`` at full size
    ``R``, starting ``r`` replicas now finishes at ``now + T * R / r``, waiting at
    ``start_full + T``. A job with no runtime estimate starts small.
    """
    assert job.elastic is not None
    full = job.gang.roles[0].replicas
    for replicas in range(full - 1, max(job.elastic[0], 1) - 1, -1):
        smaller = job.gang.resized(replicas)
        placement, _, _ = place(p, smaller, blocked)
        if placement is None:
            continue
        runtime = job.expected_runtime()
        note = f"elastic start at {replicas} of {full} replicas"
        if runtime is not None:
            later = when_and_where(p.work, job.gang, p.now, p.explain)
            start_full = later.start_time if later.outcome == Outcome.LATER else None
            finish_small = p.now + runtime * full / replicas
            if start_full is not None and start_full + runtime <= finish_small:
                return False
            if start_full is not None:
                note += (
                    f": finishes in {span(finish_small - p.now)} instead of "
                    f"{span(start_full + runtime - p.now)} waiting for all {full}"
                )
        verdict = admit_placement(p, job, placement)
        if not verdict.ok:
            return False
        scaled = runtime * full / replicas if runtime is not None else None
        bind(p, job, placement, position, replicas, note, scaled, verdict.borrowed)
        return True
    return False


def grow_elastic(p: PassState) -> list[Resize]:
    """Grow running elastic jobs (``core/elastic.py``) when no job is left waiting; each
    growth is admitted against its queue's quota and charged like a bind."""
    kept = []
    waiting = len(p.waiting) + p.unseen
    for resize in grow(p.work, tuple(p.running.values()), p.policy, p.now, waiting):
        job = p.running[resize.job].job
        if not admit_placement(p, job, resize.added).ok:
            continue
        p.work.allocate(Allocation(growth_id(resize.job), resize.added.grants))
        charge(p, job, resize.added.grants)
        kept.append(resize)
    return kept

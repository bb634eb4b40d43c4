"""Restarts after a host failure: the GPUs a job kept, and the hold on them.

Contract. ``release_hold`` gives a waiting job back its held GPUs on ``work`` before it is
looked at; ``recover_held`` restarts it on them (replacing only the lost replicas, outside reserved
hosts, within quota) and binds it; when the job stays waiting, ``keep_hold`` holds again what
is still free and ``say_held`` adds the hold to its waiting evidence. Each clears
``open_gpus`` when it changes ``work``.
"""

from __future__ import annotations

from dataclasses import replace

from boltforge.core.cycle.admit import admit_placement
from boltforge.core.cycle.place import bind
from boltforge.core.cycle.reserve import blocked_hosts
from boltforge.core.cycle.state import PassState
from boltforge.core.model.state import Allocation, Conflict
from boltforge.core.model.workload import Job
from boltforge.core.placement.recovery import recover


def release_hold(p: PassState, job: Job) -> Allocation | None:
    """Give ``job`` back the GPUs held for its restart after a host failure (None: it has
    no hold in the state)."""
    if job.held is None or job.held.allocation.job not in p.work.allocations:
        return None
    p.open_gpus = None
    return p.work.release(job.held.allocation.job)


def recover_held(p: PassState, job: Job, position: int) -> bool:
    """Restart a job that lost hosts on the GPUs it kept, replacing only the lost replicas
    with the closest healthy hosts (``core/placement/recovery.py``), outside reserved hosts it would
    delay and within its quota. Returns whether it was bound.

    Its own held hosts are never fenced off: a reservation made on them counted on the hold
    running out, and the hold is there for exactly this restart."""
    assert job.held is not None
    held = {g.host for g in job.held.allocation.grants}
    with p.work.fenced(blocked_hosts(p, job) - held):
        placement = recover(p.work, job.gang, job.held)
    if placement is None:
        return False
    verdict = admit_placement(p, job, placement)
    if not verdict.ok:
        return False
    bind(p, job, placement, position, note=placement.notes[0], borrowed=verdict.borrowed)
    return True


def keep_hold(p: PassState, hold: Allocation) -> None:
    """Hold again what a job that stays waiting was given back (what is still free of it)."""
    grants = tuple(g for g in hold.grants if all(p.work.free[g.host, gpu] for gpu in g.gpus))
    if not grants:
        return
    p.open_gpus = None
    try:
        p.work.allocate(replace(hold, grants=grants))
    except Conflict:  # its CPUs or memory went to another job meanwhile: the hold lapses
        return


def say_held(p: PassState, job: Job, hold: Allocation) -> None:
    """Add to a waiting job's evidence which GPUs wait for its restart, and until when."""
    if not p.waiting or p.waiting[-1].job != job.id:
        return
    names = p.work.tree.hosts
    kept = sorted({names[g.host].name for g in hold.grants})
    line = f"its GPUs on {', '.join(kept)} are held for its restart"
    if hold.expected_end is not None:
        line += f" for {max(hold.expected_end - p.now, 0.0):.0f} s more"
    w = p.waiting[-1]
    p.waiting[-1] = w._replace(detail=(line, *w.detail))

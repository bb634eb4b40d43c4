"""Launching bound gangs: a job's replicas go to their nodes together, once no replica that
is still leaving holds any of their GPUs (so no GPU ever runs two jobs' processes)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

from sqlalchemy import select
from sqlalchemy.orm import Session

from boltforge.control.scheduling import intent
from boltforge.control.scheduling.actuate import Touched
from boltforge.control.store.mirror import LiveReplica, Mirror
from boltforge.control.store.models import ReplicaRow

BUSY = ("starting", "running", "stopping")
Order = tuple[int, int, str]


def dispatch(s: Session, mirror: Mirror, now: float) -> Touched:
    """Move every waiting gang whose GPUs are all free to ``starting`` (in priority order).
    Which gangs can go is read from ``mirror``; only the replicas that go are read from the
    store (and changed there)."""
    gangs, busy, order = _gangs(mirror)
    if not gangs:
        return Touched()
    going: list[str] = []
    touched = Touched()
    for job_id in sorted(gangs, key=order):
        reps = gangs[job_id]
        needs = {(r.node, g) for r in reps for g in r.gpus}
        if needs & busy:
            continue
        busy |= needs
        going += [r.id for r in reps]
        touched.nodes |= {r.node for r in reps}
        touched.jobs.add(job_id)
    if not going:
        return touched
    intent.start(s, s.scalars(select(ReplicaRow).where(ReplicaRow.id.in_(going))), now)
    return touched


def _gangs(
    mirror: Mirror,
) -> tuple[dict[str, list[LiveReplica]], set[tuple[str, int]], Callable[[str], Order]]:
    """The waiting gangs by job, the GPUs busy with started replicas on their nodes, and the
    dispatch order (priority, then submission)."""
    gangs: dict[str, list[LiveReplica]] = defaultdict(list)
    busy: set[tuple[str, int]] = set()
    with mirror.reading():
        for r in mirror.replicas.values():
            if r.state == "waiting":
                gangs[r.job_id].append(r)
        for node in {r.node for reps in gangs.values() for r in reps}:
            for r in mirror.held_on(node):
                if r.state in BUSY:
                    busy |= {(r.node, g) for g in r.gpus}
        keys = {j: _key(mirror, j) for j in gangs}
    return gangs, busy, keys.__getitem__


def _key(mirror: Mirror, job_id: str) -> Order:
    job = mirror.jobs.get(job_id)
    return (job.priority, job.num, job_id) if job is not None else (99, 0, job_id)

"""Launching bound gangs: a job's replicas go to their nodes together, once no replica that
is still leaving holds any of their GPUs (so no GPU ever runs two jobs' processes)."""

from __future__ import annotations

from collections import defaultdict

from sqlalchemy import select
from sqlalchemy.orm import Session

from boltforge.control.actuate import Touched
from boltforge.control.models import JobRow, NodeRow, ReplicaRow

BUSY = ("starting", "running", "stopping")


def dispatch(s: Session, now: float) -> Touched:
    """Move every waiting gang whose GPUs are all free to ``starting`` (in priority order)."""
    waiting = list(s.scalars(select(ReplicaRow).where(ReplicaRow.state == "waiting")))
    if not waiting:
        return Touched()
    busy = {
        (r.node, g)
        for r in s.scalars(select(ReplicaRow).where(ReplicaRow.state.in_(BUSY)))
        for g in r.gpus
    }
    gangs: dict[str, list[ReplicaRow]] = defaultdict(list)
    for r in waiting:
        gangs[r.job_id].append(r)
    jobs = {j.id: j for j in s.scalars(select(JobRow).where(JobRow.id.in_(gangs)))}
    touched = Touched()
    for job_id in sorted(gangs, key=lambda j: (jobs[j].priority, jobs[j].num, j)):
        reps = gangs[job_id]
        needs = {(r.node, g) for r in reps for g in r.gpus}
        if needs & busy:
            continue
        busy |= needs
        for r in reps:
            r.state, r.dispatched_at = "starting", now
            touched.nodes.add(r.node)
        touched.jobs.add(job_id)
    for name in touched.nodes:
        node = s.get(NodeRow, name)
        if node is not None:
            node.desired_version += 1
    return touched

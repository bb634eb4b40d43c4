"""Cancelling jobs: waiting ones end at once; holding ones get the checkpoint signal and give
their GPUs back when their processes exit."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from boltforge.control.actuate import Touched, close_run
from boltforge.control.lifecycle import LIVE, transition
from boltforge.control.models import HELD, JobRow, NodeRow, ReplicaRow


def cancel_jobs(s: Session, jobs: list[JobRow], who: str, at: float) -> Touched:
    """Cancel every live job of ``jobs`` (finished ones are left as they are)."""
    touched = Touched()
    for job in jobs:
        if job.state not in LIVE:
            continue
        reps = s.scalars(
            select(ReplicaRow).where(ReplicaRow.job_id == job.id, ReplicaRow.state.in_(HELD))
        )
        live = False
        for r in reps:
            if r.state == "waiting":
                r.state, r.exited_at = "exited", at
                continue
            live = True
            if r.state != "stopping":
                r.state, r.stop_requested_at = "stopping", at
                node = s.get(NodeRow, r.node)
                if node is not None:
                    node.desired_version += 1
                touched.nodes.add(r.node)
        if not live:
            close_run(s, job, at)
        transition(s, job, "cancelled", at, f"cancelled by {who}")
        touched.jobs.add(job.id)
    return touched

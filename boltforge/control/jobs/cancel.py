"""Cancelling jobs: waiting ones end at once; holding ones get the checkpoint signal and give
their GPUs back when their processes exit."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from boltforge.control.scheduling.actuate import Touched, close_run, halt
from boltforge.control.scheduling.lifecycle import LIVE, transition
from boltforge.control.store.models import HELD, JobRow, ReplicaRow


def cancel_jobs(s: Session, jobs: list[JobRow], who: str, at: float) -> Touched:
    """Cancel every live job of ``jobs`` (finished ones are left as they are)."""
    touched = Touched()
    for job in jobs:
        if job.state not in LIVE:
            continue
        reps = list(
            s.scalars(
                select(ReplicaRow).where(ReplicaRow.job_id == job.id, ReplicaRow.state.in_(HELD))
            )
        )
        touched |= halt(s, reps, at)
        if not any(r.state == "stopping" for r in reps):
            close_run(s, job, at)
        transition(s, job, "cancelled", at, f"cancelled by {who}")
        touched.jobs.add(job.id)
    return touched

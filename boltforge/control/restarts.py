"""The restart budget: how many times a job is restarted after failures not of its own making
(its node died, or stopped a replica on its own) before it fails instead.

Preemptions and drains are the scheduler's (or an operator's) choice and never count. The
rule lives here alone; the lease (``agents``) and report (``reports``) paths both call it.
"""

from __future__ import annotations

from sqlalchemy.orm import Session

from boltforge.control.actuate import close_run
from boltforge.control.lifecycle import transition
from boltforge.control.models import JobRow
from boltforge.spec.job import DEFAULT_MAX_RESTARTS


def budget(job: JobRow) -> int:
    """The job's ``max_restarts`` (its spec stores only values other than the default)."""
    return int(job.spec.get("max_restarts", DEFAULT_MAX_RESTARTS))


def restart_or_fail(s: Session, job: JobRow, at: float, why: str) -> bool:
    """End ``job``'s current run after the failure ``why`` (e.g. "node host-3 stopped
    answering") and requeue it to resume from its last checkpoint, charging one restart; once
    ``budget`` restarts are spent the job fails instead, naming the budget and ``why``. A job
    already ``preempting`` requeues free of charge: it was leaving by the scheduler's choice.

    Callers pass a job in a holding (``scheduled``, ``running``) or ``preempting`` state and
    have already stopped the rest of its gang; call once per failure. Returns whether the job
    requeued."""
    close_run(s, job, at)
    resume = f"requeued: {why}; resumes from its last checkpoint"
    if job.state == "preempting":
        transition(s, job, "requeued", at, resume, "lost")
        return True
    allowed = budget(job)
    data = {"restarts": job.restarts, "max_restarts": allowed}
    if job.restarts >= allowed:
        message = f"failed: restart budget of {allowed} exhausted; last: {why}"
        transition(s, job, "failed", at, message, "failed", data)
        return False
    job.restarts += 1
    transition(s, job, "requeued", at, resume, "lost", {**data, "restarts": job.restarts})
    return True

"""The restart budget: how many times a job is restarted after failures not of its own making
(its node died, or stopped a replica on its own) before it fails instead.

Preemptions and drains are the scheduler's (or an operator's) choice and never count. The
rule lives here alone; the lease (``agents``) and report (``reports``) paths both call it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from boltforge.control.scheduling.actuate import close_run
from boltforge.control.scheduling.lifecycle import WAITING, record, transition
from boltforge.control.store.models import JobRow, ReplicaRow
from boltforge.ranges import hostlist
from boltforge.spec.job import DEFAULT_MAX_RESTARTS


def budget(job: JobRow) -> int:
    """The job's ``max_restarts`` (its spec stores only values other than the default)."""
    return int(job.spec.get("max_restarts", DEFAULT_MAX_RESTARTS))


def restart_or_fail(s: Session, job: JobRow, at: float, why: str, lost: Sequence[str] = ()) -> bool:
    """End ``job``'s current run after the failure ``why`` (e.g. "node host-3 stopped
    answering") and requeue it to resume from its last checkpoint, charging one restart; once
    ``budget`` restarts are spent the job fails instead, naming the budget and ``why``. A job
    already ``preempting`` requeues free of charge: it was leaving by the scheduler's choice.

    Callers pass a job in a holding (``scheduled``, ``running``) or ``preempting`` state and
    have already stopped the rest of its gang; call once per failure. ``lost`` names the
    nodes that failed under it: a job requeued after such a failure gets a recovery hold
    (``hold``), so it can restart on the hosts it kept. Returns whether the job requeued."""
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
    if lost:
        job.recovery_hold = hold(s, job, lost, at)
    return True


def hold(s: Session, job: JobRow, lost: Sequence[str], at: float) -> dict[str, Any] | None:
    """The recovery hold of ``job`` after ``lost`` nodes failed under it: what its current
    allocation's replicas hold on every other node (they are stopping; the scheduling pass
    keeps those GPUs for the job's restart, see ``world``). None when nothing is left."""
    reps = list(
        s.scalars(
            select(ReplicaRow).where(ReplicaRow.job_id == job.id, ReplicaRow.epoch == job.epoch)
        )
    )
    first: dict[str, int] = {}  # ranks run on across roles: a role's replicas from its first
    for r in reps:
        first[r.role] = min(first.get(r.role, r.rank), r.rank)
    grants = [
        {
            "role": r.role,
            "replica": r.rank - first[r.role],
            "node": r.node,
            "gpus": list(r.gpus),
            "cpus": r.cpus,
            "memory_gb": r.memory_gb,
            "storage_gb": float(r.spec.get("storage_gb", 0.0)),
        }
        for r in sorted(reps, key=lambda r: r.rank)
        if r.state in ("starting", "running", "stopping") and r.node not in lost
    ]
    return {"at": at, "lost": sorted(set(lost)), "grants": grants} if grants else None


def end_holds(s: Session, now: float, hold_s: float) -> set[str]:
    """Clear the recovery holds that ran out (``hold_s`` after they were taken), saying so on
    each waiting job's timeline, and those of jobs no longer waiting. Returns the jobs whose
    timeline grew. A job placed meanwhile had its hold cleared when it was bound."""
    out: set[str] = set()
    for job in s.scalars(select(JobRow).where(JobRow.recovery_hold.is_not(None))):
        data = job.recovery_hold or {}
        if job.state in WAITING and float(data.get("at", 0.0)) + hold_s > now:
            continue
        job.recovery_hold = None
        if job.state in WAITING:
            names = hostlist(g["node"] for g in data.get("grants", []))
            message = f"recovery hold on {names} ended; those GPUs are free for other jobs"
            record(s, job.id, now, "note", message)
            out.add(job.id)
    return out

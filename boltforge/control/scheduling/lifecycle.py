"""The job state machine: which transitions are allowed, and the timeline entry each leaves.

Every transition is written to the store (the job's new state and an event) in the same
transaction as the decision that caused it, before anything is sent to a node.

::

    pending ──► scheduled ──► running ──► succeeded | failed
       ▲            │  ▲         │
       │            │  └─────────┤  resized in place (a new epoch on more or fewer GPUs)
       │            ▼            ▼
    requeued ◄── preempting ◄────┘        (any live state) ──► cancelled
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from boltforge.control.store.models import EventRow, JobRow

LIVE = ("pending", "scheduled", "running", "preempting", "requeued")
WAITING = ("pending", "requeued")
HOLDING = ("scheduled", "running")

ALLOWED: dict[str, frozenset[str]] = {
    "pending": frozenset({"scheduled", "cancelled", "failed"}),
    "requeued": frozenset({"scheduled", "cancelled", "failed"}),
    "scheduled": frozenset({"running", "preempting", "requeued", "cancelled", "failed"}),
    "running": frozenset(
        {"scheduled", "preempting", "requeued", "succeeded", "failed", "cancelled"}
    ),
    "preempting": frozenset({"requeued", "succeeded", "failed", "cancelled"}),
    "succeeded": frozenset(),
    "failed": frozenset(),
    "cancelled": frozenset(),
}


class IllegalTransition(Exception):
    """A caller asked for a transition the state machine forbids: a bug in the caller."""


def transition(
    s: Session,
    job: JobRow,
    state: str,
    at: float,
    message: str,
    kind: str | None = None,
    data: dict[str, Any] | None = None,
) -> None:
    """Move ``job`` to ``state`` and record ``message`` on its timeline (``kind`` defaults to
    the new state). Raises ``IllegalTransition`` for a move ``ALLOWED`` does not list."""
    if state not in ALLOWED[job.state]:
        raise IllegalTransition(f"job {job.id}: {job.state} -> {state} is not allowed")
    job.state = state
    if state in ("succeeded", "failed", "cancelled"):
        job.finished_at = at
        job.position = None
        job.estimated_start = None
    record(s, job.id, at, kind or state, message, data)


def record(
    s: Session,
    job_id: str,
    at: float,
    kind: str,
    message: str,
    data: dict[str, Any] | None = None,
) -> None:
    """Append one entry to a job's timeline without changing its state."""
    s.add(EventRow(job_id=job_id, at=at, kind=kind, message=message, data=data or {}))

"""Taking a node out of service and back: cordon, drain, uncordon.

A **cordoned** node keeps what it runs but gets no new work (the scheduling pass treats it
like a node it may not use). **Draining** cordons it and moves its work off at the next
checkpoint: every job with a replica there is preempted the way the scheduler preempts (the
checkpoint signal, its grace period, then requeued to resume elsewhere from its last step).
**Uncordon** returns the node to service. Every function changes the store only; the caller
commits, then wakes what ``Touched`` names.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from boltforge.control.scheduling.actuate import Touched, preempt
from boltforge.control.scheduling.lifecycle import HOLDING
from boltforge.control.store.models import HELD, JobRow, NodeRow, ReplicaRow


class UnknownNode(Exception):
    """No node of that name has registered."""


def cordon(s: Session, name: str) -> Touched:
    """Give node ``name`` no new work; what runs there keeps running."""
    node = node_row(s, name)
    node.cordoned = True
    return Touched(nodes={name})


def uncordon(s: Session, name: str) -> Touched:
    """Return node ``name`` to service."""
    node = node_row(s, name)
    node.cordoned = False
    return Touched(nodes={name})


def drain(s: Session, name: str, now: float) -> Touched:
    """Cordon node ``name`` and preempt every job holding GPUs there: its replicas (on every
    node of the gang) get the checkpoint signal, and the job requeues once they exited. A job
    already leaving (preempting, cancelled) is left to finish leaving."""
    touched = cordon(s, name)
    for job in holders(s, name):
        why = f"node {name} is draining"
        touched |= move_off(s, job, now, why, "drained", {"node": name})
    return touched


def holders(s: Session, name: str) -> list[JobRow]:
    """The jobs holding GPUs on node ``name`` that are not already leaving (scheduled or
    running), in id order."""
    here = select(ReplicaRow.job_id).where(ReplicaRow.node == name, ReplicaRow.state.in_(HELD))
    jobs = (s.get(JobRow, job_id) for job_id in sorted(set(s.scalars(here))))
    return [job for job in jobs if job is not None and job.state in HOLDING]


def move_off(
    s: Session, job: JobRow, now: float, why: str, kind: str, data: dict[str, Any]
) -> Touched:
    """Preempt holding ``job`` to move it elsewhere, the way the scheduler preempts: every
    replica of its current allocation gets the checkpoint signal and the job requeues once
    they exited (at once, if none had started). ``why`` opens its timeline entry, of
    ``kind`` with ``data``."""
    reps = list(
        s.scalars(
            select(ReplicaRow).where(
                ReplicaRow.job_id == job.id,
                ReplicaRow.epoch == job.epoch,
                ReplicaRow.state.in_(HELD),
            )
        )
    )
    return preempt(s, job, reps, now, why, kind, data, after=", then requeued")


def node_row(s: Session, name: str) -> NodeRow:
    """Node ``name``; ``UnknownNode`` when none of that name registered."""
    node = s.get(NodeRow, name)
    if node is None:
        raise UnknownNode(name)
    return node

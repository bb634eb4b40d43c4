"""A node's preflight failed before it started a replica: the node is unfit, not the job.

The job's allocation ends (the rest of its gang is told to stop) and it requeues free of its
restart budget, so the scheduler places it on other nodes. Then the node is drained (an
audit-log entry by ``system``, action ``drain``, with the evidence): it gets no new work until
an operator uncordons it, and the jobs already running there move off at their next
checkpoint, as ``bolt nodes drain`` moves them. Unlike a straggler's cordon, this drain has no
fleet allowance: a node that cannot pass its own checks should run nothing. Everything here
changes the store only; the caller commits, then wakes what ``Touched`` names.
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from boltforge.control.audit import audit
from boltforge.control.auth import Caller
from boltforge.control.nodes.quarantine import drain
from boltforge.control.scheduling.actuate import Touched, close_run, halt
from boltforge.control.scheduling.lifecycle import transition
from boltforge.control.store.models import HELD, JobRow, NodeRow, ReplicaRow
from boltforge.wire.agent import ReplicaEvent

SYSTEM = Caller("system", "system", None, "preflight")
KIND = "preflight_failed"


def drain_unfit(s: Session, rep: ReplicaRow, ev: ReplicaEvent) -> Touched:
    """Drain ``rep``'s node after its preflight failed (``ev.detail`` is the evidence),
    audited as done by the system. Call it after ``requeue``: the refused job is no longer
    on the node, so only the node's other jobs move."""
    node = s.get(NodeRow, rep.node)
    if node is None:
        return Touched()
    touched = drain(s, node.name, ev.at)
    detail = {"reason": "preflight", "job": rep.job_id, "replica": rep.id, "evidence": ev.detail}
    audit(s, SYSTEM, "drain", node.name, ev.at, **detail)
    return touched


def requeue(s: Session, job: JobRow, rep: ReplicaRow, ev: ReplicaEvent) -> Touched:
    """End holding ``job``'s allocation after ``rep`` failed its node's preflight: stop the
    rest of its gang and requeue it to be placed elsewhere, charging no restart. The
    timeline's ``preflight_failed`` event carries the node and the evidence."""
    rest = s.scalars(
        select(ReplicaRow).where(
            ReplicaRow.job_id == job.id,
            ReplicaRow.epoch == job.epoch,
            ReplicaRow.id != rep.id,
            ReplicaRow.state.in_(HELD),
        )
    )
    touched = halt(s, rest, ev.at)
    close_run(s, job, ev.at)
    data = {"node": rep.node, "replica": rep.id, "epoch": job.epoch, "evidence": ev.detail}
    message = f"requeued: node {rep.node} failed its preflight ({ev.detail}); placed elsewhere"
    transition(s, job, "requeued", ev.at, message, KIND, data)
    touched.jobs.add(job.id)
    return touched

"""A node's preflight failed before it started a replica: the node is unfit, not the job.

The node is cordoned (an audit-log entry by ``system``, action ``cordon``, with the evidence)
so it gets no new work until an operator uncordons it; what already runs there keeps running
(``bolt nodes drain`` moves it too). The job's allocation ends (the rest of its gang is told
to stop) and it requeues free of its restart budget, so the scheduler places it on other
nodes. Unlike a straggler's, this cordon has no fleet allowance: a node that cannot pass its
own checks cannot run anything. Everything here changes the store only; the caller commits,
then wakes what ``Touched`` names.
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from boltforge.control.actuate import HELD, Touched, close_run
from boltforge.control.audit import audit
from boltforge.control.auth import Caller
from boltforge.control.health import stop
from boltforge.control.lifecycle import transition
from boltforge.control.models import JobRow, NodeRow, ReplicaRow
from boltforge.control.quarantine import cordon
from boltforge.wire.agent import ReplicaEvent

SYSTEM = Caller("system", "system", None, "preflight")
KIND = "preflight_failed"


def cordon_unfit(s: Session, rep: ReplicaRow, ev: ReplicaEvent) -> Touched:
    """Cordon ``rep``'s node after its preflight failed (``ev.detail`` is the evidence),
    audited as done by the system. A node already cordoned is left as it is."""
    node = s.get(NodeRow, rep.node)
    if node is None or node.cordoned:
        return Touched()
    touched = cordon(s, node.name)
    detail = {"reason": "preflight", "job": rep.job_id, "replica": rep.id, "evidence": ev.detail}
    audit(s, SYSTEM, "cordon", node.name, ev.at, **detail)
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
    touched = stop(s, list(rest), ev.at)
    close_run(s, job, ev.at)
    data = {"node": rep.node, "replica": rep.id, "epoch": job.epoch, "evidence": ev.detail}
    message = f"requeued: node {rep.node} failed its preflight ({ev.detail}); placed elsewhere"
    transition(s, job, "requeued", ev.at, message, KIND, data)
    touched.jobs.add(job.id)
    return touched

"""Spot reclaim notices: a node its cloud takes back at a known time.

``notice`` marks the node as reclaimed at ``now + in_s`` (a second notice can only bring that
time forward), cordons it, and moves every job holding GPUs there off the way a drain does,
except that the checkpoint signal comes at once with a grace cut to the time left, so each
stop ends before the node goes away. ``expire`` treats a node whose reclaim time has passed
as gone: what is still there is lost and its jobs requeue from their last checkpoint. They
were already leaving (``preempting``), so ``restarts.restart_or_fail`` charges no restart: a
reclaim is never the job's fault. ``settle`` writes the work each reclaimed job lost
(``lost_s``, see ``lost_work``) into the data of the timeline entry that requeued it.

Every function changes the store only; the caller commits, then wakes what ``Touched`` names.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from sqlalchemy import select
from sqlalchemy.orm import Session

from boltforge.control.nodes.agents import LIVE_REPLICA, lose
from boltforge.control.nodes.quarantine import cordon, holders, move_off, node_row
from boltforge.control.scheduling.actuate import Touched
from boltforge.control.store.models import HELD, EventRow, JobRow, NodeRow, ReplicaRow

NOTICE = "reclaim"
REQUEUES = ("checkpointed", "lost", "requeued")


@dataclass
class Notice:
    """What a reclaim notice did: when the node goes, and each job asked to checkpoint now
    with the grace it was given (seconds)."""

    reclaim_at: float
    jobs: dict[str, float] = field(default_factory=dict)
    touched: Touched = field(default_factory=Touched)


def notice(s: Session, name: str, in_s: float, now: float) -> Notice:
    """Node ``name`` is reclaimed in ``in_s`` seconds: cordon it and ask every job holding
    GPUs there to checkpoint now and move off within the time left. Raises
    ``quarantine.UnknownNode``."""
    node = node_row(s, name)
    at = now + in_s
    node.reclaim_at = at if node.reclaim_at is None else min(node.reclaim_at, at)
    left = max(node.reclaim_at - now, 0.0)
    out = Notice(node.reclaim_at, touched=cordon(s, name))
    for job in holders(s, name):
        out.jobs[job.id] = _cut_grace(s, job, left)
        why = f"reclaim notice: node {name} reclaimed in {left:.0f} s; checkpoint requested"
        data = {"node": name, "reclaim_at": node.reclaim_at, "epoch": job.epoch}
        out.touched |= move_off(s, job, now, why, NOTICE, data)
    settle(s, out.jobs)
    return out


def _cut_grace(s: Session, job: JobRow, left: float) -> float:
    """Give every held replica of ``job``'s current allocation a grace of at most ``left``
    seconds; returns the longest grace left."""
    reps = s.scalars(
        select(ReplicaRow).where(
            ReplicaRow.job_id == job.id,
            ReplicaRow.epoch == job.epoch,
            ReplicaRow.state.in_(HELD),
        )
    )
    longest = 0.0
    for r in reps:
        grace = min(float(r.spec.get("grace_s", 30.0)), left)
        r.spec = {**r.spec, "grace_s": grace}
        longest = max(longest, grace)
    return longest


def expire(s: Session, now: float) -> Touched:
    """Nodes whose reclaim time has passed are gone (``dead``): their replicas are lost and
    their jobs requeue from their last checkpoint, charged no restart."""
    touched = Touched()
    due = select(NodeRow).where(NodeRow.reclaim_at <= now, NodeRow.state.in_(("ready", "suspect")))
    for node in list(s.scalars(due)):
        node.state = "dead"
        touched.nodes.add(node.name)
        reps = s.scalars(
            select(ReplicaRow).where(
                ReplicaRow.node == node.name,
                ReplicaRow.state.in_(("waiting", *LIVE_REPLICA)),
            )
        )
        gone = lose(s, list(reps), now, f"node {node.name} was reclaimed")
        settle(s, gone.jobs)
        touched |= gone
    return touched


def settle(s: Session, job_ids: Iterable[str]) -> None:
    """For each job requeued after a reclaim notice of its current allocation, put the work
    it lost (``lost_work`` at the requeue) in the requeue entry's data as ``lost_s``. Call
    again when a late checkpoint report arrives: the figure is recomputed until the job is
    placed again."""
    for job_id in sorted(set(job_ids)):
        job = s.get(JobRow, job_id)
        if job is None or job.state != "requeued":
            continue
        told = _last(s, job_id, (NOTICE,))
        done = _last(s, job_id, REQUEUES)
        if told is None or done is None or done.id < told.id:
            continue
        if (told.data or {}).get("epoch") == job.epoch:
            done.data = {**(done.data or {}), "lost_s": round(lost_work(job, done.at), 3)}


def lost_work(job: JobRow, stopped_at: float) -> float:
    """Seconds of work ``job`` loses by stopping at ``stopped_at``: the time since its last
    checkpoint, or since its current allocation was bound when it has not checkpointed
    since (near 0 for a job that checkpointed as it stopped)."""
    marks = [t for t in (job.last_checkpoint_at, job.bound_at) if t is not None]
    return max(stopped_at - max(marks, default=stopped_at), 0.0)


def _last(s: Session, job_id: str, kinds: tuple[str, ...]) -> EventRow | None:
    q = (
        select(EventRow)
        .where(EventRow.job_id == job_id, EventRow.kind.in_(kinds))
        .order_by(EventRow.id.desc())
        .limit(1)
    )
    return s.scalar(q)

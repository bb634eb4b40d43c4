"""Store rows as the API's reply bodies."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from boltforge.control.jobs.submit import PRIORITY_NAMES
from boltforge.control.scheduling.world import degraded
from boltforge.control.store.models import HELD, EventRow, JobRow, NodeRow, ReplicaRow
from boltforge.control.views.billing import job_meter
from boltforge.ranges import hostlist
from boltforge.wire.gpuamount import gpu_part
from boltforge.wire.jobs import EventOut, JobDetail, JobSummary, NodeOut, ReplicaOut


def summary(job: JobRow, nodes: list[str] | None = None) -> JobSummary:
    """A ``bolt queue`` row for ``job``; ``nodes`` are where its current replicas sit."""
    return _summary(lambda name: getattr(job, name), nodes or [])


def stored_summary(values: Mapping[str, Any]) -> JobSummary:
    """The row of a job just stored from ``values`` (its columns, as the intake wrote
    them), without building an ORM object for it."""
    return _summary(values.get, [])


def _summary(column: Callable[[str], Any], nodes: list[str]) -> JobSummary:
    priority = column("priority")
    return JobSummary(
        id=column("id"),
        name=column("name"),
        team=column("team"),
        project=column("project"),
        user=column("user"),
        priority=priority,
        priority_name=PRIORITY_NAMES.get(priority, str(priority)),
        state=column("state"),
        gpus=column("gpus"),
        gpu_part=gpu_part(column("spec") or {}),
        replicas=column("replicas"),
        submitted_at=column("submitted_at"),
        started_at=column("started_at"),
        finished_at=column("finished_at"),
        position=column("position"),
        reason=column("reason") or "",
        estimated_start=column("estimated_start"),
        nodes=hostlist(nodes),
        array=column("array_spec"),
        array_task=column("array_index"),
        preemptions=column("preemptions") or 0,
        restarts=column("restarts") or 0,
        exit_code=column("exit_code"),
        last_step=column("last_step"),
    )


def current_replicas(s: Session, job: JobRow) -> list[ReplicaRow]:
    q = select(ReplicaRow).where(ReplicaRow.job_id == job.id, ReplicaRow.epoch == job.epoch)
    return list(s.scalars(q.order_by(ReplicaRow.rank)))


def detail(s: Session, job: JobRow, now: float) -> JobDetail:
    """Everything about one job: placement, explanation, diagnosis, timeline and meter
    (allocated and productive, ``boltforge.core.billing.meter``)."""
    reps = current_replicas(s, job) if job.epoch else []
    events = s.scalars(select(EventRow).where(EventRow.job_id == job.id).order_by(EventRow.id))
    m = job_meter(s, job, now)
    base = summary(job, [r.node for r in reps if r.state in HELD]).model_dump()
    return JobDetail(
        **base,
        spec=job.spec,
        epoch=job.epoch,
        placement=[replica_out(r) for r in reps],
        explanation=list(job.explanation or []),
        waiting=list(job.waiting or []),
        events=[event_out(e) for e in events],
        last_checkpoint_at=job.last_checkpoint_at,
        gpu_hours=round(m.gpu_hours, 6),
        dollars=round(m.dollars, 4),
        productive_gpu_hours=round(m.productive_gpu_hours, 6),
        productive_dollars=round(m.productive_dollars, 4),
    )


def replica_out(r: ReplicaRow) -> ReplicaOut:
    return ReplicaOut(
        replica=r.id,
        role=r.role,
        rank=r.rank,
        node=r.node,
        gpus=list(r.gpus),
        state=r.state,
        pid=r.pid,
        exit_code=r.exit_code,
    )


def event_out(e: EventRow) -> EventOut:
    return EventOut(seq=e.id, at=e.at, kind=e.kind, message=e.message, data=dict(e.data or {}))


def node_state(state: str, cordoned: bool, used: int) -> str:
    """A node's state as shown: a cordoned live node is ``draining`` while ``used`` GPUs are
    still held there, then ``cordoned``."""
    if state in ("ready", "suspect") and cordoned:
        return "draining" if used else "cordoned"
    return state


def node_out(n: NodeRow, used: int, jobs: list[str], now: float) -> NodeOut:
    state = node_state(n.state, n.cordoned, used)
    inv = n.inventory
    return NodeOut(
        name=n.name,
        pool=n.pool,
        gpu=str(inv.get("gpu", "")),
        gpus=n.gpus,
        gpus_used=used,
        pod=n.pod,
        rack=n.rack,
        state=state,
        last_heartbeat=n.last_heartbeat,
        jobs=jobs,
        source=str(inv.get("source", "declared")),
        address=str(inv.get("address", "")),
        reclaim_at=n.reclaim_at,
        degraded=degraded(n, now),
    )

"""The store's tables. Times are seconds since the Unix epoch (float), the same on SQLite and
PostgreSQL; structured values (specs, GPU lists, explanations) are JSON columns."""

from __future__ import annotations

from typing import Any

from sqlalchemy import JSON, Boolean, Float, ForeignKey, Index, Integer, String, Text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    """Every table of the store."""


class JobRow(Base):
    """One job, or one task of an array job. ``epoch`` counts the job's allocations: every
    bind starts a new one, and agents' reports for an older epoch are refused.
    ``recovery_hold``: after a host failure, what its replicas held on the healthy hosts and
    when (``{"at", "lost": [node], "grants": [{role, replica, node, gpus, cpus, memory_gb}]}``),
    kept for its restart for the server's ``--recovery-hold`` (None: no hold).
    ``resized_at``: when an elastic job last grew or shrank in place (None: never).
    ``service``: the service this job is a replica of (None: a job of its own)."""

    __tablename__ = "jobs"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    num: Mapped[int] = mapped_column(Integer, index=True)
    name: Mapped[str] = mapped_column(String(63))
    team: Mapped[str] = mapped_column(String(63), index=True)
    project: Mapped[str | None] = mapped_column(String(63))
    queue: Mapped[str] = mapped_column(String(200))
    user: Mapped[str] = mapped_column(String(63), default="")
    priority: Mapped[int] = mapped_column(Integer)
    state: Mapped[str] = mapped_column(String(16), index=True)
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    gpus: Mapped[int] = mapped_column(Integer)
    replicas: Mapped[int] = mapped_column(Integer)
    array_id: Mapped[str | None] = mapped_column(String(64), index=True)
    array_spec: Mapped[str | None] = mapped_column(String(200))
    array_index: Mapped[int | None] = mapped_column(Integer)
    idempotency_key: Mapped[str | None] = mapped_column(String(200), unique=True)
    submitted_at: Mapped[float] = mapped_column(Float)
    started_at: Mapped[float | None] = mapped_column(Float)
    finished_at: Mapped[float | None] = mapped_column(Float)
    exit_code: Mapped[int | None] = mapped_column(Integer)
    epoch: Mapped[int] = mapped_column(Integer, default=0)
    bound_at: Mapped[float | None] = mapped_column(Float)
    restarts: Mapped[int] = mapped_column(Integer, default=0)
    preemptions: Mapped[int] = mapped_column(Integer, default=0)
    last_preempted_at: Mapped[float | None] = mapped_column(Float)
    resized_at: Mapped[float | None] = mapped_column(Float)
    last_checkpoint_at: Mapped[float | None] = mapped_column(Float)
    last_step: Mapped[int | None] = mapped_column(Integer)
    attained_gpu_s: Mapped[float] = mapped_column(Float, default=0.0)
    borrowed: Mapped[bool] = mapped_column(Boolean, default=False)
    reason: Mapped[str] = mapped_column(String(40), default="")
    position: Mapped[int | None] = mapped_column(Integer)
    estimated_start: Mapped[float | None] = mapped_column(Float)
    waiting: Mapped[list[str]] = mapped_column(JSON, default=list)
    explanation: Mapped[list[str]] = mapped_column(JSON, default=list)
    recovery_hold: Mapped[dict[str, Any] | None] = mapped_column(JSON(none_as_null=True))
    service: Mapped[str | None] = mapped_column(String(63), index=True, default=None)


class EventRow(Base):
    """One entry of a job's timeline (queued, placed, preempted, checkpointed, resumed, ...)."""

    __tablename__ = "events"
    __table_args__ = (Index("ix_events_job_id_id", "job_id", "id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(String(64), ForeignKey("jobs.id"))
    at: Mapped[float] = mapped_column(Float)
    kind: Mapped[str] = mapped_column(String(32))
    message: Mapped[str] = mapped_column(Text)
    data: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)


HELD = ("waiting", "starting", "running", "stopping")  # replica states that hold GPUs


class ReplicaRow(Base):
    """One replica of one allocation epoch of a job, on one node.

    ``state``: ``waiting`` (bound; its GPUs are still held by a replica that is leaving),
    ``starting`` (the node was told to run it), ``running``, ``stopping`` (the node was told to
    checkpoint and stop it), ``exited``, ``lost`` (its node died). The first four hold GPUs.
    """

    __tablename__ = "replicas"
    __table_args__ = (Index("ix_replicas_node_state", "node", "state"),)

    id: Mapped[str] = mapped_column(String(120), primary_key=True)
    job_id: Mapped[str] = mapped_column(String(64), ForeignKey("jobs.id"), index=True)
    epoch: Mapped[int] = mapped_column(Integer)
    role: Mapped[str] = mapped_column(String(63))
    rank: Mapped[int] = mapped_column(Integer)
    node: Mapped[str] = mapped_column(String(63), ForeignKey("nodes.name"))
    gpus: Mapped[list[int]] = mapped_column(JSON)
    cpus: Mapped[float] = mapped_column(Float, default=0.0)
    memory_gb: Mapped[float] = mapped_column(Float, default=0.0)
    state: Mapped[str] = mapped_column(String(16), index=True)
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    pid: Mapped[int | None] = mapped_column(Integer)
    dispatched_at: Mapped[float | None] = mapped_column(Float)
    started_at: Mapped[float | None] = mapped_column(Float)
    stop_requested_at: Mapped[float | None] = mapped_column(Float)
    exited_at: Mapped[float | None] = mapped_column(Float)
    exit_code: Mapped[int | None] = mapped_column(Integer)
    signal: Mapped[int | None] = mapped_column(Integer)
    checkpoint_s: Mapped[float | None] = mapped_column(Float)
    log_seq: Mapped[int] = mapped_column(Integer, default=-1)


class NodeRow(Base):
    """A node that registered. ``desired_version`` grows whenever what it should run changes;
    agents long-poll on it. ``session`` is the agent's current lease. ``reclaim_at``: when
    its cloud takes it back, after a spot reclaim notice (None: no notice). ``degraded_until``:
    a straggler finding marks it degraded (no multi-replica work) until then."""

    __tablename__ = "nodes"

    name: Mapped[str] = mapped_column(String(63), primary_key=True)
    inventory: Mapped[dict[str, Any]] = mapped_column(JSON)
    pool: Mapped[str] = mapped_column(String(63))
    pod: Mapped[str] = mapped_column(String(63))
    rack: Mapped[str] = mapped_column(String(63))
    gpus: Mapped[int] = mapped_column(Integer)
    state: Mapped[str] = mapped_column(String(16))
    cordoned: Mapped[bool] = mapped_column(Boolean, default=False)
    session: Mapped[str] = mapped_column(String(64), default="")
    registered_at: Mapped[float] = mapped_column(Float)
    last_heartbeat: Mapped[float | None] = mapped_column(Float)
    lease_expires_at: Mapped[float | None] = mapped_column(Float)
    desired_version: Mapped[int] = mapped_column(Integer, default=0)
    health: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    reclaim_at: Mapped[float | None] = mapped_column(Float)
    degraded_until: Mapped[float | None] = mapped_column(Float)


class RunRow(Base):
    """One stretch of a job holding GPUs (an epoch from start to stop): fair-share usage and
    the cost meter are sums over these. ``checkpoint_at`` is the job's last checkpoint inside
    the stretch as known when it ended (None: none); ``cpus`` the CPUs it held (its vCPU-hours);
    ``dollars_per_hour`` prices both. ``gpu_share``: the parts of GPUs it held beside its
    whole ``gpus`` (MIG instances and fractions, each its part of a GPU; None: none)."""

    __tablename__ = "runs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(String(64), ForeignKey("jobs.id"), index=True)
    epoch: Mapped[int] = mapped_column(Integer)
    queue: Mapped[str] = mapped_column(String(200))
    team: Mapped[str] = mapped_column(String(63))
    gpus: Mapped[int] = mapped_column(Integer)
    gpu_share: Mapped[float | None] = mapped_column(Float, default=None)
    cpus: Mapped[float] = mapped_column(Float, default=0.0)
    dollars_per_hour: Mapped[float] = mapped_column(Float, default=0.0)
    started_at: Mapped[float] = mapped_column(Float)
    ended_at: Mapped[float | None] = mapped_column(Float, index=True)
    checkpoint_at: Mapped[float | None] = mapped_column(Float)

    @property
    def held_gpus(self) -> float:
        """The GPUs it held, whole and in part: what GPU-hours and usage count."""
        return self.gpus + (self.gpu_share or 0.0)


class LogRow(Base):
    """A chunk of a replica's output, in the order the agent numbered it."""

    __tablename__ = "logs"
    __table_args__ = (Index("ix_logs_job_id_id", "job_id", "id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(String(64), ForeignKey("jobs.id"))
    replica: Mapped[str] = mapped_column(String(120))
    seq: Mapped[int] = mapped_column(Integer)
    at: Mapped[float] = mapped_column(Float)
    data: Mapped[str] = mapped_column(Text)


class RankProgressRow(Base):
    """The latest step each rank of a job reported, with its recent step times."""

    __tablename__ = "rank_progress"

    job_id: Mapped[str] = mapped_column(String(64), ForeignKey("jobs.id"), primary_key=True)
    rank: Mapped[int] = mapped_column(Integer, primary_key=True)
    epoch: Mapped[int] = mapped_column(Integer)
    node: Mapped[str] = mapped_column(String(63))
    step: Mapped[int] = mapped_column(Integer)
    at: Mapped[float] = mapped_column(Float)
    step_times: Mapped[list[float]] = mapped_column(JSON, default=list)
    metrics: Mapped[dict[str, float]] = mapped_column(JSON, default=dict)


class TokenRow(Base):
    """An API token (stored as its SHA-256), for a person or an agent, with a role.

    ``nodes``: for an agent token, the node names or glob patterns it may act for, as the
    admin bound it (``["*"]``: every node, a bridge's token); None: it claims each node it is
    the first to use (``NodeClaimRow``). ``expires_at``: when it stops working (None: never).
    ``revoked_at``: when an admin revoked it (None: not revoked). ``last_used_at``: when a
    server last took it, to the minute (None: never)."""

    __tablename__ = "tokens"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(63))
    role: Mapped[str] = mapped_column(String(16))
    team: Mapped[str | None] = mapped_column(String(63))
    digest: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[float] = mapped_column(Float)
    nodes: Mapped[list[str] | None] = mapped_column(JSON(none_as_null=True), default=None)
    expires_at: Mapped[float | None] = mapped_column(Float, default=None)
    revoked_at: Mapped[float | None] = mapped_column(Float, default=None)
    last_used_at: Mapped[float | None] = mapped_column(Float, default=None)


class NodeClaimRow(Base):
    """Which agent token a node belongs to: the one that first acted for it, or the last
    token bound to it by name or pattern that registered it. A claim held by a revoked or
    expired token no longer counts."""

    __tablename__ = "node_claims"

    node: Mapped[str] = mapped_column(String(63), primary_key=True)
    token_id: Mapped[int] = mapped_column(Integer, ForeignKey("tokens.id"), index=True)
    at: Mapped[float] = mapped_column(Float)


class AuditRow(Base):
    """Who did what, when, from where: one row per mutating call."""

    __tablename__ = "audit"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    at: Mapped[float] = mapped_column(Float, index=True)
    who: Mapped[str] = mapped_column(String(63))
    role: Mapped[str] = mapped_column(String(16))
    action: Mapped[str] = mapped_column(String(63))
    target: Mapped[str] = mapped_column(String(200))
    source: Mapped[str] = mapped_column(String(100))
    detail: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)


class CounterRow(Base):
    """Named counters the store hands out (job numbers)."""

    __tablename__ = "counters"

    name: Mapped[str] = mapped_column(String(32), primary_key=True)
    value: Mapped[int] = mapped_column(Integer)


class LeaderRow(Base):
    """The leader lease of the server replicas sharing this store (one row, ``id`` 1).
    ``term`` is the fencing token: it grows by one at every change of holder, and a write
    made under an older term is refused. ``renewals`` grows at every renewal, so that the
    others see the lease alive by watching it change on their own clocks."""

    __tablename__ = "leader"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    holder: Mapped[str] = mapped_column(String(200))
    url: Mapped[str] = mapped_column(String(500))
    term: Mapped[int] = mapped_column(Integer)
    renewals: Mapped[int] = mapped_column(Integer)
    lease_s: Mapped[float] = mapped_column(Float)
    acquired_at: Mapped[float] = mapped_column(Float)


class ServiceRow(Base):
    """An inference service: its spec, the replicas its autoscaler asks for and why, the
    load last seen, and the scaler's carried state (``core/serving/autoscale.ScaleState``,
    as JSON). ``state`` is ``active`` or ``deleted`` (its replicas cancelled)."""

    __tablename__ = "services"

    name: Mapped[str] = mapped_column(String(63), primary_key=True)
    team: Mapped[str] = mapped_column(String(63), index=True)
    state: Mapped[str] = mapped_column(String(16))
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    desired: Mapped[int] = mapped_column(Integer)
    reason: Mapped[str] = mapped_column(String(200), default="")
    load: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    scaler: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    created_at: Mapped[float] = mapped_column(Float)
    scaled_at: Mapped[float | None] = mapped_column(Float)
    scale_events: Mapped[int] = mapped_column(Integer, default=0)

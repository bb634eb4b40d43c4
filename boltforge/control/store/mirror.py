"""The live part of the store, held in memory and kept current by the store's own commits.

Scheduling passes read this, never the whole store: the nodes, the live jobs (pending,
requeued, scheduled, running, preempting) and the replicas that hold GPUs. It is loaded once
when the server starts (``load``) and then follows every committed change: the store's
sessions report what they flushed (``watch``), and the changes land here only when their
transaction commits, so a rolled-back request leaves no trace. Writes that bypass the
session's unit of work (the intake's bulk inserts, bulk updates) hand their rows over with
``add_jobs`` or ``stage``.

``version`` grows with every change that can alter what a pass sees of the fleet's holdings
(a node's state, cordon or health, a job entering or leaving the GPUs, a replica that starts
or stops holding them); ``fleet_version`` with every change of the nodes' inventories.
Replies, reasons and positions, heartbeats and log offsets leave both alone. Each step of
``version`` is logged with the job or node it concerns (``changed_since``), so a reader can
bring what it derived from the mirror up to date instead of reading it whole.

The mirror also learns the runtimes of the jobs that succeed (``runtimes``, read back from the
store's most recent ``HISTORY`` successes at ``load``), for the estimates passes give jobs
sent without a time limit (``estimate``; ``core/queueing/runtimes.py``).
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from typing import Any, TypeVar

from sqlalchemy import event, inspect, select
from sqlalchemy.orm import Session, sessionmaker

from boltforge.control.scheduling.lifecycle import HOLDING, LIVE, WAITING
from boltforge.control.store.models import HELD, JobRow, NodeRow, ReplicaRow
from boltforge.core.queueing.runtimes import Finished, RuntimeHistory

LOG_KEEP = 50_000  # the changes of ``version`` remembered for ``changed_since``
CHANGES = "bolt.mirror.changes"  # Session.info key: (table, key, values, deleted) staged
HISTORY = 5000  # successful jobs read back into the runtime history at load


@dataclass(slots=True)
class LiveNode:
    """A registered node as passes see it."""

    name: str
    inventory: dict[str, Any] = field(default_factory=dict)
    state: str = "ready"
    cordoned: bool = False
    degraded_until: float | None = None
    health: dict[str, Any] = field(default_factory=dict)
    lease_expires_at: float | None = None
    last_heartbeat: float | None = None
    reclaim_at: float | None = None
    desired_version: int = 0
    session: str = ""


@dataclass(slots=True)
class LiveJob:
    """A live job (or array task) as passes see it; ``spec`` never changes after submit."""

    id: str
    num: int = 0
    team: str = ""
    queue: str = ""
    priority: int = 2
    state: str = "pending"
    spec: dict[str, Any] = field(default_factory=dict)
    gpus: int = 0
    epoch: int = 0
    submitted_at: float = 0.0
    bound_at: float | None = None
    attained_gpu_s: float = 0.0
    last_checkpoint_at: float | None = None
    last_preempted_at: float | None = None
    resized_at: float | None = None
    borrowed: bool = False
    recovery_hold: dict[str, Any] | None = None
    reason: str = ""
    position: int | None = None
    estimated_start: float | None = None
    waiting: list[str] = field(default_factory=list)
    array_id: str | None = None
    array_index: int | None = None
    service: str | None = None


@dataclass(slots=True)
class LiveReplica:
    """A replica that holds GPUs (waiting, starting, running or stopping)."""

    id: str
    job_id: str = ""
    epoch: int = 0
    role: str = "worker"
    rank: int = 0
    node: str = ""
    gpus: list[int] = field(default_factory=list)
    cpus: float = 0.0
    memory_gb: float = 0.0
    state: str = "waiting"
    stop_requested_at: float | None = None
    spec: dict[str, Any] = field(default_factory=dict)

    @property
    def grace_s(self) -> float:
        """Seconds between the checkpoint signal and the kill."""
        return float(self.spec.get("grace_s", 30.0))

    @property
    def rendezvous(self) -> tuple[str, int] | None:
        """The master address and rendezvous port the replica's gang uses (None: none)."""
        env = self.spec.get("env") or {}
        port = env.get("MASTER_PORT")
        return (str(env.get("MASTER_ADDR", "")), int(port)) if port is not None else None


Live = LiveNode | LiveJob | LiveReplica
R = TypeVar("R", LiveNode, LiveJob, LiveReplica)
_FIELDS = {cls: tuple(f.name for f in fields(cls)) for cls in (LiveNode, LiveJob, LiveReplica)}
_TABLES: dict[type, type[Live]] = {NodeRow: LiveNode, JobRow: LiveJob, ReplicaRow: LiveReplica}
_RELEVANT = {
    LiveNode: ("inventory", "state", "cordoned", "degraded_until", "health"),
    LiveJob: (
        *("priority", "bound_at", "attained_gpu_s", "last_checkpoint_at"),
        *("last_preempted_at", "resized_at", "borrowed", "recovery_hold"),
    ),
    LiveReplica: ("node", "gpus", "cpus", "memory_gb", "stop_requested_at"),
}


class Mirror:
    """The live records, by key. Readers take ``reading()``; changes arrive through the
    store's commits. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self.nodes: dict[str, LiveNode] = {}
        self.jobs: dict[str, LiveJob] = {}
        self.replicas: dict[str, LiveReplica] = {}
        self.on_node: dict[str, set[str]] = {}  # replica ids by node
        self.of_job: dict[str, set[str]] = {}  # replica ids by job
        self.version = 0
        self.fleet_version = 0
        self._log: list[tuple[str, str]] = []  # what each step of ``version`` changed
        self._log_base = 0  # the version before the first step in ``_log``
        self.runtimes = RuntimeHistory()

    # -- reading -------------------------------------------------------------------------

    @contextmanager
    def reading(self) -> Iterator[Mirror]:
        """Hold off changes while the caller reads several records consistently."""
        with self._lock:
            yield self

    def held_on(self, node: str) -> list[LiveReplica]:
        """The replicas holding GPUs on ``node``, by id."""
        with self._lock:
            ids = sorted(self.on_node.get(node, ()))
            return [self.replicas[i] for i in ids]

    def held_by_job(self) -> dict[str, list[LiveReplica]]:
        """The replicas holding GPUs, by job, each list in rank order."""
        out: dict[str, list[LiveReplica]] = {}
        with self._lock:
            for r in self.replicas.values():
                out.setdefault(r.job_id, []).append(r)
        for reps in out.values():
            reps.sort(key=lambda r: (r.epoch, r.rank))
        return out

    def replicas_of(self, job: str) -> list[LiveReplica]:
        """The replicas of ``job`` holding GPUs, by epoch and rank."""
        with self._lock:
            reps = [self.replicas[i] for i in self.of_job.get(job, ())]
        return sorted(reps, key=lambda r: (r.epoch, r.rank))

    def changed_since(self, version: int) -> tuple[set[str], set[str]] | None:
        """The jobs and the nodes whose changes moved ``version`` on since it was
        ``version``: a job whose row or replicas changed what a pass sees of its holdings, a
        node whose state, cordon or health did. None when that is no longer known (the
        oldest changes are forgotten, and ``load`` forgets all): then only a whole read will
        do. A change of the fleet itself moves ``fleet_version`` too; callers check that."""
        with self._lock:
            if version < self._log_base or version > self.version:
                return None
            jobs: set[str] = set()
            nodes: set[str] = set()
            for kind, key in self._log[version - self._log_base :]:
                (jobs if kind == "job" else nodes).add(key)
            return jobs, nodes

    def _step(self, kind: str, key: str) -> None:
        """One step of ``version``: ``key`` (a ``job`` or a ``node``) changed."""
        self.version += 1
        self._log.append((kind, key))
        if len(self._log) > LOG_KEEP:
            drop = len(self._log) // 2
            del self._log[:drop]
            self._log_base += drop

    def typical(self, team: str, name: str, gpus: int, limit_s: float | None) -> float | None:
        """What jobs like this one typically took (``RuntimeHistory.typical``; None: too few
        such jobs have succeeded yet)."""
        with self._lock:
            return self.runtimes.typical(team, name, gpus, limit_s)

    def estimate(self, team: str, name: str, gpus: int) -> float | None:
        """The runtime learned for a job of ``team`` named ``name`` on ``gpus`` GPUs (None:
        too few such jobs have succeeded yet)."""
        with self._lock:
            return self.runtimes.estimate(team, name, gpus)

    # -- loading and following the store -------------------------------------------------

    def load(self, s: Session) -> None:
        """Read the live records from the store (at start, or to rebuild after doubt)."""
        with self._lock:
            self.runtimes = RuntimeHistory()
            self.runtimes.learn_all(_recent_successes(s))
            self.nodes = {n.name: _node(n) for n in s.scalars(select(NodeRow))}
            jobs = s.scalars(select(JobRow).where(JobRow.state.in_(LIVE)))
            self.jobs = {j.id: _make(LiveJob, _values(j)) for j in jobs}
            reps = s.scalars(select(ReplicaRow).where(ReplicaRow.state.in_(HELD)))
            self.replicas = {r.id: _make(LiveReplica, _values(r)) for r in reps}
            self.on_node, self.of_job = {}, {}
            for r in self.replicas.values():
                self.on_node.setdefault(r.node, set()).add(r.id)
                self.of_job.setdefault(r.job_id, set()).add(r.id)
            self.version += 1
            self.fleet_version += 1
            self._log, self._log_base = [], self.version

    def watch(self, sessions: sessionmaker[Session]) -> None:
        """Follow every session ``sessions`` makes: what each flushes is staged, and applied
        here when its transaction commits (dropped when it rolls back)."""
        event.listen(sessions, "after_flush", _staged_flush)
        event.listen(sessions, "after_commit", self._committed)
        event.listen(sessions, "after_rollback", _dropped)

    def add_jobs(self, rows: Iterable[Mapping[str, Any]]) -> None:
        """Jobs inserted in bulk (the intake's rows, as column values), after their commit."""
        with self._lock:
            for values in rows:
                if values.get("state") in LIVE:
                    self.jobs[values["id"]] = _make(LiveJob, values)

    def _committed(self, s: Session) -> None:
        staged = s.info.pop(CHANGES, None)
        if staged:
            self.apply(staged)

    def apply(self, staged: Iterable[tuple[type, Any, dict[str, Any], bool]]) -> None:
        """Apply committed changes: ``(table, key, values, deleted)`` in the order flushed."""
        with self._lock:
            for table, key, values, deleted in staged:
                if table is NodeRow:
                    self._node(key, values, deleted)
                elif table is JobRow:
                    self._job(key, values, deleted)
                elif table is ReplicaRow:
                    self._replica(key, values, deleted)

    def _node(self, key: str, values: dict[str, Any], deleted: bool) -> None:
        old = self.nodes.get(key)
        if old is None and "inventory" not in values:
            return  # a partial change of a node never seen whole
        if deleted:
            if self.nodes.pop(key, None) is not None:
                self._step("node", key)
                self.fleet_version += 1
            return
        new = _merged(LiveNode, old, values)
        self.nodes[key] = new
        if old is None or old.inventory != new.inventory:
            self.fleet_version += 1
        if old is None or _differs(old, new, _RELEVANT[LiveNode]):
            self._step("node", key)

    def _job(self, key: str, values: dict[str, Any], deleted: bool) -> None:
        old = self.jobs.get(key)
        if old is None and "state" not in values:
            return  # a partial change of a job that is not live
        new = _merged(LiveJob, old, values)
        state = new.state
        if state == "succeeded" and old is not None and old.state != state and new.gpus > 0:
            name = str(new.spec.get("name", ""))
            runtime = new.attained_gpu_s / new.gpus
            limit = _limit_of(new.spec)
            self.runtimes.learn(Finished(new.team, name, new.gpus, runtime, limit))
        if deleted or state not in LIVE:
            popped = self.jobs.pop(key, None)
            if popped is not None and old is not None and old.state not in WAITING:
                self._step("job", key)
            return
        self.jobs[key] = new
        if old is None:
            if state not in WAITING:
                self._step("job", key)
        elif not _same_class(old.state, state) or _differs(old, new, _RELEVANT[LiveJob]):
            self._step("job", key)

    def _replica(self, key: str, values: dict[str, Any], deleted: bool) -> None:
        old = self.replicas.get(key)
        if old is None and "state" not in values:
            return  # a partial change of a replica that holds no GPUs
        new = _merged(LiveReplica, old, values)
        if old is not None:
            _unindex(self.on_node, old.node, key)
            _unindex(self.of_job, old.job_id, key)
        if deleted or new.state not in HELD:
            if self.replicas.pop(key, None) is not None:
                self._step("job", new.job_id)
            return
        self.replicas[key] = new
        self.on_node.setdefault(new.node, set()).add(key)
        self.of_job.setdefault(new.job_id, set()).add(key)
        if old is None or _differs(old, new, _RELEVANT[LiveReplica]):
            self._step("job", new.job_id)


def _unindex(index: dict[str, set[str]], at: str, key: str) -> None:
    """Take ``key`` out of ``index[at]``, and ``at`` out of ``index`` once it holds none."""
    keys = index.get(at)
    if keys is not None:
        keys.discard(key)
        if not keys:
            del index[at]


def _recent_successes(s: Session) -> list[Finished]:
    """The ``HISTORY`` most recent successful GPU jobs, oldest first."""
    rows = s.execute(
        select(JobRow.team, JobRow.name, JobRow.gpus, JobRow.attained_gpu_s, JobRow.spec)
        .where(JobRow.state == "succeeded", JobRow.gpus > 0)
        .order_by(JobRow.finished_at.desc())
        .limit(HISTORY)
    ).all()
    return [
        Finished(team, name, gpus, attained / gpus, _limit_of(spec))
        for team, name, gpus, attained, spec in reversed(rows)
    ]


def _limit_of(spec: dict[str, Any] | None) -> float | None:
    """The time limit a job's ``spec`` asked for, in seconds (None: none)."""
    limit = (spec or {}).get("time_limit")
    return float(limit) if isinstance(limit, int | float) and limit > 0 else None


def stage(s: Session, table: type, key: Any, values: dict[str, Any]) -> None:
    """Tell the mirror about a change written past the session's unit of work (a bulk
    update): it lands with the session's commit."""
    s.info.setdefault(CHANGES, []).append((table, key, values, False))


def _staged_flush(s: Session, _context: Any) -> None:
    staged = s.info.setdefault(CHANGES, [])
    for objects, deleted in ((s.new, False), (s.dirty, False), (s.deleted, True)):
        for obj in objects:
            if type(obj) in _TABLES:
                key = inspect(obj).identity
                ident = key[0] if key else _key(obj)
                staged.append((type(obj), ident, _values(obj), deleted))


def _dropped(s: Session) -> None:
    s.info.pop(CHANGES, None)


def _key(obj: Any) -> Any:
    return obj.name if isinstance(obj, NodeRow) else obj.id


_KEPT = ("spec", "inventory", "recovery_hold")  # replaced whole, never changed in place


def _values(obj: Any) -> dict[str, Any]:
    """The loaded column values of an ORM row that its record keeps (deferred, unloaded
    columns left out); lists and dicts copied, so later changes to the row cannot reach the
    mirror. Specs and inventories are kept as they are: they are only ever replaced."""
    loaded = inspect(obj).dict
    names = _FIELDS[_TABLES[type(obj)]]
    out = {}
    for k in names:
        if k in loaded:
            v = loaded[k]
            out[k] = copy.copy(v) if isinstance(v, list | dict) and k not in _KEPT else v
    return out


def _make(cls: type[R], values: Mapping[str, Any]) -> R:
    return cls(**{k: values[k] for k in _FIELDS[cls] if k in values and values[k] is not None})


def _merged(cls: type[R], old: R | None, values: dict[str, Any]) -> R:
    if old is None:
        return _make(cls, values)
    new = copy.copy(old)
    for k in _FIELDS[cls]:
        if k in values:
            setattr(new, k, values[k])
    return new


def _node(row: NodeRow) -> LiveNode:
    return _make(LiveNode, _values(row))


def _same_class(a: str, b: str) -> bool:
    return (a in WAITING and b in WAITING) or (a in HOLDING and b in HOLDING) or a == b


def _placing(health: dict[str, Any] | None) -> tuple[object, object]:
    """What of a node's health placement reads (``scheduling.world``)."""
    return (health or {}).get("degraded"), (health or {}).get("held_by_others")


def _differs(old: Live, new: Live, names: tuple[str, ...]) -> bool:
    """Whether ``old`` and ``new`` differ in any of ``names`` (of a node's health, only its
    ``degraded`` flag and what others hold there, ``held_by_others``, count)."""
    for name in names:
        a, b = getattr(old, name), getattr(new, name)
        if name == "health":
            a, b = (_placing(a), _placing(b))
        if a != b:
            return True
    return False

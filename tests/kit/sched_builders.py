"""Builders for tests of the scheduling loop and the node side without HTTP: a real store on
SQLite, the mirror following its commits, and the real ``Scheduler`` driven one pass at a
time on a fake clock. Nodes register, heartbeat and report by calling the protocol functions
(``control/nodes/agents.py``, ``reports.py``) in a transaction, as the feed would.

Each bench copies a store migrated once per process, so a test pays milliseconds, not the
migrations, for its own store.
"""

from __future__ import annotations

import atexit
import functools
import shutil
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import select
from sqlalchemy.orm import Session

from boltforge.control.auth import Caller
from boltforge.control.jobs.submit import job_rows, next_numbers
from boltforge.control.nodes import agents
from boltforge.control.nodes.agents import LeaseTerms
from boltforge.control.nodes.launch import Launcher, TorchrunLauncher
from boltforge.control.nodes.reports import apply_events
from boltforge.control.notify import Notifier
from boltforge.control.scheduling.actuate import Settings, Touched
from boltforge.control.scheduling.loop import Scheduler
from boltforge.control.scheduling.world import Caches, fleet_of
from boltforge.control.store.db import Database
from boltforge.control.store.mirror import LiveJob, LiveNode, LiveReplica, Mirror
from boltforge.control.store.models import EventRow, JobRow, NodeRow, ReplicaRow
from boltforge.core.health import HealthRules
from boltforge.core.policy import named
from boltforge.core.preempt.victims import PreemptRules
from boltforge.spec.job import JobSpec
from boltforge.spec.resolve import to_gang
from boltforge.wire.agent import (
    GpuActivity,
    Heartbeat,
    Inventory,
    Lease,
    Registration,
    ReplicaEvent,
    ReplicaStatus,
)

T0 = 1_800_000_000.0
USER = Caller("ann", "admin", None, "test")
T = TypeVar("T")


@functools.cache
def _template() -> Path:
    """A store migrated to the newest schema, once per test process."""
    folder = tempfile.mkdtemp(prefix="sched-store-")
    atexit.register(shutil.rmtree, folder, True)
    path = Path(folder) / "template.db"
    db = Database(f"sqlite:///{path}")
    db.migrate()
    db.close()
    return path


def fresh_store(directory: Path) -> Database:
    """A migrated, empty store of its own in ``directory``."""
    path = directory / "store.db"
    shutil.copyfile(_template(), path)
    return Database(f"sqlite:///{path}")


class Clock:
    """Server time that moves only when the test says so."""

    def __init__(self, start: float = T0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class RecordingBackend:
    """A backend that remembers every ``converge`` (the native one only wakes long-polls)."""

    name = "recording"

    def __init__(self) -> None:
        self.launcher: Launcher = TorchrunLauncher()
        self.converged: list[set[str]] = []

    def converge(self, nodes: Iterable[str]) -> None:
        self.converged.append(set(nodes))


def inventory(
    name: str, rack: str = "r0", pod: str = "p0", pool: str = "h100", gpus: int = 8, **extra: Any
) -> Inventory:
    """An 8-GPU H100 host of pool ``h100`` (``extra`` overrides any field)."""
    values: dict[str, Any] = {
        "name": name,
        "pool": pool,
        "gpu": "H100-80GB",
        "gpu_memory_gb": 80.0,
        "gpus": gpus,
        "nvlink_island": 8 if gpus else None,
        "cpus": 64,
        "memory_gb": 512.0,
        "pod": pod,
        "rack": rack,
    }
    values.update(extra)
    return Inventory.model_validate(values)


def running(rep: ReplicaRow, **change: Any) -> ReplicaStatus:
    """What a node says it runs of ``rep`` (``change`` alters it)."""
    values: dict[str, Any] = {
        "replica": rep.id,
        "job": rep.job_id,
        "epoch": rep.epoch,
        "state": "running",
    }
    values.update(change)
    return ReplicaStatus.model_validate(values)


def event(rep: ReplicaRow, kind: str, at: float, **extra: Any) -> ReplicaEvent:
    """A report item about ``rep``."""
    values: dict[str, Any] = {
        "replica": rep.id,
        "job": rep.job_id,
        "epoch": rep.epoch,
        "kind": kind,
        "at": at,
    }
    values.update(extra)
    return ReplicaEvent.model_validate(values)


def activity(index: int, util: float, memory: float) -> GpuActivity:
    return GpuActivity(index=index, util_pct=util, memory_used_mib=memory)


class Bench:
    """A control plane without HTTP or background threads (see the module docstring).
    ``hosts`` 8-GPU nodes register at once, two per rack; ``sessions`` holds each node's
    current lease session."""

    def __init__(
        self,
        directory: Path,
        hosts: int = 2,
        terms: LeaseTerms | None = None,
        recovery_hold_s: float = 60.0,
        full_every_s: float = 10.0,
        health: HealthRules | None = None,
        preempt: PreemptRules | None = None,
        policy: str = "default",
        grouped: bool = False,
    ) -> None:
        self.grouped = grouped  # registrations read ahead, as in the agents' group commit
        self.clock = Clock()
        self.terms = terms or LeaseTerms()
        self.db = fresh_store(directory)
        self.mirror = Mirror()
        self.mirror.watch(self.db.sessions)
        with self.db.session() as s:
            self.mirror.load(s)
        self.notifier = Notifier()
        self.backend = RecordingBackend()
        rules = preempt or PreemptRules(min_runtime_s=0.0, churn_fraction=1.0)
        self.sched = Scheduler(
            self.db,
            named(policy).with_preempt_rules(rules),
            self.notifier,
            Settings(str(directory / "checkpoints")),
            self.terms,
            self.clock,
            tick_s=3600.0,
            full_every_s=full_every_s,
            health=health,
            recovery_hold_s=recovery_hold_s,
            mirror=self.mirror,
            backend=self.backend,
        )
        self.sessions: dict[str, str] = {}
        for i in range(hosts):
            self.register(f"host-{i}", rack=f"r{i // 2}")

    def close(self) -> None:
        self.db.close()

    def __enter__(self) -> Bench:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the store ---------------------------------------------------------------------

    def write(self, change: Callable[[Session], T]) -> T:
        """Run ``change`` in one transaction (committed when it returns)."""
        with self.db.session() as s:
            return change(s)

    def job(self, job_id: str) -> JobRow:
        with self.db.session() as s:
            row = s.get(JobRow, job_id)
            assert row is not None, f"no job {job_id}"
            s.expunge(row)
            return row

    def node(self, name: str) -> NodeRow:
        with self.db.session() as s:
            row = s.get(NodeRow, name)
            assert row is not None, f"no node {name}"
            s.expunge(row)
            return row

    def replicas(self, job_id: str | None = None, state: str | None = None) -> list[ReplicaRow]:
        """Replicas (of ``job_id``, in ``state``), by id."""
        q = select(ReplicaRow).order_by(ReplicaRow.id)
        if job_id is not None:
            q = q.where(ReplicaRow.job_id == job_id)
        if state is not None:
            q = q.where(ReplicaRow.state == state)
        with self.db.session() as s:
            rows = list(s.scalars(q))
            s.expunge_all()
            return rows

    def events(self, job_id: str, kind: str | None = None) -> list[EventRow]:
        q = select(EventRow).where(EventRow.job_id == job_id).order_by(EventRow.id)
        if kind is not None:
            q = q.where(EventRow.kind == kind)
        with self.db.session() as s:
            rows = list(s.scalars(q))
            s.expunge_all()
            return rows

    def mirror_agrees(self) -> None:
        """Assert the mirror holds exactly what a fresh read of the store would."""
        fresh = Mirror()
        with self.db.session() as s:
            fresh.load(s)
        with self.mirror.reading():
            for table in ("nodes", "jobs", "replicas"):
                mine, theirs = getattr(self.mirror, table), getattr(fresh, table)
                assert mine == theirs, f"the mirror's {table} differ from the store's"
            on_node = {n: ids for n, ids in self.mirror.on_node.items() if ids}
            assert on_node == {n: ids for n, ids in fresh.on_node.items() if ids}

    # -- nodes -------------------------------------------------------------------------

    def register(
        self, name: str, running: Iterable[ReplicaStatus] = (), **inv: Any
    ) -> tuple[Lease, Touched]:
        reg = Registration(inventory=inventory(name, **inv), running=list(running))

        def change(s: Session) -> tuple[Lease, Touched]:
            if self.grouped:
                agents.read_ahead(s, [agents.registering(reg.inventory)])
            return agents.register(s, reg, self.terms, self.clock())

        lease, touched = self.write(change)
        self.sessions[name] = lease.session
        return lease, touched

    def beat(self, name: str, **hb: Any) -> tuple[Lease, Touched]:
        """A heartbeat of node ``name`` in its current session (``hb``: the rest of it)."""
        body = Heartbeat.model_validate({"session": self.sessions[name], **hb})
        return self.write(lambda s: agents.heartbeat(s, name, body, self.terms, self.clock()))

    def beat_all(self, but: Iterable[str] = ()) -> None:
        """Every live node but ``but`` heartbeats now."""
        skip = set(but)
        for name in list(self.sessions):
            if name not in skip and self.node(name).state != "dead":
                self.beat(name)

    # -- jobs --------------------------------------------------------------------------

    def submit(self, name: str, gpus: int | None, team: str = "research", **extra: Any) -> str:
        """Store a job as the intake would and wake the loop for its arrival (no pass);
        ``gpus`` None: the spec names none (its roles do)."""
        values: dict[str, Any] = {"name": name, "team": team, "command": ["python", "train.py"]}
        if gpus is not None:
            values["gpus"] = gpus
        spec = JobSpec.model_validate({**values, **extra})
        fleet = fleet_of(self.mirror, Caches())
        gang = to_gang(spec, fleet.tree, "job") if fleet.names else None

        def insert(s: Session) -> str:
            [num] = next_numbers(s, 1)
            [row] = job_rows(spec, None, gang, USER, self.clock(), None, num)
            s.add(JobRow(**row))
            return str(row["id"])

        job_id = self.write(insert)
        self.sched.wake(job_id)
        return job_id

    def place(self, name: str, gpus: int | None, team: str = "research", **extra: Any) -> str:
        """Submit a job and settle."""
        job_id = self.submit(name, gpus, team, **extra)
        self.settle()
        return job_id

    # -- passes and reports ------------------------------------------------------------

    def settle(self, passes: int = 6) -> Touched:
        """Run passes until one changes nothing (as the loop would on its wake-ups),
        checking the mirror against the store after each; returns what they touched."""
        seen = Touched()
        for _ in range(passes):
            touched = self.sched.pass_once()
            self.mirror_agrees()
            seen |= touched
            if not touched.nodes and not touched.jobs:
                break
        return seen

    def report(self, node: str, events: list[ReplicaEvent]) -> tuple[list[str], Touched]:
        """Apply replica events from ``node``; an exit or failure asks the loop for a pass,
        as the feed does (a start does not)."""
        out = self.write(lambda s: apply_events(s, node, events))
        if any(ev.kind != "started" for ev in events):
            self.sched.wake()
        return out

    def start_all(self) -> None:
        """Every replica told to start reports it started, then the loop settles."""
        for rep in self.replicas(state="starting"):
            self.report(rep.node, [event(rep, "started", self.clock(), pid=4242)])
        self.settle()

    def exit_all(self, job_id: str, code: int = 0, checkpoint_s: float | None = None) -> None:
        """Every replica of ``job_id`` still holding GPUs exits with ``code``."""
        for rep in self.replicas(job_id):
            if rep.state in ("starting", "running", "stopping"):
                ev = event(rep, "exited", self.clock(), exit_code=code, checkpoint_s=checkpoint_s)
                self.report(rep.node, [ev])
        self.settle()

    def held_nodes(self, job_id: str) -> set[str]:
        """The nodes where ``job_id`` holds GPUs now."""
        held = ("waiting", "starting", "running", "stopping")
        return {r.node for r in self.replicas(job_id) if r.state in held}


# -- mirrors written by hand, for what a pass reads ---------------------------------------------


def live_node(name: str, rack: str = "r0", **values: Any) -> LiveNode:
    """A registered 8-GPU H100 node as the mirror holds it (``values``: its other fields)."""
    inv = inventory(name, rack=rack).model_dump(mode="json")
    return LiveNode(name=name, inventory=inv, **values)


def live_job(job_id: str, state: str = "pending", gpus: int = 8, **values: Any) -> LiveJob:
    """A live job of team research asking for ``gpus`` GPUs (``spec``: more of its spec);
    a job that has been placed is in its first allocation epoch."""
    spec: dict[str, Any] = {"name": f"j{job_id}", "team": "research", "gpus": gpus}
    spec.update(values.pop("spec", {}))
    base: dict[str, Any] = {
        "num": int(job_id),
        "team": "research",
        "queue": "research",
        "state": state,
        "spec": spec,
        "gpus": gpus,
        "epoch": 0 if state == "pending" else 1,
        "submitted_at": T0 - 100,
    }
    base.update(values)
    return LiveJob(id=job_id, **base)


def live_replica(
    job_id: str, node: str, gpus: list[int], epoch: int = 1, rank: int = 0, **values: Any
) -> LiveReplica:
    """A running replica of ``job_id`` holding ``gpus`` on ``node``."""
    base: dict[str, Any] = {"state": "running", "spec": {"grace_s": 30.0}}
    base.update(values)
    rid = f"{job_id}.{epoch}.{rank}"
    return LiveReplica(id=rid, job_id=job_id, epoch=epoch, rank=rank, node=node, gpus=gpus, **base)


def mirror_of(
    nodes: Iterable[LiveNode], jobs: Iterable[LiveJob] = (), replicas: Iterable[LiveReplica] = ()
) -> Mirror:
    """A mirror holding exactly these records."""
    m = Mirror()
    m.nodes = {n.name: n for n in nodes}
    m.jobs = {j.id: j for j in jobs}
    m.replicas = {r.id: r for r in replicas}
    for r in m.replicas.values():
        m.on_node.setdefault(r.node, set()).add(r.id)
    return m

"""Builders for control-plane tests that run the real server app in-process: a fleet of
stand-in nodes speaking the agent protocol through the API, a fake clock, and job specs.

The server (FastAPI app, store, scheduling loop) is the real one; only the agents are played
by the test, so every step of a scenario is explicit and instant.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, select, text

from boltforge.control.app import create_app
from boltforge.control.runtime import Runtime, ServerConfig
from boltforge.control.scheduling.world import Caches, World, load_world, refresh_world
from boltforge.control.store.invariants import double_allocations
from boltforge.control.store.mirror import Mirror
from boltforge.control.store.models import ReplicaRow
from boltforge.core.model.state import Grant
from boltforge.core.preempt.victims import PreemptRules
from boltforge.testing.postgres import binaries, postgres
from boltforge.wire.agent import DesiredState, ReplicaSpec
from boltforge.wire.jobs import JobDetail

ADMIN = {"Authorization": "Bearer adm"}
AGENT = {"Authorization": "Bearer agt"}


class Clock:
    """Server time that moves only when a test says so."""

    def __init__(self, start: float = 1_800_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def mirror_agrees(rt: Runtime) -> None:
    """Assert that ``rt``'s mirror holds exactly what a fresh read of its store would."""
    fresh = Mirror()
    with rt.db.session() as s:
        fresh.load(s)
    with rt.mirror.reading():
        for table in ("nodes", "jobs", "replicas"):
            mine, theirs = getattr(rt.mirror, table), getattr(fresh, table)
            assert mine == theirs, f"the mirror's {table} differ from the store's"


def world_agrees(rt: Runtime) -> None:
    """Assert that the world the scheduler keeps current by the mirror's changes
    (``refresh_world``), brought up to date now, holds what a whole read of the mirror
    would: every allocation and its grants, the free GPUs, who runs, the recovery holds, the
    rendezvous ports, the cordoned and degraded hosts and the holdings per queue."""
    sched = rt.scheduler
    with sched.lock:
        live = sched._world
        if live is None:
            return
        live.now = rt.clock()
        if live.now >= live.stale_at:
            sched._world = None
            return
        hold = sched.recovery_hold_s
        if sched._world_version != rt.mirror.version:
            version = refresh_world(live, rt.mirror, sched.caches, sched._world_version, hold)
            if version is None:  # it reads the world whole then: nothing to compare
                sched._world = None
                return
            sched._world_version = version
        whole = load_world(rt.mirror, live.now, Caches(), hold_s=hold)
        mine, theirs = _held(live), _held(whole)
        differ = [k for k in mine if mine[k] != theirs[k]]
        shown = [(k, mine[k], theirs[k]) for k in differ]
        assert not differ, f"the world kept current differs from a whole read: {shown}"


def _held(world: World) -> dict[str, Any]:
    state = world.state
    return {
        "allocations": {k: _grants(a.grants) for k, a in state.allocations.items()},
        "free": state.free.tolist(),
        "running": sorted(r.job.id for r in world.running),
        "holds": sorted(world.holds),
        "ports": {addr: sorted(p) for addr, p in world.ports.items() if p},
        "cordoned": state.cordoned.tolist(),
        "degraded": state.degraded.tolist(),
        "holdings": {
            q: {pool: n for pool, n in pools.items() if n}
            for q, pools in world.holdings().items()
            if any(pools.values())
        },
    }


def _grants(grants: tuple[Grant, ...]) -> list[tuple[object, ...]]:
    """What a grant holds (a bind numbers replicas within their role, a read by rank)."""
    held = [
        (g.role, g.host, g.gpus, float(g.cpus), float(g.memory_gb), float(g.storage_gb), g.share)
        for g in grants
    ]
    return sorted(held, key=repr)


def make_spec(name: str, gpus: int, team: str = "research", **extra: Any) -> dict[str, Any]:
    """A runnable job spec: ``gpus`` GPUs (8 per replica when more than 8)."""
    spec: dict[str, Any] = {
        "name": name,
        "team": team,
        "gpus": gpus,
        "command": ["python", "train.py"],
    }
    spec.update(extra)
    return spec


@dataclass
class Node:
    """A stand-in agent: registers, heartbeats and reports what the test tells it to."""

    fleet: Fleet
    name: str
    rack: str
    gpus: int = 8
    session: str = ""
    started: set[str] = field(default_factory=set)

    def inventory(self) -> dict[str, Any]:
        """What the node registers with: an 8-GPU H100 host of pool ``h100``."""
        return {
            "name": self.name,
            "pool": "h100",
            "gpu": "H100-80GB",
            "gpu_memory_gb": 80,
            "gpus": self.gpus,
            "nvlink_island": 8,
            "cpus": 64,
            "memory_gb": 512,
            "pod": "p0",
            "rack": self.rack,
        }

    def register(self, running: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        body = {"inventory": self.inventory(), "running": running or []}
        lease: dict[str, Any] = self.fleet.post("/v1/agents/register", body, AGENT).json()
        self.session = lease["session"]
        return lease

    def heartbeat(self, gpus: list[dict[str, Any]] | None = None) -> int:
        """Renew the lease; ``gpus``: the GPU activity NVML would have sampled."""
        body: dict[str, Any] = {"session": self.session}
        if gpus is not None:
            body["gpus"] = gpus
        r = self.fleet.http.post(f"/v1/agents/{self.name}/heartbeat", json=body, headers=AGENT)
        return int(r.status_code)

    def desired(self) -> DesiredState:
        r = self.fleet.http.get(f"/v1/agents/{self.name}/desired", headers=AGENT)
        return DesiredState.model_validate(r.json())

    def to_run(self) -> list[ReplicaSpec]:
        return [r for r in self.desired().replicas if r.action == "run"]

    def to_stop(self) -> list[ReplicaSpec]:
        return [r for r in self.desired().replicas if r.action == "stop"]

    def report(self, **body: Any) -> dict[str, Any]:
        r = self.fleet.http.post(
            f"/v1/agents/{self.name}/report",
            json={"session": self.session, **body},
            headers=AGENT,
        )
        out: dict[str, Any] = r.json()
        return out

    def start(self, rep: ReplicaSpec) -> None:
        ev = {
            "replica": rep.replica,
            "job": rep.job,
            "epoch": rep.epoch,
            "kind": "started",
            "at": self.fleet.clock(),
            "pid": 4242,
        }
        self.report(events=[ev])
        self.started.add(rep.replica)

    def exit(self, rep: ReplicaSpec, code: int = 0, checkpoint_s: float | None = None) -> None:
        ev = {
            "replica": rep.replica,
            "job": rep.job,
            "epoch": rep.epoch,
            "kind": "exited",
            "at": self.fleet.clock(),
            "exit_code": code,
            "checkpoint_s": checkpoint_s,
        }
        self.report(events=[ev])


class Fleet:
    """The real server app on SQLite (or ``db_url``), with ``hosts`` stand-in 8-GPU nodes,
    two per rack. Use as a context manager."""

    def __init__(self, tmp: Path, hosts: int = 4, db_url: str | None = None, **config: Any):
        self.clock = Clock()
        rules = config.pop("preempt", PreemptRules(min_runtime_s=0.0, churn_fraction=1.0))
        self.config = ServerConfig(
            db_url=db_url or f"sqlite:///{tmp / 'store.db'}",
            checkpoint_root=str(tmp / "checkpoints"),
            admin_token="adm",
            agent_token="agt",
            preempt=rules,
            tick_s=3600.0,
            **{"overlap": False, **config},
        )
        self.app = create_app(self.config, self.clock)
        self.http = TestClient(self.app)
        self.nodes = {f"host-{i}": Node(self, f"host-{i}", f"r{i // 2}") for i in range(hosts)}
        self._gate = threading.Event()
        self._gate.set()

    def __enter__(self) -> Fleet:
        self.http.__enter__()
        for node in self.nodes.values():
            node.register()
        self.settle()
        return self

    def _gated(self, pass_once: Callable[..., Any]) -> Callable[..., Any]:
        """``pass_once`` that first waits while ``loop_held`` holds passes back (30 s at
        most, so a mistake shows as a slow test rather than a hang)."""

        def gated(*args: Any, **kwargs: Any) -> Any:
            self._gate.wait(30.0)
            return pass_once(*args, **kwargs)

        return gated

    @contextlib.contextmanager
    def loop_held(self) -> Iterator[None]:
        """No pass starts inside the block: reports sent one node at a time (a gang's exits)
        reach the server before any pass reads them, as one agent batch would."""
        scheduler = self.rt.scheduler
        if "pass_once" not in vars(scheduler):  # the server's loop passes through the gate
            scheduler.pass_once = self._gated(scheduler.pass_once)  # type: ignore[method-assign]
        self._gate.clear()
        try:
            yield
        finally:
            self._gate.set()

    def __exit__(self, *exc: object) -> None:
        self.http.__exit__(*exc)

    @property
    def rt(self) -> Runtime:
        rt: Runtime = self.app.state.runtime
        return rt

    def post(self, path: str, body: dict[str, Any], headers: dict[str, str] = ADMIN) -> Any:
        return self.http.post(path, json=body, headers=headers)

    def submit(self, spec: dict[str, Any], headers: dict[str, str] = ADMIN, **req: Any) -> str:
        r = self.post("/v1/jobs", {"spec": spec, **req}, headers)
        assert r.status_code in (200, 201), r.text
        self.settle()
        job_id: str = r.json()["job"]["id"]
        return job_id

    def settle(self) -> None:
        """Run scheduling passes until nothing changes (as the loop would on its wake-ups).
        Every scenario checks on the way that the in-memory world the passes read is the
        store's live part exactly (``mirror_agrees``), and that the world kept current by
        its changes is what a whole read would give (``world_agrees``)."""
        scheduler = self.rt.scheduler
        for _ in range(5):
            touched = scheduler.pass_once()  # it wakes the nodes it touched
            if touched.nodes or touched.jobs:
                continue
            # The server's own loop may have taken the work asked for before this pass did:
            # wait for its pass to end, then stop only if nothing is asked for still.
            deadline = time.monotonic() + 30.0
            while scheduler.passing() and time.monotonic() < deadline:
                time.sleep(0.005)
            if scheduler.wanted() == (0, False):
                break
        mirror_agrees(self.rt)
        world_agrees(self.rt)

    def job(self, job_id: str, headers: dict[str, str] = ADMIN) -> JobDetail:
        r = self.http.get(f"/v1/jobs/{job_id}", headers=headers)
        assert r.status_code == 200, r.text
        return JobDetail.model_validate(r.json())

    def start_everything(self) -> None:
        """Every node starts whatever it was told to run and has not started yet."""
        for node in self.nodes.values():
            for rep in node.to_run():
                if rep.replica not in node.started:
                    node.start(rep)
        self.settle()

    def stop_everything(self, checkpoint_s: float = 2.0) -> list[str]:
        """Every replica told to stop checkpoints and exits; returns their ids."""
        stopped = []
        with self.loop_held():
            for node in self.nodes.values():
                for rep in node.to_stop():
                    node.exit(rep, 0, checkpoint_s)
                    stopped.append(rep.replica)
        self.settle()
        return stopped

    def finish(self, job_id: str, code: int = 0) -> None:
        """Every running replica of ``job_id`` exits with ``code``, all before the next pass."""
        with self.loop_held():
            for node in self.nodes.values():
                for rep in node.to_run():
                    if rep.job == job_id:
                        node.exit(rep, code)
        self.settle()

    def replicas(self) -> list[ReplicaRow]:
        with self.rt.db.session() as s:
            return list(s.scalars(select(ReplicaRow)))

    def no_gpu_held_twice(self) -> None:
        """No GPU was ever held by two allocations at once."""
        with self.rt.db.session() as s:
            assert double_allocations(s) == []


# --- the nodes at work, on the fake clock ---------------------------------------------------


def running(fleet: Fleet) -> list[tuple[str, ReplicaSpec]]:
    return [(name, rep) for name, node in fleet.nodes.items() for rep in node.to_run()]


def report_steps(fleet: Fleet, job: str, step_times: dict[int, float], steps: int = 12) -> None:
    """Every running replica of ``job`` reports ``steps`` steps of its rank's step time."""
    for name, rep in running(fleet):
        if rep.job != job:
            continue
        rank = int(rep.env["RANK"])
        items: list[dict[str, Any]] = [
            {
                "replica": rep.replica,
                "job": job,
                "epoch": rep.epoch,
                "rank": rank,
                "step": i + 1,
                "at": fleet.clock(),
                "step_time_s": step_times[rank],
            }
            for i in range(steps)
        ]
        fleet.nodes[name].report(progress=items)


def later(fleet: Fleet, seconds: float) -> None:
    """Let ``seconds`` pass in steps of at most 5 s, the nodes heartbeating at each."""
    while seconds > 0:
        step = min(seconds, 5.0)
        fleet.clock.advance(step)
        seconds -= step
        for node in fleet.nodes.values():
            node.heartbeat()
        fleet.settle()


def wait_for(check: Any, timeout: float = 10.0) -> None:
    """Poll ``check()`` until it is true (for what the background loop does on its own)."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.02)


def require_postgres() -> bool:
    """Whether PostgreSQL tests must run (CI sets BOLT_REQUIRE_POSTGRES=1) rather than skip."""
    return os.environ.get("BOLT_REQUIRE_POSTGRES") == "1"


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[str]:
    """One real PostgreSQL server for the session (skipped where it is not installed, unless
    CI requires it)."""
    if binaries() is None:
        if require_postgres():
            raise RuntimeError("PostgreSQL is required here. To fix: apt-get install postgresql")
        pytest.skip("PostgreSQL is not installed (apt-get install postgresql)")
    with postgres() as url:
        yield url


def fresh_database(server_url: str) -> str:
    """A new, empty database on the server; its URL."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    engine = create_engine(server_url, isolation_level="AUTOCOMMIT")
    with engine.connect() as c:
        c.execute(text(f'CREATE DATABASE "{name}"'))
    engine.dispose()
    return server_url.rsplit("/", 1)[0] + f"/{name}"


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The store every control-plane scenario runs against: SQLite, then real PostgreSQL."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'store.db'}"
    return fresh_database(request.getfixturevalue("postgres_server"))

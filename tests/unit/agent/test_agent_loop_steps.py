"""The agent loop one step at a time, against a stand-in control plane that answers inside
the test's event loop: registering through a server that is not ready, what heartbeats carry
and what their answers make the agent do, following the desired state as it changes (start,
new epoch, stop with its grace, replicas not listed, GPUs still held), fencing when the lease
ran out, and what happens to reports and artifacts the server refuses."""

from __future__ import annotations

import asyncio
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any, TypeVar

import httpx
import pytest

from boltforge import __version__
from boltforge.agent import loop as loop_module
from boltforge.agent.activity import MIB
from boltforge.agent.client import Backoff, Refused, ServerClient, StoreAway
from boltforge.agent.loop import EXIT_OK, EXIT_REFUSED, Agent, _exit_code
from boltforge.agent.preflight import NodeHooks, Preflight
from boltforge.agent.processes import replica_paths
from boltforge.wire.agent import (
    AgentReport,
    DesiredState,
    Heartbeat,
    Inventory,
    Lease,
    Registration,
    ReplicaEvent,
    ReplicaSpec,
)

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="replicas are Linux processes")

T = TypeVar("T")
NODE = "host-0"
INVENTORY = Inventory(name=NODE, gpu="H100-80GB", gpus=8, gpu_memory_gb=80)

SLEEPS = "import time; print('ready', flush=True); time.sleep(30)"

CHECKPOINTS_ON_TERM = """
import signal, sys, time
def on_term(signum, frame):
    time.sleep(0.2)
    print("checkpoint saved", flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
print("ready", flush=True)
time.sleep(30)
"""

IGNORES_TERM = """
import signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("ready", flush=True)
time.sleep(30)
"""


class Plane:
    """The agent endpoints, answered from memory inside the event loop. ``fail`` lists, per
    endpoint (register, heartbeat, desired, report, artifacts), statuses to answer with
    before answering properly; ``stop`` goes into the next lease."""

    def __init__(self, lease_s: float = 30.0, heartbeat_s: float = 5.0) -> None:
        self.lease_s, self.heartbeat_s = lease_s, heartbeat_s
        self.version = 0
        self.replicas: list[ReplicaSpec] = []
        self.session: str | None = None
        self.sessions = 0
        self.stop: list[str] = []
        self.fail: dict[str, list[int]] = {}
        self.refuse_items: list[str] = []
        self.registrations: list[Registration] = []
        self.heartbeats: list[Heartbeat] = []
        self.polls: list[int] = []
        self.reports: list[AgentReport] = []
        self.uploads: list[tuple[str, str, str, bytes]] = []
        self.while_beating: Callable[[], None] = lambda: None

    def set_desired(self, *replicas: ReplicaSpec) -> int:
        self.version += 1
        self.replicas = list(replicas)
        return self.version

    def events(self, kind: str | None = None) -> list[ReplicaEvent]:
        return [e for r in self.reports for e in r.events if kind in (None, e.kind)]

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        parts = request.url.path.strip("/").split("/")
        what = parts[2] if parts[2] in ("register", "desired") else parts[3]
        if self.fail.get(what):
            status = self.fail[what].pop(0)
            return reply(status, {"error": f"answered {status}", "problems": []})
        body = await request.aread()
        if what == "register":
            self.registrations.append(Registration.model_validate_json(body))
            self.sessions += 1
            self.session = f"s-{self.sessions}"
            return reply(200, self.lease())
        if what == "heartbeat":
            beat = Heartbeat.model_validate_json(body)
            if beat.session != self.session:
                return reply(409, {"error": "unknown session", "problems": []})
            self.heartbeats.append(beat)
            self.while_beating()
            return reply(200, self.lease())
        if what == "desired":
            since = int(request.url.params["since"])
            self.polls.append(since)
            deadline = time.monotonic() + float(request.url.params["wait"])
            while self.version <= since and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            state = DesiredState(node=NODE, version=self.version, replicas=self.replicas)
            return reply(200, state.model_dump(mode="json"))
        if what == "report":
            report = AgentReport.model_validate_json(body)
            if report.session != self.session:
                return reply(409, {"error": "unknown session", "problems": []})
            self.reports.append(report)
            return reply(200, {"refused": self.refuse_items})
        replica, name = parts[4], "/".join(parts[5:])
        self.uploads.append((replica, name, request.headers["x-sha256"], body))
        return reply(201, {})

    def lease(self) -> dict[str, Any]:
        stop, self.stop = self.stop, []
        assert self.session is not None
        return Lease(
            node=NODE,
            session=self.session,
            lease_s=self.lease_s,
            heartbeat_s=self.heartbeat_s,
            stop=stop,
            desired_version=self.version,
        ).model_dump(mode="json")


def reply(status: int, body: Any) -> httpx.Response:
    return httpx.Response(status, json=body)


def agent_for(plane: Plane, work: Path, **kw: Any) -> Agent:
    client = ServerClient(
        "http://plane", "tok", timeout_s=2.0, transport=httpx.MockTransport(plane)
    )
    return Agent(client, INVENTORY, work, poll_wait_s=0.2, tick_s=0.01, max_backoff_s=0.01, **kw)


def spec(code: str = SLEEPS, name: str = "j/w0", epoch: int = 1, **fields: Any) -> ReplicaSpec:
    base: dict[str, Any] = {"job": "j", "action": "run", "command": [sys.executable, "-c", code]}
    return ReplicaSpec(replica=name, epoch=epoch, **{**base, **fields})


def run(make: Callable[[], Awaitable[T]]) -> T:
    async def bounded() -> T:
        return await asyncio.wait_for(make(), 30)

    return asyncio.run(bounded())


async def until(check: Callable[[], T], timeout: float = 15.0) -> T:
    deadline = time.monotonic() + timeout
    while not (got := check()):
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.01)
    return got


def outbox_events(agent: Agent, kind: str | None = None) -> list[ReplicaEvent]:
    return [e for e in agent.outbox.events if kind in (None, e.kind)]


async def ready(agent: Agent, one: ReplicaSpec) -> None:
    log = replica_paths(agent.runtime.work_dir, one).log
    await until(lambda: log.exists() and "ready" in log.read_text())


async def exit_of(agent: Agent, name: str, epoch: int = 1) -> ReplicaEvent:
    def found() -> list[ReplicaEvent]:
        return [e for e in outbox_events(agent, "exited") if (e.replica, e.epoch) == (name, epoch)]

    [event] = await until(found)
    return event


async def end(agent: Agent) -> None:
    """Kill whatever the test left running and wait for it."""
    agent.runtime.stop_all(0)
    await agent.runtime.wait_all(5.0)
    agent.runtime.cancel_tasks()
    await agent.client.aclose()


async def background(work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
    task = asyncio.create_task(work)
    await asyncio.sleep(0)
    return task


async def cancel(task: asyncio.Task[None]) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


@pytest.fixture(autouse=True)
def quick_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    """Retries come at once: the tests count them, not how long they wait."""
    monkeypatch.setattr(loop_module, "Backoff", lambda max_s: Backoff(first_s=0.001, max_s=0.002))


# --- registering ------------------------------------------------------------------------------


def test_the_agent_registers_through_a_server_that_is_not_ready_yet(tmp_path: Path) -> None:
    plane = Plane()
    plane.fail["register"] = [503, 500, 429]
    agent = agent_for(plane, tmp_path)

    async def go() -> None:
        session = await agent._register()
        assert agent.session is session and session.node == NODE and session.id == "s-1"
        await agent.client.aclose()

    run(go)
    assert len(plane.registrations) == 1  # the three unanswered ones never arrived
    assert plane.fail["register"] == []
    [body] = plane.registrations
    assert body.inventory == INVENTORY and body.agent_version == __version__


def test_a_refused_registration_ends_the_agent_with_exit_2(tmp_path: Path) -> None:
    plane = Plane()
    plane.fail["register"] = [401]
    agent = agent_for(plane, tmp_path)
    assert run(agent.run) == EXIT_REFUSED
    assert plane.registrations == [] and plane.fail["register"] == []  # never tried again


def test_registration_lists_what_runs_and_exits_the_server_has_not_heard_of(
    tmp_path: Path,
) -> None:
    plane = Plane()
    agent = agent_for(plane, tmp_path)
    gone = ReplicaEvent(replica="j/w9", job="j", epoch=4, kind="failed", at=1.0)

    async def go() -> int | None:
        await agent.runtime.start(spec())
        agent.outbox.add_event(gone)
        await agent._register()
        pid = agent.runtime.live["j/w0"].pid
        await end(agent)
        return pid

    pid = run(go)
    [body] = plane.registrations
    running = [(r.replica, r.epoch, r.state, r.pid) for r in body.running]
    assert running == [("j/w0", 1, "running", pid), ("j/w9", 4, "exited", None)]


@pytest.mark.parametrize(
    ("since", "server_version", "asks_from"),
    [
        pytest.param(10, 3, 2, id="a server that restarted behind the agent"),
        pytest.param(10, 0, 0, id="a server with no desired state yet"),
        pytest.param(2, 9, 2, id="a server ahead: the agent catches up by polling"),
    ],
)
def test_after_registering_the_agent_asks_from_a_version_the_server_has(
    tmp_path: Path, since: int, server_version: int, asks_from: int
) -> None:
    plane = Plane()
    plane.version = server_version
    agent = agent_for(plane, tmp_path)
    agent.since = since

    async def go() -> None:
        await agent._register()
        await agent.client.aclose()

    run(go)
    assert agent.since == asks_from


def test_the_lease_is_noted_in_the_launch_record_while_replicas_run(tmp_path: Path) -> None:
    plane = Plane(lease_s=40.0)
    agent = agent_for(plane, tmp_path)

    async def go() -> float | None:
        await agent.runtime.start(spec())
        before = time.time()
        await agent._register()
        saved = agent.runtime.record.read().lease_until
        await end(agent)
        assert saved is not None and before + 35 < saved <= time.time() + 40
        return saved

    assert run(go) is not None


# --- heartbeats -------------------------------------------------------------------------------


def test_a_lost_session_makes_the_agent_register_again(tmp_path: Path) -> None:
    plane = Plane()
    agent = agent_for(plane, tmp_path)

    async def go() -> None:
        session = await agent._register()
        assert await agent._heartbeat(session)
        plane.session = "someone-else"
        assert not await agent._heartbeat(session)
        assert agent.session is None and not agent._registered.is_set()
        again = await agent._register()
        assert again.id == "s-2" and await agent._heartbeat(again)
        await agent.client.aclose()

    run(go)
    assert [h.session for h in plane.heartbeats] == ["s-1", "s-2"]


def test_an_unanswered_heartbeat_keeps_the_session(tmp_path: Path) -> None:
    plane = Plane()
    plane.fail["heartbeat"] = [500]
    agent = agent_for(plane, tmp_path)

    async def go() -> None:
        session = await agent._register()
        renewed = agent.lease.renewed_at
        assert await agent._heartbeat(session)  # sleep, then try again
        assert agent.session is session and agent.lease.renewed_at == renewed
        await agent.client.aclose()

    run(go)


def test_a_late_answer_for_a_replaced_session_renews_nothing(tmp_path: Path) -> None:
    plane = Plane()
    agent = agent_for(plane, tmp_path)

    async def go() -> None:
        old = await agent._register()
        renewed = agent.lease.renewed_at
        newer = replace(old, id="s-newer")
        plane.while_beating = lambda: setattr(agent, "session", newer)
        assert not await agent._heartbeat(old)  # answered, but for the session replaced
        assert agent.session is newer and agent.lease.renewed_at == renewed
        await agent.client.aclose()

    run(go)


def test_a_lease_that_names_a_replica_stops_it_at_the_servers_word(tmp_path: Path) -> None:
    plane = Plane()
    agent = agent_for(plane, tmp_path)
    one = spec(CHECKPOINTS_ON_TERM, grace_s=10.0)

    async def go() -> ReplicaEvent:
        session = await agent._register()
        await agent.runtime.start(one)
        await ready(agent, one)
        plane.stop = ["j/w0", "j/unknown"]
        assert await agent._heartbeat(session)
        assert [s.state for s in agent.runtime.statuses()] == ["stopping"]
        event = await exit_of(agent, "j/w0")
        await end(agent)
        return event

    event = run(go)
    assert event.exit_code == 0 and not event.by_node and event.checkpoint_s is not None


def test_a_heartbeat_says_what_runs_each_gpus_activity_and_whether_the_agent_leaves(
    tmp_path: Path,
) -> None:
    nvml = SimpleNamespace(
        NVMLError=RuntimeError,
        nvmlInit=lambda: None,
        nvmlShutdown=lambda: None,
        nvmlDeviceGetCount=lambda: 2,
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetUtilizationRates=lambda h: SimpleNamespace(gpu=[90, 0][h]),
        nvmlDeviceGetMemoryInfo=lambda h: SimpleNamespace(used=[2048, 0][h] * MIB),
    )
    plane = Plane()
    inventory = INVENTORY.model_copy(update={"gpus": 2, "source": "nvml"})
    client = ServerClient("http://plane", "t", transport=httpx.MockTransport(plane))
    agent = Agent(client, inventory, tmp_path, tick_s=0.01)
    agent.runtime.preflight = Preflight(inventory, NodeHooks(), load=lambda: nvml)

    async def go() -> None:
        session = await agent._register()
        await agent.runtime.start(spec())
        await agent._heartbeat(session)
        agent._closing = True
        await agent._heartbeat(session)
        await end(agent)

    run(go)
    first, last = plane.heartbeats
    assert [(g.index, g.util_pct, g.memory_used_mib) for g in first.gpus] == [
        (0, 90.0, 2048.0),
        (1, 0.0, 0.0),
    ]
    assert [(r.replica, r.state) for r in first.running] == [("j/w0", "running")]
    assert (first.leaving, last.leaving) == (False, True)


def test_a_declared_node_sends_no_gpu_activity(tmp_path: Path) -> None:
    plane = Plane()
    agent = agent_for(plane, tmp_path)

    async def go() -> None:
        await agent._heartbeat(await agent._register())
        await agent.client.aclose()

    run(go)
    assert plane.heartbeats[0].gpus == []


# --- the desired state ------------------------------------------------------------------------


def test_each_new_desired_state_is_taken_and_the_next_poll_asks_past_it(tmp_path: Path) -> None:
    plane = Plane()
    agent = agent_for(plane, tmp_path)
    one = spec(action="stop")

    async def go() -> None:
        await agent._register()
        agent._wake.clear()
        poller = await background(agent._poll_desired())
        version = plane.set_desired(one)
        await until(lambda: agent.since == version)
        assert agent.desired == [one] and agent._wake.is_set()
        await until(lambda: version in plane.polls)
        await cancel(poller)
        await agent.client.aclose()

    run(go)
    assert plane.polls[0] == 0 and plane.polls[-1] == 1


@pytest.mark.parametrize(
    ("status", "registers_again"),
    [
        pytest.param(404, True, id="unknown node: register again"),
        pytest.param(409, True, id="unknown session: register again"),
        pytest.param(422, False, id="another refusal: keep the session"),
        pytest.param(500, False, id="no answer: keep the session"),
    ],
)
def test_a_failed_poll_drops_the_session_only_when_the_server_forgot_the_node(
    tmp_path: Path, status: int, registers_again: bool
) -> None:
    plane = Plane()
    plane.fail["desired"] = [status]
    agent = agent_for(plane, tmp_path)

    async def go() -> bool:
        session = await agent._register()
        poller = await background(agent._poll_desired())
        if registers_again:
            await until(lambda: agent.session is None)
        else:
            await until(lambda: plane.polls)  # polled again, after the failure
        kept = agent.session is session
        await cancel(poller)
        await agent.client.aclose()
        return kept

    assert run(go) is not registers_again


# --- converging on the desired state (real processes) -----------------------------------------


def test_what_is_desired_starts_once_and_a_stop_never_run_here_is_skipped(tmp_path: Path) -> None:
    plane = Plane()
    agent = agent_for(plane, tmp_path)
    runs, never = spec(gpus=[0]), spec(name="j/w1", action="stop", gpus=[1])

    async def go() -> None:
        await agent._register()
        agent.desired = [runs, never]
        await agent._converge()
        await agent._converge()  # nothing changed: nothing more happens
        assert set(agent.runtime.live) == {"j/w0"}
        await end(agent)

    run(go)
    started = outbox_events(agent, "started")
    assert [e.replica for e in started] == ["j/w0"]
    [skipped] = [e for e in outbox_events(agent, "exited") if e.replica == "j/w1"]
    assert skipped.detail == "stopped before it started" and skipped.pid is None


def test_a_new_epoch_stops_the_old_replica_and_starts_once_it_exited(tmp_path: Path) -> None:
    plane = Plane()
    agent = agent_for(plane, tmp_path)
    old, new = spec(CHECKPOINTS_ON_TERM, epoch=1), spec(SLEEPS, epoch=2)

    async def go() -> ReplicaEvent:
        await agent._register()
        agent.desired = [old]
        await agent._converge()
        await ready(agent, old)
        agent.desired = [new]
        await agent._converge()
        assert [(s.epoch, s.state) for s in agent.runtime.statuses()] == [(1, "stopping")]
        ended = await exit_of(agent, "j/w0", epoch=1)
        assert agent._wake.is_set()  # the exit wakes the converger
        await agent._converge()
        assert [(s.epoch, s.state) for s in agent.runtime.statuses()] == [(2, "running")]
        await end(agent)
        return ended

    ended = run(go)
    assert ended.exit_code == 0 and ended.checkpoint_s is not None and not ended.by_node
    assert [(e.kind, e.epoch) for e in outbox_events(agent) if e.kind == "started"] == [
        ("started", 1),
        ("started", 2),
    ]


def test_a_stop_with_its_own_grace_kills_a_replica_that_ignores_the_signal(
    tmp_path: Path,
) -> None:
    plane = Plane()
    agent = agent_for(plane, tmp_path)
    one = spec(IGNORES_TERM, grace_s=60.0)

    async def go() -> ReplicaEvent:
        await agent._register()
        agent.desired = [one]
        await agent._converge()
        await ready(agent, one)
        agent.desired = [one.model_copy(update={"action": "stop", "grace_s": 0.2})]
        await agent._converge()
        event = await exit_of(agent, "j/w0")
        await end(agent)
        return event

    event = run(go)
    assert event.signal == signal.SIGKILL and event.exit_code is None
    assert event.checkpoint_s is not None and 0.2 <= event.checkpoint_s < 10


def test_a_replica_the_desired_state_no_longer_lists_is_stopped(tmp_path: Path) -> None:
    plane = Plane()
    agent = agent_for(plane, tmp_path)
    one = spec(CHECKPOINTS_ON_TERM)

    async def go() -> ReplicaEvent:
        await agent._register()
        agent.desired = [one]
        await agent._converge()
        await ready(agent, one)
        agent.desired = []
        await agent._converge()
        event = await exit_of(agent, "j/w0")
        await agent._converge()  # its epoch has run: never started again
        await end(agent)
        return event

    event = run(go)
    assert event.exit_code == 0 and not event.by_node
    assert len(outbox_events(agent, "started")) == 1


def test_a_replica_waits_for_gpus_a_stopping_replica_still_holds(tmp_path: Path) -> None:
    plane = Plane()
    agent = agent_for(plane, tmp_path)
    leaving = spec(CHECKPOINTS_ON_TERM, name="old/w0", gpus=[0, 1])
    coming = spec(SLEEPS, name="new/w0", gpus=[1, 2])

    async def go() -> None:
        await agent._register()
        agent.desired = [leaving]
        await agent._converge()
        await ready(agent, leaving)
        agent.desired = [coming]
        await agent._converge()
        assert set(agent.runtime.live) == {"old/w0"}  # GPU 1 is not free yet
        await exit_of(agent, "old/w0")
        await agent._converge()
        assert set(agent.runtime.live) == {"new/w0"}
        await end(agent)

    run(go)
    kinds = [(e.replica, e.kind) for e in outbox_events(agent) if e.replica in ("old/w0", "new/w0")]
    assert kinds.index(("old/w0", "exited")) < kinds.index(("new/w0", "started"))


def test_a_replica_launched_while_the_lease_ran_out_is_stopped_at_once(tmp_path: Path) -> None:
    plane = Plane()
    agent = agent_for(plane, tmp_path)
    one, other = spec(SLEEPS, gpus=[0]), spec(name="j/w1", gpus=[1])
    launch = agent.runtime.start

    async def fenced_during_launch(started: ReplicaSpec) -> None:
        agent._fence(late=False)  # the monitor fences while the launch is under way
        assert agent.runtime.live == {}  # so the fence itself stops nothing
        await launch(started)

    async def go() -> ReplicaEvent:
        await agent._register()
        agent.runtime.start = fenced_during_launch  # type: ignore[method-assign,assignment]
        agent.desired = [one, other]
        await agent._converge()
        assert set(agent.runtime.live) == {"j/w0"}  # nothing more starts once fenced
        assert [s.state for s in agent.runtime.statuses()] == ["stopping"]
        event = await exit_of(agent, "j/w0")
        await end(agent)
        return event

    event = run(go)
    assert event.by_node and event.signal == signal.SIGTERM


@pytest.mark.parametrize("why", ["no session", "fenced", "closing", "no desired state yet"])
def test_nothing_starts_without_a_session_while_fenced_or_closing(tmp_path: Path, why: str) -> None:
    plane = Plane()
    agent = agent_for(plane, tmp_path)

    async def go() -> None:
        await agent._register()
        agent.desired = [spec()]
        if why == "no session":
            agent.session = None
        elif why == "fenced":
            agent._fenced = True
        elif why == "closing":
            agent._closing = True
        else:
            agent.desired = None
        await agent._converge()
        await end(agent)

    run(go)
    assert agent.runtime.live == {} and len(agent.outbox) == 0


# --- fencing ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overdue_s", "killed"),
    [
        pytest.param(0.05, False, id="noticed in time: checkpoint signal and grace"),
        pytest.param(30.0, True, id="noticed late: killed without a checkpoint"),
    ],
)
def test_a_lease_that_ran_out_stops_every_replica_and_drops_the_session(
    tmp_path: Path, overdue_s: float, killed: bool
) -> None:
    plane = Plane(lease_s=5.0)
    agent = agent_for(plane, tmp_path)
    one = spec(CHECKPOINTS_ON_TERM, grace_s=20.0)

    async def go() -> ReplicaEvent:
        await agent._register()
        await agent.runtime.start(one)
        await ready(agent, one)
        agent.lease.renewed_at = time.monotonic() - agent.lease.lease_s - overdue_s
        monitor = await background(agent._monitor())
        event = await exit_of(agent, "j/w0")
        assert agent._fenced and agent.session is None
        await cancel(monitor)
        await end(agent)
        return event

    event = run(go)
    assert event.by_node
    if killed:
        assert event.signal == signal.SIGKILL and event.exit_code is None
    else:
        assert event.exit_code == 0 and event.signal is None
        assert event.checkpoint_s is not None and event.checkpoint_s >= 0.2


# --- reports and artifacts --------------------------------------------------------------------


def started(replica: str = "j/w0") -> ReplicaEvent:
    return ReplicaEvent(replica=replica, job="j", epoch=1, kind="started", at=1.0, pid=7)


@pytest.mark.parametrize(
    ("status", "sent", "kept", "session_kept"),
    [
        pytest.param(None, True, False, True, id="taken"),
        pytest.param(409, False, True, False, id="session lost: kept for the next session"),
        pytest.param(422, True, False, True, id="refused for good: dropped"),
        pytest.param(500, False, True, True, id="not answered: kept for the retry"),
        pytest.param(429, False, True, True, id="shed: kept for the retry"),
    ],
)
def test_what_happens_to_a_report_depends_on_the_answer(
    tmp_path: Path, status: int | None, sent: bool, kept: bool, session_kept: bool
) -> None:
    plane = Plane()
    agent = agent_for(plane, tmp_path)

    async def go() -> bool:
        session = await agent._register()
        agent.outbox.add_event(started())
        batch = agent.outbox.batch(session.id)
        assert batch is not None
        if status is not None:
            plane.fail["report"] = [status]
        result = await agent._send(session, batch)
        assert (agent.session is session) is session_kept
        await agent.client.aclose()
        return result

    assert run(go) is sent
    assert (len(agent.outbox) == 1) is kept


def test_items_the_server_calls_stale_are_not_sent_again(tmp_path: Path) -> None:
    plane = Plane()
    plane.refuse_items = ["j/w0"]
    agent = agent_for(plane, tmp_path)

    async def go() -> None:
        session = await agent._register()
        agent.outbox.add_event(started())
        batch = agent.outbox.batch(session.id)
        assert batch is not None and await agent._send(session, batch)
        await agent.client.aclose()

    run(go)
    assert len(agent.outbox) == 0 and len(plane.events()) == 1


@pytest.mark.parametrize(
    ("status", "done"),
    [
        pytest.param(None, True, id="kept"),
        pytest.param(404, True, id="refused for good: dropped"),
        pytest.param(500, False, id="not answered: tried again later"),
    ],
)
def test_an_artifact_leaves_the_spool_once_kept_or_refused_for_good(
    tmp_path: Path, status: int | None, done: bool
) -> None:
    plane = Plane()
    if status is not None:
        plane.fail["artifacts"] = [status]
    agent = agent_for(plane, tmp_path)
    path = tmp_path / "model.bin"
    path.write_bytes(b"weights")

    async def go() -> tuple[bool, bool]:
        before = await agent._send_artifact("j-1.1.0", "out/model.bin", path, "ab" * 32)
        await agent._register()
        after = await agent._send_artifact("j-1.1.0", "out/model.bin", path, "ab" * 32)
        await agent.client.aclose()
        return before, after

    assert run(go) == (False, done)  # nothing is sent before the agent has registered
    if status is None:
        assert plane.uploads == [("j-1.1.0", "out/model.bin", "ab" * 32, b"weights")]


def test_an_ended_replicas_outputs_reach_the_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(loop_module, "ARTIFACT_POLL_S", 0.01)
    monkeypatch.chdir(tmp_path)
    plane = Plane()
    agent = agent_for(plane, tmp_path / "work")
    writes = (
        "import pathlib; pathlib.Path('out').mkdir(); pathlib.Path('out/a.txt').write_text('A')"
    )
    one = spec(writes, name="j-1.1.0", outputs=["out"], cwd=str(tmp_path))

    async def go() -> None:
        await agent._register()
        await agent.runtime.start(one)
        await exit_of(agent, "j-1.1.0")
        sender = await background(agent._send_artifacts())
        await until(lambda: plane.uploads)
        await cancel(sender)
        await end(agent)

    run(go)
    [(replica, name, sha, body)] = plane.uploads
    assert (replica, name, body) == ("j-1.1.0", "out/a.txt", b"A")
    assert sha == "559aead08264d5795d3909718cdd05abd49572e84fe55590eef31a88a08fdffd"
    assert not any((tmp_path / "work" / "artifacts").iterdir())


# --- the whole agent ----------------------------------------------------------------------------


def test_stopping_the_agent_stops_its_replicas_says_it_leaves_and_reports_the_exit(
    tmp_path: Path,
) -> None:
    plane = Plane(heartbeat_s=0.02)
    plane.set_desired(spec(CHECKPOINTS_ON_TERM, grace_s=10.0))
    agent = agent_for(plane, tmp_path)

    async def go() -> int:
        running = asyncio.create_task(agent.run())
        await until(lambda: plane.events("started"))
        await until(lambda: "ready" in "".join(c.data for r in plane.reports for c in r.logs))
        agent.request_stop()
        return await running

    assert run(go) == EXIT_OK
    [exited] = plane.events("exited")
    assert exited.exit_code == 0 and exited.by_node and exited.checkpoint_s is not None
    assert any(h.leaving for h in plane.heartbeats)
    assert not any(h.leaving for h in plane.heartbeats[:1])
    log = "".join(c.data for r in plane.reports for c in r.logs)
    assert "checkpoint saved" in log
    assert plane.registrations[0].running == []


async def finished(result: Any = None, error: BaseException | None = None) -> asyncio.Task[None]:
    async def work() -> None:
        if error is not None:
            raise error

    task = asyncio.create_task(work())
    await asyncio.gather(task, return_exceptions=True)
    return task


def test_the_exit_code_is_2_for_a_refused_node_0_otherwise_and_other_errors_propagate() -> None:
    async def go() -> None:
        assert _exit_code({await finished()}) == EXIT_OK
        assert _exit_code({await finished(error=Refused(401, "bad token", []))}) == EXIT_REFUSED
        cancelled = asyncio.create_task(asyncio.sleep(10))
        await cancel(cancelled)
        assert _exit_code({cancelled}) == EXIT_OK
        with pytest.raises(RuntimeError, match="bug"):
            _exit_code({await finished(error=RuntimeError("bug"))})

    asyncio.run(go())


class _Sleeps:
    """``asyncio`` for the agent's loop module, recording the sleeps it asks for."""

    def __init__(self) -> None:
        self.asked: list[float] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(asyncio, name)

    async def sleep(self, seconds: float) -> None:
        self.asked.append(seconds)
        await asyncio.sleep(0)


def test_a_report_held_by_the_servers_store_is_sent_again_when_the_server_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 503 of a store away past the client's own patience: the next try comes after the
    server's Retry-After (1.5 s here), not after the agent's backoff (0.01 s)."""
    plane = Plane()
    agent = agent_for(plane, tmp_path)
    sleeps = _Sleeps()
    monkeypatch.setattr(loop_module, "asyncio", sleeps)
    real = agent.client.report
    answers: list[Exception] = [StoreAway("503 the store is unavailable", 1.5)]

    async def report(node: str, body: Any) -> Any:
        if answers:
            raise answers.pop()
        return await real(node, body)

    async def go() -> None:
        await agent._register()
        agent.outbox.add_event(started())
        monkeypatch.setattr(agent.client, "report", report)
        sending = asyncio.ensure_future(agent._send_reports())
        await until(lambda: len(agent.outbox) == 0)
        sending.cancel()
        await asyncio.gather(sending, return_exceptions=True)
        await agent.client.aclose()

    run(go)
    assert 1.5 in sleeps.asked
    assert len(plane.events()) == 1

"""A stand-in for the control plane's agent endpoints, for the agent's unit tests only.

``FakeServer`` answers the four agent endpoints (register, heartbeat, desired long-poll,
report) from memory on a free loopback port, so a test can drive a real agent: set the
desired replicas, cut the node off (``partitioned``), forget sessions (409s), and read back
everything the agent registered, heartbeated and reported. It checks the token, the bodies
(against the wire models) and the session, and nothing else: it is not the server.
``AgentThread`` runs an ``Agent`` on its own event loop in a thread against it.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import parse_qs, urlparse

from pydantic import BaseModel, ValidationError

from boltforge.agent.client import ServerClient
from boltforge.agent.loop import Agent
from boltforge.agent.preflight import NodeHooks
from boltforge.wire.agent import (
    AgentReport,
    DesiredState,
    Heartbeat,
    Inventory,
    Lease,
    LogChunk,
    Progress,
    Registration,
    ReplicaEvent,
    ReplicaSpec,
    ReportReply,
)

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)


class FakeServer:
    """The agent endpoints, in memory. All state is read and written under ``cond``."""

    def __init__(self, token: str = "secret", lease_s: float = 5.0, heartbeat_s: float = 0.2):
        self.token, self.lease_s, self.heartbeat_s = token, lease_s, heartbeat_s
        self.cond = threading.Condition()
        self.version = 0
        self.replicas: list[ReplicaSpec] = []
        self.sessions: dict[str, str] = {}
        self.registrations: list[Registration] = []
        self.heartbeats: list[Heartbeat] = []
        self.polls: list[int] = []
        self.events: list[ReplicaEvent] = []
        self.logs: list[LogChunk] = []
        self.progress: list[Progress] = []
        self.stop_on_register: list[str] = []
        self.partitioned = False
        self.closed = False
        self._http = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self._http.daemon_threads = True
        self._http.fake = self  # type: ignore[attr-defined]
        self._thread = threading.Thread(target=self._http.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._http.server_address[1]}"

    def __enter__(self) -> FakeServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        with self.cond:
            self.closed = True
            self.cond.notify_all()
        self._http.shutdown()
        self._http.server_close()

    # what tests do

    def set_desired(self, *replicas: ReplicaSpec) -> int:
        """Replace the node's desired replicas; returns the new version."""
        with self.cond:
            self.version += 1
            self.replicas = list(replicas)
            self.cond.notify_all()
            return self.version

    def forget_sessions(self) -> None:
        with self.cond:
            self.sessions.clear()

    def wait_for(self, what: Callable[[], T], timeout_s: float = 15.0) -> T:
        """Poll ``what()`` (under the lock) until it is truthy; fail after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            with self.cond:
                value = what()
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out; events so far: {self.events}")
            time.sleep(0.02)

    def events_of(self, replica: str, kind: str | None = None) -> list[ReplicaEvent]:
        return [e for e in self.events if e.replica == replica and kind in (None, e.kind)]

    def log_of(self, replica: str) -> str:
        return "".join(c.data for c in self.logs if c.replica == replica)

    def wait_log(self, replica: str, text: str, timeout_s: float = 15.0) -> str:
        """The replica's output so far, once it contains ``text``."""
        return self.wait_for(lambda: text in (out := self.log_of(replica)) and out, timeout_s) or ""

    # what the handler calls

    def handle(self, method: str, path: str, query: dict[str, str], body: bytes) -> Any:
        parts = path.strip("/").split("/")
        if self.partitioned:
            return 503, {"error": "partitioned", "problems": []}
        if method == "POST" and parts == ["v1", "agents", "register"]:
            return self._register(_parse(Registration, body))
        if len(parts) != 4 or parts[:2] != ["v1", "agents"]:
            return 404, {"error": "not found", "problems": [path]}
        what = (method, parts[3])
        if what == ("POST", "heartbeat"):
            return self._heartbeat(parts[2], _parse(Heartbeat, body))
        if what == ("GET", "desired"):
            return self._desired(parts[2], int(query["since"]), float(query["wait"]))
        if what == ("POST", "report"):
            return self._report(parts[2], _parse(AgentReport, body))
        return 404, {"error": "not found", "problems": [path]}

    def _lease(self, node: str, stop: list[str] | None = None) -> Lease:
        return Lease(
            node=node,
            session=self.sessions[node],
            lease_s=self.lease_s,
            heartbeat_s=self.heartbeat_s,
            stop=stop or [],
            desired_version=self.version,
        )

    def _register(self, body: Registration) -> Lease:
        node = body.inventory.name
        with self.cond:
            self.registrations.append(body)
            self.sessions[node] = uuid.uuid4().hex
            return self._lease(node, list(self.stop_on_register))

    def _heartbeat(self, node: str, body: Heartbeat) -> Any:
        with self.cond:
            if self.sessions.get(node) != body.session:
                return 409, {"error": "unknown session", "problems": []}
            self.heartbeats.append(body)
            return self._lease(node)

    def _desired(self, node: str, since: int, wait_s: float) -> DesiredState:
        with self.cond:
            self.polls.append(since)
            self.cond.wait_for(lambda: self.version > since or self.closed, timeout=wait_s)
            return DesiredState(node=node, version=self.version, replicas=self.replicas)

    def _report(self, node: str, body: AgentReport) -> Any:
        with self.cond:
            if self.sessions.get(node) != body.session:
                return 409, {"error": "unknown session", "problems": []}
            self.events += body.events
            self.logs += body.logs
            self.progress += body.progress
            return ReportReply()


class _BadBody(Exception):
    def __init__(self, problems: list[str]) -> None:
        self.problems = problems


def _parse(model: type[M], body: bytes) -> M:
    try:
        return model.model_validate_json(body)
    except ValidationError as e:
        raise _BadBody([f"{e['loc']}: {e['msg']}" for e in e.errors()]) from None


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")

    def _serve(self, method: str) -> None:
        fake: FakeServer = self.server.fake  # type: ignore[attr-defined]
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        url = urlparse(self.path)
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        if self.headers.get("Authorization") != f"Bearer {fake.token}":
            self._reply(401, {"error": "bad token", "problems": []})
            return
        try:
            out = fake.handle(method, url.path, query, body)
        except _BadBody as e:
            out = (422, {"error": "invalid body", "problems": e.problems})
        status, data = out if isinstance(out, tuple) else (200, out)
        self._reply(status, data.model_dump(mode="json") if isinstance(data, BaseModel) else data)

    def _reply(self, status: int, data: Any) -> None:
        raw = json.dumps(data).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def log_message(self, format: str, *args: Any) -> None:
        pass


class AgentThread:
    """An ``Agent`` for ``server`` running on its own event loop in a thread, with short
    polls, ticks and backoffs so tests run fast. ``code`` is ``run()``'s exit code; ``hooks``
    the agent's prolog and epilog scripts."""

    def __init__(
        self,
        server: FakeServer,
        work_dir: Path,
        token: str | None = None,
        hooks: NodeHooks | None = None,
    ) -> None:
        self.server, self.work_dir, self.hooks = server, work_dir, hooks
        self.token = server.token if token is None else token
        self.inventory = Inventory(name="host-0", gpu="H100-80GB", gpus=8, gpu_memory_gb=80)
        self.code: int | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    async def _main(self) -> None:
        self.loop = asyncio.get_running_loop()
        client = ServerClient(self.server.url, self.token, timeout_s=2.0)
        self.agent = Agent(
            client,
            self.inventory,
            self.work_dir,
            poll_wait_s=1.0,
            tick_s=0.05,
            max_backoff_s=0.3,
            hooks=self.hooks,
        )
        self._ready.set()
        self.code = await self.agent.run()

    def __enter__(self) -> AgentThread:
        self._thread.start()
        assert self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self, timeout_s: float = 30.0) -> int | None:
        """Ask the agent to stop (as SIGTERM would) and wait for it to return."""
        if self._thread.is_alive():
            self.loop.call_soon_threadsafe(self.agent.request_stop)
            self._thread.join(timeout_s)
        assert not self._thread.is_alive(), "the agent did not stop"
        return self.code

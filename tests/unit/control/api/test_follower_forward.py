"""Server replicas on one store (``control/replicas.py``): a follower forwards every call
but ``/healthz`` to the leader and streams its answer back, answers ``503`` with
``Retry-After`` while no leader is known or answers, and never forwards to itself; the lease
keeper's reasons for stopping. The leader here is a real HTTP server on localhost; the
lease is the real one on SQLite."""

from __future__ import annotations

import asyncio
import hashlib
import shutil
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from fastapi.testclient import TestClient
from sqlalchemy.exc import OperationalError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Message, Receive, Scope, Send

from boltforge.control.app import create_app
from boltforge.control.replicas import HOP_BY_HOP, OPEN_PATHS, FollowerForward, Keeper
from boltforge.control.runtime import ServerConfig
from boltforge.control.store.db import Database
from boltforge.control.store.leadership import Leadership, LeaseTimes

# A lease nobody takes over during a test, however slow the machine.
LONG = LeaseTimes(lease_s=3600.0, renew_every_s=1.0, deadline_s=2.0)


# -- a leader to forward to ----------------------------------------------------------------


async def echo(request: Request) -> Response:
    """What the leader received: method, path, query, headers and the body's digest."""
    body = await request.body()
    seen = {
        "method": request.method,
        "path": request.url.path,
        "query": request.url.query,
        "headers": dict(request.headers),
        "length": len(body),
        "sha256": hashlib.sha256(body).hexdigest(),
    }
    return JSONResponse(seen, headers={"x-leader": "a"})


async def teapot(request: Request) -> Response:
    return PlainTextResponse("short and stout", status_code=418, headers={"retry-after": "7"})


async def chunks(request: Request) -> Response:
    async def lines() -> Any:
        for i in range(5):
            yield f"event {i}\n"

    return StreamingResponse(lines(), media_type="text/event-stream")


LEADER_APP = Starlette(
    routes=[
        Route("/echo/{rest:path}", echo, methods=["GET", "POST", "PUT", "DELETE"]),
        Route("/teapot", teapot),
        Route("/chunks", chunks),
    ]
)


@pytest.fixture(scope="module")
def leader_url() -> Iterator[str]:
    """A real HTTP server on localhost playing the leader. Its socket listens before the
    server starts, so calls made meanwhile wait in the backlog instead of failing."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    port = sock.getsockname()[1]
    config = uvicorn.Config(LEADER_APP, log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=10)
    sock.close()


def closed_port() -> int:
    """A localhost port nothing listens on (connections to it are refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


# -- the replica doing the forwarding --------------------------------------------------------


@dataclass
class Local:
    """The follower's own app: records what reached it and answers ``local``."""

    paths: list[str] = field(default_factory=list)
    kinds: list[str] = field(default_factory=list)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.kinds.append(scope["type"])
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        self.paths.append(scope["path"])
        await PlainTextResponse("local")(scope, receive, send)


@pytest.fixture(scope="module")
def empty_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A migrated SQLite file, made once and copied for each test."""
    path = tmp_path_factory.mktemp("template") / "replicas.db"
    store = Database(f"sqlite:///{path}")
    store.migrate()
    store.close()
    return path


@pytest.fixture
def db(tmp_path: Path, empty_store: Path) -> Iterator[Database]:
    path = tmp_path / "replicas.db"
    shutil.copyfile(empty_store, path)
    store = Database(f"sqlite:///{path}")
    yield store
    store.close()


def leads(db: Database, name: str, url: str) -> Leadership:
    """Replica ``name`` (advertising ``url``) takes the free lease on a handle of its own."""
    lead = Leadership(Database(db.url), name, url, LONG)
    assert lead.try_acquire()
    return lead


@dataclass
class Replica:
    """Replica ``b``: its lease handle, whether it acts, its own app, and a client to it."""

    leadership: Leadership
    acting: asyncio.Event
    local: Local
    http: TestClient


@pytest.fixture
def replica_b(db: Database) -> Iterator[Replica]:
    leadership = Leadership(Database(db.url), "b", "http://b.invalid:8080", LONG)
    acting = asyncio.Event()
    local = Local()
    app = FollowerForward(local, leadership=leadership, acting=acting)
    with TestClient(app) as http:  # one event loop for every call (the forwarder's client)
        yield Replica(leadership, acting, local, http)


def refused(r: Any, words: str) -> None:
    """``r`` is the follower's own 503: JSON naming ``words`` and the fix, retry in 1 s."""
    assert r.status_code == 503, r.text
    assert r.headers["retry-after"] == "1"
    assert r.headers["content-type"] == "application/json"
    assert int(r.headers["content-length"]) == len(r.content)
    error = r.json()["error"]
    assert words in error and error.endswith("To fix: retry in a second")


# -- while no leader answers -----------------------------------------------------------------


def test_with_no_leader_yet_every_call_is_a_503_to_retry(replica_b: Replica) -> None:
    for method, path in (("GET", "/v1/jobs"), ("POST", "/v1/jobs"), ("GET", "/metrics")):
        refused(replica_b.http.request(method, path), "no replica leads yet")
    assert replica_b.local.paths == []


def test_healthz_is_answered_by_the_replica_itself_whoever_leads(replica_b: Replica) -> None:
    assert "/healthz" in OPEN_PATHS
    r = replica_b.http.get("/healthz")
    assert (r.status_code, r.text) == (200, "local")
    assert replica_b.local.paths == ["/healthz"]


def test_a_leader_without_an_address_is_not_forwarded_to(db: Database, replica_b: Replica) -> None:
    leads(db, "a", "")
    refused(replica_b.http.get("/v1/jobs"), "no replica leads yet")


def test_a_replica_never_forwards_to_itself(db: Database, replica_b: Replica) -> None:
    """The store names ``b`` (its lease from before a restart still stands) while this
    ``b`` does not lead: forwarding would loop back to itself."""
    leads(db, "b", "http://b.invalid:8080")
    refused(replica_b.http.get("/v1/jobs"), "no replica leads yet")
    assert replica_b.local.paths == []


def test_a_leader_still_recovering_answers_503_until_it_acts(
    db: Database, replica_b: Replica
) -> None:
    assert replica_b.leadership.try_acquire()
    refused(replica_b.http.get("/v1/jobs"), "no replica leads yet")
    replica_b.acting.set()
    r = replica_b.http.get("/v1/jobs")
    assert (r.status_code, r.text) == (200, "local")
    assert replica_b.local.paths == ["/v1/jobs"]


def test_a_leader_that_does_not_answer_is_named_in_the_503(
    db: Database, replica_b: Replica
) -> None:
    leads(db, "a", f"http://127.0.0.1:{closed_port()}")
    refused(replica_b.http.post("/v1/jobs", json={"spec": {}}), "the leader (a) does not answer")
    assert replica_b.local.paths == []


def test_other_kinds_of_connection_pass_straight_through(replica_b: Replica) -> None:
    """The lifespan (and websockets) are the replica's own, leader or not."""
    assert replica_b.local.kinds[0] == "lifespan"


def test_a_websocket_scope_goes_to_the_replica_itself(db: Database) -> None:
    leadership = Leadership(Database(db.url), "b", "http://b.invalid", LONG)
    seen: list[str] = []

    async def inner(scope: Scope, receive: Receive, send: Send) -> None:
        seen.append(scope["type"])

    async def never(message: Message) -> None:
        raise AssertionError("nothing is sent for a scope that passes through")

    async def nothing() -> Message:
        return {"type": "websocket.connect"}

    forward = FollowerForward(inner, leadership=leadership, acting=asyncio.Event())
    asyncio.run(forward({"type": "websocket", "path": "/ws"}, nothing, never))
    assert seen == ["websocket"]


# -- forwarding to the leader ----------------------------------------------------------------


@pytest.fixture
def forwarding(db: Database, replica_b: Replica, leader_url: str) -> Replica:
    leads(db, "a", leader_url)
    return replica_b


def test_a_call_is_forwarded_with_its_method_path_query_and_body(forwarding: Replica) -> None:
    body = bytes(range(256)) * 800  # 200 KiB, not JSON: passed on as bytes
    r = forwarding.http.put("/echo/v1/jobs/j-1?after=3&wait=2.5", content=body)
    assert r.status_code == 200, r.text
    seen = r.json()
    assert (seen["method"], seen["path"], seen["query"]) == (
        "PUT",
        "/echo/v1/jobs/j-1",
        "after=3&wait=2.5",
    )
    assert (seen["length"], seen["sha256"]) == (len(body), hashlib.sha256(body).hexdigest())
    assert forwarding.local.paths == []


def test_the_leader_sees_the_callers_address_and_credentials_but_no_hop_headers(
    forwarding: Replica, leader_url: str
) -> None:
    headers = {
        "Authorization": "Bearer bf_secret",
        "Proxy-Authorization": "Basic cHJveHk=",
        "Idempotency-Key": "k-1",
        "Connection": "keep-alive",
    }
    seen = forwarding.http.get("/echo/x", headers=headers).json()["headers"]
    assert seen["authorization"] == "Bearer bf_secret"
    assert seen["idempotency-key"] == "k-1"
    assert seen["x-forwarded-for"] == "testclient"  # the test client's address
    assert "proxy-authorization" not in seen
    assert seen["host"] == leader_url.removeprefix("http://")  # the leader's, not testserver
    assert {b"connection", b"host", b"proxy-authorization"} <= HOP_BY_HOP


def test_the_leaders_status_headers_and_body_come_back_as_they_are(forwarding: Replica) -> None:
    r = forwarding.http.get("/teapot")
    assert (r.status_code, r.text) == (418, "short and stout")
    assert r.headers["retry-after"] == "7"  # the leader's, not the follower's own 1
    echoed = forwarding.http.delete("/echo/y")
    assert echoed.headers["x-leader"] == "a"
    assert echoed.json()["method"] == "DELETE"


def test_a_streamed_reply_is_streamed_back_whole_without_its_hop_headers(
    forwarding: Replica,
) -> None:
    with forwarding.http.stream("GET", "/chunks") as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        assert "transfer-encoding" not in r.headers
        text = "".join(r.iter_text())
    assert text == "".join(f"event {i}\n" for i in range(5))


def test_the_leaders_own_404_is_passed_on_not_answered_locally(forwarding: Replica) -> None:
    r = forwarding.http.get("/no/such/route")
    assert r.status_code == 404
    assert forwarding.local.paths == []


# -- the real app as a follower --------------------------------------------------------------


def test_a_server_that_follows_says_so_and_sends_callers_to_the_leader(
    tmp_path: Path, db: Database
) -> None:
    down = f"http://127.0.0.1:{closed_port()}"
    leads(db, "a", down)
    config = ServerConfig(
        db_url=db.url,
        checkpoint_root=str(tmp_path / "ckpt"),
        admin_token="adm",
        replica="b",
        advertise_url="http://b.invalid:8080",
        leader_lease=LONG,
    )
    with TestClient(create_app(config)) as http:
        health = http.get("/healthz")
        assert health.json() == {"status": "ok", "role": "follower", "replica": "b"}
        r = http.get("/v1/jobs", headers={"Authorization": "Bearer adm"})
        refused(r, "the leader (a) does not answer")


# -- the lease keeper ------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


QUICK = LeaseTimes(lease_s=3.0, renew_every_s=0.001, deadline_s=2.0)


def keeper_of(db: Database, clock: Clock) -> tuple[Leadership, Keeper, list[str]]:
    lead = Leadership(Database(db.url), "a", "http://a", QUICK, clock)
    assert lead.try_acquire()
    told: list[str] = []
    return lead, Keeper(lead, told.append), told


def test_a_keeper_whose_store_cannot_be_reached_stops_at_the_renew_deadline(
    db: Database,
) -> None:
    clock = Clock()
    lead, keeper, told = keeper_of(db, clock)

    def unreachable() -> bool:
        raise OperationalError("update", {}, Exception("connection refused"))

    lead.renew = unreachable  # type: ignore[method-assign]
    clock.now += QUICK.deadline_s  # no renewal for the whole deadline
    keeper.run()  # in this thread: it returns once it told
    assert told == ["a could not renew its leader lease in time"]


def test_a_keeper_tells_once_that_another_replica_took_the_term(db: Database) -> None:
    clock = Clock()
    lead, keeper, told = keeper_of(db, clock)
    lead.term = None  # the store said another term began
    keeper.run()
    keeper.lost("again")  # a second reason after stopping is not told
    assert told == ["a's term is over: another replica leads"]


def test_a_stopped_keeper_tells_nothing(db: Database) -> None:
    clock = Clock()
    _, keeper, told = keeper_of(db, clock)
    keeper.stop()
    keeper.run()
    keeper.lost("too late")
    assert told == []

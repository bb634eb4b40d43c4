"""Overload protection: the middleware on a tiny ASGI app (who is shed, with what reply, and
that every slot comes back), the Python client's retries, and the real server app under a
flood of submissions from one token (some shed, another token served, nothing accepted
lost). Requests are held in flight by gates the tests open, never by timing."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from control_kit import ADMIN, Fleet, make_spec
from prometheus_client.parser import text_string_to_metric_families
from starlette.types import Message, Receive, Scope, Send

from boltforge import client as client_module
from boltforge.client import ApiFailure, Client
from boltforge.control.api.overload import Limiter, Limits, Overload, Shed, Ticket
from boltforge.control.jobs.intake import Order

# ---- a tiny ASGI app and hand-made requests ------------------------------------------------


class Held:
    """An ASGI app that answers 200 once the test opens its gate; ``entered`` counts the
    requests that reached it. ``fail`` makes it raise instead; ``listen`` makes it wait for
    the client to go away (as a streaming reply does) and return without answering."""

    def __init__(self, fail: bool = False, listen: bool = False) -> None:
        self.gate = asyncio.Event()
        self.entered = 0
        self.fail = fail
        self.listen = listen

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.entered += 1
        if self.listen:
            while (await receive())["type"] != "http.disconnect":
                pass
            return
        await self.gate.wait()
        if self.fail:
            raise RuntimeError("the handler failed")
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


def request(
    path: str = "/v1/jobs",
    token: str | None = "alice",
    method: str = "POST",
    query: bytes = b"",
    client: tuple[str, int] = ("10.0.0.1", 40000),
) -> Scope:
    headers = [(b"authorization", f"Bearer {token}".encode())] if token else []
    return {
        "type": "http",
        "method": method,
        "path": path,
        "query_string": query,
        "headers": [(b"host", b"bolt"), *headers],
        "client": client,
    }


async def unread() -> Message:
    raise AssertionError("the request body was read")


class Call:
    """One request through ``mw`` as a task; ``sent`` holds what came back."""

    def __init__(self, mw: Overload, scope: Scope, receive: Receive = unread) -> None:
        self.sent: list[Message] = []
        self.task = asyncio.ensure_future(mw(scope, receive, self._send))

    async def _send(self, message: Message) -> None:
        self.sent.append(message)

    @property
    def status(self) -> int:
        return int(self.sent[0]["status"])

    @property
    def headers(self) -> dict[str, str]:
        return {k.decode(): v.decode() for k, v in self.sent[0]["headers"]}

    def body(self) -> dict[str, Any]:
        out: dict[str, Any] = json.loads(self.sent[1]["body"])
        return out


async def settle(until: Callable[[], bool]) -> None:
    """Let the other tasks run until ``until()`` holds (a bounded number of turns)."""
    for _ in range(1000):
        if until():
            return
        await asyncio.sleep(0)
    raise AssertionError("the tasks never got there")


async def answered(call: Call) -> Call:
    await call.task
    return call


def run(test: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(test())


def roles(token: str) -> str | None:
    """The server's known tokens, as ``Runtime.known_caller`` would say."""
    return {"agt": "agent", "adm": "admin", "alice": "member", "bob": "member"}.get(token)


def refusals(mw: Overload) -> dict[str, int]:
    """The reasons ``mw`` shed requests for, with their counts."""
    return {reason: n for reason, n in mw.limiter.shed.items() if n}


def middleware(app: Held, clock: Callable[[], float] = time.monotonic, **limits: Any) -> Overload:
    return Overload(app, Limiter(Limits(**limits), roles, clock))


# ---- who is shed, and how ------------------------------------------------------------------


def test_a_caller_past_its_limit_gets_429_with_retry_after_and_the_fix_unread() -> None:
    async def go() -> None:
        app = Held()
        mw = middleware(app, per_caller=2)
        held = [Call(mw, request()) for _ in range(2)]
        await settle(lambda: app.entered == 2)
        shed = await answered(Call(mw, request()))  # ``unread`` fails if the body is read
        assert shed.status == 429 and app.entered == 2
        assert shed.headers["retry-after"] == "1"
        assert shed.headers["content-type"] == "application/json"
        assert shed.body() == {
            "error": "too many requests in flight for this token (limit 2). To fix: wait "
            "Retry-After seconds, or send fewer at once",
            "problems": [],
        }
        assert refusals(mw) == {"caller": 1}
        app.gate.set()
        assert [(await answered(c)).status for c in held] == [200, 200]

    run(go)


def test_one_caller_flooding_does_not_shed_another() -> None:
    async def go() -> None:
        app = Held()
        mw = middleware(app, per_caller=3)
        flood = [Call(mw, request(token="alice")) for _ in range(10)]
        other = Call(mw, request(token="bob"))
        await settle(lambda: app.entered == 4)
        assert sum(1 for c in flood if c.task.done() and c.status == 429) == 7
        assert not other.task.done()  # bob's request reached the app and waits there
        app.gate.set()
        assert (await answered(other)).status == 200

    run(go)


def test_unauthenticated_callers_are_told_apart_by_address() -> None:
    async def go() -> None:
        app = Held()
        mw = middleware(app, per_caller=1)
        first = Call(mw, request("/console/", token=None, method="GET"))
        await settle(lambda: app.entered == 1)
        again = await answered(Call(mw, request("/console/", token=None, method="GET")))
        assert again.status == 429 and "for this address" in again.body()["error"]
        elsewhere = Call(mw, request("/console/", None, "GET", client=("10.0.0.2", 1)))
        await settle(lambda: app.entered == 2)
        app.gate.set()
        assert [(await answered(c)).status for c in (first, elsewhere)] == [200, 200]

    run(go)


def test_past_the_server_wide_cap_anyone_gets_503_with_retry_after() -> None:
    async def go() -> None:
        app = Held()
        mw = middleware(app, per_caller=10, total=3)
        held = [Call(mw, request(token=t)) for t in ("alice", "bob", "carol")]
        await settle(lambda: app.entered == 3)
        shed = await answered(Call(mw, request(token="dave")))
        assert shed.status == 503 and int(shed.headers["retry-after"]) >= 1
        assert "server has too many requests in flight (limit 3)" in shed.body()["error"]
        assert "To fix: wait Retry-After seconds" in shed.body()["error"]
        assert refusals(mw) == {"server": 1}
        app.gate.set()
        for c in held:
            await c.task

    run(go)


def test_a_rate_past_the_callers_bucket_gets_429_with_the_seconds_until_its_next_token() -> None:
    async def go() -> None:
        now = [100.0]
        app = Held()
        app.gate.set()
        mw = middleware(app, lambda: now[0], rate=0.5, burst=2)
        assert [(await answered(Call(mw, request()))).status for _ in range(2)] == [200, 200]
        shed = await answered(Call(mw, request()))
        assert shed.status == 429 and shed.headers["retry-after"] == "2"
        assert "per second for this token (limit 0.5/s, bursts of 2)" in shed.body()["error"]
        assert (await answered(Call(mw, request(token="bob")))).status == 200
        now[0] += 2.0
        assert (await answered(Call(mw, request()))).status == 200

    run(go)


def test_a_bucket_holds_at_least_one_request_whatever_its_burst() -> None:
    limiter = Limiter(Limits(rate=0.2, burst=0.5), clock=lambda: 0.0)
    assert isinstance(limiter.admit(request()), Ticket)
    refused = limiter.admit(request())
    assert isinstance(refused, Shed) and refused.retry_after == 5


EXEMPT = [
    request("/healthz", None, "GET"),
    request("/metrics", None, "GET"),
    request("/v1/console/stream", "alice", "GET"),
    request("/v1/agents/host-0/desired", "agt", "GET", b"since=3&wait=30"),
]


def test_health_metrics_the_event_stream_and_agent_long_polls_are_never_shed() -> None:
    async def go() -> None:
        app = Held()
        mw = middleware(app, per_caller=1, total=1, per_node=1, agents=1)
        busy = [Call(mw, request()), Call(mw, request("/v1/agents/register", "agt"))]
        await settle(lambda: app.entered == 2)
        passed = [Call(mw, scope) for scope in EXEMPT * 3]
        await settle(lambda: app.entered == 2 + len(passed))
        assert not refusals(mw)
        app.gate.set()
        for c in busy + passed:
            assert (await answered(c)).status == 200
        assert mw.limiter.in_flight() == 0

    run(go)


def test_agent_calls_have_their_own_pool_and_a_limit_per_node() -> None:
    async def go() -> None:
        app = Held()
        mw = middleware(app, per_caller=1, total=1, per_node=2, agents=5)
        person = Call(mw, request())
        beats = [Call(mw, request("/v1/agents/host-0/heartbeat", "agt")) for _ in range(2)]
        await settle(lambda: app.entered == 3)  # people are at their cap; agents are not
        third = await answered(Call(mw, request("/v1/agents/host-0/heartbeat", "agt")))
        assert third.status == 429 and "for node host-0 (limit 2)" in third.body()["error"]
        other = [Call(mw, request(f"/v1/agents/host-1/{w}", "agt")) for w in ("report", "desired")]
        register = Call(mw, request("/v1/agents/register", "adm"))
        await settle(lambda: app.entered == 6)
        full = await answered(Call(mw, request("/v1/agents/register", "agt")))
        assert full.status == 503 and "too many agent requests" in full.body()["error"]
        assert refusals(mw) == {"node": 1, "agents": 1}
        app.gate.set()
        for c in [person, *beats, *other, register]:
            assert (await answered(c)).status == 200

    run(go)


def test_a_person_calling_agent_paths_counts_as_a_person() -> None:
    async def go() -> None:
        app = Held()
        mw = middleware(app, per_caller=1, per_node=10)
        first = Call(mw, request("/v1/agents/host-0/heartbeat", "alice"))
        await settle(lambda: app.entered == 1)
        again = await answered(Call(mw, request("/v1/agents/host-1/heartbeat", "alice")))
        assert again.status == 429 and refusals(mw) == {"caller": 1}
        app.gate.set()
        await first.task

    run(go)


# ---- every slot comes back -----------------------------------------------------------------


def test_slots_come_back_when_a_request_ends_fails_is_abandoned_or_cancelled() -> None:
    async def go() -> None:
        ok, failing, listening = Held(), Held(fail=True), Held(listen=True)
        for app in (ok, failing):
            app.gate.set()
        mws = [middleware(app, per_caller=1) for app in (ok, failing, listening)]
        assert (await answered(Call(mws[0], request()))).status == 200
        with pytest.raises(RuntimeError):
            await Call(mws[1], request()).task

        async def gone() -> Message:
            await asyncio.sleep(0)
            return {"type": "http.disconnect"}

        await Call(mws[2], request(), gone).task  # the client went away; no reply was sent
        ok.gate.clear()
        cancelled = Call(mws[0], request())
        await settle(lambda: ok.entered == 2)
        cancelled.task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await cancelled.task
        for mw in mws:
            assert mw.limiter.in_flight() == 0
            assert not refusals(mw)
        ok.gate.set()
        assert (await answered(Call(mws[0], request()))).status == 200

    run(go)


def test_release_forgets_a_caller_with_nothing_in_flight() -> None:
    limiter = Limiter(Limits(per_caller=1))
    ticket = limiter.admit(request())
    assert isinstance(ticket, Ticket) and limiter.in_flight(ticket.key) == 1
    assert isinstance(limiter.admit(request()), Shed)
    limiter.release(ticket)
    assert limiter.in_flight() == 0 and not limiter._counts


def test_a_limit_of_zero_is_no_limit() -> None:
    limiter = Limiter(Limits(per_caller=0, total=0, per_node=0, agents=0))
    scopes = [request(), request("/v1/agents/host-0/heartbeat", "agt")] * 500
    assert all(isinstance(limiter.admit(s), Ticket) for s in scopes)
    assert limiter.in_flight() == 1000


# ---- the Python client ---------------------------------------------------------------------


def client_answering(replies: list[httpx.Response]) -> Client:
    """A client whose server answers ``replies`` in turn."""
    c = Client("http://bolt", "tok")
    c.http.close()
    c.http = httpx.Client(
        base_url="http://bolt", transport=httpx.MockTransport(lambda _: replies.pop(0))
    )
    return c


def shed_reply(status: int = 429, retry: str | None = "1") -> httpx.Response:
    headers = {"Retry-After": retry} if retry is not None else {}
    body = {"error": "too many requests in flight for this token (limit 2). To fix: ...."}
    return httpx.Response(status, headers=headers, json={**body, "problems": []})


@pytest.fixture
def slept(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    waits: list[float] = []
    monkeypatch.setattr(client_module, "time", SimpleNamespace(sleep=waits.append))
    return waits


def test_the_client_waits_out_retry_after_and_sends_again(slept: list[float]) -> None:
    whoami = {"name": "a", "role": "admin", "team": None}
    replies = [shed_reply(429, "2"), shed_reply(503, "1"), httpx.Response(200, json=whoami)]
    with client_answering(replies) as c:
        assert c.whoami().name == "a"
    assert len(slept) == 2 and 2.0 <= slept[0] <= 2.5 and 1.0 <= slept[1] <= 1.25


def test_the_client_gives_up_after_a_few_retries_and_never_retries_other_refusals(
    slept: list[float],
) -> None:
    with client_answering([shed_reply() for _ in range(4)]) as c, pytest.raises(ApiFailure) as e:
        c.whoami()
    assert e.value.status == 429 and "To fix" in e.value.message and len(slept) == 3
    for reply in (shed_reply(retry=None), shed_reply(retry="3600"), shed_reply(422, "1")):
        with client_answering([reply]) as c, pytest.raises(ApiFailure):
            c.whoami()
    assert len(slept) == 3


# ---- the real server app -------------------------------------------------------------------


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    with Fleet(tmp_path, max_in_flight_per_caller=4) as f:
        yield f


def member(fleet: Fleet, name: str) -> dict[str, str]:
    body = {"name": name, "role": "member", "team": "research"}
    r = fleet.post("/v1/tokens", body)
    assert r.status_code == 201, r.text
    return {"Authorization": f"Bearer {r.json()['token']}"}


def hold_submissions_of(fleet: Fleet, name: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Make ``name``'s submissions wait before they are stored until ``.set()`` is called on
    the returned event; ``.held`` lists the orders waiting."""
    gate = threading.Event()
    gate.held = []  # type: ignore[attr-defined]
    store = fleet.rt.intake.write_async

    async def gated(order: Order) -> list[dict[str, Any]]:
        if order.caller.name == name:
            gate.held.append(order)  # type: ignore[attr-defined]
            while not gate.is_set():
                await asyncio.sleep(0.005)
        return await store(order)

    monkeypatch.setattr(fleet.rt.intake, "write_async", gated)
    return gate


def wait_for(check: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 60
    while not check():
        assert time.monotonic() < deadline, "never happened"
        time.sleep(0.005)


def test_a_flood_from_one_token_is_shed_another_is_served_and_nothing_accepted_is_lost(
    fleet: Fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    flood, calm = member(fleet, "flood"), member(fleet, "calm")
    gate = hold_submissions_of(fleet, "flood", monkeypatch)
    replies: dict[int, httpx.Response] = {}

    def submit(i: int) -> None:
        headers = {**flood, "Idempotency-Key": f"flood-{i}"}
        replies[i] = fleet.post("/v1/jobs", {"spec": make_spec(f"flood-{i}", 8)}, headers)

    threads = [threading.Thread(target=submit, args=(i,)) for i in range(16)]
    try:
        for t in threads:
            t.start()
        wait_for(lambda: len(gate.held) == 4 and len(replies) == 12)
        shed = sorted(replies)
        for r in replies.values():
            assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1
            assert "(limit 4). To fix: wait Retry-After seconds" in r.json()["error"]
        served = fleet.post("/v1/jobs", {"spec": make_spec("calm", 8)}, calm)
        assert served.status_code == 201, served.text
    finally:
        gate.set()
        for t in threads:
            t.join()
    accepted = {i: r.json()["job"]["id"] for i, r in replies.items() if r.status_code == 201}
    assert len(accepted) == 4 and not set(accepted) & set(shed)
    retry = {**flood, "Idempotency-Key": f"flood-{shed[0]}"}  # a shed one, sent again
    retried = fleet.post("/v1/jobs", {"spec": make_spec(f"flood-{shed[0]}", 8)}, retry)
    assert retried.status_code == 201
    jobs = {j["id"]: j["name"] for j in fleet.http.get("/v1/jobs", headers=ADMIN).json()["jobs"]}
    want = {f"flood-{i}" for i in accepted} | {"calm", f"flood-{shed[0]}"}
    assert set(jobs.values()) == want and len(jobs) == 6
    assert all(jobs[job] == f"flood-{i}" for i, job in accepted.items())
    again = fleet.post("/v1/jobs", {"spec": make_spec(f"flood-{shed[0]}", 8)}, retry)
    assert again.status_code == 200 and again.json()["job"]["id"] == retried.json()["job"]["id"]
    assert shed_total(fleet) == {"caller": 12, "rate": 0, "server": 0, "node": 0, "agents": 0}
    assert fleet.app.state.overload.in_flight() == 0


def shed_total(fleet: Fleet) -> dict[str, float]:
    text = fleet.http.get("/metrics").text
    [family] = [f for f in text_string_to_metric_families(text) if f.name == "bolt_api_shed"]
    return {s.labels["reason"]: s.value for s in family.samples}


def test_the_servers_agents_are_counted_apart_from_its_people(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with Fleet(tmp_path, hosts=2, max_in_flight=1, max_in_flight_per_node=1) as fleet:
        limiter = fleet.app.state.overload
        gate = hold_submissions_of(fleet, "admin", monkeypatch)
        result: list[httpx.Response] = []
        waiting = threading.Thread(
            target=lambda: result.append(fleet.post("/v1/jobs", {"spec": make_spec("a", 8)}))
        )
        waiting.start()
        try:
            wait_for(lambda: len(gate.held) == 1)
            assert fleet.http.get("/v1/jobs", headers=ADMIN).status_code == 503
            assert fleet.nodes["host-0"].heartbeat() == 200  # the agents' pool is not full
            assert fleet.http.get("/healthz").status_code == 200
        finally:
            gate.set()
            waiting.join()
        assert result[0].status_code == 201 and limiter.in_flight() == 0

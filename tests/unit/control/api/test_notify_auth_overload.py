"""Long-poll wake-ups (``notify.py``), tokens and roles (``auth.py``), the pure parts of
overload protection (``api/overload.py``) and header reading (``api/headers.py``)."""

from __future__ import annotations

import asyncio
import json
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from starlette.types import Message, Receive, Scope, Send

from boltforge.control import notify
from boltforge.control.api import overload
from boltforge.control.api.headers import AskedGZip, header, raw_header
from boltforge.control.api.overload import Limiter, Limits, Overload, Shed, Ticket
from boltforge.control.auth import ROLES, Caller, create_token, digest, lookup, new_token
from boltforge.control.notify import ANY, Notifier
from boltforge.control.store.db import Database

# -- notify ---------------------------------------------------------------------------------


def test_counts_grow_per_key_and_for_any() -> None:
    n = Notifier()
    n.notify(["job:1", "node:a"])
    n.notify(["job:1"])
    assert (n.count("job:1"), n.count("node:a"), n.count(ANY), n.count("other")) == (2, 1, 2, 0)


def test_notifying_nothing_changes_nothing() -> None:
    n = Notifier()
    n.notify([])
    assert (n.count(ANY), n.seq) == (0, 0)


def test_since_names_the_keys_notified_after_a_sequence_number() -> None:
    n = Notifier()
    n.notify(["a", "b"])
    seen = n.seq
    n.notify(["c"])
    n.notify(["a"])
    assert seen == 2
    assert n.since(seen) == (4, {"c", "a"})
    assert n.since(n.seq) == (4, set())
    assert n.since(0) == (4, {"a", "b", "c"})


def test_a_follower_too_far_behind_is_told_to_refresh(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(notify, "LOG_SIZE", 3)
    n = Notifier()
    n.notify(["a", "b", "c", "d", "e"])
    assert n.since(1) == (5, None)
    assert n.since(2) == (5, {"c", "d", "e"})


async def _waits(n: Notifier, key: str, timeout: float, wake: list[str] | None) -> bool:
    n.bind(asyncio.get_running_loop())
    seen = n.count(key)
    if wake is not None:
        threading.Timer(0.02, n.notify, args=(wake,)).start()
    return await n.wait(key, seen, timeout)


def test_a_waiter_wakes_when_its_key_is_notified_from_another_thread() -> None:
    n = Notifier()
    assert asyncio.run(_waits(n, "job:1", 10.0, ["job:1"])) is True
    assert n._waiters.get("job:1", []) == []


def test_closing_wakes_every_waiter_and_lets_none_wait_again() -> None:
    """The server shuts down: its long-polls answer with what they have."""

    async def go() -> tuple[list[bool], bool]:
        n = Notifier()
        n.bind(asyncio.get_running_loop())
        waiting = [asyncio.ensure_future(n.wait(k, n.count(k), 60.0)) for k in ("job:1", ANY)]
        await asyncio.sleep(0.01)
        n.close()
        woken = await asyncio.wait_for(asyncio.gather(*waiting), 5.0)
        again = await asyncio.wait_for(n.wait("job:1", n.count("job:1"), 60.0), 5.0)
        return woken, again

    woken, again = asyncio.run(go())
    assert woken == [True, True]  # woken by the close, not by their 60 s timeouts
    assert again is False


def test_a_waiter_on_any_wakes_for_every_key() -> None:
    assert asyncio.run(_waits(Notifier(), ANY, 10.0, ["node:x"])) is True


def test_a_waiter_times_out_when_only_other_keys_move() -> None:
    n = Notifier()
    assert asyncio.run(_waits(n, "job:1", 0.2, ["job:2"])) is False
    assert n._waiters.get("job:1", []) == []


def test_a_waiter_that_already_missed_a_notification_returns_at_once() -> None:
    n = Notifier()

    async def late() -> bool:
        n.bind(asyncio.get_running_loop())
        seen = n.count("k")
        n.notify(["k"])
        return await n.wait("k", seen, 0.0)

    assert asyncio.run(late()) is True


def test_notifying_after_the_loop_closed_still_counts() -> None:
    n = Notifier()

    async def bind() -> None:
        n.bind(asyncio.get_running_loop())

    asyncio.run(bind())
    n.notify(["k"])
    assert n.count("k") == 1


# -- auth -----------------------------------------------------------------------------------


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Database]:
    store = Database(f"sqlite:///{tmp_path / 'auth.db'}")
    store.migrate()
    yield store
    store.close()


def test_a_stored_token_is_found_by_its_value_and_kept_only_as_a_digest(db: Database) -> None:
    with db.session() as s:
        alice = create_token(s, "alice", "member", "vision", 1.0)
        ops = create_token(s, "ops", "admin", None, 1.0, token="fixed-admin-token")
    assert ops == "fixed-admin-token"
    with db.session() as s:
        assert lookup(s, alice) == Caller("alice", "member", "vision")
        assert lookup(s, ops) == Caller("ops", "admin", None)
        assert lookup(s, "bf_unknown") is None
        assert lookup(s, digest(alice)) is None


def test_an_unknown_role_is_refused_with_the_known_ones(db: Database) -> None:
    with db.session() as s, pytest.raises(ValueError, match="admin, member, viewer, agent"):
        create_token(s, "x", "root", None, 1.0)


def test_digest_is_sha256_hex() -> None:
    assert digest("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"


def test_new_tokens_are_prefixed_url_safe_and_distinct() -> None:
    tokens = {new_token() for _ in range(50)}
    assert len(tokens) == 50
    assert all(re.fullmatch(r"bf_[A-Za-z0-9_-]{32}", t) for t in tokens)


CALLERS = {
    "admin": Caller("root", "admin"),
    "viewer": Caller("v", "viewer"),
    "member": Caller("m", "member", "vision"),
    "agent": Caller("node-1", "agent"),
    "teamless member": Caller("m2", "member", None),
}

# (who, sees vision, sees nlp, acts for vision, acts for nlp, is admin)
RULES = [
    ("admin", True, True, True, True, True),
    ("viewer", True, True, False, False, False),
    ("member", True, False, True, False, False),
    ("agent", False, False, False, False, False),
    ("teamless member", False, False, False, False, False),
]


@pytest.mark.parametrize(("who", "see_v", "see_n", "act_v", "act_n", "admin"), RULES)
def test_team_rules_by_role(
    who: str, see_v: bool, see_n: bool, act_v: bool, act_n: bool, admin: bool
) -> None:
    c = CALLERS[who]
    assert (c.sees_team("vision"), c.sees_team("nlp")) == (see_v, see_n)
    assert (c.acts_for_team("vision"), c.acts_for_team("nlp")) == (act_v, act_n)
    assert c.is_admin is admin


def test_every_role_is_covered_by_the_rules() -> None:
    assert {CALLERS[w].role for w, *_ in RULES} == set(ROLES)


@given(st.sampled_from(ROLES), st.sampled_from(["a", "b", None]), st.sampled_from(["a", "b"]))
def test_whoever_may_act_for_a_team_may_also_see_it(
    role: str, team: str | None, other: str
) -> None:
    c = Caller("x", role, team)
    if c.acts_for_team(other):
        assert c.sees_team(other)


# -- overload: deciding from the request line and headers -------------------------------------


def scope(
    path: str,
    *,
    method: str = "GET",
    query: bytes = b"",
    token: str | None = None,
    client: str = "10.1.1.1",
    kind: str = "http",
) -> Scope:
    headers = [(b"host", b"bolt")]
    if token is not None:
        headers.append((b"authorization", f"Bearer {token}".encode()))
    return {
        "type": kind,
        "method": method,
        "path": path,
        "query_string": query,
        "headers": headers,
        "client": (client, 5000),
    }


@pytest.mark.parametrize(
    ("method", "path", "query", "waits"),
    [
        ("GET", "/v1/agents/n1/desired", b"wait=30", True),
        ("GET", "/v1/agents/n1/desired", b"since=4&wait=0.5", True),
        ("GET", "/v1/agents/n1/desired", b"wait=0", False),
        ("GET", "/v1/agents/n1/desired", b"wait=soon", False),
        ("GET", "/v1/agents/n1/desired", b"", False),
        ("POST", "/v1/agents/n1/desired", b"wait=30", False),
        ("GET", "/v1/agents/n1/heartbeat", b"wait=30", False),
        ("GET", "/v1/jobs/desired", b"wait=30", False),
    ],
)
def test_only_an_agent_s_waiting_desired_read_is_a_long_poll(
    method: str, path: str, query: bytes, waits: bool
) -> None:
    assert overload._long_poll(scope(path, method=method, query=query)) is waits


@pytest.mark.parametrize(
    ("path", "node"),
    [
        ("/v1/agents/n1/heartbeat", "n1"),
        ("/v1/agents/gpu-07/reports/x", "gpu-07"),
        ("/v1/agents/register", None),
    ],
)
def test_an_agent_call_is_counted_against_the_node_in_its_path(path: str, node: str | None) -> None:
    assert overload._node_of(path) == node


def test_callers_are_keyed_by_a_digest_of_their_token_else_their_address() -> None:
    a = overload._caller_key(b"Bearer one", scope("/"))
    b = overload._caller_key(b"Bearer two", scope("/"))
    assert a != b and len(a) == 16 and b"one" not in a
    assert overload._caller_key(None, scope("/", client="10.9.9.9")) == b"@10.9.9.9"
    no_client = {**scope("/"), "client": None}
    assert overload._caller_key(None, no_client) == b"@"


@pytest.mark.parametrize(
    ("count", "limit", "full"), [(0, 0, False), (10**6, 0, False), (1, 2, False), (2, 2, True)]
)
def test_a_limit_is_full_at_its_count_and_zero_is_none(count: int, limit: int, full: bool) -> None:
    assert overload._full(count, limit) is full


@pytest.mark.parametrize(
    ("rate", "burst", "size"),
    [(5.0, 0.0, 5.0), (5.0, 20.0, 20.0), (0.2, 0.0, 1.0), (0.5, 0.5, 1.0)],
)
def test_a_bucket_holds_its_burst_else_one_second_at_least_one(
    rate: float, burst: float, size: float
) -> None:
    assert overload._bucket_size(Limits(rate=rate, burst=burst)) == size


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_drained_bucket_refills_at_the_rate() -> None:
    clock = Clock()
    lim = Limiter(Limits(rate=2.0, burst=2.0), clock=clock)
    people = [lim.admit(scope("/v1/jobs", token="t")) for _ in range(3)]
    assert [type(p) for p in people] == [Ticket, Ticket, Shed]
    shed = people[2]
    assert isinstance(shed, Shed)
    assert (shed.status, shed.retry_after, shed.reason) == (429, 1, "rate")
    assert "limit 2/s, bursts of 2" in shed.message
    clock.now += 0.5
    assert isinstance(lim.admit(scope("/v1/jobs", token="t")), Ticket)
    assert lim.shed["rate"] == 1


def test_a_slow_rate_asks_for_a_longer_wait_in_whole_seconds() -> None:
    clock = Clock()
    lim = Limiter(Limits(rate=0.25), clock=clock)
    assert isinstance(lim.admit(scope("/x", token="t")), Ticket)
    clock.now += 1.0
    shed = lim.admit(scope("/x", token="t"))
    assert isinstance(shed, Shed) and shed.retry_after == 3


def test_full_buckets_are_dropped_when_too_many_are_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(overload, "MAX_BUCKETS", 3)
    clock = Clock()
    lim = Limiter(Limits(rate=1.0, burst=5.0), clock=clock)
    for i in range(3):
        assert isinstance(lim.admit(scope("/x", token=f"old{i}")), Ticket)
    clock.now += 60.0
    assert isinstance(lim.admit(scope("/x", token="new")), Ticket)
    assert len(lim._buckets) == 1


def test_an_agent_path_with_a_person_s_token_is_a_person_s_request() -> None:
    roles = {"agt": "agent", "adm": "admin", "bob": "member"}
    lim = Limiter(Limits(), role_of=roles.get)
    for token, pool in [("agt", "agents"), ("adm", "agents"), ("bob", "people"), ("?", "people")]:
        ticket = lim.admit(scope("/v1/agents/n1/heartbeat", method="POST", token=token))
        assert isinstance(ticket, Ticket) and ticket.pool == pool, token
    basic = {**scope("/v1/agents/n1/heartbeat"), "headers": [(b"authorization", b"Basic agt")]}
    ticket = lim.admit(basic)
    assert isinstance(ticket, Ticket) and ticket.pool == "people"


def test_exempt_paths_and_long_polls_take_no_slot() -> None:
    lim = Limiter(Limits(per_caller=1, total=1))
    for path in sorted(overload.EXEMPT):
        assert lim.admit(scope(path, token="t")) is None
    assert lim.admit(scope("/v1/agents/n1/desired", query=b"wait=5", token="t")) is None
    assert lim.in_flight() == 0


def test_release_gives_back_both_the_caller_s_slot_and_the_pool_s() -> None:
    lim = Limiter(Limits(per_caller=2))
    tickets = [lim.admit(scope("/x", token="t")) for _ in range(2)]
    assert lim.in_flight() == 2
    for t in tickets:
        assert isinstance(t, Ticket)
        lim.release(t)
    assert lim.in_flight() == 0 and lim._counts == {}


class Recorder:
    def __init__(self) -> None:
        self.sent: list[Message] = []

    async def __call__(self, message: Message) -> None:
        self.sent.append(message)


async def _no_body() -> Message:
    raise AssertionError("the body was read")


def test_a_refusal_is_the_api_error_body_with_retry_after() -> None:
    out = Recorder()
    asyncio.run(overload.refuse(out, Shed(503, 4, "server", "busy. To fix: wait")))
    start, body = out.sent
    headers = dict(start["headers"])
    assert start["status"] == 503
    assert headers[b"retry-after"] == b"4"
    assert headers[b"content-type"] == b"application/json"
    assert int(headers[b"content-length"]) == len(body["body"])
    assert json.loads(body["body"]) == {"error": "busy. To fix: wait", "problems": []}


def test_the_middleware_refuses_without_reading_the_body_or_calling_the_app() -> None:
    called: list[str] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        called.append(scope["path"])
        await receive()

    lim = Limiter(Limits(per_caller=1))
    held = lim.admit(scope("/v1/jobs", token="t"))
    out = Recorder()
    asyncio.run(Overload(app, lim)(scope("/v1/jobs", method="POST", token="t"), _no_body, out))
    assert called == []
    assert out.sent[0]["status"] == 429
    assert isinstance(held, Ticket)


def test_the_middleware_passes_other_protocols_through_untouched() -> None:
    called: list[str] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        called.append(scope["type"])

    lim = Limiter(Limits(per_caller=1, total=1))
    lim.admit(scope("/x", token="t"))
    asyncio.run(Overload(app, lim)(scope("/ws", kind="websocket", token="t"), _no_body, Recorder()))
    assert called == ["websocket"]
    assert lim.in_flight() == 1


# -- headers --------------------------------------------------------------------------------


def test_raw_header_finds_the_first_value_and_none_when_absent() -> None:
    s: dict[str, Any] = {"headers": [(b"x-a", b"1"), (b"x-b", b"2"), (b"x-a", b"3")]}
    assert raw_header(s, b"x-a") == b"1"
    assert raw_header(s, b"x-c") is None
    assert raw_header(s, b"X-A") is None


def test_header_decodes_latin_1() -> None:
    s: dict[str, Any] = {"headers": [(b"x-name", "caf\u00e9".encode("latin-1"))]}
    assert header(s, b"x-name") == "caf\u00e9"
    assert header(s, b"x-none") is None


def _asgi(accept: bytes | None, kind: str = "http") -> Scope:
    headers = [] if accept is None else [(b"accept-encoding", accept)]
    return {"type": kind, "method": "GET", "path": "/", "headers": headers, "query_string": b""}


@pytest.mark.parametrize(
    ("accept", "gzipped"),
    [(b"gzip, deflate", True), (b"br;q=1, gzip;q=0.5", True), (b"identity", False), (None, False)],
)
def test_only_clients_asking_for_gzip_get_it(accept: bytes | None, gzipped: bool) -> None:
    big = b"x" * 5000

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": big})

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    out = Recorder()
    asyncio.run(AskedGZip(app, minimum_size=500)(_asgi(accept), receive, out))
    headers = dict(out.sent[0]["headers"])
    body = b"".join(m.get("body", b"") for m in out.sent[1:])
    assert (headers.get(b"content-encoding") == b"gzip") is gzipped
    assert (body == big) is not gzipped

"""The agent's HTTP client: what each reply means for the agent (``SessionLost``: register
again; ``Refused``: the request is wrong; ``Unreachable``: try later), which calls go on to the
next server address, what it sends (only fields that differ from their defaults), artifact
uploads, and the backoff between retries."""

from __future__ import annotations

import asyncio
import hashlib
import json
import ssl
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from boltforge.agent.client import (
    AgentClientError,
    Backoff,
    Refused,
    ServerClient,
    SessionLost,
    Unreachable,
    Untrusted,
)
from boltforge.wire.agent import (
    AgentReport,
    Heartbeat,
    Inventory,
    Registration,
    ReplicaEvent,
)

T = TypeVar("T")
Answer = Callable[[httpx.Request], httpx.Response]
LEASE = {"node": "host-0", "session": "s-1", "lease_s": 15.0, "heartbeat_s": 2.0}


class Server:
    """Stand-in replicas by host: each answers with its function (None refuses the
    connection); ``seen`` lists the requests in order."""

    def __init__(self, **answers: Answer | None) -> None:
        self.answers = answers
        self.seen: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.seen.append(request)
        answer = self.answers[request.url.host]
        if answer is None:
            raise httpx.ConnectError("connection refused", request=request)
        return answer(request)

    @property
    def hosts(self) -> list[str]:
        return [r.url.host for r in self.seen]


def reply(status: int, body: Any = None, text: str | None = None) -> Answer:
    if text is not None:
        return lambda _: httpx.Response(status, text=text)
    return lambda _: httpx.Response(status, json=body)


def on(server: Server, addresses: str = "http://a") -> ServerClient:
    return ServerClient(
        addresses, "agent-token", timeout_s=4.0, transport=httpx.MockTransport(server)
    )


def run(work: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(work)


def heartbeat(client: ServerClient, body: Heartbeat | None = None) -> Any:
    return run(client.heartbeat("host-0", body or Heartbeat(session="s-1"), 1.0))


# --- what each reply means ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("answer", "error", "text"),
    [
        pytest.param(
            reply(409, {"error": "unknown session"}), SessionLost, "unknown session", id="409"
        ),
        pytest.param(reply(500, {"error": "boom"}), Unreachable, "500 boom", id="500"),
        pytest.param(reply(503, {"error": "no leader"}), Unreachable, "503 no leader", id="503"),
        pytest.param(reply(408, {"error": "slow"}), Unreachable, "408 slow", id="408 timeout"),
        pytest.param(reply(429, {"error": "busy"}), Unreachable, "429 busy", id="429 shed"),
        pytest.param(
            reply(502, text="<html>bad gateway</html>"), Unreachable, "502 <html>", id="html"
        ),
        pytest.param(
            reply(401, {"error": "bad token", "problems": []}), Refused, "401 bad token", id="401"
        ),
        pytest.param(
            reply(422, {"error": "invalid body", "problems": ["gpus: too many", "name: bad"]}),
            Refused,
            "422 invalid body: gpus: too many; name: bad",
            id="422 with problems",
        ),
        pytest.param(
            reply(400, {"error": "odd", "problems": "one thing"}),
            Refused,
            "400 odd: one thing",
            id="problems not a list",
        ),
        pytest.param(
            reply(404, ["not", "a", "dict"]), Refused, "404 ['not', 'a', 'dict']", id="list"
        ),
        pytest.param(reply(403, text="forbidden"), Refused, "403 forbidden", id="plain text"),
        pytest.param(
            reply(200, {"node": "host-0"}), Unreachable, "unexpected reply", id="bad body"
        ),
        pytest.param(reply(200, text="not json"), Unreachable, "unexpected reply", id="not json"),
    ],
)
def test_each_reply_becomes_the_error_that_says_what_to_do(
    answer: Answer, error: type[AgentClientError], text: str
) -> None:
    with pytest.raises(AgentClientError) as caught:
        heartbeat(on(Server(a=answer)))
    assert type(caught.value) is error
    assert text in str(caught.value)


def test_a_refusal_keeps_its_status_error_and_problems() -> None:
    body = {"error": "invalid inventory", "problems": ["gpus: at most 64", 7]}
    with pytest.raises(Refused) as caught:
        heartbeat(on(Server(a=reply(422, body))))
    assert caught.value.status == 422
    assert caught.value.error == "invalid inventory"
    assert caught.value.problems == ["gpus: at most 64", "7"]


def test_a_good_reply_is_the_lease() -> None:
    lease = heartbeat(on(Server(a=reply(200, {**LEASE, "stop": ["j/w0"], "desired_version": 4}))))
    assert (lease.session, lease.stop, lease.desired_version) == ("s-1", ["j/w0"], 4)


def test_a_certificate_that_does_not_verify_is_untrusted_with_the_fix() -> None:
    def untrusted(request: httpx.Request) -> httpx.Response:
        cause = ssl.SSLCertVerificationError(1, "certificate verify failed")
        cause.verify_message = "unable to get local issuer certificate"
        raise httpx.ConnectError("handshake", request=request) from cause

    with pytest.raises(Untrusted) as caught:
        heartbeat(on(Server(a=untrusted), "https://a"))
    message = str(caught.value)
    assert message.startswith("POST /v1/agents/host-0/heartbeat: cannot verify the TLS")
    assert "https://a: unable to get local issuer certificate" in message
    assert "start the agent with --ca" in message and "BOLT_CA" in message
    assert isinstance(caught.value, Unreachable)  # retried like any unanswered call


def test_an_unanswered_call_names_the_call_and_the_error() -> None:
    with pytest.raises(Unreachable) as caught:
        heartbeat(on(Server(a=None)))
    assert type(caught.value) is Unreachable
    assert str(caught.value) == (
        "POST /v1/agents/host-0/heartbeat: ConnectError connection refused"
    )


# --- which calls go on to the next address --------------------------------------------------------


def test_a_call_that_never_connected_tries_every_address_once() -> None:
    server = Server(a=None, b=None, c=None)
    client = on(server, "http://a,http://b,http://c")
    with pytest.raises(Unreachable):
        heartbeat(client)
    assert server.hosts == ["a", "b", "c"]
    assert client.base_url == "http://a"  # round the list: the next call starts over


def test_a_connect_timeout_counts_as_never_delivered() -> None:
    def slow(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectTimeout("timed out connecting", request=request)

    server = Server(a=slow, b=reply(200, LEASE))
    client = on(server, "http://a,http://b")
    assert heartbeat(client).node == "host-0"
    assert server.hosts == ["a", "b"] and client.base_url == "http://b"


def test_a_replica_with_no_leader_sends_the_next_call_on_and_the_error_is_retryable() -> None:
    server = Server(a=reply(503, {"error": "no leader"}), b=reply(200, LEASE))
    client = on(server, "http://a,http://b")
    with pytest.raises(Unreachable):
        heartbeat(client)
    assert heartbeat(client).session == "s-1"
    assert server.hosts == ["a", "b"]


def test_other_errors_keep_the_address() -> None:
    server = Server(a=reply(500, {"error": "boom"}), b=reply(200, LEASE))
    client = on(server, "http://a,http://b")
    for _ in range(2):
        with pytest.raises(Unreachable):
            heartbeat(client)
    assert server.hosts == ["a", "a"] and client.base_url == "http://a"


# --- what goes on the wire ------------------------------------------------------------------------


def test_bodies_leave_out_what_equals_its_default() -> None:
    server = Server(a=reply(200, LEASE))
    client = on(server)
    inventory = Inventory(name="host-0", gpus=8, gpu="H100-80GB")
    run(client.register(Registration(inventory=inventory)))
    heartbeat(client, Heartbeat(session="s-1", leaving=True))
    register, beat = (json.loads(r.content) for r in server.seen)
    assert register == {"inventory": {"name": "host-0", "gpu": "H100-80GB", "gpus": 8}}
    assert beat == {"session": "s-1", "leaving": True}
    for request in server.seen:
        assert request.headers["authorization"] == "Bearer agent-token"
        assert request.headers["content-type"] == "application/json"


def test_the_long_poll_asks_since_a_version_and_waits_longer_than_the_server() -> None:
    state = {"node": "host 0", "version": 9, "replicas": []}
    server = Server(a=reply(200, state))
    got = run(on(server).desired("host 0", since=8, wait_s=25.0))
    [request] = server.seen
    assert got.version == 9
    assert request.method == "GET" and request.url.raw_path == (
        b"/v1/agents/host%200/desired?since=8&wait=25"
    )
    assert request.content == b"" and "content-type" not in request.headers
    timeout = request.extensions["timeout"]
    assert timeout["read"] == 29.0 and timeout["connect"] == 3.0  # wait + the client's timeout


def test_a_bridge_polls_every_nodes_changes_at_once() -> None:
    changes = {"seq": 12, "full": True, "nodes": [{"node": "n1", "version": 3}]}
    server = Server(a=reply(200, changes))
    got = run(on(server).desired_changes(since=-1, wait_s=0.5))
    assert got.full and [n.node for n in got.nodes] == ["n1"]
    assert server.seen[0].url.raw_path == b"/v1/agents/desired?since=-1&wait=0.5"


def test_a_bridge_heartbeats_many_nodes_in_one_call() -> None:
    answer = {"leases": {"n1": {**LEASE, "node": "n1"}}, "lost": ["n2"]}
    server = Server(a=reply(200, answer))
    beats = {"n1": Heartbeat(session="a"), "n2": Heartbeat(session="b")}
    got = run(on(server).heartbeats(beats, 5.0))
    assert got.lost == ["n2"] and got.leases["n1"].node == "n1"
    assert json.loads(server.seen[0].content) == {
        "beats": {"n1": {"session": "a"}, "n2": {"session": "b"}}
    }


def test_a_report_goes_to_the_nodes_report_endpoint() -> None:
    server = Server(a=reply(200, {"refused": ["j/w0"]}))
    event = ReplicaEvent(replica="j/w0", job="j", epoch=1, kind="started", at=1.5, pid=42)
    got = run(on(server).report("host-0", AgentReport(session="s-1", events=[event])))
    assert got.refused == ["j/w0"]
    request = server.seen[0]
    assert request.url.path == "/v1/agents/host-0/report"
    sent = json.loads(request.content)
    assert sent["events"] == [
        {"replica": "j/w0", "job": "j", "epoch": 1, "kind": "started", "at": 1.5, "pid": 42}
    ]


# --- artifact uploads ---------------------------------------------------------------------------


def upload(server: Server, path: Path, name: str = "out/model.bin") -> None:
    sha = hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else "0" * 64
    run(on(server).upload_artifact("host-0", "j-1/w 0", name, path, sha))


def test_an_artifact_is_streamed_whole_with_its_checksum(tmp_path: Path) -> None:
    data = bytes(range(256)) * 5000  # over one read chunk
    path = tmp_path / "model.bin"
    path.write_bytes(data)
    server = Server(a=reply(201, {}))
    upload(server, path, "out/model weights.bin")
    [request] = server.seen
    assert request.method == "PUT"
    assert request.url.raw_path == (
        b"/v1/agents/host-0/artifacts/j-1%2Fw%200/out/model%20weights.bin"
    )
    assert request.headers["x-sha256"] == hashlib.sha256(data).hexdigest()
    assert request.headers["content-type"] == "application/octet-stream"
    assert request.content == data


@pytest.mark.parametrize(
    ("answer", "error"),
    [
        pytest.param(reply(500, text="disk full"), Unreachable, id="server error: try later"),
        pytest.param(reply(503, text="no leader"), Unreachable, id="no leader: try later"),
        pytest.param(reply(400, text="checksum mismatch"), Refused, id="bad upload: never"),
        pytest.param(reply(404, text="no such replica"), Refused, id="unknown replica: never"),
        pytest.param(None, Unreachable, id="refused connection: try later"),
    ],
)
def test_an_upload_the_server_did_not_keep_says_whether_to_try_again(
    tmp_path: Path, answer: Answer | None, error: type[AgentClientError]
) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"x")
    with pytest.raises(AgentClientError) as caught:
        upload(Server(a=answer), path)
    assert type(caught.value) is error


def test_a_refused_upload_carries_what_the_server_said(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"x")
    with pytest.raises(Refused) as caught:
        upload(Server(a=reply(413, text="too large " * 100)), path)
    assert caught.value.status == 413
    assert caught.value.error.startswith("too large") and len(caught.value.error) == 300


def test_an_upload_of_a_file_that_is_gone_is_left_for_later(tmp_path: Path) -> None:
    server = Server(a=reply(201, {}))
    with pytest.raises(Unreachable, match="artifact upload"):
        upload(server, tmp_path / "vanished")
    assert server.seen == []


# --- backoff --------------------------------------------------------------------------------------


def test_backoff_doubles_up_to_its_cap_and_starts_over_on_reset() -> None:
    backoff = Backoff(first_s=1.0, max_s=5.0)
    delays = [backoff.next() for _ in range(6)]
    for delay, nominal in zip(delays, [1, 2, 4, 5, 5, 5], strict=True):
        assert 0.8 * nominal <= delay <= 1.2 * nominal
    backoff.reset()
    assert 0.8 <= backoff.next() <= 1.2


@settings(max_examples=50, deadline=None)
@given(st.floats(0.01, 5.0), st.floats(0.01, 60.0), st.integers(1, 30))
def test_a_backoff_delay_never_passes_its_cap_plus_jitter(
    first: float, cap: float, calls: int
) -> None:
    backoff = Backoff(first_s=first, max_s=cap)
    delays = [backoff.next() for _ in range(calls)]
    assert all(0 < d <= 1.2 * max(first, cap) for d in delays)
    assert delays[0] <= 1.2 * first

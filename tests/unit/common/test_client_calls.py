"""The Python client of the HTTP API as its callers rely on it: where the server and token come
from, which calls go to the next of several addresses and which are never sent twice, waiting
out a server that shed a call, the errors a user reads (with their fix), and what each call
puts on the wire."""

from __future__ import annotations

import json
import ssl
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import boltforge.client as client_module
from boltforge.addresses import CONNECT_S, Addresses
from boltforge.client import (
    DEFAULT_SERVER,
    MAX_RETRY_AFTER_S,
    ApiFailure,
    Client,
    config_path,
    resolve,
    retry_after,
)
from boltforge.wire.jobs import SubmitRequest, TokenRequest

WHOAMI = {"name": "ci", "role": "admin", "team": None}
Answer = Callable[[httpx.Request], httpx.Response]


class Servers:
    """Stand-in servers by host name: each answers with its function (None refuses the
    connection). ``seen`` lists every request in the order it arrived."""

    def __init__(self, **answers: Answer | None) -> None:
        self.answers = answers
        self.seen: list[httpx.Request] = []

    @property
    def hosts(self) -> list[str]:
        return [r.url.host for r in self.seen]

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.seen.append(request)
        answer = self.answers[request.url.host]
        if answer is None:
            raise httpx.ConnectError("connection refused", request=request)
        return answer(request)


def ok(body: Any = WHOAMI, status: int = 200) -> Answer:
    return lambda _: httpx.Response(status, json=body)


def raises(error: type[httpx.TransportError]) -> Answer:
    def answer(request: httpx.Request) -> httpx.Response:
        raise error("gone mid-call", request=request)

    return answer


def shed(status: int = 429, retry: str = "0") -> Answer:
    body = {"error": "too many requests in flight", "problems": []}
    return lambda _: httpx.Response(status, headers={"Retry-After": retry}, json=body)


def connect(servers: Servers, addresses: str, token: str | None = "tok") -> Client:
    """A ``Client`` for ``addresses`` whose requests reach ``servers``."""
    c = Client(addresses, token)
    headers, timeout = c.http.headers, c.http.timeout
    c.http.close()
    c.http = httpx.Client(
        base_url=c.server, headers=headers, timeout=timeout, transport=httpx.MockTransport(servers)
    )
    return c


@pytest.fixture(autouse=True)
def no_waiting(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The client's sleeps are recorded, never slept; its clock moves on by what it would
    have slept."""
    waits: list[float] = []
    clock = SimpleNamespace(sleep=waits.append, monotonic=lambda: sum(waits))
    monkeypatch.setattr(client_module, "time", clock)
    return waits


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No BOLT_* variables; what ``bolt up`` saves goes under ``tmp_path``."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    for name in ("BOLT_SERVER", "BOLT_TOKEN", "BOLT_CA"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path


def saved(text: str) -> None:
    path = config_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


# --- where the server and token come from ---------------------------------------------------


def test_without_anything_given_the_client_goes_to_the_local_default(env: Path) -> None:
    assert resolve(None, None) == (DEFAULT_SERVER, None)


def test_arguments_beat_the_environment_which_beats_what_bolt_up_saved(
    env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    saved(json.dumps({"server": "http://saved:1/", "token": "saved-token"}))
    assert resolve(None, None) == ("http://saved:1", "saved-token")
    monkeypatch.setenv("BOLT_SERVER", "http://env:2")
    monkeypatch.setenv("BOLT_TOKEN", "env-token")
    assert resolve(None, None) == ("http://env:2", "env-token")
    assert resolve("http://arg:3///", "arg-token") == ("http://arg:3", "arg-token")


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("{not json", id="not JSON"),
        pytest.param('["http://a:1", "tok"]', id="a list, not an object"),
        pytest.param("", id="empty"),
    ],
)
def test_a_saved_file_that_is_not_a_json_object_is_ignored(env: Path, text: str) -> None:
    saved(text)
    assert resolve(None, None) == (DEFAULT_SERVER, None)


def test_a_client_needs_at_least_one_address() -> None:
    with pytest.raises(ValueError, match="no server address"):
        Client(" ,, ", "tok")


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 9999), min_size=1, max_size=6, unique=True), st.integers(0, 20))
def test_addresses_are_visited_in_turn_and_round_the_list(ports: list[int], steps: int) -> None:
    given_ = Addresses(",".join(f"http://h:{p}/" for p in ports))
    visited = [given_.current] + [given_.advance() for _ in range(steps)]
    assert visited == [f"http://h:{ports[i % len(ports)]}" for i in range(steps + 1)]
    assert len(given_) == len(ports)


# --- which calls go to the next address -----------------------------------------------------


def test_undelivered_calls_go_on_through_every_address_and_stay_with_the_one_that_answers() -> None:
    servers = Servers(a=None, b=None, c=ok())
    with connect(servers, "http://a,http://b,http://c") as c:
        assert c.whoami().name == "ci"
        assert c.server == "http://c"
        c.whoami()
    assert servers.hosts == ["a", "b", "c", "c"]


def test_going_on_past_the_last_address_starts_again_at_the_first() -> None:
    answers: dict[str, Answer | None] = {"a": None, "b": ok()}
    servers = Servers(**answers)
    with connect(servers, "http://a,http://b") as c:
        c.whoami()
        servers.answers.update(a=ok(), b=None)
        c.whoami()
        assert c.server == "http://a"
    assert servers.hosts == ["a", "b", "b", "a"]


def test_a_write_that_never_connected_is_sent_to_the_next_address() -> None:
    servers = Servers(a=raises(httpx.ConnectTimeout), b=ok({"jobs": []}))
    with connect(servers, "http://a,http://b") as c:
        assert c.cancel("7").jobs == []
    assert [(r.url.host, r.method, r.url.path) for r in servers.seen] == [
        ("a", "POST", "/v1/jobs/7/cancel"),
        ("b", "POST", "/v1/jobs/7/cancel"),
    ]


@pytest.mark.parametrize(
    "error", [httpx.ReadTimeout, httpx.ReadError, httpx.RemoteProtocolError, httpx.WriteError]
)
def test_a_write_without_a_key_that_may_have_arrived_is_never_sent_again(
    error: type[httpx.TransportError],
) -> None:
    servers = Servers(a=raises(error), b=ok({}))
    with connect(servers, "http://a,http://b") as c, pytest.raises(ApiFailure) as failed:
        c.drain("host-0")
    assert servers.hosts == ["a"]
    assert failed.value.status == 0 and "http://a" in failed.value.message


@pytest.mark.parametrize("error", [httpx.ReadTimeout, httpx.RemoteProtocolError])
def test_a_read_cut_off_mid_way_goes_to_the_next_address(
    error: type[httpx.TransportError],
) -> None:
    servers = Servers(a=raises(error), b=ok({"nodes": []}))
    with connect(servers, "http://a,http://b") as c:
        assert c.nodes().nodes == []
    assert servers.hosts == ["a", "b"]


def test_a_token_request_cut_off_mid_way_is_not_sent_twice() -> None:
    servers = Servers(a=raises(httpx.ReadTimeout), b=ok({}))
    request = TokenRequest.model_validate({"name": "ci", "role": "member", "team": "nlp"})
    with connect(servers, "http://a,http://b") as c, pytest.raises(ApiFailure):
        c.create_token(request)
    assert servers.hosts == ["a"]


def test_a_single_address_that_has_no_leader_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(client_module, "RETRIES", 0)
    servers = Servers(a=ok({"error": "no replica leads yet", "problems": []}, status=503))
    with connect(servers, "http://a") as c:
        with pytest.raises(ApiFailure) as failed:
            c.whoami()
        assert c.server == "http://a"
    assert failed.value.status == 503 and failed.value.message == "no replica leads yet"


def test_a_shed_call_at_a_replica_without_a_leader_is_sent_again_to_the_next(
    no_waiting: list[float],
) -> None:
    servers = Servers(a=shed(503, "0"), b=ok())
    with connect(servers, "http://a,http://b") as c:
        assert c.whoami().name == "ci"
    assert servers.hosts == ["a", "b"]
    assert no_waiting == [0.0]


def test_a_shed_write_is_sent_again_since_the_server_did_not_act_on_it(
    no_waiting: list[float],
) -> None:
    replies = iter([shed(429, "1"), shed(429, "2"), ok({"jobs": []})])
    servers = Servers(a=lambda request: next(replies)(request))
    with connect(servers, "http://a") as c:
        assert c.cancel("9").jobs == []
    assert [r.method for r in servers.seen] == ["POST"] * 3
    assert len(no_waiting) == 2
    assert 1.0 <= no_waiting[0] <= 1.25 and 2.0 <= no_waiting[1] <= 2.5  # spread by jitter


# --- how long a shed call waits ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "header", "wait"),
    [
        pytest.param(429, "2", 2.0, id="seconds"),
        pytest.param(503, "0.5", 0.5, id="a fraction"),
        pytest.param(429, "0", 0.0, id="at once"),
        pytest.param(429, "-3", 0.0, id="negative means at once"),
        pytest.param(429, str(MAX_RETRY_AFTER_S), MAX_RETRY_AFTER_S, id="the longest honoured"),
        pytest.param(429, str(MAX_RETRY_AFTER_S + 0.5), None, id="too long to wait out"),
        pytest.param(429, "Wed, 21 Oct 2037 07:28:00 GMT", None, id="a date"),
        pytest.param(429, None, None, id="no header"),
        pytest.param(500, "1", None, id="another error"),
        pytest.param(200, "1", None, id="a success"),
    ],
)
def test_retry_after_is_honoured_only_for_a_shed_call_in_seconds(
    status: int, header: str | None, wait: float | None
) -> None:
    headers = {"Retry-After": header} if header is not None else {}
    assert retry_after(httpx.Response(status, headers=headers)) == wait


# --- the errors a user reads ----------------------------------------------------------------


def test_a_refusal_carries_the_servers_message_and_each_problem() -> None:
    body = {
        "error": "invalid job spec",
        "problems": [{"field": "job.gpus", "value": 0, "message": "must be at least 1"}],
    }
    with connect(Servers(a=ok(body, status=422)), "http://a") as c, pytest.raises(ApiFailure) as e:
        c.submit(SubmitRequest(yaml="name: x\n"))
    assert e.value.status == 422
    assert e.value.message == str(e.value) == "invalid job spec"
    [problem] = e.value.problems
    assert (problem.field, problem.value, problem.message) == ("job.gpus", 0, "must be at least 1")


@pytest.mark.parametrize(
    ("reply", "message"),
    [
        pytest.param(httpx.Response(502, text="Bad Gateway"), "Bad Gateway", id="plain text"),
        pytest.param(httpx.Response(502), "HTTP 502", id="no body"),
        pytest.param(httpx.Response(404, text="x" * 900), "x" * 500, id="long text is cut"),
        pytest.param(httpx.Response(400, json={"detail": "no"}), "{'detail': 'no'}", id="no error"),
    ],
)
def test_a_refusal_without_the_usual_body_still_says_something(
    reply: httpx.Response, message: str
) -> None:
    with connect(Servers(a=lambda _: reply), "http://a") as c, pytest.raises(ApiFailure) as e:
        c.job("1")
    assert (e.value.status, e.value.message, e.value.problems) == (reply.status_code, message, [])


def test_every_address_refusing_names_the_last_and_how_to_start_a_server() -> None:
    with connect(Servers(a=None, b=None), "http://a,http://b") as c, pytest.raises(ApiFailure) as e:
        c.fleet()
    assert e.value.status == 0
    assert e.value.message.startswith("cannot reach http://b: ")
    assert "`bolt up` or `bolt server`, or set BOLT_SERVER" in e.value.message


def test_a_certificate_that_does_not_verify_says_to_pass_the_ca() -> None:
    def untrusted(request: httpx.Request) -> httpx.Response:
        cause = ssl.SSLCertVerificationError(1, "certificate verify failed")
        cause.verify_message = "self-signed certificate in certificate chain"
        raise httpx.ConnectError("handshake failed", request=request) from cause

    with connect(Servers(a=untrusted), "https://a") as c, pytest.raises(ApiFailure) as e:
        c.whoami()
    assert e.value.status == 0
    assert e.value.message == (
        "cannot verify the TLS certificate of https://a: self-signed certificate in "
        "certificate chain. To fix: pass --ca with the CA certificate that signed it "
        "(or set BOLT_CA)"
    )


@pytest.mark.parametrize(
    ("address", "advice"),
    [
        pytest.param("http://a", "use an https:// URL in --server or BOLT_SERVER", id="http"),
        pytest.param("https://a", "start it with `bolt up`", id="https"),
    ],
)
def test_a_server_that_hangs_up_on_plain_http_may_serve_https(address: str, advice: str) -> None:
    hung_up = raises(httpx.RemoteProtocolError)
    with connect(Servers(a=hung_up), address) as c, pytest.raises(ApiFailure) as e:
        c.cordon("host-0")
    assert advice in e.value.message and "gone mid-call" in e.value.message


# --- what goes on the wire ------------------------------------------------------------------


def test_the_token_is_sent_as_a_bearer_and_no_token_sends_none() -> None:
    servers = Servers(a=ok())
    with connect(servers, "http://a", token="s3cret") as c:
        c.whoami()
    with connect(servers, "http://a", token=None) as c:
        c.whoami()
    assert servers.seen[0].headers["authorization"] == "Bearer s3cret"
    assert "authorization" not in servers.seen[1].headers


def test_each_submission_gets_a_fresh_key_unless_one_is_given() -> None:
    reply = {
        "job": {
            "id": "j-1",
            "name": "x",
            "team": "nlp",
            "priority": 50,
            "priority_name": "normal",
            "state": "pending",
            "gpus": 8,
            "replicas": 1,
            "submitted_at": 1.0,
        }
    }
    servers = Servers(a=ok(reply))
    request = SubmitRequest(yaml="name: x\n", gpus="8xH100")
    with connect(servers, "http://a") as c:
        assert c.submit(request).job.id == "j-1"
        c.submit(request)
        c.submit(request, idempotency_key="mine-1")
    keys = [r.headers["idempotency-key"] for r in servers.seen]
    assert keys[0] != keys[1] and keys[2] == "mine-1"
    assert all(k.startswith("bolt-") and len(k) == 37 for k in keys[:2])
    # fields left unset are not sent: the server applies its own defaults
    assert json.loads(servers.seen[0].content) == {
        "yaml": "name: x\n",
        "gpus": "8xH100",
        "source": "job",
    }


NODE = {
    "name": "h/1",
    "pool": "p",
    "gpu": "H100",
    "gpus": 8,
    "gpus_used": 0,
    "pod": "p0",
    "rack": "r0",
    "state": "cordoned",
}


def node_calls(request: httpx.Request) -> httpx.Response:
    if request.url.path.endswith("/reclaim"):
        return httpx.Response(200, json={"node": NODE, "reclaim_at": 500.0, "jobs": []})
    return httpx.Response(200, json=NODE)


def test_node_names_are_one_path_segment_and_reclaim_sends_its_notice() -> None:
    servers = Servers(a=node_calls)
    with connect(servers, "http://a") as c:
        assert c.cordon("h/1").state == "cordoned"
        c.uncordon("h 1")
        c.drain("h?1")
        assert c.reclaim("h/1", 90).reclaim_at == 500.0
    paths = [(r.method, r.url.raw_path.decode()) for r in servers.seen]
    assert paths == [
        ("POST", "/v1/nodes/h%2F1/cordon"),
        ("POST", "/v1/nodes/h%201/uncordon"),
        ("POST", "/v1/nodes/h%3F1/drain"),
        ("POST", "/v1/nodes/h%2F1/reclaim"),
    ]
    assert json.loads(servers.seen[-1].content) == {"in_s": 90}


def test_listing_jobs_sends_only_the_filters_given() -> None:
    servers = Servers(a=ok({"jobs": []}))
    with connect(servers, "http://a") as c:
        c.jobs()
        c.jobs(state="running")
        c.jobs(team="nlp", state="pending")
    assert [dict(r.url.params) for r in servers.seen] == [
        {},
        {"state": "running"},
        {"state": "pending", "team": "nlp"},
    ]


def test_long_polls_wait_ten_seconds_longer_than_they_asked_the_server_to() -> None:
    page = {"job": "j-1", "state": "running", "events": [], "next": 5, "lines": [], "jobs": []}
    servers = Servers(a=ok(page))
    with connect(servers, "http://a") as c:
        assert c.events("j-1", after=5, wait=20.0).events == []
        assert c.logs("j-1", after=5, wait=20.0).next == 5
        c.jobs()
    polls, plain = servers.seen[:2], servers.seen[2]
    assert [r.url.path for r in polls] == ["/v1/jobs/j-1/events", "/v1/jobs/j-1/logs"]
    for request in polls:
        assert dict(request.url.params) == {"after": "5", "wait": "20.0"}
        timeout = request.extensions["timeout"]
        assert timeout["read"] == 30.0 and timeout["connect"] == CONNECT_S
    assert plain.extensions["timeout"]["read"] == 30.0  # the client's own default


def test_cost_asks_for_its_grouping_and_period() -> None:
    servers = Servers(a=ok({}, status=500))
    with connect(servers, "http://a") as c, pytest.raises(ApiFailure):
        c.cost(by="project", since="7d")
    assert dict(servers.seen[0].url.params) == {"by": "project", "since": "7d"}


# --- artifacts and health -----------------------------------------------------------------


def test_an_artifact_arrives_in_the_chunks_the_server_sent() -> None:
    def chunks(_: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=iter([b"abc", b"def", b"g"]))

    servers = Servers(a=chunks)
    with connect(servers, "http://a") as c:
        got = list(c.download_artifact("j-1", "out/model weights.bin"))
    assert got == [b"abc", b"def", b"g"]
    assert servers.seen[0].url.raw_path == b"/v1/jobs/j-1/artifacts/out/model%20weights.bin"


def test_a_jobs_artifacts_are_listed_by_name_with_their_checksums() -> None:
    kept = {
        "name": "0/out/model.bin",
        "size": 7,
        "sha256": "ab" * 32,
        "replica": "j-1.1.0",
        "epoch": 1,
        "at": 5.0,
    }
    servers = Servers(a=ok({"job": "j-1", "artifacts": [kept]}))
    with connect(servers, "http://a") as c:
        listed = c.artifacts("j-1")
    assert [(a.name, a.size, a.epoch) for a in listed.artifacts] == [("0/out/model.bin", 7, 1)]
    assert (servers.seen[0].method, servers.seen[0].url.path) == ("GET", "/v1/jobs/j-1/artifacts")


def test_a_missing_artifact_is_a_refusal_with_the_servers_message() -> None:
    gone = ok({"error": "no artifact out/x of job j-1", "problems": []}, status=404)
    with connect(Servers(a=gone), "http://a") as c, pytest.raises(ApiFailure) as e:
        list(c.download_artifact("j-1", "out/x"))
    assert (e.value.status, e.value.message) == (404, "no artifact out/x of job j-1")


def test_an_artifact_from_a_server_that_is_not_there_says_so() -> None:
    with connect(Servers(a=None), "http://a") as c, pytest.raises(ApiFailure) as e:
        list(c.download_artifact("j-1", "out/x"))
    assert e.value.status == 0 and e.value.message.startswith("cannot reach http://a")


@pytest.mark.parametrize(
    ("answer", "healthy"),
    [
        pytest.param(ok({}), True, id="200"),
        pytest.param(ok({}, status=503), False, id="503"),
        pytest.param(None, False, id="refused"),
        pytest.param(raises(httpx.ReadTimeout), False, id="timed out"),
    ],
)
def test_healthy_is_a_yes_or_no_and_never_raises(answer: Answer | None, healthy: bool) -> None:
    servers = Servers(a=answer)
    with connect(servers, "http://a") as c:
        assert c.healthy() is healthy
    assert [r.url.path for r in servers.seen] == ["/healthz"]

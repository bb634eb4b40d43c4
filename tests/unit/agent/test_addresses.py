"""Clients given several replicas' addresses: a call that could not be delivered goes to
the next address at once, as does one cut off mid-way that is safe to repeat (a read, a
submission with its idempotency key); a replica with no leader behind it (503) sends the
next call on; a write that may have arrived and has no key is never sent twice."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping

import httpx
import pytest

from boltforge.addresses import Addresses
from boltforge.agent.client import ServerClient, Unreachable
from boltforge.client import ApiFailure, Client
from boltforge.wire.agent import Heartbeat, Lease
from boltforge.wire.jobs import SubmitRequest

WHOAMI = {"name": "a", "role": "admin", "team": None}
LEASE = {"node": "n", "session": "s", "lease_s": 15, "heartbeat_s": 2}


class Replicas:
    """Stand-in replicas by host: each answers with its function, or refuses connections
    (None). ``calls`` lists the hosts in the order they were called."""

    def __init__(self, answers: dict[str, Callable[[httpx.Request], httpx.Response] | None]):
        self.answers, self.calls = answers, list[str]()

    def __call__(self, request: httpx.Request) -> httpx.Response:
        host = request.url.host
        self.calls.append(host)
        answer = self.answers[host]
        if answer is None:
            raise httpx.ConnectError("connection refused", request=request)
        return answer(request)


def ok(body: Mapping[str, object]) -> Callable[[httpx.Request], httpx.Response]:
    return lambda _: httpx.Response(200, json=body)


def no_leader(_: httpx.Request) -> httpx.Response:
    return httpx.Response(503, json={"error": "no replica leads yet", "problems": []})


def cut_mid_call(request: httpx.Request) -> httpx.Response:
    raise httpx.ReadError("connection reset", request=request)


def client_on(replicas: Replicas, servers: str) -> Client:
    c = Client(servers, "tok")
    c.http.close()
    c.http = httpx.Client(base_url=c.server, transport=httpx.MockTransport(replicas))
    return c


def agent_client_on(replicas: Replicas, servers: str) -> ServerClient:
    return ServerClient(servers, "tok", transport=httpx.MockTransport(replicas))


def heartbeat(c: ServerClient) -> Lease:
    return asyncio.run(c.heartbeat("n", Heartbeat(session="s"), 1.0))


def test_addresses_are_read_from_a_comma_separated_list() -> None:
    given = Addresses(" http://a:1/, http://b:2 ,,")
    assert given.all == ["http://a:1", "http://b:2"]
    assert given.current == "http://a:1"
    assert given.advance() == "http://b:2"
    assert given.advance() == "http://a:1"
    with pytest.raises(ValueError, match="no server address"):
        Addresses(" , ")


def test_the_cli_client_sends_an_undelivered_call_to_the_next_replica() -> None:
    replicas = Replicas({"a": None, "b": ok(WHOAMI)})
    with client_on(replicas, "http://a,http://b") as c:
        assert c.whoami().name == "a"
        assert c.whoami().name == "a"
    assert replicas.calls == ["a", "b", "b"]  # and stays with the one that answered


def test_the_cli_client_fails_once_every_replica_refused() -> None:
    replicas = Replicas({"a": None, "b": None})
    with client_on(replicas, "http://a,http://b") as c, pytest.raises(ApiFailure) as e:
        c.whoami()
    assert e.value.status == 0
    assert replicas.calls == ["a", "b"]


def test_the_cli_client_sends_a_read_cut_off_mid_way_to_the_next_replica() -> None:
    replicas = Replicas({"a": cut_mid_call, "b": ok(WHOAMI)})
    with client_on(replicas, "http://a,http://b") as c:
        assert c.whoami().name == "a"
    assert replicas.calls == ["a", "b"]


def test_a_submission_cut_off_mid_way_is_sent_again_with_the_same_key() -> None:
    keys: list[str] = []

    def answered(request: httpx.Request) -> httpx.Response:  # any answer will do
        keys.append(request.headers["idempotency-key"])
        return httpx.Response(422, json={"error": "no such team", "problems": []})

    def cut(request: httpx.Request) -> httpx.Response:
        keys.append(request.headers["idempotency-key"])
        return cut_mid_call(request)

    replicas = Replicas({"a": cut, "b": answered})
    with client_on(replicas, "http://a,http://b") as c, pytest.raises(ApiFailure) as e:
        c.submit(SubmitRequest.model_validate({"spec": {"name": "x", "gpus": 8}}))
    assert e.value.status == 422
    assert replicas.calls == ["a", "b"]
    assert len(keys) == 2 and keys[0] == keys[1]  # the server makes the job once


def test_a_write_without_a_key_cut_off_mid_way_is_never_sent_twice() -> None:
    replicas = Replicas({"a": cut_mid_call, "b": ok({})})
    with client_on(replicas, "http://a,http://b") as c, pytest.raises(ApiFailure):
        c.cancel("7")
    assert replicas.calls == ["a"]


def test_a_replica_with_no_leader_sends_the_next_call_to_the_next_replica(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("boltforge.client.RETRIES", 0)
    replicas = Replicas({"a": no_leader, "b": ok(WHOAMI)})
    with client_on(replicas, "http://a,http://b") as c:
        with pytest.raises(ApiFailure) as e:
            c.whoami()
        assert e.value.status == 503
        assert c.whoami().name == "a"
    assert replicas.calls == ["a", "b"]


def test_an_agent_keeps_its_lease_through_a_replica_that_refuses() -> None:
    replicas = Replicas({"a": None, "b": ok(LEASE)})
    c = agent_client_on(replicas, "http://a,http://b")
    assert heartbeat(c).session == "s"
    assert c.base_url == "http://b"
    assert replicas.calls == ["a", "b"]


def test_an_agent_call_cut_mid_way_is_not_sent_again_but_the_next_goes_on() -> None:
    replicas = Replicas({"a": cut_mid_call, "b": ok(LEASE)})
    c = agent_client_on(replicas, "http://a,http://b")
    with pytest.raises(Unreachable):
        heartbeat(c)
    assert replicas.calls == ["a"]
    heartbeat(c)
    assert replicas.calls == ["a", "b"]

"""An agent's report that the server refuses because its store is away (503 with a ``store``
body and ``Retry-After``) is sent again in place, after the wait the server asked for, so it
lands as soon as the store is back; any other 503 stays an ``Unreachable`` at once, and so
does a store that stays away past ``STORE_WAIT_S``."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import httpx
import pytest

from boltforge.agent import client as agent_client
from boltforge.agent.client import ServerClient, StoreAway, Unreachable
from boltforge.wire.agent import AgentReport

AWAY = {"error": "the store is unavailable since ...", "problems": [], "store": {}}


def server(replies: list[httpx.Response]) -> tuple[ServerClient, list[httpx.Request]]:
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return replies.pop(0) if len(replies) > 1 else replies[0]

    transport = httpx.MockTransport(answer)
    return ServerClient("http://a", "agent-token", timeout_s=4.0, transport=transport), seen


def away() -> httpx.Response:
    return httpx.Response(503, json=AWAY, headers={"Retry-After": "0"})


def report(client: ServerClient) -> Callable[[], object]:
    return lambda: asyncio.run(client.report("host-0", AgentReport(session="s-1")))


def test_a_report_waits_out_the_store_and_lands_when_it_is_back() -> None:
    client, seen = server([away(), away(), httpx.Response(200, json={"refused": []})])
    assert report(client)() is not None
    assert len(seen) == 3


def test_a_503_for_anything_else_is_unreachable_at_once() -> None:
    shed = httpx.Response(
        503, json={"error": "too many", "problems": []}, headers={"Retry-After": "1"}
    )
    client, seen = server([shed])
    with pytest.raises(Unreachable) as raised:
        report(client)()
    assert not isinstance(raised.value, StoreAway)
    assert len(seen) == 1


def test_a_store_away_for_too_long_is_unreachable_in_the_end(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(agent_client, "STORE_WAIT_S", 0.5)
    client, seen = server([away()])
    with pytest.raises(StoreAway):
        report(client)()
    assert 2 <= len(seen) <= 6

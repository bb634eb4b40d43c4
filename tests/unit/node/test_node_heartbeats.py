"""Batched heartbeats on their own: one call for every lease, each listing what its node
runs only when that changed (and for every node every ``full_every_s``)."""

from __future__ import annotations

import asyncio
from typing import cast

from boltforge.node.follower import Heartbeats, NodeServer
from boltforge.wire.agent import Heartbeat, HeartbeatsReply, Lease, ReplicaStatus


class Beats:
    """The server's batched heartbeat: renews every lease, remembering what was sent."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Heartbeat]] = []

    async def heartbeats(self, beats: dict[str, Heartbeat], timeout_s: float) -> HeartbeatsReply:
        self.sent.append(beats)
        return HeartbeatsReply(leases={n: lease(n, b.session) for n, b in beats.items()})


def lease(node: str, session: str) -> Lease:
    return Lease(node=node, session=session, lease_s=15, heartbeat_s=5)


def running(node: str) -> list[ReplicaStatus]:
    return [ReplicaStatus(replica=f"{node}.r", job="j", epoch=1, state="running")]


def renew(hb: Heartbeats, leases: dict[str, Lease], changed: set[str], now: float) -> None:
    asyncio.run(hb.renew(leases, running, changed, now))


def listed(server: Beats) -> dict[str, int]:
    return {node: len(beat.running) for node, beat in server.sent[-1].items()}


def test_every_lease_is_renewed_in_one_call_listing_only_what_changed() -> None:
    server = Beats()
    hb = Heartbeats(cast(NodeServer, server), full_every_s=30.0)
    leases = {n: lease(n, f"s-{n}") for n in ("a", "b")}
    renew(hb, leases, set(), now=0.0)
    assert listed(server) == {"a": 1, "b": 1}  # the first lists everything
    assert not hb.due(leases, 4.9) and hb.due(leases, 5.0)
    renew(hb, leases, {"b"}, now=5.0)
    assert listed(server) == {"a": 0, "b": 1}
    renew(hb, leases, set(), now=30.0)
    assert listed(server) == {"a": 1, "b": 1}  # every 30 s, all of it again
    assert len(server.sent) == 3


def test_with_no_lease_nothing_is_sent_and_nothing_is_due() -> None:
    server = Beats()
    hb = Heartbeats(cast(NodeServer, server))
    renew(hb, {}, set(), now=0.0)
    assert server.sent == [] and not hb.due({}, 100.0)

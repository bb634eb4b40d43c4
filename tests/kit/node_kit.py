"""A node backend that runs replicas in memory (``MemoryNodes``), and the agent protocol of
the real server app in-process (``agent_client``): with them, ``tests/unit/node`` proves the
node-side contract (``boltforge.node``) on its own, against the server every backend talks
to."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field

import httpx
from control_kit import Fleet

from boltforge.agent.client import ServerClient, Unreachable
from boltforge.node.driver import DriverServer
from boltforge.wire.agent import (
    AgentReport,
    DesiredChanges,
    Heartbeat,
    HeartbeatsReply,
    Inventory,
    Lease,
    Registration,
    ReplicaEvent,
    ReplicaSpec,
    ReplicaStatus,
    ReportsReply,
)


class Relay(httpx.AsyncBaseTransport):
    """Hands each request to the fleet's test client (which runs the server app on a loop
    of its own) from a worker thread, so a ``ServerClient`` talks to the real app."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        body = await request.aread()
        path = request.url.raw_path.decode()
        headers = dict(request.headers)
        reply = await asyncio.to_thread(
            self.fleet.http.request, request.method, path, content=body, headers=headers
        )
        return httpx.Response(reply.status_code, headers=reply.headers, content=reply.content)


def agent_client(fleet: Fleet) -> ServerClient:
    """A client of the fleet's agent protocol, with its agent token."""
    return ServerClient("http://server", "agt", transport=Relay(fleet))


def inventory(name: str, rack: str = "r0", gpus: int = 8) -> Inventory:
    """An 8-GPU H100 node of pool ``h100``, as the fleet's own stand-ins are."""
    return Inventory.model_validate(
        {
            "name": name,
            "pool": "h100",
            "gpu": "H100-80GB",
            "gpu_memory_gb": 80,
            "gpus": gpus,
            "nvlink_island": 8,
            "cpus": 64,
            "memory_gb": 512,
            "pod": "p0",
            "rack": rack,
        }
    )


@dataclass
class Held:
    """A replica a memory node runs: its spec, whether it is up, and what was asked of it."""

    spec: ReplicaSpec
    up: bool = False
    stop_grace: float | None = None
    stopping: bool = False
    ended: bool = False  # its end is yet to be handed out by ``observe``
    signals: list[int] = field(default_factory=list)


class MemoryNodes:
    """A ``NodeBackend`` whose replicas live in memory and do only what the test says:
    ``up`` (a replica is running), ``exit`` (it ended with a code), ``checkpointed`` (a
    stopping replica exited after its checkpoint). ``asked`` records every call, in order."""

    def __init__(self, *names: str) -> None:
        self.inventories = {n: inventory(n, rack=f"r{i // 2}") for i, n in enumerate(names)}
        self.held: dict[str, dict[str, Held]] = defaultdict(dict)
        self.events: dict[str, list[ReplicaEvent]] = defaultdict(list)
        self.asked: list[tuple[str, ...]] = []

    # the contract

    def nodes(self) -> Mapping[str, Inventory]:
        return self.inventories

    async def start(self, node: str, spec: ReplicaSpec) -> None:
        self.asked.append(("start", node, spec.replica))
        self.held[node][spec.replica] = Held(spec)

    async def stop(self, node: str, replica: str, grace_s: float | None) -> None:
        held = self.held[node].get(replica)
        if held is None or held.stopping:
            return
        self.asked.append(("stop", node, replica, str(grace_s)))
        held.stopping, held.stop_grace = True, grace_s
        held.signals.append(15)

    async def signal(self, node: str, replica: str, signum: int) -> None:
        held = self.held[node].get(replica)
        if held is not None:
            held.signals.append(signum)

    def running(self, node: str) -> list[ReplicaStatus]:
        return [
            ReplicaStatus(
                replica=h.spec.replica,
                job=h.spec.job,
                epoch=h.spec.epoch,
                state="stopping" if h.stopping else "running",
            )
            for h in self.held[node].values()
        ]

    def observe(self) -> Mapping[str, list[ReplicaEvent]]:
        out, self.events = self.events, defaultdict(list)
        for held in self.held.values():
            for replica in [r for r, h in held.items() if h.ended]:
                del held[replica]
        return out

    # what the test makes happen

    def up(self, node: str, replica: str, at: float) -> None:
        held = self.held[node][replica]
        held.up = True
        self.events[node].append(self._event(held, "started", at, pid=4242))

    def exit(self, node: str, replica: str, at: float, code: int = 0) -> None:
        held = self.held[node][replica]
        held.ended = True
        self.events[node].append(self._event(held, "exited", at, exit_code=code))

    def checkpointed(self, node: str, replica: str, at: float, took_s: float = 2.0) -> None:
        held = self.held[node][replica]
        held.ended = True
        event = self._event(held, "exited", at, signal=15, checkpoint_s=took_s)
        self.events[node].append(event)

    def replicas(self) -> list[tuple[str, str]]:
        """(node, replica) of every replica running, in start order per node."""
        return [(n, r) for n, held in self.held.items() for r, h in held.items() if not h.ended]

    @staticmethod
    def _event(held: Held, kind: str, at: float, **extra: object) -> ReplicaEvent:
        spec = held.spec
        fields = {"replica": spec.replica, "job": spec.job, "epoch": spec.epoch}
        return ReplicaEvent.model_validate({**fields, "kind": kind, "at": at, **extra})


class Counting:
    """The agent protocol of ``server``, counting the batched calls it passes on; it fails
    the next ``fail_reports`` reports as an unreachable server would."""

    def __init__(self, server: DriverServer) -> None:
        self.server = server
        self.calls: list[tuple[str, tuple[str, ...]]] = []  # (call, the nodes it carried)
        self.fail_reports = 0

    async def register(self, body: Registration) -> Lease:
        return await self.server.register(body)

    async def desired_changes(self, since: int, wait_s: float) -> DesiredChanges:
        changes = await self.server.desired_changes(since, wait_s)
        self.calls.append(("desired", tuple(sorted(s.node for s in changes.nodes))))
        return changes

    async def heartbeats(self, beats: dict[str, Heartbeat], timeout_s: float) -> HeartbeatsReply:
        self.calls.append(("heartbeats", tuple(sorted(beats))))
        return await self.server.heartbeats(beats, timeout_s)

    async def reports(self, reports: dict[str, AgentReport]) -> ReportsReply:
        if self.fail_reports:
            self.fail_reports -= 1
            raise Unreachable("reports: the server did not answer")
        self.calls.append(("reports", tuple(sorted(reports))))
        return await self.server.reports(reports)

    def count(self, call: str) -> int:
        return sum(1 for c, _ in self.calls if c == call)

"""``NodeDriver``: a ``NodeBackend``'s nodes kept in step with the server.

Each ``step``:

1. registers the backend's nodes that have no lease, or whose inventory changed, listing
   what each runs; a node the backend no longer lists is let go;
2. takes what the backend observed into the report outbox (an ended replica's epoch never
   runs again on its node);
3. converges every node on its desired state (``converge.plan``): stops first (with the
   desired state's grace), then replicas told to stop before they ever started here are
   reported as exited (``converge.never_started``), then starts;
4. renews the leases in one batched heartbeat when due (a replica a lease names, one the
   server does not know or has moved past, is stopped with its grace);
5. sends every node's events in one batched report.

The desired states come from one long-poll for all nodes (``follow``, beside the steps;
``poll`` for one answer). The backend does only what differs per kind of node."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Protocol

from boltforge.agent.client import AgentClientError
from boltforge.node.backend import NodeBackend
from boltforge.node.converge import never_started, plan
from boltforge.node.follower import DesiredFollower, Heartbeats, NodeServer, ReportOutbox
from boltforge.wire.agent import DesiredChanges, Inventory, Lease, Registration, ReplicaSpec

log = logging.getLogger("boltforge.node")

ENDED = ("exited", "failed")


class DriverServer(NodeServer, Protocol):
    """The agent protocol as a driver speaks it: registrations and the batched calls."""

    async def register(self, body: Registration) -> Lease: ...


class NodeDriver:
    """Keeps ``backend``'s nodes registered, converged and reported (see the module
    docstring). ``clock``: the monotonic clock heartbeats are timed on. ``version``: what
    registrations name as the agent's version."""

    def __init__(
        self,
        server: DriverServer,
        backend: NodeBackend,
        *,
        wait_s: float = 20.0,
        version: str = "node",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.server, self.backend, self.version, self.clock = server, backend, version, clock
        self.leases: dict[str, Lease] = {}
        self.registered: dict[str, Inventory] = {}
        self.desired: dict[str, list[ReplicaSpec]] = {}
        self.finished: dict[str, set[tuple[str, int]]] = {}  # (replica, epoch) ended, by node
        self.changed: set[str] = set()  # nodes whose replicas changed since the last beat
        self.follower = DesiredFollower(server, wait_s)
        self.heartbeats = Heartbeats(server)
        self.outbox = ReportOutbox()

    async def follow(self) -> None:
        """Follow every node's desired state until cancelled (beside ``step``)."""
        await self.follower.follow(self.apply)

    async def poll(self) -> None:
        """Take one answer of the desired-state long-poll."""
        self.apply(await self.follower.poll())

    def apply(self, changes: DesiredChanges) -> None:
        """Keep the desired states of the backend's nodes (a full answer replaces all)."""
        if changes.full:
            self.desired = {}
        mine = self.backend.nodes()
        for state in changes.nodes:
            if state.node in mine:
                self.desired[state.node] = state.replicas

    async def step(self) -> None:
        """One pass (see the module docstring)."""
        await self.register()
        self.collect()
        for node in list(self.leases):
            await self.converge(node)
        await self.beat()
        for node in await self.outbox.send(self.server, self.leases):
            self.leases.pop(node, None)  # registered again on the next step

    async def register(self) -> None:
        """Register the nodes without a lease or with a changed inventory; let go of the
        nodes the backend no longer lists."""
        nodes = self.backend.nodes()
        for name in [n for n in self.leases if n not in nodes]:
            del self.leases[name]
            self.desired.pop(name, None)
        for name, inv in nodes.items():
            if name in self.leases and self.registered.get(name) == inv:
                continue
            running = self.backend.running(name)
            reg = Registration(inventory=inv, running=running, agent_version=self.version)
            self.leases[name] = await self.server.register(reg)
            self.registered[name] = inv

    async def converge(self, node: str) -> None:
        """Make ``node`` match its desired state (``converge.plan``)."""
        specs = self.desired.get(node)
        if specs is None:
            return
        live = {s.replica: s.epoch for s in self.backend.running(node) if s.state != "exited"}
        finished = self.finished.setdefault(node, set())
        todo = plan(specs, live, finished)
        for replica, grace in todo.stop.items():
            await self.backend.stop(node, replica, grace)
        for spec in todo.skip:
            finished.add((spec.replica, spec.epoch))
            self.outbox.add(node, never_started(spec.replica, spec.job, spec.epoch))
        for spec in todo.start:
            await self.backend.start(node, spec)
            self.changed.add(node)

    def collect(self) -> None:
        """Take what the backend observed into the outbox; an ended replica's epoch is
        finished on its node (it never runs again)."""
        for node, events in self.backend.observe().items():
            if not events:
                continue
            self.outbox.add(node, *events)
            self.changed.add(node)
            ended = {(e.replica, e.epoch) for e in events if e.kind in ENDED}
            self.finished.setdefault(node, set()).update(ended)

    async def beat(self) -> None:
        """Renew every lease in one heartbeat when due; a lost node registers again on the
        next step, and a replica a lease names is stopped (with its grace)."""
        if not self.heartbeats.due(self.leases, self.clock()):
            return
        sent, self.changed = self.changed, set()
        try:
            reply = await self.heartbeats.renew(
                self.leases, self.backend.running, sent, self.clock()
            )
        except BaseException:
            self.changed |= sent
            raise
        for node in reply.lost:
            self.leases.pop(node, None)
        for node, lease in reply.leases.items():
            for replica in lease.stop:
                await self.backend.stop(node, replica, None)

    async def run(self, every_s: float = 0.5) -> None:
        """Follow the server and step every ``every_s`` until cancelled. A step the server
        did not answer is logged and the next one tries again (what was not sent waits)."""
        follow = asyncio.create_task(self.follow())
        try:
            while True:
                try:
                    await self.step()
                except (AgentClientError, OSError) as e:
                    log.warning("node step failed, retrying: %s", e)
                await asyncio.sleep(every_s)
        finally:
            follow.cancel()
            await asyncio.gather(follow, return_exceptions=True)

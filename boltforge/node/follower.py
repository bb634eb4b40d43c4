"""Following the server for any number of nodes, with one call per duty whatever their count:

- ``DesiredFollower``: the desired states, with one long-poll (``desired_changes``) for
  every node the caller's token may act for;
- ``Heartbeats``: the nodes' leases, renewed in one batched heartbeat when the first is
  due, each listing what its node runs when that changed (and every ``full_every_s`` for
  every node), the rest listing nothing (which renews the lease and leaves the server's
  view as it was);
- ``ReportOutbox``: what happened to the replicas, kept per node in order and sent in one
  batched report; what does not go through waits for the next sending, and a node whose
  session was lost keeps its events until it registers again.

The bookkeeping is plain synchronous code with the time passed in; only the calls to the
server are coroutines, so an asyncio loop drives it directly and a threaded backend through
``asyncio.run`` or a loop of its own. None of it registers nodes: a backend registers each
node with its inventory (``NodeServer.register``) and keeps the leases in a mapping it
shares with ``Heartbeats`` and ``ReportOutbox``."""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, MutableMapping
from typing import Protocol

from boltforge.agent.client import AgentClientError
from boltforge.wire.agent import (
    AgentReport,
    DesiredChanges,
    Heartbeat,
    HeartbeatsReply,
    Lease,
    ReplicaEvent,
    ReplicaStatus,
    ReportsReply,
)

log = logging.getLogger("boltforge.node")

FULL_BEAT_S = 30.0  # how often heartbeats list what every node runs, changed or not
RETRY_S = 1.0  # after a long-poll that was not answered


class NodeServer(Protocol):
    """The batched calls of the agent protocol a follower makes (``agent.client.ServerClient``
    is one). Each raises ``AgentClientError`` when its reply did not come back."""

    async def desired_changes(self, since: int, wait_s: float) -> DesiredChanges: ...

    async def heartbeats(
        self, beats: dict[str, Heartbeat], timeout_s: float
    ) -> HeartbeatsReply: ...

    async def reports(self, reports: dict[str, AgentReport]) -> ReportsReply: ...


class DesiredFollower:
    """The server's desired states of every node, with one long-poll at a time. Each answer
    holds the states of the nodes whose intent changed since the last one (``full``: of
    every node, replacing all the caller knew)."""

    def __init__(self, server: NodeServer, wait_s: float = 20.0) -> None:
        self.server, self.wait_s = server, wait_s
        self.since = -1  # the last change seen (-1: none; the next answer is full)

    def restart(self) -> None:
        """Ask for every node's state again on the next poll (a full answer)."""
        self.since = -1

    async def poll(self) -> DesiredChanges:
        """One long-poll: the changes after ``since``, or none after ``wait_s``. Raises
        ``AgentClientError`` when the server did not answer."""
        changes = await self.server.desired_changes(self.since, self.wait_s)
        self.since = changes.seq
        return changes

    async def follow(
        self,
        apply: Callable[[DesiredChanges], None],
        active: Callable[[], bool] = lambda: True,
    ) -> None:
        """Poll until cancelled, handing each answer to ``apply``. While ``active()`` is
        false (a replica that does not lead) it does not poll, and polls for everything
        once it is true again. An unanswered poll is retried after ``RETRY_S``."""
        while True:
            if not active():
                self.restart()
                await asyncio.sleep(0.5)
                continue
            try:
                changes = await self.poll()
            except AgentClientError as e:
                log.debug("desired states: %s", e)
                await asyncio.sleep(RETRY_S)
                continue
            apply(changes)


class Heartbeats:
    """Every node's lease renewed in one call. ``due`` says when; ``renew`` sends them."""

    def __init__(self, server: NodeServer, full_every_s: float = FULL_BEAT_S) -> None:
        self.server, self.full_every_s = server, full_every_s
        self.next_at = 0.0  # when the leases are next renewed
        self.full_at = 0.0  # when heartbeats next list what every node runs
        self._silent: dict[str, Heartbeat] = {}  # by node: its heartbeat that lists nothing

    def reset(self) -> None:
        """Renew on the next ``due`` check, listing what every node runs."""
        self.next_at = self.full_at = 0.0

    def due(self, leases: Mapping[str, Lease], now: float) -> bool:
        """Whether some lease is to be renewed at ``now``."""
        return bool(leases) and now >= self.next_at

    async def renew(
        self,
        leases: MutableMapping[str, Lease],
        running: Callable[[str], list[ReplicaStatus]],
        changed: Iterable[str],
        now: float,
        health: Callable[[str], dict[str, str]] | None = None,
    ) -> HeartbeatsReply:
        """Send every node of ``leases`` its heartbeat, listing ``running(node)`` for the
        nodes ``changed`` (every node when a full listing is due), and keep the renewed
        leases in ``leases``. The next renewal is due after the shortest ``heartbeat_s``.
        The caller handles ``lost`` (register those nodes again) and each lease's ``stop``
        (replicas to stop at once). Raises ``AgentClientError`` when the reply did not
        come back: the caller lists its ``changed`` nodes again next time. With no lease
        (all were let go meanwhile) it sends nothing. ``health``: each node's health facts,
        sent on every heartbeat of that node (the server keeps the last ones it got)."""
        if not leases:
            return HeartbeatsReply()
        every = min(lease.heartbeat_s for lease in leases.values())
        self.next_at = now + every
        full, listed = now >= self.full_at, set(changed)
        beats = {
            node: self._beat(
                node,
                lease.session,
                running if full or node in listed else None,
                health(node) if health is not None else {},
            )
            for node, lease in leases.items()
        }
        reply = await self.server.heartbeats(beats, every * 2 + 5)
        if full:
            self.full_at = now + self.full_every_s
        leases.update(reply.leases)
        return reply

    def _beat(
        self,
        node: str,
        session: str,
        running: Callable[[str], list[ReplicaStatus]] | None,
        health: dict[str, str],
    ) -> Heartbeat:
        """``node``'s heartbeat with its ``health``: listing what it runs, or nothing (kept
        from the last time: most of a fleet's heartbeats are these, the same every time)."""
        if running is not None:
            return Heartbeat(session=session, running=running(node), health=health)
        beat = self._silent.get(node)
        if beat is None or beat.session != session or beat.health != health:
            beat = self._silent[node] = Heartbeat(session=session, health=health)
        return beat


class ReportOutbox:
    """The events each node has to report, in the order they happened. ``outbox[node]`` is
    that node's list (empty for a node with none)."""

    def __init__(self) -> None:
        self._events: defaultdict[str, list[ReplicaEvent]] = defaultdict(list)

    def __getitem__(self, node: str) -> list[ReplicaEvent]:
        return self._events[node]

    def __bool__(self) -> bool:
        return any(self._events.values())

    def add(self, node: str, *events: ReplicaEvent) -> None:
        """Queue ``events`` of ``node``, after those already waiting."""
        self._events[node].extend(events)

    def add_all(self, events: Mapping[str, Iterable[ReplicaEvent]]) -> None:
        """Queue each node's ``events``."""
        for node, evs in events.items():
            self.add(node, *evs)

    def take(self, leases: Mapping[str, Lease]) -> dict[str, AgentReport]:
        """Every waiting event of the nodes with a lease, as one report per node, taken out
        of the outbox (``put_back`` returns them)."""
        batch = {}
        for node, events in self._events.items():
            lease = leases.get(node)
            if lease is not None and events:
                batch[node] = AgentReport(session=lease.session, events=events)
                self._events[node] = []
        return batch

    def put_back(self, batch: Mapping[str, AgentReport]) -> None:
        """Return a batch that did not go through, ahead of what was queued since."""
        for node, report in batch.items():
            self._events[node] = report.events + self._events[node]

    async def send(self, server: NodeServer, leases: Mapping[str, Lease]) -> list[str]:
        """Send every node's waiting events in one call; the nodes whose session the server
        had lost (register them again: their events wait for it). Raises
        ``AgentClientError`` or ``OSError`` when the reply did not come back; the events
        then wait for the next sending."""
        batch = self.take(leases)
        if not batch:
            return []
        try:
            reply = await server.reports(batch)
        except (AgentClientError, OSError):
            self.put_back(batch)
            raise
        self.put_back({node: batch[node] for node in reply.lost if node in batch})
        for node, refused in reply.refused.items():
            log.info("server refused stale report items of %s: %s", node, ", ".join(refused))
        return list(reply.lost)

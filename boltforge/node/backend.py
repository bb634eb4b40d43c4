"""``NodeBackend``: what differs per kind of node, and only that.

Everything else a node does is the same on every kind and lives beside this file: the
rules that turn a desired state into starts and stops (``converge``), following the server
for many nodes at once (``follower``), and the loop that joins them (``driver.NodeDriver``).
A new kind of node (Ray, a cloud's batch API) implements this protocol and hands it to a
``NodeDriver``; ``tests/kit/node_kit.py`` holds one that runs replicas in memory, and
``docs/architecture.md`` ("Writing a node backend") a skeleton."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from boltforge.wire.agent import Inventory, ReplicaEvent, ReplicaSpec, ReplicaStatus


class NodeBackend(Protocol):
    """Starts, stops, signals and observes replicas on the nodes it speaks for. Replicas are
    named by ``ReplicaSpec.replica`` and run at most one epoch at a time per node; the
    driver never asks to start a replica that ``running`` still lists."""

    def nodes(self) -> Mapping[str, Inventory]:
        """The nodes this backend speaks for now, by name, and what each has; a node that
        leaves the mapping is let go (its lease runs out and the server writes off what it
        ran). A node whose inventory changes is registered again."""
        ...

    async def start(self, node: str, spec: ReplicaSpec) -> None:
        """Launch ``spec`` on ``node`` and return without waiting for it to be up. From
        then on ``running(node)`` lists it; ``observe`` hands out its ``started`` event
        once it is up, or a ``failed`` one (with ``detail``) when it could not start."""
        ...

    async def stop(self, node: str, replica: str, grace_s: float | None) -> None:
        """Stop ``replica``: the checkpoint signal (SIGTERM) now, a kill once ``grace_s``
        passed (None: the grace its spec gave; 0: kill now, no checkpoint). Its ``exited``
        event, with ``checkpoint_s`` (how long it took), comes from ``observe``. Asking
        again while it stops, or for a replica not running, does nothing (the driver asks
        on every pass until it has gone)."""
        ...

    async def signal(self, node: str, replica: str, signum: int) -> None:
        """Send ``signum`` to ``replica``'s processes, nothing more (a replica not running
        is ignored)."""
        ...

    def running(self, node: str) -> list[ReplicaStatus]:
        """What ``node`` runs: each replica started and not yet handed out as ended by
        ``observe`` (``running``, or ``stopping`` once asked to stop). Heartbeats and
        registrations list it, and the driver's converging reads it."""
        ...

    def observe(self) -> Mapping[str, list[ReplicaEvent]]:
        """What happened to the replicas since the last call, by node, in order: ``started``,
        ``exited`` (``exit_code``, or ``signal`` when killed; ``by_node`` when the node
        ended it on its own, so the job runs again) and ``failed``. Each event is handed
        out once; a replica whose ``exited`` or ``failed`` event was handed out is no
        longer ``running``."""
        ...

"""Intent: the one place where what a replica should be doing changes.

Every start and stop the control plane decides (a dispatched gang, a preemption, a
cancellation, a failed gang's survivors, a node taken out of service) is written here, as
the replica's state in the store, and the replica's node is marked changed
(``desired_version`` grows) so the backend converges it (``control/nodes/backend.py``). Nothing
else sets a replica to ``starting`` or ``stopping`` or bumps a node's version for it.

The states a replica moves through: ``waiting`` (bound; its GPUs may still be held by
replicas that are leaving) -> ``starting`` (the node is to run it) -> ``running`` (the node
said so) -> ``stopping`` (the node is to send the checkpoint signal, then kill after the
grace) -> ``exited``. A replica stopped before it was dispatched goes straight to
``exited``.
"""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy.orm import Session

from boltforge.control.store.db import by_key
from boltforge.control.store.models import NodeRow, ReplicaRow


def start(s: Session, reps: Iterable[ReplicaRow], now: float) -> set[str]:
    """Tell the nodes to run ``reps`` (those still ``waiting``); returns those nodes."""
    nodes: set[str] = set()
    for r in reps:
        if r.state == "waiting":
            r.state, r.dispatched_at = "starting", now
            nodes.add(r.node)
    changed(s, nodes)
    return nodes


def stop(s: Session, reps: Iterable[ReplicaRow], now: float) -> set[str]:
    """Tell the nodes to stop ``reps`` (the checkpoint signal, then a kill after each
    one's grace); replicas never dispatched end at once, and ones already stopping or
    gone are left as they are. Returns the nodes told."""
    nodes: set[str] = set()
    for r in reps:
        if r.state == "waiting":
            r.state, r.exited_at = "exited", now
        elif r.state in ("starting", "running"):
            r.state, r.stop_requested_at = "stopping", now
            nodes.add(r.node)
    changed(s, nodes)
    return nodes


def changed(s: Session, nodes: set[str]) -> None:
    """Mark what ``nodes`` should run as changed (their agents, long-polling, wake). Nodes
    the session holds already are not read again; the rest are read in one query."""
    for node in by_key(s, NodeRow, nodes).values():
        renewed(node)


def renewed(node: NodeRow) -> None:
    """Mark what ``node`` (a row at hand, perhaps not yet stored) should run as changed."""
    node.desired_version = (node.desired_version or 0) + 1

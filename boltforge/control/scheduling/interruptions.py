"""Observed interruption rates per pool, read from the store, for cost-aware routing.

An *interruption* of a node is a spot reclaim notice (a ``reclaim`` timeline entry naming
the node, ``control/nodes/spot.py``) or replicas lost with their node (``lost``: the node died or
restarted without them). Several jobs on one node interrupted at once count once; replicas
lost within ``SAME_EVENT_S`` of a reclaim of their node are that reclaim. A pool's rate is
its interruptions over the last ``days`` divided by the host-hours its nodes were registered
in that window (at least one hour), so it is per host-hour: ``core/placement/routing.py`` multiplies
it by the hosts a gang spans. A job's spot interruptions are the distinct interruptions it
suffered on nodes of spot pools in the same window.
"""

from __future__ import annotations

from collections import defaultdict

from sqlalchemy import select
from sqlalchemy.orm import Session, defer

from boltforge.control.store.models import EventRow, NodeRow, ReplicaRow
from boltforge.core.model.topology import Tier, TopologyTree
from boltforge.core.placement.routing import RoutingFacts

NOTICE = "reclaim"  # spot.NOTICE (not imported: spot imports actuate, which imports world)
DAYS = 7.0
SAME_EVENT_S = 600.0


def routing_facts(
    s: Session,
    tree: TopologyTree,
    nodes: dict[str, NodeRow],
    now: float,
    days: float = DAYS,
    max_spot_interruptions: int | None = 3,
) -> RoutingFacts:
    """Interruptions per host-hour by pool and spot interruptions by job, over ``days``."""
    since = now - days * 86400.0
    hits: dict[str, set[float]] = defaultdict(set)  # node -> interruption times
    by_job: dict[str, set[tuple[str, float]]] = defaultdict(set)
    notices = select(EventRow).where(EventRow.kind == NOTICE, EventRow.at >= since)
    for ev in s.scalars(notices):
        host = str((ev.data or {}).get("node", ""))
        if host not in nodes:
            continue
        at = float((ev.data or {}).get("reclaim_at", ev.at))
        hits[host].add(at)
        by_job[ev.job_id].add((host, at))
    lost = (
        select(ReplicaRow)
        .options(defer(ReplicaRow.spec))
        .where(ReplicaRow.state == "lost", ReplicaRow.exited_at >= since)
    )
    for rep in s.scalars(lost):
        if rep.node not in nodes or rep.exited_at is None:
            continue
        near = [t for t in hits[rep.node] if abs(t - rep.exited_at) <= SAME_EVENT_S]
        at = near[0] if near else rep.exited_at
        hits[rep.node].add(at)
        by_job[rep.job_id].add((rep.node, at))
    count: dict[str, int] = defaultdict(int)
    exposure: dict[str, float] = defaultdict(float)
    for name, row in nodes.items():
        count[row.pool] += len(hits.get(name, ()))
        exposure[row.pool] += max(now - max(row.registered_at, since), 0.0) / 3600.0
    rates = {pool: count[pool] / max(exposure[pool], 1.0) for pool in exposure if count[pool]}
    spot = {p.name for p in tree.pools if p.tier == Tier.SPOT}
    on_spot = {
        job: sum(1 for host, _ in seen if nodes[host].pool in spot) for job, seen in by_job.items()
    }
    return RoutingFacts(rates, {j: n for j, n in on_spot.items() if n}, max_spot_interruptions)

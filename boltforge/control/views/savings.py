"""Cost saved by sharing the fleet versus static team pools, read from the store (the method
is in ``core/billing/savings.py`` and docs/cost.md).

Node lives: from a node's first registration in the audit log (else its latest one) until
its lease ran out if it is dead, else until now; a node that died and came back counts as
live in between. Team use: each run's GPUs per pool, from the replicas of its epoch."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from sqlalchemy import func, select
from sqlalchemy.orm import Session, defer

from boltforge.control.store.models import AuditRow, NodeRow, ReplicaRow, RunRow
from boltforge.control.views.billing import CHUNK, runs_in
from boltforge.core.billing.savings import Life, Savings, Use, savings
from boltforge.wire.cost import SavingsOut


def fleet_savings(s: Session, since: float, now: float) -> SavingsOut:
    """Static versus shared cost over ``[since, now]``."""
    nodes = {n.name: n for n in s.scalars(select(NodeRow))}
    prices: dict[str, float] = {}
    for n in nodes.values():
        prices[n.pool] = max(prices.get(n.pool, 0.0), _price(n))
    runs = runs_in(s, since, now)
    uses = [u for r, pools in _pools(s, runs, nodes).items() for u in _uses(r, pools, prices)]
    result = savings(uses, _lives(s, nodes), prices, since, now)
    return _out(result)


def _price(node: NodeRow) -> float:
    return float(node.inventory.get("price_per_gpu_hour", 0.0) or 0.0)


def _lives(s: Session, nodes: dict[str, NodeRow]) -> list[Life]:
    first = dict(
        s.execute(
            select(AuditRow.target, func.min(AuditRow.at))
            .where(AuditRow.action == "register")
            .group_by(AuditRow.target)
        ).all()
    )
    return [
        Life(
            n.pool,
            n.gpus,
            _price(n),
            min(first.get(n.name, n.registered_at), n.registered_at),
            _death(n),
        )
        for n in nodes.values()
    ]


def _death(node: NodeRow) -> float | None:
    if node.state != "dead":
        return None
    return node.lease_expires_at or node.last_heartbeat or node.registered_at


def _pools(
    s: Session, runs: Sequence[RunRow], nodes: dict[str, NodeRow]
) -> dict[RunRow, dict[str, int]]:
    """Each run's GPUs per pool, from the replicas of its job's epoch on known nodes."""
    keys = {(r.job_id, r.epoch) for r in runs}
    ids = sorted({r.job_id for r in runs})
    found: dict[tuple[str, int], dict[str, int]] = defaultdict(dict)
    q = select(ReplicaRow).options(defer(ReplicaRow.spec))
    for i in range(0, len(ids), CHUNK):
        for rep in s.scalars(q.where(ReplicaRow.job_id.in_(ids[i : i + CHUNK]))):
            node = nodes.get(rep.node)
            if (rep.job_id, rep.epoch) in keys and node is not None:
                pools = found[(rep.job_id, rep.epoch)]
                pools[node.pool] = pools.get(node.pool, 0) + len(rep.gpus)
    return {r: found.get((r.job_id, r.epoch), {}) for r in runs}


def _uses(run: RunRow, pools: dict[str, int], prices: dict[str, float]) -> list[Use]:
    """``run`` as uses per pool; a run whose replicas are unknown counts in a pool named by
    its price per GPU-hour."""
    if not pools and run.gpus:
        price = run.dollars_per_hour / run.gpus
        name = f"${price:g}/GPU-h"
        prices.setdefault(name, price)
        pools = {name: run.gpus}
    return [Use(run.team, p, n, run.started_at, run.ended_at) for p, n in sorted(pools.items())]


def _out(result: Savings) -> SavingsOut:
    return SavingsOut(
        since=result.since,
        hours=result.hours,
        static_dollars=result.static_dollars,
        shared_dollars=result.shared_dollars,
        saved_dollars=result.saved_dollars,
        peaks=result.peaks,
    )

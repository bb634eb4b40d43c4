"""Topology-blind first-fit placement: the baseline that FIFO and Slurm-like policies use."""

from __future__ import annotations

import numpy as np

from boltforge.core.model.gang import Gang
from boltforge.core.model.levels import Level
from boltforge.core.model.state import Allocation, FleetState
from boltforge.core.model.topology import IntArray
from boltforge.core.placement import crossing as costs
from boltforge.core.placement.answers import Placement, RolePlan
from boltforge.core.placement.hostfit import eligible_hosts, host_fit
from boltforge.core.placement.place import role_order
from boltforge.core.placement.roleplan import assign


def first_fit(state: FleetState, gang: Gang) -> Placement | None:
    """Place ``gang`` on hosts in index order, each taking as many replicas as it can.

    All roles or none; GPU models are not mixed inside a role (the first model whose hosts
    hold every replica wins). ``state`` is not changed. The placement carries its real crossing
    cost, so a simulator can charge the slowdown that topology-blindness causes.
    """
    work = state.copy() if len(gang.roles) > 1 else state
    plans: list[RolePlan] = []
    for role in role_order(gang):
        fit = host_fit(work, role, eligible_hosts(work, role), role.replicas)
        counts = _fill(work, fit.slots, role.replicas, role.gpus)
        if counts is None:
            return None
        grants = assign(work, role, counts)
        breakdown = costs.role_cost(work.tree, grants)
        gpu_type = work.tree.pool_of(grants[0].host).gpu_type if role.gpus else ""
        plans.append(
            RolePlan(role.name, Level.SPINE, work.tree.name, tuple(grants), breakdown, (), gpu_type)
        )
        if len(gang.roles) > 1:
            work.allocate(Allocation(f"{gang.name}/{role.name}", tuple(grants)))
    total = costs.ZERO
    for p in plans:
        total = costs.add(total, p.cost)
    return Placement(gang.name, tuple(plans), total)


def _fill(state: FleetState, slots: IntArray, replicas: int, gpus: int) -> dict[int, int] | None:
    """Replicas per host for the first GPU model, in host order, that holds them all."""
    tree = state.tree
    by_type: dict[str, dict[int, int]] = {}
    left: dict[str, int] = {}
    for h in np.flatnonzero(slots > 0):
        kind = tree.pool_of(int(h)).gpu_type if gpus else ""
        counts = by_type.setdefault(kind, {})
        remaining = left.setdefault(kind, replicas)
        if remaining == 0:
            continue
        take = min(int(slots[h]), remaining)
        counts[int(h)] = take
        left[kind] = remaining - take
        if left[kind] == 0:
            return counts
    return None

"""Place a gang now: all roles or none, each on its cheapest, best-fitting set of hosts."""

from __future__ import annotations

import numpy as np

from boltforge.core.model.gang import Gang, Role
from boltforge.core.model.levels import Level
from boltforge.core.model.state import Allocation, FleetState
from boltforge.core.model.topology import BoolArray, IntArray, TopologyTree
from boltforge.core.placement import crossing as costs
from boltforge.core.placement.answers import (
    Alternative,
    Decision,
    Outcome,
    Placement,
    RolePlan,
)
from boltforge.core.placement.hostfit import eligible_hosts
from boltforge.core.placement.roleplan import assign, plan_role

__all__ = [
    "Alternative",
    "Decision",
    "Outcome",
    "Placement",
    "RolePlan",
    "assign",
    "place_gang",
    "plan_role",
    "role_order",
]


def role_order(gang: Gang) -> list[Role]:
    """Roles in placement order: most GPUs first, so the collective-heavy role anchors the gang."""
    return sorted(gang.roles, key=lambda r: (-r.total_gpus, -r.gpus, r.name))


def place_gang(state: FleetState, gang: Gang) -> tuple[Placement | None, Role | None]:
    """Place every role of ``gang`` on ``state`` without changing it.

    Returns the placement, or ``(None, role)`` naming the first role that did not fit. Later
    roles are kept near the first: inside its rack if they fit there, else its pod, else anywhere
    the gang's topology rule allows. With a ``required`` level every role stays inside the first
    role's domain at that level; if the gang does not fit there, each other domain with room
    for the whole gang is tried in turn.
    """
    if _plain_single(gang):
        return _place_single(state, gang)
    placement, failed = _place_roles(state, gang, None)
    required = gang.topology.required
    if placement is not None or required is None or required == Level.SPINE:
        return placement, failed
    if len(gang.roles) == 1:
        return None, failed  # one role's search already covered every domain
    column = domain_column(state.tree, required)
    for domain in _roomy_domains(state, column, gang):
        placement, _ = _place_roles(state, gang, column == domain)
        if placement is not None:
            return placement, None
    return None, failed


def _plain_single(gang: Gang) -> bool:
    """One role of one GPU replica and no topology rule: the common small job."""
    role = gang.roles[0]
    rule = gang.topology
    return (
        len(gang.roles) == 1
        and role.replicas == 1
        and role.gpus > 0
        and rule.required is None
        and rule.preferred is None
    )


def _place_single(state: FleetState, gang: Gang) -> tuple[Placement | None, Role | None]:
    """``place_gang`` for a plain single replica (same answer, fewer steps)."""
    role = gang.roles[0]
    plan = plan_role(state, role, eligible_hosts(state, role), Level.SPINE)
    if plan is None:
        return None, role
    return Placement(gang.name, (plan,), plan.cost), None


def _roomy_domains(state: FleetState, column: IntArray, gang: Gang) -> list[int]:
    """Domains whose free GPUs could hold the whole gang, fullest first (best fit)."""
    free = np.bincount(column, weights=state.free_gpus_per_host(), minlength=int(column.max()) + 1)
    need = gang.total_gpus
    return sorted((int(d) for d in np.flatnonzero(free >= need)), key=lambda d: (free[d], d))


def _place_roles(
    state: FleetState, gang: Gang, within: BoolArray | None
) -> tuple[Placement | None, Role | None]:
    work = state.copy() if len(gang.roles) > 1 else state
    plans: list[RolePlan] = []
    notes: list[str] = []
    anchor: int | None = None
    for role in role_order(gang):
        plan, note = _place_role_near(work, gang, role, anchor, within)
        if plan is None:
            return None, role
        if note:
            notes.append(note)
        plans.append(plan)
        if anchor is None and plan.grants:
            anchor = plan.grants[0].host
        if len(gang.roles) > 1:
            work.allocate(Allocation(f"{gang.name}/{role.name}", plan.grants))
    if gang.topology.required == Level.ISLAND and not _one_island(state.tree, plans):
        return None, role_order(gang)[-1]
    total = costs.ZERO
    for p in plans:
        total = costs.add(total, p.cost)
    return Placement(gang.name, tuple(plans), total, tuple(notes)), None


def _one_island(tree: TopologyTree, plans: list[RolePlan]) -> bool:
    spots = {
        (g.host, int(tree.gpu_island[g.host, gpu]))
        for p in plans
        for g in p.grants
        for gpu in g.gpus
    }
    hosts = {g.host for p in plans for g in p.grants}
    return len(spots) <= 1 and len(hosts) <= 1


def _place_role_near(
    state: FleetState, gang: Gang, role: Role, anchor: int | None, within: BoolArray | None
) -> tuple[RolePlan | None, str | None]:
    eligible = eligible_hosts(state, role)
    if within is not None:
        eligible &= within
    required = gang.topology.required
    if anchor is not None and required is not None and required < Level.SPINE:
        column = domain_column(state.tree, required)
        eligible &= column == column[anchor]
    cpu_hosts = eligible & (state.tree.host_gpus == 0) if role.node_class == "cpu" else None
    if cpu_hosts is not None and cpu_hosts.any():
        # CPU-only roles go to CPU nodes when the fleet has them, sparing GPU hosts' CPUs.
        plan, note = _place_on(state, gang, role, anchor, cpu_hosts)
        if plan is not None:
            return plan, note
    return _place_on(state, gang, role, anchor, eligible)


def _place_on(
    state: FleetState, gang: Gang, role: Role, anchor: int | None, eligible: BoolArray
) -> tuple[RolePlan | None, str | None]:
    tree = state.tree
    cap = gang.topology.required or Level.SPINE
    if anchor is not None:
        for level in (Level.RACK, Level.POD):
            if level >= cap:
                break
            near = eligible & (domain_column(tree, level) == tree.domain_of(anchor, level))
            plan = plan_role(state, role, near, cap)
            if plan is not None:
                return plan, None
    preferred = gang.topology.preferred
    if preferred is not None and preferred < cap:
        plan = plan_role(state, role, eligible, preferred)
        if plan is not None:
            return plan, None
        relaxed = plan_role(state, role, eligible, cap)
        note = (
            f"role {role.name}: no single {preferred.label} could hold it, so it spans "
            f"{relaxed.level.label} {relaxed.domain}"
            if relaxed
            else None
        )
        return relaxed, note
    return plan_role(state, role, eligible, cap), None


def domain_column(tree: TopologyTree, level: Level) -> IntArray:
    """For each host, the index of its domain at ``level`` (hosts stand for islands)."""
    if level <= Level.HOST:
        return np.arange(len(tree.hosts), dtype=np.int64)
    if level == Level.RACK:
        return tree.host_rack
    if level == Level.POD:
        return tree.host_pod
    return np.zeros(len(tree.hosts), dtype=np.int64)

"""Place a gang now: all roles or none, each on its cheapest, best-fitting set of hosts."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum

import numpy as np

from boltforge.core import cost as costs
from boltforge.core.gang import Gang, Role
from boltforge.core.hostfit import eligible_hosts, host_fit, select_gpus
from boltforge.core.levels import Level
from boltforge.core.search import Candidate, candidates, run
from boltforge.core.state import Allocation, FleetState, Grant
from boltforge.core.topology import BoolArray, IntArray, TopologyTree

# How many of the cheapest candidates get their exact cost computed before one is chosen.
EXACT_CANDIDATES = 4


class Outcome(IntEnum):
    """Graded answers, comparable with ``max()``: never < not now < later < now."""

    NEVER = 0
    NOT_NOW = 1
    LATER = 2
    NOW = 3


@dataclass(frozen=True, slots=True)
class Alternative:
    """A placement the chosen one beat: where it was and what it would have cost.

    ``cost`` is exact for candidates the engine priced in full and otherwise the search's
    estimate, which is exact unless replicas would straddle NVLink islands or leave their rail.
    """

    level: Level
    domain: str
    cost: float
    hosts: int


@dataclass(frozen=True, slots=True)
class RolePlan:
    """Where one role goes: the domain that holds it, its grants, its cost and the runners-up."""

    role: str
    level: Level
    domain: str
    grants: tuple[Grant, ...]
    cost: costs.CostBreakdown
    alternatives: tuple[Alternative, ...]
    gpu_type: str


@dataclass(frozen=True, slots=True)
class Placement:
    """A whole gang's placement. ``cost`` is the sum of its roles' crossing costs."""

    job: str
    roles: tuple[RolePlan, ...]
    cost: costs.CostBreakdown
    notes: tuple[str, ...] = ()

    @property
    def grants(self) -> tuple[Grant, ...]:
        return tuple(g for r in self.roles for g in r.grants)

    @property
    def main(self) -> RolePlan:
        return self.roles[0]

    def nodes(self, tree: TopologyTree) -> dict[str, list[int]]:
        """Host name to the GPU indices the gang holds there (CPU-only replicas map to [])."""
        out: dict[str, list[int]] = {}
        for g in self.grants:
            out.setdefault(tree.hosts[g.host].name, []).extend(g.gpus)
        return {h: sorted(v) for h, v in out.items()}

    def allocation(self, expected_end: float | None = None, priority: int = 3) -> Allocation:
        return Allocation(self.job, self.grants, expected_end, priority)

    @property
    def rail_aligned(self) -> bool:
        return self.cost.hops["rail"] == 0


@dataclass(frozen=True, slots=True)
class Decision:
    """The answer to a placement question: the outcome, and a placement or the reasons why not."""

    outcome: Outcome
    placement: Placement | None = None
    reasons: tuple[str, ...] = ()
    fixes: tuple[str, ...] = ()
    start_time: float | None = None
    waits_for: tuple[str, ...] = field(default=())

    @property
    def placed(self) -> bool:
        return self.outcome == Outcome.NOW


def role_order(gang: Gang) -> list[Role]:
    """Roles in placement order: most GPUs first, so the collective-heavy role anchors the gang."""
    return sorted(gang.roles, key=lambda r: (-r.total_gpus, -r.gpus, r.name))


def place_gang(state: FleetState, gang: Gang) -> tuple[Placement | None, Role | None]:
    """Place every role of ``gang`` on ``state`` without changing it.

    Returns the placement, or ``(None, role)`` naming the first role that did not fit. Later
    roles are kept near the first: inside its rack if they fit there, else its pod, else anywhere
    the gang's topology rule allows.
    """
    work = state.copy() if len(gang.roles) > 1 else state
    plans: list[RolePlan] = []
    notes: list[str] = []
    anchor: int | None = None
    for role in role_order(gang):
        plan, note = _place_role_near(work, gang, role, anchor)
        if plan is None:
            return None, role
        if note:
            notes.append(note)
        plans.append(plan)
        if anchor is None and plan.grants:
            anchor = plan.grants[0].host
        if len(gang.roles) > 1:
            work.allocate(Allocation(f"{gang.name}/{role.name}", plan.grants))
    total = costs.ZERO
    for p in plans:
        total = costs.add(total, p.cost)
    return Placement(gang.name, tuple(plans), total, tuple(notes)), None


def _place_role_near(
    state: FleetState, gang: Gang, role: Role, anchor: int | None
) -> tuple[RolePlan | None, str | None]:
    eligible = eligible_hosts(state, role)
    cpu_hosts = eligible & (state.tree.host_gpus == 0)
    if role.gpus == 0 and cpu_hosts.any():
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
            if level > cap:
                break
            near = eligible & (_domain_column(tree, level) == tree.domain_of(anchor, level))
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


def _domain_column(tree: TopologyTree, level: Level) -> IntArray:
    return tree.host_rack if level == Level.RACK else tree.host_pod


def plan_role(state: FleetState, role: Role, eligible: BoolArray, cap: Level) -> RolePlan | None:
    """Cheapest placement of one role on ``eligible`` hosts inside one domain no wider than ``cap``.

    GPU models are never mixed inside a role: each model among the eligible hosts is searched on
    its own and the cheapest result wins (ties go to the smaller, cheaper GPU).
    """
    tree = state.tree
    best: tuple[tuple[float, float, float], RolePlan] | None = None
    for gpu_type, hosts in _by_gpu_type(tree, eligible, role).items():
        plan = _plan_on(state, role, hosts, cap, gpu_type)
        if plan is None:
            continue
        pool = tree.pools[int(tree.host_pool[plan.grants[0].host])] if plan.grants else None
        key = (
            round(plan.cost.total, 9),
            pool.gpu_memory_gb if pool else 0.0,
            pool.price_per_gpu_hour if pool else 0.0,
        )
        if best is None or key < best[0]:
            best = (key, plan)
    return best[1] if best else None


def _by_gpu_type(tree: TopologyTree, eligible: BoolArray, role: Role) -> dict[str, BoolArray]:
    if role.gpus == 0:
        return {"": eligible}
    types = sorted({tree.pools[i].gpu_type for i in np.unique(tree.host_pool[eligible])})
    pool_type = np.array([p.gpu_type for p in tree.pools])
    host_type = pool_type[tree.host_pool] if len(tree.hosts) else pool_type[:0]
    return {t: eligible & (host_type == t) for t in types}


def _plan_on(
    state: FleetState, role: Role, eligible: BoolArray, cap: Level, gpu_type: str
) -> RolePlan | None:
    tree = state.tree
    fit = host_fit(state, role, eligible, role.replicas)
    if int(fit.slots.sum()) < role.replicas:
        return None
    search = run(tree, fit, role.replicas, role.gpus)
    found = candidates(tree, fit, search, role.gpus, cap)
    if not found:
        return None
    # Exact costs never fall below the search's estimates, so stop once the next estimate
    # cannot beat the best exact cost found (branch and bound over the candidates).
    scored: list[tuple[costs.CostBreakdown, Candidate, list[Grant]]] = []
    for cand in found[:EXACT_CANDIDATES]:
        if scored and cand.value >= scored[0][0].total - 1e-9:
            break
        grants = assign(state, role, cand.counts)
        scored.append((costs.role_cost(tree, grants), cand, grants))
        scored.sort(key=lambda item: (round(item[0].total, 9), item[1].value))
    breakdown, win, grants = scored[0]
    alternatives = [_alternative(tree, c, b) for b, c, _ in scored[1:]]
    alternatives += [_alternative(tree, c, None) for c in found if c not in [s[1] for s in scored]]
    return RolePlan(
        role.name,
        win.level,
        tree.domain_name(win.level, win.domain),
        tuple(grants),
        breakdown,
        tuple(alternatives[:3]),
        gpu_type,
    )


def _alternative(
    tree: TopologyTree, cand: Candidate, breakdown: costs.CostBreakdown | None
) -> Alternative:
    value = breakdown.total if breakdown else round(cand.value, 3)
    return Alternative(
        cand.level, tree.domain_name(cand.level, cand.domain), value, len(cand.counts)
    )


def assign(state: FleetState, role: Role, counts: dict[int, int]) -> list[Grant]:
    """Turn replicas-per-host into grants: ranks in topology order, GPUs on rails where possible."""
    tree = state.tree
    grants: list[Grant] = []
    template: list[tuple[int, ...]] | None = None
    for host in sorted(counts):
        row = state.free[host].copy()
        sets = select_gpus(row, tree.gpu_island[host], counts[host], role, template)
        if template is None:
            template = sets
        for gpus in sets:
            grants.append(Grant(role.name, len(grants), host, gpus, role.cpus, role.memory_gb))
    return grants

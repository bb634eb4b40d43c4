"""Plan one role: search the tree, price the best candidates exactly, polish the winner."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np

from boltforge.core.model.gang import Role
from boltforge.core.model.levels import Level
from boltforge.core.model.state import FleetState, Grant
from boltforge.core.model.topology import BoolArray, TopologyTree
from boltforge.core.placement import crossing as costs
from boltforge.core.placement.answers import Alternative, RolePlan
from boltforge.core.placement.hostfit import HostFit, host_fit, select_gpus
from boltforge.core.placement.search import DomainCandidate, candidates, run
from boltforge.core.placement.single import plan_single

# How many of the cheapest candidates may get their exact cost computed before one is chosen.
EXACT_CANDIDATES = 4
# How many host swaps the polishing pass may price exactly per role.
SWAP_BUDGET = 24


def plan_role(state: FleetState, role: Role, eligible: BoolArray, cap: Level) -> RolePlan | None:
    """Cheapest placement of one role on ``eligible`` hosts inside one domain no wider than ``cap``.

    GPU models are never mixed inside a role: each model among the eligible hosts is searched on
    its own and the cheapest result wins (ties go to the smaller, cheaper GPU). ``cap ==
    ISLAND`` keeps the whole role inside one NVLink island.
    """
    tree = state.tree
    best: tuple[tuple[float, float, float], RolePlan] | None = None
    for gpu_type, hosts in _by_gpu_type(tree, eligible, role).items():
        plan = _plan_on(state, role, hosts, cap, gpu_type)
        if plan is None:
            continue
        pool = tree.pool_of(plan.grants[0].host) if plan.grants else None
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
    if len(tree.hosts_of_type) == 1:
        return {next(iter(tree.hosts_of_type)): eligible}
    present = np.bincount(tree.host_pool[eligible], minlength=len(tree.pools)) > 0
    types = sorted({tree.pools[i].gpu_type for i in np.flatnonzero(present)})
    if len(types) == 1:
        return {types[0]: eligible}
    return {t: eligible & tree.hosts_of_type[t] for t in types}


def _plan_on(
    state: FleetState, role: Role, eligible: BoolArray, cap: Level, gpu_type: str
) -> RolePlan | None:
    if role.replicas == 1:
        return plan_single(state, role, eligible, cap, gpu_type)  # one host, no search
    tree = state.tree
    fit = host_fit(state, role, eligible, role.replicas, island_only=cap == Level.ISLAND)
    if int(fit.slots.sum()) < role.replicas:
        return None
    search = run(tree, fit, role.replicas, role.gpus, cap)
    found = candidates(tree, fit, search, role.gpus, cap)
    if not found:
        return None
    # Exact costs never fall below the search's estimates, so stop once the next estimate
    # cannot beat the best exact cost found (branch and bound over the candidates).
    scored: list[tuple[costs.CostBreakdown, DomainCandidate, list[Grant]]] = []
    for cand in found[:EXACT_CANDIDATES]:
        if scored and cand.value >= scored[0][0].total - 1e-9:
            break
        grants = assign(state, role, cand.counts)
        _, grants, exact = polish(
            state, role, fit, cand.counts, grants, costs.role_cost(tree, grants)
        )
        scored.append((exact, cand, grants))
        scored.sort(key=lambda item: (round(item[0].total, 9), item[1].value))
    breakdown, win, grants = scored[0]
    priced = [c for _, c, _ in scored]
    alternatives = [_alternative(tree, c, b) for b, c, _ in scored[1:]]
    alternatives += [_alternative(tree, c, None) for c in found if c not in priced]
    level = Level.ISLAND if cap == Level.ISLAND else win.level
    domain = tree.domain_name(win.level, win.domain)
    return RolePlan(
        role.name, level, domain, tuple(grants), breakdown, tuple(alternatives[:3]), gpu_type
    )


def polish(
    state: FleetState,
    role: Role,
    fit: HostFit,
    counts: dict[int, int],
    grants: list[Grant],
    breakdown: costs.CostBreakdown,
) -> tuple[dict[int, int], list[Grant], costs.CostBreakdown]:
    """Improve a placement by local moves priced exactly (hill climbing, at most SWAP_BUDGET).

    The search sees GPU counts, not which GPUs are free, so replicas smaller than a host can
    land off their rail or straddle islands. Two moves are tried: hand one host's whole share to
    an unused host of the same rack, and move one replica between hosts of the placement or to
    an unused host of a rack it uses. A move is kept when the exact cost drops, or stays equal
    while fewer free GPUs are left on the touched hosts (best fit). Full-host replicas placed
    on rail are left alone: no move can improve them.
    """
    if not role.gpus or len(counts) <= 1:
        return counts, grants, breakdown  # one host: the host search already priced it exactly
    if breakdown.hops["rail"] == 0 and all(fit.free[h] == k * role.gpus for h, k in counts.items()):
        return counts, grants, breakdown
    budget = SWAP_BUDGET
    improved = True
    while improved and budget > 0:
        improved = False
        for trial in _moves(state.tree, fit, counts):
            budget -= 1
            trial_grants = assign(state, role, trial)
            trial_cost = costs.role_cost(state.tree, trial_grants)
            if _better(fit, role, trial, trial_cost, counts, breakdown):
                counts, grants, breakdown, improved = trial, trial_grants, trial_cost, True
                break
            if budget <= 0:
                break
    return counts, grants, breakdown


def _better(
    fit: HostFit,
    role: Role,
    trial: dict[int, int],
    trial_cost: costs.CostBreakdown,
    counts: dict[int, int],
    cost: costs.CostBreakdown,
) -> bool:
    if trial_cost.total < cost.total - 1e-9:
        return True
    if trial_cost.total > cost.total + 1e-9:
        return False

    def leftover(c: dict[int, int]) -> int:
        return sum(int(fit.free[h]) - k * role.gpus for h, k in c.items())

    return leftover(trial) < leftover(counts)


def _moves(tree: TopologyTree, fit: HostFit, counts: dict[int, int]) -> Iterator[dict[int, int]]:
    """Neighbouring placements: whole-share swaps inside a rack, then moving replicas.

    Replicas move between the placement's hosts or to unused hosts of the racks and pods it
    uses (the tightest few of each).
    """
    racks = {int(tree.host_rack[h]) for h in counts}
    pods = {int(tree.host_pod[h]) for h in counts}

    def unused(hosts: Iterable[int], limit: int) -> list[int]:
        found = {int(h) for h in hosts if h >= 0 and h not in counts and fit.slots[h] > 0}
        return sorted(found, key=lambda h: (int(fit.free[h]), h))[:limit]

    near = unused((h for r in racks for h in tree.rack_hosts[r]), 6)
    pod_racks = {int(r) for p in pods for r in tree.pod_racks[p] if r >= 0} - racks
    wider = unused((h for r in pod_racks for h in tree.rack_hosts[r]), 4)
    for host in sorted(counts, key=lambda h: (-int(fit.free[h]), h)):
        for other in near:
            if tree.host_rack[other] == tree.host_rack[host] and fit.slots[other] >= counts[host]:
                trial = {h: k for h, k in counts.items() if h != host}
                trial[other] = counts[host]
                yield trial
    for src in sorted(counts):
        for dst in [*sorted(counts), *near, *wider]:
            room = int(fit.slots[dst]) - counts.get(dst, 0)
            for moved in range(1, min(counts[src], room) + 1):
                if dst == src:
                    break
                trial = dict(counts)
                trial[src] -= moved
                if trial[src] == 0:
                    del trial[src]
                trial[dst] = trial.get(dst, 0) + moved
                yield trial


def _alternative(
    tree: TopologyTree, cand: DomainCandidate, breakdown: costs.CostBreakdown | None
) -> Alternative:
    value = breakdown.total if breakdown else round(cand.value, 3)
    name = tree.domain_name(cand.level, cand.domain)
    return Alternative(cand.level, name, value, len(cand.counts))


def assign(state: FleetState, role: Role, counts: dict[int, int]) -> list[Grant]:
    """Turn replicas-per-host into grants: ranks in topology order, GPUs on rails where possible.

    The host with the most replicas picks its GPUs first; its GPU sets become the rail template
    that the other hosts reuse where those GPUs are free.
    """
    tree = state.tree
    if not counts:
        return []
    lead = min(counts, key=lambda h: (-counts[h], h))
    sets: dict[int, list[tuple[int, ...]]] = {}
    row = state.free[lead].copy()
    sets[lead] = select_gpus(row, tree.gpu_island[lead], counts[lead], role)
    lead_pool = tree.host_pool[lead]
    for host in counts:
        if host != lead:
            row = state.free[host].copy()
            same = bool(tree.host_pool[host] == lead_pool)
            sets[host] = select_gpus(
                row, tree.gpu_island[host], counts[host], role, sets[lead], same
            )
    grants: list[Grant] = []
    for host in sorted(counts):
        for gpus in sets[host]:
            grants.append(
                Grant(
                    role.name, len(grants), host, gpus, role.cpus, role.memory_gb, role.storage_gb
                )
            )
    return grants

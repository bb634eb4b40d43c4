"""Plan one role: search the tree, price the best candidates exactly, polish the winner."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np

from boltforge.core.model.gang import Role
from boltforge.core.model.levels import Level
from boltforge.core.model.state import FleetState, Grant
from boltforge.core.model.topology import BoolArray, IntArray, TopologyTree
from boltforge.core.placement import crossing as costs
from boltforge.core.placement.answers import Alternative, RolePlan
from boltforge.core.placement.hostfit import HostFit, host_fit, select_gpus
from boltforge.core.placement.search import DomainCandidate, candidates, run
from boltforge.core.placement.single import plan_single

# How many of the cheapest candidates may get their exact cost computed before one is chosen.
EXACT_CANDIDATES = 4
# How many host swaps the polishing pass may price exactly per role.
SWAP_BUDGET = 24
# How many hosts' GPU sets are tried as rail templates when the best placement priced exactly
# came out dearer than the search estimated it (``_templates``).
RAIL_TEMPLATES = 3
# An exact cost this far above the estimate is a surprise (estimates carry tie-break terms).
SURPRISE = 0.5


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
    scored: list[Scored] = []
    for cand in found[:EXACT_CANDIDATES]:
        if scored and cand.value >= scored[0][0].total - 1e-9:
            break
        scored.append(_priced(state, role, fit, cand))
        scored.sort(key=_by_cost)
    exact, first, _ = scored[0]
    if exact.total > first.value + SURPRISE:  # off its rail, or across islands: look again
        templates = list(_templates(state, role, fit))
        for on_rails in _rail_fits(role, fit, templates):
            search = run(tree, on_rails, role.replicas, role.gpus, cap)
            found_on_rails = candidates(tree, on_rails, search, role.gpus, cap)
            scored += [_priced(state, role, fit, c) for c in found_on_rails[:1]]
        built = _rail_candidates(tree, role, fit, cap, templates)
        scored += [_priced(state, role, fit, c) for c in built]
        scored.sort(key=_by_cost)
    breakdown, win, grants = scored[0]
    priced = [c for _, c, _ in scored]
    alternatives = [_alternative(tree, c, b) for b, c, _ in scored[1:]]
    alternatives += [_alternative(tree, c, None) for c in found if c not in priced]
    level = Level.ISLAND if cap == Level.ISLAND else win.level
    domain = tree.domain_name(win.level, win.domain)
    return RolePlan(
        role.name, level, domain, tuple(grants), breakdown, tuple(alternatives[:3]), gpu_type
    )


Scored = tuple[costs.CostBreakdown, DomainCandidate, list[Grant]]
Template = tuple[int, list[tuple[int, ...]], IntArray]  # lead host, its GPU sets, room


def _by_cost(item: Scored) -> tuple[float, float]:
    return round(item[0].total, 9), item[1].value


def _priced(state: FleetState, role: Role, fit: HostFit, cand: DomainCandidate) -> Scored:
    """``cand`` made into grants, polished, with its exact cost."""
    grants = assign(state, role, cand.counts)
    start = costs.role_cost(state.tree, grants)
    _, grants, exact = polish(state, role, fit, cand.counts, grants, start)
    return exact, cand, grants


def _rail_candidates(
    tree: TopologyTree, role: Role, fit: HostFit, cap: Level, templates: list[Template]
) -> Iterator[DomainCandidate]:
    """Placements that keep every replica on its lead's rail, built around each of the
    ``RAIL_TEMPLATES`` roomiest hosts. The lead takes as many replicas as it can; the GPU
    sets it would give them are the template; the rest go, roomiest first, to hosts where
    those very sets are free: in the lead's rack, then its pod, then the fleet, as far as
    ``cap`` allows, none taking more than the lead. Leads whose template was seen already, or
    that cannot be completed, give none. Candidates are valued at 0: they are to be priced
    exactly."""
    offering = np.flatnonzero(fit.slots > 0).tolist()
    for lead, sets, room in templates:
        take = len(sets)
        counts, level = {lead: take}, Level.HOST
        for ring in (Level.RACK, Level.POD, Level.SPINE):
            if sum(counts.values()) == role.replicas or ring > cap:
                break
            level = ring
            near = [h for h in offering if h not in counts and _within(tree, h, lead, ring)]
            for h in sorted(near, key=lambda h: (-int(room[h]), int(fit.free[h]), h)):
                more = min(int(room[h]), take, role.replicas - sum(counts.values()))
                if more > 0:
                    counts[h] = more
        if sum(counts.values()) == role.replicas and len(counts) > 1:
            yield DomainCandidate(level, tree.domain_of(lead, level), 0.0, counts)


def _templates(state: FleetState, role: Role, fit: HostFit) -> Iterator[Template]:
    """For each of the ``RAIL_TEMPLATES`` roomiest hosts (a distinct template each): the
    host, the GPU sets it would give as many replicas as it can take, and how many of those
    very sets every host has free (at most its slots)."""
    tree = state.tree
    offering = np.flatnonzero(fit.slots > 0).tolist()
    leads = sorted(offering, key=lambda h: (-int(fit.slots[h]), h))[:RAIL_TEMPLATES]
    seen: set[frozenset[tuple[int, ...]]] = set()
    for lead in leads:
        take = min(int(fit.slots[lead]), role.replicas)
        sets = select_gpus(state.free[lead].copy(), tree.gpu_island[lead], take, role)
        if frozenset(sets) in seen:
            continue
        seen.add(frozenset(sets))
        on_rail = sum(state.free[:, list(s)].all(axis=1).astype(np.int64) for s in sets)
        yield lead, sets, np.minimum(fit.slots, on_rail)


def _rail_fits(role: Role, fit: HostFit, templates: list[Template]) -> Iterator[HostFit]:
    """``fit`` cut down, for each of ``templates`` (``_templates``), to the replicas every
    host can take on the template's very GPU sets, for the search to run again."""
    for _, _, room in templates:
        if int(room.sum()) < role.replicas:
            continue
        intra = fit.intra.copy()
        for k in range(1, intra.shape[1]):
            intra[room < k, k] = np.inf
        yield HostFit(room, intra, fit.free, fit.rack_free, fit.pod_free)


def _within(tree: TopologyTree, host: int, lead: int, level: Level) -> bool:
    """Whether ``host`` shares ``lead``'s domain at ``level``."""
    return tree.domain_of(host, level) == tree.domain_of(lead, level)


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
        if host == lead:
            continue
        same = bool(tree.host_pool[host] == lead_pool)
        want = sets[lead][: counts[host]]
        if same and len(want) == counts[host] and state.free[host, _flat(want)].all():
            sets[host] = want  # what select_gpus gives when the lead's first sets are free
            continue
        row = state.free[host].copy()
        sets[host] = select_gpus(row, tree.gpu_island[host], counts[host], role, sets[lead], same)
    grants: list[Grant] = []
    for host in sorted(counts):
        for gpus in sets[host]:
            grants.append(
                Grant(
                    role.name, len(grants), host, gpus, role.cpus, role.memory_gb, role.storage_gb
                )
            )
    return grants


def _flat(sets: list[tuple[int, ...]]) -> list[int]:
    return [g for gpus in sets for g in gpus]

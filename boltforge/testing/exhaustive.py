"""Exhaustive placement search, a first-fit baseline and random small cases to grade the engine."""

from __future__ import annotations

import math
import random
import statistics
from dataclasses import dataclass

from boltforge.core.model.gang import Role
from boltforge.core.model.levels import Level
from boltforge.core.model.state import Allocation, FleetState, Grant
from boltforge.core.model.topology import HostLayout, TopologyTree
from boltforge.core.placement.crossing import role_cost
from boltforge.core.placement.fragmentation import measure
from boltforge.core.placement.hostfit import HostFit, eligible_hosts, host_fit
from boltforge.core.placement.modes import place_now
from boltforge.core.placement.roleplan import assign
from boltforge.testing.builders import make_gang, make_pool, make_role

# Enumeration grows as C(replicas + hosts - 1, hosts - 1); keep the oracle to small fleets.
MAX_HOSTS = 12


@dataclass(frozen=True, slots=True)
class Split:
    """One way to place a role: replicas per host, the grants ``assign`` makes, their cost."""

    counts: dict[int, int]
    grants: tuple[Grant, ...]
    cost: float


def optimal(state: FleetState, role: Role, cap: Level = Level.SPINE) -> Split | None:
    """The cheapest split of ``role`` over hosts inside one domain no wider than ``cap``.

    Every split of the replicas that the hosts' slots allow is tried, one GPU type and one
    ``cap`` domain at a time; each becomes grants through the engine's own ``assign`` and is
    priced by ``role_cost``. Branches whose hops so far already reach the best cost are cut,
    which is exact because every host added can only add hops. None when nothing fits.
    """
    tree = state.tree
    if len(tree.hosts) > MAX_HOSTS:
        raise ValueError(f"exhaustive search is for fleets of at most {MAX_HOSTS} hosts")
    fit = host_fit(state, role, eligible_hosts(state, role), role.replicas)
    best: Split | None = None
    for hosts in _groups(tree, fit, role, cap).values():
        found = _search(state, role, fit, hosts, math.inf if best is None else best.cost)
        if found is not None and (best is None or found.cost < best.cost - 1e-9):
            best = found
    return best


def optimal_cost(state: FleetState, role: Role, cap: Level = Level.SPINE) -> float:
    """Cost of ``optimal``; ``math.inf`` when the role cannot be placed at all."""
    found = optimal(state, role, cap)
    return math.inf if found is None else found.cost


def first_fit(state: FleetState, role: Role) -> Split | None:
    """The naive baseline: hosts in index order, each taking as many replicas as it can.

    GPU types are never mixed: types are tried in the order their first usable host appears,
    and the first that holds every replica wins. None when no type can.
    """
    tree = state.tree
    fit = host_fit(state, role, eligible_hosts(state, role), role.replicas)
    by_type: dict[str, list[int]] = {}
    for h in range(len(tree.hosts)):
        if fit.slots[h] > 0:
            by_type.setdefault(_gpu_type(tree, h, role), []).append(h)
    for hosts in by_type.values():
        counts: dict[int, int] = {}
        left = role.replicas
        for h in hosts:
            take = min(int(fit.slots[h]), left)
            counts[h] = take
            left -= take
            if left == 0:
                return _priced(state, role, counts)
    return None


def _gpu_type(tree: TopologyTree, host: int, role: Role) -> str:
    return tree.pool_of(host).gpu_type if role.gpus else ""


def _groups(
    tree: TopologyTree, fit: HostFit, role: Role, cap: Level
) -> dict[tuple[str, int], list[int]]:
    """Usable hosts by (GPU type, domain at ``cap``), each list in host order."""
    groups: dict[tuple[str, int], list[int]] = {}
    for h in range(len(tree.hosts)):
        if fit.slots[h] > 0:
            key = (_gpu_type(tree, h, role), tree.domain_of(h, cap))
            groups.setdefault(key, []).append(h)
    return groups


def _priced(state: FleetState, role: Role, counts: dict[int, int]) -> Split:
    grants = assign(state, role, counts)
    return Split(dict(counts), tuple(grants), role_cost(state.tree, grants).total)


def _search(
    state: FleetState, role: Role, fit: HostFit, hosts: list[int], bound: float
) -> Split | None:
    """The cheapest split over ``hosts`` that costs less than ``bound``, or None.

    Depth-first over replicas per host, most first so good splits come early, cutting any
    branch whose lower bound already reaches the best cost found.
    """
    tree = state.tree
    w = tree.weights
    slots = [int(fit.slots[h]) for h in hosts]
    room_after = [sum(slots[i:]) for i in range(len(hosts) + 1)]
    best: Split | None = None

    def lower(counts: dict[int, int]) -> float:
        # Hops every completion of ``counts`` pays at least: rack, pod and spine hops between
        # the hosts chosen so far, and one NVLink-or-dearer hop per GPU beyond the first on each.
        if not counts:
            return 0.0
        racks = {int(tree.host_rack[h]) for h in counts}
        pods = {int(tree.host_pod[h]) for h in counts}
        spread = (len(counts) - len(racks)) * w.rack + (len(racks) - len(pods)) * w.pod
        inside = sum(max(k * role.gpus - 1, 0) for k in counts.values()) * w.nvlink
        return spread + (len(pods) - 1) * w.spine + inside

    def walk(i: int, left: int, counts: dict[int, int]) -> None:
        nonlocal best
        limit = bound if best is None else best.cost
        if lower(counts) >= limit - 1e-9 or room_after[i] < left:
            return
        if left == 0:
            split = _priced(state, role, counts)
            if split.cost < limit - 1e-9:
                best = split
            return
        for take in range(min(slots[i], left), -1, -1):
            if take:
                counts[hosts[i]] = take
            walk(i + 1, left - take, counts)
            counts.pop(hosts[i], None)

    walk(0, role.replicas, {})
    return best


# --- random small cases: shared by bench/quality.py and tests/unit/core/test_placement_quality.py

_POOLS = (
    make_pool("hgx", "H100-80GB", 80, gpus=8, island=8),
    make_pool("pcie", "H100-80GB", 80, gpus=8, island=4),
    make_pool("l4", "L4-24GB", 24, gpus=4, island=1),
    make_pool("a100", "A100-40GB", 40, gpus=8, island=8),
)


@dataclass(frozen=True, slots=True)
class QualityCase:
    """A small random fleet, its occupancy and one single-role job."""

    seed: int
    state: FleetState
    role: Role


@dataclass(frozen=True, slots=True)
class QualityResult:
    """How the engine, the exhaustive optimum and first-fit did on one case."""

    seed: int
    engine: float | None
    optimum: float | None
    first_fit: float | None
    frag_engine: float | None
    frag_first_fit: float | None


def random_case(seed: int) -> QualityCase:
    """Case ``seed``: 1-2 pools, 1-2 pods of 1-3 racks of 1-4 hosts (at most 10), 0-80% busy."""
    rng = random.Random(seed)
    pools = tuple(rng.sample(_POOLS, rng.choice((1, 1, 2))))
    layout: list[HostLayout] = []
    for p in range(rng.randint(1, 2)):
        for r in range(rng.randint(1, 3)):
            for h in range(rng.randint(1, 4)):
                if len(layout) < 10:
                    pool = rng.randrange(len(pools))
                    layout.append(HostLayout(f"p{p}-r{r}-h{h}", pool, f"p{p}", f"p{p}-r{r}"))
    tree = TopologyTree.build(f"case-{seed}", pools, layout)
    state = scatter(tree, rng.uniform(0.0, 0.8), rng)
    gpus = rng.choice((1, 1, 2, 4, 4, 8))
    tp = rng.choice([t for t in (1, 2, 4) if t <= gpus and gpus % t == 0])
    replicas = rng.randint(1, 6 if gpus <= 2 else 4)
    return QualityCase(seed, state, make_role("worker", replicas=replicas, gpus=gpus, tp=tp))


def scatter(tree: TopologyTree, fraction: float, rng: random.Random) -> FleetState:
    """A state with about ``fraction`` of GPUs held by single-host jobs at random free GPUs.

    Unlike ``builders.occupy`` it works on fleets whose hosts have different GPU counts, and it
    leaves free GPUs scattered across islands, the hardest case for the within-host selector.
    """
    state = FleetState(tree)
    hosts = [h.index for h in tree.hosts if tree.host_gpus[h.index] > 0]
    target = int(tree.total_gpus * fraction)
    n = 0
    while state.free_gpus > tree.total_gpus - target and hosts:
        h = rng.choice(hosts)
        free = [int(g) for g in state.free[h].nonzero()[0]]
        size = min(rng.choice((1, 1, 2, 4, 8)), len(free), tree.total_gpus - target)
        if size == 0:
            continue
        gpus = tuple(sorted(rng.sample(free, size)))
        end = rng.uniform(600, 8 * 3600)
        state.allocate(Allocation(f"bg-{n}", (Grant("w", 0, h, gpus),), end))
        n += 1
    return state


def evaluate(case: QualityCase) -> QualityResult:
    """Place ``case`` with the engine, the exhaustive search and first-fit; compare them."""
    state, role = case.state, case.role
    decision = place_now(state, make_gang(case.role.name, roles=(role,)))
    best = optimal(state, role)
    naive = first_fit(state, role)
    engine = decision.placement
    return QualityResult(
        seed=case.seed,
        engine=engine.cost.total if engine else None,
        optimum=best.cost if best else None,
        first_fit=naive.cost if naive else None,
        frag_engine=_fragmentation_after(state, engine.grants) if engine else None,
        frag_first_fit=_fragmentation_after(state, naive.grants) if naive else None,
    )


def _fragmentation_after(state: FleetState, grants: tuple[Grant, ...]) -> float:
    after = state.copy()
    after.allocate(Allocation("candidate", grants))
    return measure(after).index


def _ratio(a: float, b: float) -> float:
    if b > 0:
        return a / b
    return 1.0 if a <= 1e-9 else math.inf


def summarize(results: list[QualityResult]) -> dict[str, float | int]:
    """The headline figures: share optimal, worst and mean ratio, and the first-fit comparison.

    Ratios are engine over optimum (or over first-fit) per case; one whose denominator is zero
    counts as 1 when the numerator is zero too. Fragmentation is ``measure(state).index`` after
    allocating each placement; its ratio is of the means, as most cases score 0 or 1.
    """
    pairs = [(r.engine, r.optimum) for r in results]
    placed = [(e, o) for e, o in pairs if e is not None and o is not None]
    vs_opt = [_ratio(e, o) for e, o in placed]
    both = [r for r in results if r.engine is not None and r.first_fit is not None]
    cost_ff = [_ratio(r.engine or 0.0, r.first_fit or 0.0) for r in both]
    frag_e = [r.frag_engine or 0.0 for r in both]
    frag_ff = [r.frag_first_fit or 0.0 for r in both]
    mean_e = statistics.fmean(frag_e) if both else 0.0
    mean_ff = statistics.fmean(frag_ff) if both else 0.0
    return {
        "cases": len(results),
        "placed": len(placed),
        "feasibility_disagreements": sum(1 for e, o in pairs if (e is None) != (o is None)),
        "optimal_share": (
            sum(1 for e, o in placed if e <= o + 1e-9) / len(placed) if placed else 1.0
        ),
        "worst_ratio_vs_optimal": max(vs_opt, default=1.0),
        "share_over_10_percent_worse": (
            sum(1 for v in vs_opt if v > 1.10 + 1e-9) / len(vs_opt) if vs_opt else 0.0
        ),
        "mean_ratio_vs_optimal": statistics.fmean(vs_opt) if vs_opt else 1.0,
        "median_cost_ratio_vs_first_fit": statistics.median(cost_ff) if cost_ff else 1.0,
        "mean_cost_ratio_vs_first_fit": statistics.fmean(cost_ff) if cost_ff else 1.0,
        "mean_fragmentation_engine": mean_e,
        "mean_fragmentation_first_fit": mean_ff,
        "fragmentation_ratio_vs_first_fit": _ratio(mean_e, mean_ff),
        "median_fragmentation_ratio_vs_first_fit": (
            statistics.median(_ratio(e, f) for e, f in zip(frag_e, frag_ff, strict=True))
            if both
            else 1.0
        ),
    }

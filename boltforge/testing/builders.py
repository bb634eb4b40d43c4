"""Builders for fleets, gangs and states: ``make_fleet(racks=4, hosts=8)``, ``make_gang(...)``."""

from __future__ import annotations

import random

from boltforge.core.model.gang import Capability, Gang, Role, TopologyRule
from boltforge.core.model.levels import CrossingWeights, Level
from boltforge.core.model.state import Allocation, FleetState, Grant
from boltforge.core.model.topology import HostLayout, Pool, Tier, TopologyTree


def make_pool(
    name: str = "h100",
    gpu_type: str = "H100-80GB",
    memory_gb: float = 80,
    gpus: int = 8,
    island: int = 8,
    tier: Tier = Tier.RESERVED,
    price: float = 2.5,
    cpus: int = 128,
    host_memory_gb: float = 1024,
) -> Pool:
    return Pool(
        name,
        gpu_type,
        memory_gb,
        gpus,
        island if gpus else 1,
        cpus,
        host_memory_gb,
        gpus,
        tier,
        price,
    )


def make_fleet(
    pods: int = 1,
    racks: int = 2,
    hosts: int = 4,
    gpus: int = 8,
    island: int = 8,
    pools: list[Pool] | None = None,
    weights: CrossingWeights | None = None,
) -> TopologyTree:
    """A fleet of ``pods`` x ``racks`` x ``hosts``; with several pools each gets its own pods."""
    pool_list = pools or [make_pool(gpus=gpus, island=island)]
    layout = []
    for pi, pool in enumerate(pool_list):
        for p in range(pods):
            for r in range(racks):
                for h in range(hosts):
                    pod, rack = f"{pool.name}-p{p}", f"{pool.name}-p{p}-r{r}"
                    layout.append(HostLayout(f"{rack}-h{h}", pi, pod, rack))
    return TopologyTree.build("test", tuple(pool_list), layout, weights)


def make_role(
    name: str = "worker",
    replicas: int = 1,
    gpus: int = 8,
    tp: int = 1,
    cpus: float = 0,
    memory_gb: float = 0,
    gpu_types: tuple[str, ...] = (),
    min_memory: float = 0,
) -> Role:
    cap = Capability(frozenset(gpu_types), min_memory)
    return Role(name, replicas, gpus, cpus, memory_gb, cap, tp)


def make_gang(
    name: str = "job",
    gpus: int = 8,
    per_node: int = 8,
    tp: int = 1,
    required: Level | None = None,
    preferred: Level | None = None,
    roles: tuple[Role, ...] = (),
    team: str = "research",
) -> Gang:
    """A gang of ``gpus`` GPUs split ``per_node`` per replica, or of explicit ``roles``."""
    if not roles:
        roles = (make_role(replicas=max(1, gpus // per_node), gpus=min(per_node, gpus), tp=tp),)
    return Gang(name, roles, TopologyRule(required, preferred), team)


# Job sizes (GPUs) and how often each occurs among running jobs: mostly small, a heavy tail.
STATE_ARRAYS = (  # every per-GPU, per-host and per-domain array a ``FleetState`` keeps
    "free",
    "free_cpus",
    "free_memory",
    "free_storage",
    "cordoned",
    "degraded",
    "island_free",
    "host_free",
    "island_max",
    "rack_free",
    "pod_free",
    "fit_key",
)
JOB_SIZES = ((1, 40), (2, 10), (4, 15), (8, 20), (16, 6), (32, 4), (64, 3), (128, 1.5), (256, 0.5))


def occupy(tree: TopologyTree, fraction: float, seed: int = 0, churn: float = 0.25) -> FleetState:
    """A state with about ``fraction`` of GPUs busy and the ragged free space of a real fleet.

    Jobs drawn from ``JOB_SIZES`` are first packed rack by rack (small jobs share hosts, large
    ones take whole hosts) up to ``fraction + churn``, as a packing scheduler would leave a busy
    fleet; then random jobs end until ``fraction`` remains, leaving holes of every size. Each job
    gets an expected end between 10 minutes and 8 hours from time 0.
    """
    rng = random.Random(seed)
    state = FleetState(tree)
    racks = list(range(len(tree.rack_names)))
    rng.shuffle(racks)
    order = [int(h) for r in racks for h in tree.rack_hosts[r] if h >= 0 and tree.host_gpus[h]]
    total = tree.total_gpus
    sizes, weights = zip(*JOB_SIZES, strict=True)
    used, cursor, n, misses = 0, 0, 0, 0
    partial: list[int] = []
    while used < min(fraction + churn, 0.98) * total and misses < 50:
        size = rng.choices(sizes, weights)[0]
        grants = _pack_one(state, order, partial, cursor, size)
        if grants is None:
            misses += 1  # too big for what is left: draw another size
            continue
        misses = 0
        cursor = max(cursor, max(g.host_pos for g in grants) + 1)
        real = tuple(Grant("w", i, g.host, g.gpus) for i, g in enumerate(grants))
        state.allocate(Allocation(f"bg-{n}", real, rng.uniform(600, 8 * 3600)))
        used += size
        n += 1
    jobs = list(state.allocations)
    rng.shuffle(jobs)
    for job in jobs:
        if state.free_gpus >= (1 - fraction) * total:
            break
        state.release(job)
    return state


class _Spot:
    __slots__ = ("gpus", "host", "host_pos")

    def __init__(self, host: int, host_pos: int, gpus: tuple[int, ...]) -> None:
        self.host, self.host_pos, self.gpus = host, host_pos, gpus


def _pack_one(
    state: FleetState, order: list[int], partial: list[int], cursor: int, size: int
) -> list[_Spot] | None:
    per_host = int(state.tree.host_gpus[order[0]]) if order else 0
    if size < per_host:
        for pos in partial[-4:]:
            free = [int(g) for g in state.free[order[pos]].nonzero()[0]]
            if len(free) >= size:
                return [_Spot(order[pos], pos, tuple(free[:size]))]
        if cursor >= len(order):
            return None
        partial.append(cursor)
        return [_Spot(order[cursor], cursor, tuple(range(size)))]
    hosts = -(-size // per_host)
    if cursor + hosts > len(order):
        return None
    return [_Spot(order[p], p, tuple(range(per_host))) for p in range(cursor, cursor + hosts)]

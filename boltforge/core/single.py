"""The fast path for a role of one replica: the cheapest, tightest single host, no search."""

from __future__ import annotations

import numpy as np

from boltforge.core import cost as costs
from boltforge.core.answers import Alternative, RolePlan
from boltforge.core.gang import Role
from boltforge.core.hostfit import select_gpus
from boltforge.core.levels import Level
from boltforge.core.state import FleetState, Grant
from boltforge.core.topology import BoolArray, IntArray, TopologyTree

_EPS = 1e-9


def plan_single(
    state: FleetState, role: Role, eligible: BoolArray, cap: Level, gpu_type: str
) -> RolePlan | None:
    """Place one replica of ``role`` on the best host among ``eligible`` (None: none has room).

    Same answer as the general search for one replica, computed on whole columns at once: the
    host with the cheapest ring inside it, then the fewest GPUs left free on it, then in its
    rack, then in its pod (best fit keeps empty hosts, racks and pods whole). With ``cap ==
    ISLAND`` only a single NVLink island may hold it. The two runners-up are the alternatives.
    """
    hosts = _hosts_with_room(state, role, eligible, cap == Level.ISLAND)
    if hosts.size == 0:
        return None
    islands = _islands_needed(state, hosts, role.gpus)
    best = _best_three(state, hosts, islands, role.gpus)
    tree = state.tree
    host = int(hosts[best[0]])
    grants = [Grant(role.name, 0, host, replica_gpus(state, host, role), role.cpus, role.memory_gb)]
    alternatives = tuple(
        Alternative(Level.HOST, tree.hosts[int(h)].name, _ring(tree, role.gpus, int(n)), 1)
        for h, n in zip(hosts[best[1:]], islands[best[1:]], strict=True)
    )
    level = Level.ISLAND if cap == Level.ISLAND else Level.HOST
    return RolePlan(
        role.name,
        level,
        tree.hosts[host].name,
        tuple(grants),
        costs.role_cost(tree, grants),
        alternatives,
        gpu_type,
    )


def _hosts_with_room(state: FleetState, role: Role, eligible: BoolArray, island: bool) -> IntArray:
    g, t = role.gpus, role.tensor_parallel
    if island:
        ok = state.island_max >= g
    elif t > 1:
        ok = (state.island_free // t).sum(axis=1) >= g // t
    else:
        ok = state.host_free >= g
    ok &= eligible & ~state.cordoned
    if role.cpus > 0:
        ok &= state.free_cpus >= role.cpus * (1 - _EPS)
    if role.memory_gb > 0:
        ok &= state.free_memory >= role.memory_gb * (1 - _EPS)
    return np.flatnonzero(ok)


def _islands_needed(state: FleetState, hosts: IntArray, g: int) -> IntArray:
    """NVLink islands one replica of ``g`` GPUs spans on each host, packed into the fewest."""
    islands = np.ones(hosts.size, dtype=np.int64)
    spill = np.flatnonzero(state.island_max[hosts] < g) if g else hosts[:0]
    if spill.size:
        covered = np.cumsum(-np.sort(-state.island_free[hosts[spill]], axis=1), axis=1)
        islands[spill] = (covered < g).sum(axis=1) + 1
    return islands


def _ring(tree: TopologyTree, g: int, islands: int) -> float:
    """Ring cost inside one host for a replica of ``g`` GPUs over ``islands`` islands."""
    if g == 0:
        return 0.0
    w = tree.weights
    return float((g - islands) * w.nvlink + (islands - 1) * w.host)


def _best_three(state: FleetState, hosts: IntArray, islands: IntArray, g: int) -> IntArray:
    """Positions in ``hosts`` of the three best, best first: the cheapest ring inside the host
    (the fewest islands spanned, when a host hop costs more than an NVLink hop), then the
    fewest GPUs left on the host, in its rack, in its pod, then the lowest index."""
    tree = state.tree
    w = tree.weights
    ring = islands if w.host > w.nvlink else (g - islands) * w.nvlink + (islands - 1) * w.host
    keys = (
        state.pod_free[tree.host_pod[hosts]],
        state.rack_free[tree.host_rack[hosts]],
        state.host_free[hosts],
        ring,
    )
    return np.lexsort(keys)[:3]


def plan_on_host(state: FleetState, role: Role, host: int, gpu_type: str) -> RolePlan | None:
    """One replica of ``role`` on ``host`` inside one NVLink island, if it still has room there.

    The cycle uses this to repeat the previous job's host for a job of the same shape: after a
    one-host job took GPUs on the best host ``h`` (one island holding it), ``h`` still has the
    cheapest ring (one island) and now the fewest GPUs left, so it stays the best host for the
    same shape as long as one island still holds the replica. First-fit's choice repeats too:
    the hosts before ``h`` had no room and gained none.
    """
    g = role.gpus
    ok = state.island_max[host] >= g and not state.cordoned[host]
    if role.tensor_parallel > 1:
        ok = (
            ok
            and int((state.island_free[host] // role.tensor_parallel).sum())
            * (role.tensor_parallel)
            >= g
        )
    if role.cpus > 0:
        ok = ok and state.free_cpus[host] >= role.cpus * (1 - _EPS)
    if role.memory_gb > 0:
        ok = ok and state.free_memory[host] >= role.memory_gb * (1 - _EPS)
    if not ok:
        return None
    tree = state.tree
    grants = [Grant(role.name, 0, host, replica_gpus(state, host, role), role.cpus, role.memory_gb)]
    return RolePlan(
        role.name,
        Level.HOST,
        tree.hosts[host].name,
        tuple(grants),
        costs.role_cost(tree, grants),
        (),
        gpu_type,
    )


def replica_gpus(state: FleetState, host: int, role: Role) -> tuple[int, ...]:
    """The GPUs ``select_gpus`` picks for one replica of ``role`` on ``host`` (no template),
    read off the state's per-island counts when one island holds the replica: the tightest
    such island (the lowest on ties; islands number GPUs in order), its lowest free GPUs."""
    g = role.gpus
    counts = state.island_free[host].tolist()
    fitting = [(n, i) for i, n in enumerate(counts) if n >= g]
    if g == 0 or not fitting:
        (gpus,) = select_gpus(state.free[host].copy(), state.tree.gpu_island[host], 1, role)
        return gpus
    island = min(fitting)[1]
    free = np.flatnonzero(state.free[host] & (state.tree.gpu_island[host] == island))
    return tuple(free[:g].tolist())

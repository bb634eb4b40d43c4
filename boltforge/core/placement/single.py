"""The fast path for a role of one replica: the cheapest, tightest single host, no search."""

from __future__ import annotations

import numpy as np

from boltforge.core.model.gang import Role
from boltforge.core.model.levels import Level
from boltforge.core.model.state import FleetState, Grant
from boltforge.core.model.topology import BoolArray, IntArray, TopologyTree
from boltforge.core.placement import crossing as costs
from boltforge.core.placement.answers import Alternative, RolePlan
from boltforge.core.placement.hostfit import select_gpus

_EPS = 1e-9
_NO_ROOM = np.iinfo(np.int64).max


def plan_single(
    state: FleetState, role: Role, eligible: BoolArray, cap: Level, gpu_type: str
) -> RolePlan | None:
    """Place one replica of ``role`` on the best host among ``eligible`` (None: none has room).

    Same answer as the general search for one replica, computed on whole columns at once: the
    host with the cheapest ring inside it, then the fewest GPUs left free on it, then in its
    rack, then in its pod (best fit keeps empty hosts, racks and pods whole). With ``cap ==
    ISLAND`` only a single NVLink island may hold it. The two runners-up are the alternatives.
    """
    ok = _room(state, role, eligible, cap == Level.ISLAND)
    islands = _islands_needed(state, ok, role.gpus)
    best = _best_three(state, ok, islands)
    if not best:
        return None
    tree = state.tree
    host = best[0]
    grants = [_grant(state, host, role)]
    alternatives = tuple(
        Alternative(Level.HOST, tree.hosts[h].name, _ring(tree, role.gpus, _at(islands, h)), 1)
        for h in best[1:]
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


def _room(state: FleetState, role: Role, eligible: BoolArray, island: bool) -> BoolArray:
    """Mask of the eligible, uncordoned hosts that can hold one replica of ``role``."""
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
    if role.storage_gb > 0:
        ok &= state.free_storage >= role.storage_gb * (1 - _EPS)
    return ok


def _islands_needed(state: FleetState, ok: BoolArray, g: int) -> IntArray | None:
    """Per host, the NVLink islands one replica of ``g`` GPUs spans there, packed into the
    fewest (1 on hosts outside ``ok``); None when one island holds it on every ``ok`` host."""
    short = state.island_max < g
    short &= ok
    spill = np.flatnonzero(short)
    if not spill.size:
        return None
    islands = np.ones(ok.size, dtype=np.int64)
    covered = np.cumsum(-np.sort(-state.island_free[spill], axis=1), axis=1)
    islands[spill] = (covered < g).sum(axis=1) + 1
    return islands


def _at(islands: IntArray | None, host: int) -> int:
    return 1 if islands is None else int(islands[host])


def _ring(tree: TopologyTree, g: int, islands: int) -> float:
    """Ring cost inside one host for a replica of ``g`` GPUs over ``islands`` islands."""
    if g == 0:
        return 0.0
    w = tree.weights
    return float((g - islands) * w.nvlink + (islands - 1) * w.host)


def _best_three(state: FleetState, ok: BoolArray, islands: IntArray | None) -> list[int]:
    """The three best hosts among ``ok``, best first: the cheapest ring inside the host, then
    the fewest GPUs left on the host, in its rack, in its pod (``FleetState.fit_key``), then
    the lowest index. A ring over ``n`` islands costs ``(g - n)·nvlink + (n - 1)·host``, so
    it grows with ``n`` when a host hop costs more than an NVLink hop, shrinks when it costs
    less, and is the same for every host when they are equal (or ``islands`` is None)."""
    tree = state.tree
    spans, w = tree.fit_spans, tree.weights
    key = state.fit_key
    if islands is not None and w.host != w.nvlink:
        rank = islands - 1 if w.host > w.nvlink else spans.islands - islands
        key = key + rank * spans.ring_weight
    key = np.where(ok, key, _NO_ROOM)
    best: list[int] = []
    for _ in range(3):
        h = int(key.argmin())
        if key[h] == _NO_ROOM:
            break
        best.append(h)
        key[h] = _NO_ROOM
    return best


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
    if role.storage_gb > 0:
        ok = ok and state.free_storage[host] >= role.storage_gb * (1 - _EPS)
    if not ok:
        return None
    tree = state.tree
    grants = [_grant(state, host, role)]
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
    island_of = state.tree.host_lists.island[host]
    free = state.free[host].tolist()
    chosen = [gpu for gpu, ok in enumerate(free) if ok and island_of[gpu] == island]
    return tuple(chosen[:g])


def _grant(state: FleetState, host: int, role: Role) -> Grant:
    """One replica of ``role`` on ``host``: its GPUs there, CPUs, memory and storage."""
    gpus = replica_gpus(state, host, role)
    return Grant(role.name, 0, host, gpus, role.cpus, role.memory_gb, role.storage_gb)

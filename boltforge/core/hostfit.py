"""What each host can take of one role right now, and which of its GPUs a replica gets."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from boltforge.core.gang import Role
from boltforge.core.levels import CrossingWeights
from boltforge.core.state import FleetState
from boltforge.core.topology import BoolArray, FloatArray, IntArray

_UNBOUNDED = 1 << 30


@dataclass(frozen=True, slots=True)
class HostFit:
    """Per-host capacity for one role.

    ``slots[h]``: how many replicas host ``h`` can take (0 where ineligible or cordoned).
    ``intra[h, k]``: ring cost inside host ``h`` when it takes ``k`` replicas (NVLink hops inside
    islands, host hops between them); ``inf`` beyond ``slots[h]``.
    ``free[h]``: free GPUs on the host, for best-fit tie-breaking.
    """

    slots: IntArray
    intra: FloatArray
    free: IntArray


def eligible_hosts(state: FleetState, role: Role) -> BoolArray:
    """Hosts whose pool satisfies the role's capability (ignoring what is free)."""
    tree = state.tree
    ok_pools = np.array([role.capability.accepts(p, role.gpus > 0) for p in tree.pools])
    if role.gpus > 0:
        sizes = np.array([p.island_size for p in tree.pools])
        per_host = np.array([p.gpus_per_host for p in tree.pools])
        ok_pools &= (sizes >= role.tensor_parallel) & (per_host >= role.gpus)
    return ok_pools[tree.host_pool] if len(tree.pools) else np.zeros(0, dtype=np.bool_)


def host_fit(state: FleetState, role: Role, eligible: BoolArray, limit: int) -> HostFit:
    """Compute ``HostFit`` for ``role`` over all hosts; ``limit`` caps slots (the replica count)."""
    island_free = state.free_per_island()
    free = island_free.sum(axis=1)
    slots = np.full(free.shape, _UNBOUNDED, dtype=np.int64)
    g, t = role.gpus, role.tensor_parallel
    if g > 0:
        slots = (island_free // t).sum(axis=1) // (g // t) if t > 1 else free // g
    if role.cpus > 0:
        slots = np.minimum(slots, np.floor(state.free_cpus / role.cpus + 1e-9).astype(np.int64))
    if role.memory_gb > 0:
        by_mem = np.floor(state.free_memory / role.memory_gb + 1e-9).astype(np.int64)
        slots = np.minimum(slots, by_mem)
    slots = np.where(eligible & ~state.cordoned, np.minimum(slots, limit), 0)
    intra = _intra_costs(island_free, slots, g, state.tree.weights)
    return HostFit(slots=slots, intra=intra, free=free)


def _intra_costs(island_free: IntArray, slots: IntArray, g: int, w: CrossingWeights) -> FloatArray:
    """Ring cost inside each host for k = 0..max(slots) replicas, packing into fewest islands."""
    kmax = int(slots.max()) if slots.size else 0
    ks = np.arange(kmax + 1)
    if g == 0:
        cost = np.zeros((slots.size, kmax + 1))
    else:
        covered = np.cumsum(-np.sort(-island_free, axis=1), axis=1)  # (n, I)
        need = ks * g  # (K,)
        islands = (covered[:, None, :] < need[None, :, None]).sum(axis=2) + 1  # (n, K)
        cost = (need[None, :] - islands) * w.nvlink + (islands - 1) * w.host
        cost[:, 0] = 0.0
    cost = cost.astype(np.float64)
    cost[ks[None, :] > slots[:, None]] = np.inf
    return cost


def select_gpus(
    free_row: BoolArray,
    island_of: IntArray,
    count: int,
    role: Role,
    template: list[tuple[int, ...]] | None = None,
) -> list[tuple[int, ...]]:
    """Pick GPUs on one host for ``count`` replicas of ``role``; mutates ``free_row``.

    Each replica goes, in order of preference: onto the same local GPU indices as the matching
    replica of ``template`` (keeps data-parallel peers on the same network rail); inside the
    single island that fits it most tightly; or across islands, whole tensor-parallel groups per
    island, fullest islands first. The caller guarantees the host has the slots.
    """
    chosen: list[tuple[int, ...]] = []
    for j in range(count):
        want = template[j] if template and j < len(template) else None
        if want is not None and _usable(free_row, island_of, want, role.tensor_parallel):
            pick = want
        else:
            pick = _pack(free_row, island_of, role.gpus, role.tensor_parallel)
        free_row[list(pick)] = False
        chosen.append(pick)
    return chosen


def _usable(free_row: BoolArray, island_of: IntArray, gpus: tuple[int, ...], t: int) -> bool:
    if not all(free_row[g] for g in gpus):
        return False
    groups = [gpus[i : i + t] for i in range(0, len(gpus), t)]
    return all(len({int(island_of[g]) for g in grp}) == 1 for grp in groups)


def _pack(free_row: BoolArray, island_of: IntArray, g: int, t: int) -> tuple[int, ...]:
    if g == 0:
        return ()
    islands: dict[int, list[int]] = {}
    for gpu in np.flatnonzero(free_row & (island_of >= 0)):
        islands.setdefault(int(island_of[gpu]), []).append(int(gpu))
    fitting = [members for members in islands.values() if len(members) >= g]
    if fitting:
        return tuple(min(fitting, key=len)[:g])
    pick: list[int] = []
    for members in sorted(islands.values(), key=len, reverse=True):
        usable = (len(members) // t) * t
        pick.extend(members[: min(usable, g - len(pick))])
        if len(pick) == g:
            break
    return tuple(sorted(pick))

"""What each host can take of one role right now, and which of its GPUs a replica gets."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from boltforge.core.model.gang import Role
from boltforge.core.model.levels import CrossingWeights
from boltforge.core.model.state import FleetState
from boltforge.core.model.topology import BoolArray, FloatArray, IntArray

_UNBOUNDED = 1 << 30


@dataclass(frozen=True, slots=True)
class HostFit:
    """Per-host capacity for one role.

    ``slots[h]``: how many replicas host ``h`` can take (0 where ineligible or cordoned).
    ``intra[h, k]``: ring cost inside host ``h`` when it takes ``k`` replicas (NVLink hops inside
    islands, host hops between them); ``inf`` beyond ``slots[h]``.
    ``free[h]``: free GPUs on the host, and ``rack_free`` / ``pod_free`` per rack and pod, for
    best-fit tie-breaking.
    """

    slots: IntArray
    intra: FloatArray
    free: IntArray
    rack_free: IntArray
    pod_free: IntArray


def eligible_hosts(state: FleetState, role: Role) -> BoolArray:
    """Hosts whose pool satisfies the role's capability (ignoring what is free), less the
    degraded hosts when the role's replicas talk to peers (``talks``).

    The pool part depends only on the fleet's pools, so it is remembered per fleet; callers
    get a fresh array they may change.
    """
    tree = state.tree
    key = (role.capability, role.gpus, role.tensor_parallel, role.node_class)
    cached = tree.eligible_cache.get(key)
    if cached is None:
        cached = _eligible(state, role)
        tree.eligible_cache[key] = cached
    if talks(role) and state.degraded.any():
        return cached & ~state.degraded
    return cached.copy()


def talks(role: Role) -> bool:
    """Whether ``role``'s replicas communicate heavily (several replicas, or a tensor-parallel
    group): such replicas never go to a degraded host, where one slow GPU or link would
    slow the whole collective."""
    return role.replicas > 1 or role.tensor_parallel > 1


def _eligible(state: FleetState, role: Role) -> BoolArray:
    """Hosts whose pool meets the role's capability and node class: storage work only on
    storage nodes, and nothing else there (CPU-only work may use GPU nodes' spare CPUs)."""
    tree = state.tree
    storage = role.node_class == "storage"
    ok_pools = np.array(
        [
            role.capability.accepts(p, role.gpus > 0) and (p.kind == "storage") == storage
            for p in tree.pools
        ]
    )
    if role.gpus > 0:
        sizes = np.array([p.island_size for p in tree.pools])
        per_host = np.array([p.gpus_per_host for p in tree.pools])
        ok_pools &= (sizes >= role.tensor_parallel) & (per_host >= role.gpus)
    return ok_pools[tree.host_pool] if len(tree.pools) else np.zeros(0, dtype=np.bool_)


def host_fit(
    state: FleetState, role: Role, eligible: BoolArray, limit: int, island_only: bool = False
) -> HostFit:
    """Compute ``HostFit`` for ``role`` over all hosts; ``limit`` caps slots (the replica count).

    With ``island_only`` a host offers only what its largest free island holds, for roles that
    must stay inside one NVLink island.
    """
    island_free = state.free_per_island()
    free = state.host_free
    slots = np.full(free.shape, _UNBOUNDED, dtype=np.int64)
    g, t = role.gpus, role.tensor_parallel
    if g > 0 and island_only:
        slots = state.island_max // g
    elif g > 0:
        slots = (island_free // t).sum(axis=1) // (g // t) if t > 1 else free // g
    if role.cpus > 0:
        slots = np.minimum(slots, np.floor(state.free_cpus / role.cpus + 1e-9).astype(np.int64))
    if role.memory_gb > 0:
        by_mem = np.floor(state.free_memory / role.memory_gb + 1e-9).astype(np.int64)
        slots = np.minimum(slots, by_mem)
    if role.storage_gb > 0:
        by_disk = np.floor(state.free_storage / role.storage_gb + 1e-9).astype(np.int64)
        slots = np.minimum(slots, by_disk)
    slots = np.where(eligible & ~state.cordoned, np.minimum(slots, limit), 0)
    intra = _intra_costs(island_free, state.island_max, slots, g, state.tree.weights)
    return HostFit(slots, intra, free, state.rack_free, state.pod_free)


def _intra_costs(
    island_free: IntArray, island_max: IntArray, slots: IntArray, g: int, w: CrossingWeights
) -> FloatArray:
    """Ring cost inside each host for k = 0..max(slots) replicas, packing into fewest islands."""
    kmax = int(slots.max()) if slots.size else 0
    ks = np.arange(kmax + 1)
    if g == 0:
        cost = np.zeros((slots.size, kmax + 1))
    else:
        need = ks * g  # (K,)
        islands = np.ones((slots.size, kmax + 1), dtype=np.int64)
        # Only hosts whose largest free island cannot hold all they may take need sorting.
        spill = np.flatnonzero(slots * g > island_max)
        if spill.size:
            covered = np.cumsum(-np.sort(-island_free[spill], axis=1), axis=1)  # (s, I)
            islands[spill] = (covered[:, None, :] < need[None, :, None]).sum(axis=2) + 1
        cost = ((need[None, :] - islands) * w.nvlink + (islands - 1) * w.host).astype(np.float64)
        cost[:, 0] = 0.0
    for k in range(1, kmax + 1):  # a column at a time: cheaper than a 2-D boolean mask
        cost[slots < k, k] = np.inf
    return cost


def select_gpus(
    free_row: BoolArray,
    island_of: IntArray,
    count: int,
    role: Role,
    template: list[tuple[int, ...]] | None = None,
    same_layout: bool = False,
) -> list[tuple[int, ...]]:
    """Pick GPUs on one host for ``count`` replicas of ``role``; mutates ``free_row``.

    Replicas first reuse the local GPU indices of ``template`` (the lead host's replicas) where
    those are free and keep tensor-parallel groups inside islands: that keeps data-parallel peers
    on the same network rail. The rest are packed into the fewest islands that hold them all
    (the tightest single island when one suffices), each replica inside one island where
    possible, else as whole tensor-parallel groups across islands. The caller guarantees the
    host has the slots. ``same_layout`` says the template comes from a host with the same
    island layout, so its tensor-parallel groups need no re-check.
    """
    if role.gpus == 0:
        return [() for _ in range(count)]
    chosen: list[tuple[int, ...]] = []
    for want in template or []:
        if len(chosen) == count:
            break
        if bool(free_row[list(want)].all()) and (
            same_layout or _grouped(island_of, want, role.tensor_parallel)
        ):
            free_row[list(want)] = False
            chosen.append(want)
    islands = _islands(free_row, island_of, (count - len(chosen)) * role.gpus)
    while len(chosen) < count:
        pick = _pack(islands, role.gpus, role.tensor_parallel)
        free_row[list(pick)] = False
        chosen.append(pick)
    return chosen


def _grouped(island_of: IntArray, gpus: tuple[int, ...], t: int) -> bool:
    groups = [gpus[i : i + t] for i in range(0, len(gpus), t)]
    return all(len({int(island_of[g]) for g in grp}) == 1 for grp in groups)


def _islands(free_row: BoolArray, island_of: IntArray, need: int) -> list[list[int]]:
    """Free GPUs by island, restricted to the fewest islands that together hold ``need``."""
    by_island: dict[int, list[int]] = {}
    free = np.flatnonzero(free_row & (island_of >= 0))
    for gpu, island in zip(free.tolist(), island_of[free].tolist(), strict=True):
        by_island.setdefault(island, []).append(gpu)
    groups = list(by_island.values())
    fitting = [members for members in groups if len(members) >= need]
    if fitting:
        return [min(fitting, key=len)]
    groups.sort(key=len, reverse=True)
    out, held = [], 0
    for members in groups:
        if held >= need:
            break
        out.append(members)
        held += len(members)
    return out + [m for m in groups if m not in out]


def _pack(islands: list[list[int]], g: int, t: int) -> tuple[int, ...]:
    """Take one replica from ``islands`` (mutated): inside the tightest island that fits it."""
    fitting = [members for members in islands if len(members) >= g]
    if fitting:
        members = min(fitting, key=len)
        pick, members[:] = members[:g], members[g:]
        return tuple(pick)
    taken: list[int] = []
    for members in sorted(islands, key=len, reverse=True):
        usable = min((len(members) // t) * t, g - len(taken))
        taken.extend(members[:usable])
        members[:] = members[usable:]
        if len(taken) == g:
            break
    return tuple(sorted(taken))

"""Per-cycle fleet usage: which GPUs, CPUs and memory are free, and who holds the rest."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from boltforge.core.model.topology import BoolArray, FloatArray, IntArray, TopologyTree
from boltforge.core.sharing import mig
from boltforge.core.sharing.share import GpuUse, Share, room_for


@dataclass(frozen=True, slots=True)
class Grant:
    """What one replica holds on one host: whole ``gpus``, or a ``share`` of one GPU (a MIG
    instance or a fraction; ``core/sharing``) with ``gpus`` empty."""

    role: str
    replica: int
    host: int
    gpus: tuple[int, ...]
    cpus: float = 0.0
    memory_gb: float = 0.0
    storage_gb: float = 0.0
    share: Share | None = None


@dataclass(frozen=True, slots=True)
class Allocation:
    """Everything a running job holds, and when it is expected to end (None: unknown).
    ``gpus`` counts its GPUs; ``spread`` is (host, GPUs there) for each grant with GPUs."""

    job: str
    grants: tuple[Grant, ...]
    expected_end: float | None = None
    priority: int = 3
    gpus: int = field(init=False, compare=False)
    spread: tuple[tuple[int, int], ...] = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        spread = tuple([(g.host, len(g.gpus)) for g in self.grants if g.gpus])
        object.__setattr__(self, "gpus", sum([n for _, n in spread]))
        object.__setattr__(self, "spread", spread)


_LACKS = "lacks the CPUs, memory or storage asked for"


class Conflict(Exception):
    """A grant asked for a GPU or host capacity that is not free: a bug in the caller."""


class FleetState:
    """Free resources per host, in arrays indexed like the tree's hosts.

    ``free[h, g]`` says whether GPU ``g`` of host ``h`` is free. ``allocate`` and ``release``
    keep the arrays and the allocation table consistent; ``copy`` is cheap, so what-if questions
    work on a copy and leave the original untouched. ``island_free[h, i]`` (free GPUs per NVLink
    island) is kept in step by ``allocate`` and ``release``, and so are ``host_free``,
    ``island_max`` (largest free island per host), ``rack_free``, ``pod_free`` and
    ``fit_key``; change ``free`` only through them.

    ``fit_key[h]`` packs the free GPUs on host ``h``, in its rack and in its pod into one
    integer (``TopologyTree.fit_spans``), so the tightest host is an ``argmin`` away: best fit
    orders hosts by exactly these three counts.

    ``changes`` counts the allocations and releases made; ``memo`` holds what callers derived
    from the allocation table, each entry stamped with ``changes`` when it was made (stale once
    the count moves on). A copy starts with the same count and its own copy of the memo.

    ``cordoned[h]``: host ``h`` takes no new work. ``degraded[h]``: it is healthy enough for
    work that runs alone on it but too slow or flaky for replicas that talk to peers, so it
    takes no replica of a multi-replica or tensor-parallel role (``hostfit.talks``).

    ``shared[(h, g)]`` is what GPU ``g`` of host ``h`` holds in shares (``GpuUse``); a GPU with
    any share is not free, so no exclusive grant lands on it, and it is free again when its
    last share is released.
    """

    __slots__ = (
        "allocations",
        "changes",
        "cordoned",
        "degraded",
        "fit_key",
        "free",
        "free_cpus",
        "free_memory",
        "free_storage",
        "host_free",
        "island_free",
        "island_max",
        "memo",
        "pod_free",
        "rack_free",
        "shared",
        "tree",
    )

    def __init__(self, tree: TopologyTree) -> None:
        self.tree = tree
        self.free: BoolArray = tree.gpu_island >= 0
        self.free_cpus: FloatArray = tree.host_cpus.copy()
        self.free_memory: FloatArray = tree.host_memory.copy()
        self.free_storage: FloatArray = tree.host_storage.copy()
        self.cordoned: BoolArray = np.zeros(len(tree.hosts), dtype=np.bool_)
        self.degraded: BoolArray = np.zeros(len(tree.hosts), dtype=np.bool_)
        self.allocations: dict[str, Allocation] = {}
        self.island_free: IntArray = tree.island_onehot.sum(axis=1).astype(np.int64)
        self.host_free: IntArray = tree.host_gpus.copy()
        self.island_max: IntArray = self.island_free.max(axis=1, initial=0)
        self.rack_free: IntArray = np.bincount(
            tree.host_rack, weights=tree.host_gpus, minlength=len(tree.rack_names)
        ).astype(np.int64)
        self.pod_free: IntArray = np.bincount(
            tree.host_pod, weights=tree.host_gpus, minlength=len(tree.pod_names)
        ).astype(np.int64)
        self.fit_key: IntArray = self._fit_keys()
        self.changes = 0
        self.memo: dict[str, tuple[int, Any]] = {}
        self.shared: dict[tuple[int, int], GpuUse] = {}

    def _fit_keys(self) -> IntArray:
        """``fit_key`` computed afresh from the per-host, rack and pod counts."""
        tree, spans = self.tree, self.tree.fit_spans
        rack = self.rack_free[tree.host_rack] * spans.pod
        return self.host_free * spans.host_weight + rack + self.pod_free[tree.host_pod]

    def fenced(self, hosts: Collection[int] | BoolArray) -> Fence:
        """``with state.fenced(hosts):`` treats ``hosts`` (host indices, or a mask over
        hosts) as cordoned inside the block, then restores the cordons as they were."""
        return Fence(self, hosts)

    def copy(self) -> FleetState:
        other = FleetState.__new__(FleetState)
        other.tree = self.tree
        other.free = self.free.copy()
        other.free_cpus = self.free_cpus.copy()
        other.free_memory = self.free_memory.copy()
        other.free_storage = self.free_storage.copy()
        other.cordoned = self.cordoned.copy()
        other.degraded = self.degraded.copy()
        other.allocations = dict(self.allocations)
        other.island_free = self.island_free.copy()
        other.host_free = self.host_free.copy()
        other.island_max = self.island_max.copy()
        other.rack_free = self.rack_free.copy()
        other.pod_free = self.pod_free.copy()
        other.fit_key = self.fit_key.copy()
        other.changes = self.changes
        other.memo = dict(self.memo)
        other.shared = dict(self.shared)
        return other

    def free_gpus_per_host(self) -> IntArray:
        """Free GPUs per host (read-only view of the state)."""
        return self.host_free

    def free_per_island(self) -> IntArray:
        """``[h, i]``: free GPUs in island ``i`` of host ``h`` (read-only view of the state)."""
        return self.island_free

    @property
    def free_gpus(self) -> int:
        return int(self.free.sum())

    def allocate(self, allocation: Allocation) -> None:
        """Take every grant of ``allocation``; on a clash raise ``Conflict``, change nothing."""
        if allocation.job in self.allocations:
            raise Conflict(f"job {allocation.job} already holds resources")
        self._check(allocation.grants)
        for g in allocation.grants:
            self._take(g, -1)
            if g.share is not None:
                self._share(allocation.job, g, -1)
        self.allocations[allocation.job] = allocation
        self.changes += 1

    def release(self, job: str) -> Allocation:
        """Return everything ``job`` holds to the free pool; raise KeyError if it holds nothing."""
        allocation = self.allocations.pop(job)
        self.changes += 1
        for g in allocation.grants:
            self._take(g, +1)
            if g.share is not None:
                self._share(allocation.job, g, +1)
        return allocation

    def release_many(self, jobs: list[str]) -> None:
        """Release several jobs at once (vectorized); raise KeyError if one holds nothing."""
        allocations = [self.allocations.pop(job) for job in jobs]
        self.changes += 1
        grants = [g for a in allocations for g in a.grants]
        hosts = np.array([g.host for g in grants for _ in g.gpus], dtype=np.int64)
        gpus = np.array([gpu for g in grants for gpu in g.gpus], dtype=np.int64)
        if hosts.size:
            tree = self.tree
            self.free[hosts, gpus] = True
            np.add.at(self.island_free, (hosts, tree.gpu_island[hosts, gpus]), 1)
            touched = np.unique(hosts)
            self.island_max[touched] = self.island_free[touched].max(axis=1)
            self.host_free += np.bincount(hosts, minlength=len(self.host_free))
            self.rack_free += np.bincount(tree.host_rack[hosts], minlength=len(self.rack_free))
            self.pod_free += np.bincount(tree.host_pod[hosts], minlength=len(self.pod_free))
            self.fit_key = self._fit_keys()
        for g in grants:
            self.free_cpus[g.host] += g.cpus
            self.free_memory[g.host] += g.memory_gb
            self.free_storage[g.host] += g.storage_gb
        for a in allocations:
            for g in a.grants:
                if g.share is not None:
                    self._share(a.job, g, +1)

    def _share(self, job: str, g: Grant, sign: int) -> None:
        """Add (``sign`` -1) or drop (+1) ``job``'s share in grant ``g``; the GPU leaves the
        free pool with its first share and comes back with its last."""
        assert g.share is not None
        key = (g.host, g.share.gpu)
        use = self.shared.get(key)
        whole = Grant(g.role, g.replica, g.host, (g.share.gpu,))
        if sign < 0:
            if use is None:
                self._take(whole, -1)
                use = GpuUse(g.share.mode, ())
            self.shared[key] = use.with_share(job, g.share)
            return
        left = None if use is None else use.without(job, g.share)
        if left is None:
            self.shared.pop(key, None)
            self._take(whole, +1)
        else:
            self.shared[key] = left

    def _check_shares(self, grants: tuple[Grant, ...]) -> None:
        """Raise ``Conflict`` unless every share in ``grants`` fits its GPU (mode, geometry,
        room), counting the earlier shares of the same grants."""
        width = self.free.shape[1]
        uses: dict[tuple[int, int], GpuUse | None] = {}
        for g in grants:
            if g.share is None:
                continue
            key = (g.host, g.share.gpu)
            if not 0 <= g.share.gpu < width:
                self._conflict(Grant(g.role, g.replica, g.host, (g.share.gpu,)))
            if key not in uses:
                uses[key] = self.shared.get(key)
                if uses[key] is None and not self.free[key]:
                    self._conflict(Grant(g.role, g.replica, g.host, (g.share.gpu,)))
            pool = self.tree.pool_of(g.host)
            model = mig.model_of(pool.gpu_type, pool.gpu_memory_gb) if pool.mig else None
            why = room_for(uses[key], g.share, model, pool.gpu_memory_gb)
            if why is not None:
                raise Conflict(f"{self.tree.hosts[g.host].name}: {why}")
            use = uses[key] or GpuUse(g.share.mode, ())
            uses[key] = use.with_share("", g.share)

    def _take(self, g: Grant, sign: int) -> None:
        """Give back (``sign`` +1) or take (-1) one grant's GPUs, CPUs and memory."""
        h, gpus = g.host, g.gpus
        if gpus:
            n = sign * len(gpus)
            facts = self.tree.host_lists
            free, freed = self.free[h], sign > 0
            for gpu in gpus:  # one element at a time: cheaper than a fancy index for a few
                free[gpu] = freed
            row = self.island_free[h]
            if len(row) == 1:
                row[0] += n
                self.island_max[h] = row[0]
            else:
                islands = facts.island[h]
                counts = row.tolist()
                for gpu in gpus:
                    counts[islands[gpu]] += sign
                row[:] = counts
                self.island_max[h] = max(counts)
            self.host_free[h] += n
            rack, pod = facts.rack[h], facts.pod[h]
            self.rack_free[rack] += n
            self.pod_free[pod] += n
            spans = self.tree.fit_spans
            self.fit_key[h] += n * spans.host_weight
            self.fit_key[facts.rack_members[rack]] += n * spans.pod
            self.fit_key[facts.pod_members[pod]] += n
        if g.cpus:
            self.free_cpus[h] += sign * g.cpus
        if g.memory_gb:
            self.free_memory[h] += sign * g.memory_gb
        if g.storage_gb:
            self.free_storage[h] += sign * g.storage_gb

    def _check(self, grants: tuple[Grant, ...]) -> None:
        """Raise ``Conflict`` unless every GPU of ``grants`` exists, is free and is granted
        once, every share fits, and each host has the CPUs, memory and storage they ask of
        it together (to within 1e-9)."""
        width = self.free.shape[1]
        if len(grants) == 1:
            if grants[0].share is not None:
                self._check_shares(grants)
            self._check_one(grants[0])
            return
        if any(g.share is not None for g in grants):
            self._check_shares(grants)
        seen: set[tuple[int, int]] = set()
        cpus: dict[int, float] = {}
        memory: dict[int, float] = {}
        storage: dict[int, float] = {}
        for g in grants:
            for gpu in g.gpus:
                if not 0 <= gpu < width or not self.free[g.host, gpu] or (g.host, gpu) in seen:
                    self._conflict(g)
                seen.add((g.host, gpu))
            cpus[g.host] = cpus.get(g.host, 0.0) + g.cpus
            memory[g.host] = memory.get(g.host, 0.0) + g.memory_gb
            storage[g.host] = storage.get(g.host, 0.0) + g.storage_gb
        for h, need in cpus.items():
            if (
                need > self.free_cpus[h] + 1e-9
                or memory[h] > self.free_memory[h] + 1e-9
                or storage[h] > self.free_storage[h] + 1e-9
            ):
                raise Conflict(f"{self.tree.hosts[h].name} {_LACKS}")

    def _check_one(self, g: Grant) -> None:
        """``_check`` for a lone grant, on Python scalars (its shares are checked already)."""
        h, gpus = g.host, g.gpus
        free = self.free[h].tolist()
        width = len(free)
        for gpu in gpus:
            if not (0 <= gpu < width and free[gpu]):
                self._conflict(g)
        if len(gpus) > 1 and len(set(gpus)) != len(gpus):
            self._conflict(g)
        if (
            g.cpus > self.free_cpus.item(h) + 1e-9
            or g.memory_gb > self.free_memory.item(h) + 1e-9
            or g.storage_gb > self.free_storage.item(h) + 1e-9
        ):
            raise Conflict(f"{self.tree.hosts[h].name} {_LACKS}")

    def _conflict(self, g: Grant) -> None:
        """Raise ``Conflict`` naming the first GPU of ``g`` that is not free."""
        width = self.free.shape[1]
        taken = [gpu for gpu in g.gpus if not 0 <= gpu < width or not self.free[g.host, gpu]]
        gpu = taken[0] if taken else g.gpus[0]
        raise Conflict(f"GPU {gpu} of {self.tree.hosts[g.host].name} is not free")


class Fence:
    """Hosts cordoned on a state for the length of a ``with`` block (``FleetState.fenced``);
    the cordons before it are restored on the way out, whatever happened inside."""

    def __init__(self, state: FleetState, hosts: Collection[int] | BoolArray) -> None:
        self.state, self.hosts = state, hosts
        self.saved = state.cordoned

    def __enter__(self) -> FleetState:
        self.saved = self.state.cordoned.copy()
        if isinstance(self.hosts, np.ndarray):
            self.state.cordoned |= self.hosts
        elif self.hosts:
            self.state.cordoned[list(self.hosts)] = True
        return self.state

    def __exit__(self, *exc: object) -> None:
        self.state.cordoned = self.saved

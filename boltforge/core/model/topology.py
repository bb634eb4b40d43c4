"""The fleet as an immutable tree of domains (pod, rack, host, NVLink island, GPU)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from functools import cached_property

import numpy as np
import numpy.typing as npt

from boltforge.core.model.levels import CrossingWeights, Level

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]
FloatArray = npt.NDArray[np.float64]


class Tier(StrEnum):
    """How capacity is bought: reserved up front, on demand, or spot (reclaimable)."""

    RESERVED = "reserved"
    ON_DEMAND = "on-demand"
    SPOT = "spot"


@dataclass(frozen=True, slots=True)
class Pool:
    """A node pool: identical hosts with one GPU model, one price and one capacity tier.

    ``island_size`` is the number of GPUs that share one NVLink domain inside a host (8 on HGX
    boxes, 4 on PCIe-switched boxes with NVLink bridges, 1 on PCIe-only hosts).

    ``node_class`` is what the pool's hosts are for (``NODE_CLASSES``): ``gpu`` (training and
    inference), ``cpu`` (CPU-only batch) or ``storage`` (data pipelines, with
    ``storage_gb`` of local capacity per host at ``storage_gbps``). Empty means ``gpu`` for a
    pool with GPUs and ``cpu`` for one without (``kind``). ``price_per_vcpu_hour`` prices the
    CPUs a job holds there, on top of its GPUs.
    """

    name: str
    gpu_type: str
    gpu_memory_gb: float
    gpus_per_host: int
    island_size: int
    cpus: int
    memory_gb: float
    rails: int
    tier: Tier
    price_per_gpu_hour: float
    node_class: str = ""
    storage_gb: float = 0.0
    storage_gbps: float = 0.0
    price_per_vcpu_hour: float = 0.0
    mig: bool = False
    mig_layout: tuple[str, ...] = ()

    @property
    def kind(self) -> str:
        """The pool's node class, resolved (see the class docstring)."""
        return self.node_class or ("gpu" if self.gpus_per_host else "cpu")


NODE_CLASSES = ("gpu", "cpu", "storage")


@dataclass(frozen=True, slots=True)
class Host:
    """One machine: where it sits (pod, rack) and what it holds (its pool's hardware)."""

    index: int
    name: str
    pool: int
    pod: int
    rack: int


@dataclass(frozen=True, slots=True)
class HostLayout:
    """Where one host goes when a tree is built: pool index and pod/rack names."""

    name: str
    pool: int
    pod: str
    rack: str


@dataclass(frozen=True, slots=True)
class HostLists:
    """Per-host facts as Python lists (indexing a list is far cheaper than a NumPy scalar)."""

    rack: list[int]
    pod: list[int]
    island: list[list[int]]
    pool_name: list[str]
    rack_members: list[slice | IntArray]
    pod_members: list[slice | IntArray]


@dataclass(frozen=True, slots=True)
class FitSpans:
    """Radixes that pack (islands spanned, free GPUs on the host, in its rack, in its pod) into
    one integer whose order is their lexicographic order: each is an exclusive upper bound."""

    islands: int
    host: int
    rack: int
    pod: int

    @property
    def host_weight(self) -> int:
        return self.rack * self.pod

    @property
    def ring_weight(self) -> int:
        return self.host * self.rack * self.pod


def _members(column: IntArray, count: int) -> list[slice | IntArray]:
    """The hosts of each domain: a slice when they are numbered consecutively (as layouts
    list them), else their indices."""
    out: list[slice | IntArray] = []
    for d in range(count):
        hosts = np.flatnonzero(column == d)
        contiguous = hosts.size and hosts[-1] - hosts[0] + 1 == hosts.size
        out.append(slice(int(hosts[0]), int(hosts[-1]) + 1) if contiguous else hosts)
    return out


def _padded(groups: list[list[int]]) -> IntArray:
    width = max((len(g) for g in groups), default=0)
    out = np.full((len(groups), max(width, 1)), -1, dtype=np.int64)
    for i, g in enumerate(groups):
        out[i, : len(g)] = g
    return out


@dataclass(frozen=True)
class TopologyTree:
    """The static shape of a fleet, built once per fleet generation and shared read-only.

    Hosts, racks and pods are numbered densely; per-host facts live in arrays indexed by host
    number so per-cycle code can work on whole columns at once. ``rack_hosts`` and ``pod_racks``
    are padded with -1. ``gpu_island[h, g]`` is the island of GPU ``g`` on host ``h`` (-1 where
    the host has fewer GPUs) and ``gpu_rail[h, g]`` its network rail.
    """

    name: str
    pools: tuple[Pool, ...]
    hosts: tuple[Host, ...]
    rack_names: tuple[str, ...]
    pod_names: tuple[str, ...]
    weights: CrossingWeights
    host_pool: IntArray = field(repr=False)
    host_rack: IntArray = field(repr=False)
    host_pod: IntArray = field(repr=False)
    host_gpus: IntArray = field(repr=False)
    host_cpus: FloatArray = field(repr=False)
    host_memory: FloatArray = field(repr=False)
    host_storage: FloatArray = field(repr=False)
    rack_pod: IntArray = field(repr=False)
    rack_hosts: IntArray = field(repr=False)
    pod_racks: IntArray = field(repr=False)
    gpu_island: IntArray = field(repr=False)
    gpu_rail: IntArray = field(repr=False)
    island_onehot: npt.NDArray[np.int8] = field(repr=False)
    host_index: dict[str, int] = field(repr=False)

    @classmethod
    def build(
        cls,
        name: str,
        pools: tuple[Pool, ...],
        layout: list[HostLayout],
        weights: CrossingWeights | None = None,
    ) -> TopologyTree:
        """Number pods, racks and hosts in the order ``layout`` lists them and derive the arrays."""
        pod_ids: dict[str, int] = {}
        rack_ids: dict[str, int] = {}
        rack_pod: list[int] = []
        hosts: list[Host] = []
        for i, spot in enumerate(layout):
            pod = pod_ids.setdefault(spot.pod, len(pod_ids))
            if spot.rack not in rack_ids:
                rack_ids[spot.rack] = len(rack_ids)
                rack_pod.append(pod)
            hosts.append(Host(i, spot.name, spot.pool, pod, rack_ids[spot.rack]))
        max_gpus = max((p.gpus_per_host for p in pools), default=0) or 1
        n = len(hosts)
        gpu_island = np.full((n, max_gpus), -1, dtype=np.int64)
        gpu_rail = np.full((n, max_gpus), -1, dtype=np.int64)
        for h in hosts:
            pool = pools[h.pool]
            for g in range(pool.gpus_per_host):
                gpu_island[h.index, g] = g // pool.island_size
                gpu_rail[h.index, g] = g % max(pool.rails, 1)
        max_islands = int(gpu_island.max()) + 1 if n else 1
        onehot = np.zeros((n, max_gpus, max(max_islands, 1)), dtype=np.int8)
        hs, gs = np.nonzero(gpu_island >= 0)
        onehot[hs, gs, gpu_island[hs, gs]] = 1
        rack_members: list[list[int]] = [[] for _ in rack_ids]
        for h in hosts:
            rack_members[h.rack].append(h.index)
        pod_members: list[list[int]] = [[] for _ in pod_ids]
        for r, p in enumerate(rack_pod):
            pod_members[p].append(r)
        return cls(
            name=name,
            pools=pools,
            hosts=tuple(hosts),
            rack_names=tuple(rack_ids),
            pod_names=tuple(pod_ids),
            weights=weights or CrossingWeights(),
            host_pool=np.array([h.pool for h in hosts], dtype=np.int64),
            host_rack=np.array([h.rack for h in hosts], dtype=np.int64),
            host_pod=np.array([h.pod for h in hosts], dtype=np.int64),
            host_gpus=np.array([pools[h.pool].gpus_per_host for h in hosts], dtype=np.int64),
            host_cpus=np.array([pools[h.pool].cpus for h in hosts], dtype=np.float64),
            host_memory=np.array([pools[h.pool].memory_gb for h in hosts], dtype=np.float64),
            host_storage=np.array([pools[h.pool].storage_gb for h in hosts], dtype=np.float64),
            rack_pod=np.array(rack_pod, dtype=np.int64),
            rack_hosts=_padded(rack_members),
            pod_racks=_padded(pod_members),
            gpu_island=gpu_island,
            gpu_rail=gpu_rail,
            island_onehot=onehot,
            host_index={h.name: h.index for h in hosts},
        )

    @cached_property
    def eligible_cache(self) -> dict[object, BoolArray]:
        """Hosts eligible per role capability (filled by ``hostfit.eligible_hosts``)."""
        return {}

    @cached_property
    def answer_cache(self) -> dict[object, object]:
        """Answers that depend only on the fleet, per question (e.g. whether a shape fits the
        empty fleet); filled by the modules that ask them."""
        return {}

    @cached_property
    def hosts_of_type(self) -> dict[str, BoolArray]:
        """For each GPU model, a mask of the hosts that carry it."""
        types = {p.gpu_type for p in self.pools}
        pool_type = np.array([p.gpu_type for p in self.pools])
        host_type = pool_type[self.host_pool] if len(self.hosts) else pool_type[:0]
        return {t: host_type == t for t in types}

    @cached_property
    def host_lists(self) -> HostLists:
        """Per-host facts as Python lists, for hot loops that touch one host at a time."""
        return HostLists(
            rack=self.host_rack.tolist(),
            pod=self.host_pod.tolist(),
            island=self.gpu_island.tolist(),
            pool_name=[self.pools[p].name for p in self.host_pool.tolist()],
            rack_members=_members(self.host_rack, len(self.rack_names)),
            pod_members=_members(self.host_pod, len(self.pod_names)),
        )

    @cached_property
    def fit_spans(self) -> FitSpans:
        """Radixes for ``FleetState.fit_key`` (see ``FitSpans``); raise ValueError for a fleet
        whose pods are so large that the packed key would not fit in 63 bits."""
        most = int(self.host_gpus.max(initial=0))
        racks = np.bincount(self.host_rack, weights=self.host_gpus, minlength=1)
        pods = np.bincount(self.host_pod, weights=self.host_gpus, minlength=1)
        spans = FitSpans(most + 2, most + 1, int(racks.max()) + 1, int(pods.max()) + 1)
        if spans.islands * spans.ring_weight >= 2**62:
            raise ValueError(f"fleet {self.name}: pods too large to rank hosts by best fit")
        return spans

    @property
    def total_gpus(self) -> int:
        return int(self.host_gpus.sum())

    def pool_of(self, host: int) -> Pool:
        return self.pools[int(self.host_pool[host])]

    def domain_name(self, level: Level, index: int) -> str:
        """Name of domain ``index`` at ``level`` (a host, rack or pod name; the fleet name)."""
        if level <= Level.HOST:
            return self.hosts[index].name
        if level == Level.RACK:
            return self.rack_names[index]
        if level == Level.POD:
            return self.pod_names[index]
        return self.name

    def domain_of(self, host: int, level: Level) -> int:
        """Index of the domain at ``level`` that contains ``host``."""
        if level <= Level.HOST:
            return host
        if level == Level.RACK:
            return int(self.host_rack[host])
        if level == Level.POD:
            return int(self.host_pod[host])
        return 0

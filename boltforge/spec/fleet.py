"""The fleet spec: node pools (hardware, tier, price) and their layout into pods, racks, hosts."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal, Self

from pydantic import (
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    model_validator,
)

from boltforge.core.model.levels import DEFAULT_WEIGHTS, CrossingWeights
from boltforge.core.model.topology import HostLayout, Pool, Tier, TopologyTree
from boltforge.core.sharing import mig
from boltforge.spec.errors import SpecError, SpecProblem, from_validation
from boltforge.spec.loader import read_yaml
from boltforge.spec.strict import Strict
from boltforge.spec.units import seconds

MAX_HOSTS = 200_000


class Layout(Strict):
    """How a pool fills pods and racks.

    Either ``pods`` x ``racks_per_pod`` x ``hosts_per_rack``, or ``hosts`` in total, which fills
    racks of ``hosts_per_rack`` and pods of ``racks_per_pod`` in order (the last may be partial).
    """

    pods: int = Field(1, ge=1)
    racks_per_pod: int = Field(1, ge=1)
    hosts_per_rack: int = Field(1, ge=1)
    hosts: int | None = Field(None, ge=1)

    @property
    def host_count(self) -> int:
        return self.hosts or self.pods * self.racks_per_pod * self.hosts_per_rack

    def places(self) -> list[tuple[int, int, int]]:
        """(pod, rack in pod, host in rack) for every host, in order."""
        per_pod = self.racks_per_pod * self.hosts_per_rack
        out = []
        for i in range(self.host_count):
            pod, rest = divmod(i, per_pod)
            rack, host = divmod(rest, self.hosts_per_rack)
            out.append((pod, rack, host))
        return out


Duration = Annotated[float, BeforeValidator(seconds)]


class ReclaimSpec(Strict):
    """How a spot pool's provider takes hosts back, as the simulator replays it.

    Each host is reclaimed at random, ``rate_per_host_day`` times per day on average (a Poisson
    process per host); its jobs get ``notice`` seconds of warning, and the host comes back
    ``back_after`` seconds after it is gone. Durations take ``90``, ``"120s"``, ``"2h"``.
    """

    rate_per_host_day: float = Field(ge=0)
    notice: Duration = 120.0
    back_after: Duration = 7200.0


NodeClass = Literal["gpu", "cpu", "storage"]


class PoolSpec(Strict):
    """One node pool. ``nvlink_island`` is GPUs per NVLink domain (1 means PCIe only).
    ``class`` is what its hosts are for (gpu, cpu or storage; by default gpu with GPUs, cpu
    without); a storage pool declares its hosts' local ``storage_gb`` and ``storage_gbps``.
    ``price_per_vcpu_hour`` prices the CPUs jobs hold there. ``mig: true`` lets its GPUs be
    cut into MIG instances (A100-40GB, A100-80GB, H100-80GB); ``mig_layout`` lists the
    instances each GPU is cut into now (e.g. ``[3g.40gb, 2g.20gb, 1g.10gb, 1g.10gb]``)."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9-]{0,40}$")
    node_class: NodeClass | None = Field(None, alias="class")
    gpu: str = ""
    gpu_memory_gb: float = Field(0, ge=0)
    gpus_per_host: int = Field(8, ge=0, le=64)
    nvlink_island: int | None = Field(None, ge=1)
    cpus: int = Field(128, ge=1)
    memory_gb: float = Field(1024, gt=0)
    rails: int | None = Field(None, ge=1)
    tier: Tier = Tier.ON_DEMAND
    price_per_gpu_hour: float = Field(0.0, ge=0)
    price_per_vcpu_hour: float = Field(0.0, ge=0)
    storage_gb: float = Field(0.0, ge=0)
    storage_gbps: float = Field(0.0, ge=0)
    layout: Layout = Layout()
    reclaim: ReclaimSpec | None = None
    mig: bool = False
    mig_layout: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if self.reclaim is not None and self.tier != Tier.SPOT:
            raise ValueError(
                f"pool {self.name}: `reclaim` is only for spot pools (tier is {self.tier}). "
                "To fix: set `tier: spot` or remove `reclaim`"
            )
        _check_class(self.name, self.node_class, self.gpus_per_host, self.storage_gb)
        if self.gpus_per_host == 0:
            return self
        if not self.gpu:
            raise ValueError(
                f"pool {self.name} has GPUs but no `gpu` model. To fix: add e.g. `gpu: H100-80GB`"
            )
        if self.gpu_memory_gb <= 0:
            raise ValueError(
                f"pool {self.name} needs `gpu_memory_gb`. To fix: add e.g. `gpu_memory_gb: 80`"
            )
        island = self.island
        if self.gpus_per_host % island:
            raise ValueError(
                f"pool {self.name}: nvlink_island {island} does not divide gpus_per_host "
                f"{self.gpus_per_host}. To fix: use a divisor such as {self.gpus_per_host // 2}"
            )
        check_mig(self.name, self.gpu, self.gpu_memory_gb, self.mig, self.mig_layout)
        return self

    @property
    def island(self) -> int:
        if self.gpus_per_host == 0:
            return 1
        return self.nvlink_island or self.gpus_per_host

    def to_pool(self) -> Pool:
        return Pool(
            name=self.name,
            gpu_type=self.gpu if self.gpus_per_host else "cpu",
            gpu_memory_gb=self.gpu_memory_gb,
            gpus_per_host=self.gpus_per_host,
            island_size=self.island,
            cpus=self.cpus,
            memory_gb=self.memory_gb,
            rails=self.rails or max(self.gpus_per_host, 1),
            tier=self.tier,
            price_per_gpu_hour=self.price_per_gpu_hour,
            node_class=self.node_class or "",
            storage_gb=self.storage_gb,
            storage_gbps=self.storage_gbps,
            price_per_vcpu_hour=self.price_per_vcpu_hour,
            mig=self.mig,
            mig_layout=tuple(self.mig_layout),
        )


def check_mig(pool: str, gpu: str, memory_gb: float, on: bool, layout: list[str]) -> None:
    """Raise ``ValueError`` (with the fix) when a pool's MIG settings do not fit its GPUs."""
    if layout and not on:
        raise ValueError(f"pool {pool} has a `mig_layout` but not `mig: true`. To fix: add it")
    if not on:
        return
    model = mig.model_of(gpu, memory_gb)
    if model is None:
        known = ", ".join(mig.MODELS)
        raise ValueError(
            f"pool {pool}: {gpu} with {memory_gb:g} GB has no MIG profiles here. "
            f"To fix: remove `mig`, or use one of {known}"
        )
    try:
        mig.layout(model, layout)
    except ValueError as err:
        raise ValueError(
            f"pool {pool}: mig_layout {err}. To fix: list profiles that fit one GPU together"
        ) from None


def _check_class(pool: str, node_class: str | None, gpus: int, storage_gb: float) -> None:
    """Raise ``ValueError`` (with the fix) when a pool's class contradicts its hardware."""
    if node_class == "gpu" and gpus == 0:
        raise ValueError(
            f"pool {pool} is class gpu with no GPUs. To fix: set gpus_per_host or `class: cpu`"
        )
    if node_class == "storage" and storage_gb <= 0:
        raise ValueError(
            f"pool {pool} is class storage with no local storage. To fix: add e.g. "
            "`storage_gb: 30000` (and `storage_gbps`)"
        )
    if node_class in ("cpu", "storage") and gpus:
        raise ValueError(
            f"pool {pool} is class {node_class} but has {gpus} GPUs per host. To fix: set "
            "`gpus_per_host: 0` or `class: gpu`"
        )


class Weights(Strict):
    """Crossing weights per level; see ``boltforge.core.model.levels`` for where the
    defaults come from."""

    nvlink: float = Field(DEFAULT_WEIGHTS["nvlink"], gt=0)
    host: float = Field(DEFAULT_WEIGHTS["host"], gt=0)
    rack: float = Field(DEFAULT_WEIGHTS["rack"], gt=0)
    pod: float = Field(DEFAULT_WEIGHTS["pod"], gt=0)
    spine: float = Field(DEFAULT_WEIGHTS["spine"], gt=0)
    rail: float = Field(DEFAULT_WEIGHTS["rail"], gt=0)

    @model_validator(mode="after")
    def _ordered(self) -> Self:
        problem = self.to_weights().problem()
        if problem:
            raise ValueError(
                f"{problem}. To fix: order them nvlink <= host <= rack <= pod <= spine"
            )
        return self

    def to_weights(self) -> CrossingWeights:
        return CrossingWeights(**self.model_dump())


class FleetSpec(Strict):
    """A whole fleet: a name, its pools and optional crossing weights."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
    pools: list[PoolSpec] = Field(min_length=1)
    weights: Weights = Weights()

    @model_validator(mode="after")
    def _unique_and_bounded(self) -> Self:
        names = [p.name for p in self.pools]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"pool names repeat: {', '.join(dupes)}. To fix: rename them")
        hosts = sum(p.layout.host_count for p in self.pools)
        if hosts > MAX_HOSTS:
            raise ValueError(f"{hosts} hosts is more than {MAX_HOSTS}. To fix: split the fleet")
        return self

    def to_tree(self) -> TopologyTree:
        """Build the topology: hosts are named ``<pool>-p<pod>-r<rack>-h<host>``."""
        layout: list[HostLayout] = []
        for i, pool in enumerate(self.pools):
            for p, r, h in pool.layout.places():
                rack = f"{pool.name}-p{p}-r{r:02d}"
                layout.append(HostLayout(f"{rack}-h{h:02d}", i, f"{pool.name}-p{p}", rack))
        pools = tuple(p.to_pool() for p in self.pools)
        return TopologyTree.build(self.name, pools, layout, self.weights.to_weights())


def parse_fleet(data: object, source: str = "fleet") -> FleetSpec:
    """Validate already-loaded YAML data as a fleet spec, or raise ``SpecError``."""
    if not isinstance(data, dict):
        raise SpecError(source, [SpecProblem("fleet", type(data).__name__, "must be a mapping")])
    try:
        return FleetSpec.model_validate(data)
    except ValidationError as e:
        raise from_validation(source, "fleet", e) from None


def load_fleet_spec(path: str | Path) -> FleetSpec:
    """Read and validate the fleet spec in ``path``; raise ``SpecError`` on any problem."""
    return parse_fleet(read_yaml(path), str(path))


def load_fleet(path: str | Path) -> TopologyTree:
    """Read, validate and build the fleet in ``path``; raise ``SpecError`` on any problem."""
    return parse_fleet(read_yaml(path), str(path)).to_tree()

"""What a job asks for: a gang of roles, each some replicas of one resource vector."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import StrEnum

from boltforge.core.model.levels import Level
from boltforge.core.model.topology import Pool, Tier


class SpotPolicy(StrEnum):
    """Whether a job may run on reclaimable spot capacity."""

    NEVER = "never"
    ALLOWED = "allowed"
    PREFER = "prefer"


@dataclass(frozen=True, slots=True)
class Capability:
    """Which GPUs a replica accepts: named types, a memory floor, named pools, spot or not."""

    gpu_types: frozenset[str] = frozenset()
    min_gpu_memory_gb: float = 0.0
    pools: frozenset[str] = frozenset()
    spot: SpotPolicy = SpotPolicy.ALLOWED

    def accepts(self, pool: Pool, needs_gpus: bool) -> bool:
        """True when a replica with this capability may run on a host of ``pool``."""
        if self.pools and pool.name not in self.pools:
            return False
        if self.spot == SpotPolicy.NEVER and pool.tier == Tier.SPOT:
            return False
        if not needs_gpus:
            return True
        if pool.gpus_per_host == 0:
            return False
        if self.gpu_types and pool.gpu_type not in self.gpu_types:
            return False
        return pool.gpu_memory_gb >= self.min_gpu_memory_gb

    def describe(self) -> str:
        parts = []
        if self.gpu_types:
            parts.append("GPU " + " or ".join(sorted(self.gpu_types)))
        if self.min_gpu_memory_gb:
            parts.append(f"at least {self.min_gpu_memory_gb:g} GB of GPU memory")
        if self.pools:
            parts.append("pool " + " or ".join(sorted(self.pools)))
        if self.spot == SpotPolicy.NEVER:
            parts.append("no spot capacity")
        return ", ".join(parts) or "any GPU"


@dataclass(frozen=True, slots=True)
class Role:
    """``replicas`` identical workers, each on one host with ``gpus`` GPUs, CPUs, memory and
    ``storage_gb`` of the host's local storage.

    ``tensor_parallel`` GPUs of a replica form one tensor-parallel group that must share an
    NVLink island; ``pipeline_stages`` and ``data_parallel`` are hints that shape the ordering
    of ranks but not the feasibility of a placement.
    """

    name: str
    replicas: int
    gpus: int
    cpus: float = 0.0
    memory_gb: float = 0.0
    capability: Capability = field(default_factory=Capability)
    tensor_parallel: int = 1
    pipeline_stages: int = 1
    data_parallel: int = 0
    storage_gb: float = 0.0

    @property
    def total_gpus(self) -> int:
        return self.replicas * self.gpus

    @property
    def node_class(self) -> str:
        """The node class the role runs on, from what it asks: GPUs (``gpu``), else local
        storage (``storage``), else ``cpu``."""
        return "gpu" if self.gpus else "storage" if self.storage_gb else "cpu"


@dataclass(frozen=True, slots=True)
class TopologyRule:
    """``required``: the gang must fit inside one domain of that level; ``preferred``: try it."""

    required: Level | None = None
    preferred: Level | None = None


@dataclass(frozen=True, slots=True)
class Gang:
    """All roles of one job, placed together or not at all."""

    name: str
    roles: tuple[Role, ...]
    topology: TopologyRule = field(default_factory=TopologyRule)
    team: str = ""
    priority: int = 3
    total_gpus: int = field(init=False, repr=False, compare=False)
    total_cpus: float = field(init=False, repr=False, compare=False)
    total_memory_gb: float = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        roles = self.roles
        object.__setattr__(self, "total_gpus", sum(r.total_gpus for r in roles))
        object.__setattr__(self, "total_cpus", sum(r.replicas * r.cpus for r in roles))
        object.__setattr__(self, "total_memory_gb", sum(r.replicas * r.memory_gb for r in roles))

    def resized(self, replicas: int) -> Gang:
        """This gang with ``replicas`` replicas of its first role (an elastic job's size)."""
        first = replace(self.roles[0], replicas=replicas)
        return replace(self, roles=(first, *self.roles[1:]))

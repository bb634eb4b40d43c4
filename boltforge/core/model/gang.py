"""What a job asks for: a gang of roles, each some replicas of one resource vector."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import ClassVar

from boltforge.core.model.levels import Level
from boltforge.core.model.topology import Pool, Tier
from boltforge.core.sharing.share import ShareAsk


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

    ``share``: each replica holds part of one GPU (a MIG instance or a fraction) instead of
    ``gpus`` whole ones (then 0); ``core/sharing/place.py`` places such roles.
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
    share: ShareAsk | None = None

    @property
    def total_gpus(self) -> int:
        return self.replicas * self.gpus

    @property
    def node_class(self) -> str:
        """The node class the role runs on, from what it asks: GPUs (``gpu``), else local
        storage (``storage``), else ``cpu``."""
        return "gpu" if self.gpus or self.share else "storage" if self.storage_gb else "cpu"


@dataclass(frozen=True, slots=True)
class TopologyRule:
    """``required``: the gang must fit inside one domain of that level; ``preferred``: try it."""

    required: Level | None = None
    preferred: Level | None = None


class Shape:
    """What placement depends on in a gang (``key``: each role's sizes and needs, and the
    topology rule). Shapes key the caches a pass consults for every job, so each is hashed
    once and made once per process (``of``): equal keys give the very same object, and a
    comparison is an identity check. Pickles as its key, made again where it lands."""

    __slots__ = ("_hash", "key")
    _made: ClassVar[dict[tuple[object, ...], Shape]] = {}

    def __init__(self, key: tuple[object, ...]) -> None:
        self.key = key
        self._hash = hash(key)

    @classmethod
    def of(cls, key: tuple[object, ...]) -> Shape:
        """The shape of ``key``: the one made before for an equal key, if any."""
        made = cls._made.get(key)
        if made is None:
            made = cls._made[key] = cls(key)
        return made

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        return isinstance(other, Shape) and self._hash == other._hash and self.key == other.key

    def __reduce__(self) -> tuple[object, tuple[tuple[object, ...]]]:
        return Shape.of, (self.key,)

    def __repr__(self) -> str:
        return f"Shape({self.key!r})"


@dataclass(frozen=True, slots=True)
class Gang:
    """All roles of one job, placed together or not at all. ``shape`` is what placement
    depends on (see ``Shape``); ``shared``: its replicas ask for parts of GPUs
    (``core/sharing``; every role does, as the spec requires)."""

    name: str
    roles: tuple[Role, ...]
    topology: TopologyRule = field(default_factory=TopologyRule)
    team: str = ""
    priority: int = 3
    total_gpus: int = field(init=False, repr=False, compare=False)
    total_cpus: float = field(init=False, repr=False, compare=False)
    total_memory_gb: float = field(init=False, repr=False, compare=False)
    shape: Shape = field(init=False, repr=False, compare=False)
    shared: bool = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        roles = self.roles
        object.__setattr__(self, "total_gpus", sum(r.total_gpus for r in roles))
        object.__setattr__(self, "total_cpus", sum(r.replicas * r.cpus for r in roles))
        object.__setattr__(self, "total_memory_gb", sum(r.replicas * r.memory_gb for r in roles))
        needs = tuple(
            (
                r.replicas,
                r.gpus,
                r.tensor_parallel,
                r.capability,
                r.cpus,
                r.memory_gb,
                r.storage_gb,
                r.share,
            )
            for r in roles
        )
        object.__setattr__(self, "shape", Shape.of((needs, self.topology)))
        object.__setattr__(self, "shared", any(r.share is not None for r in roles))

    def resized(self, replicas: int) -> Gang:
        """This gang with ``replicas`` replicas of its first role (an elastic job's size)."""
        first = replace(self.roles[0], replicas=replicas)
        return replace(self, roles=(first, *self.roles[1:]))

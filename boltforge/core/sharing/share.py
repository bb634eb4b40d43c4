"""What a replica asks for and holds when it uses part of a GPU.

A shared GPU is in one of two modes, never both and never beside an exclusive job: ``mig``
(cut into MIG instances, each holding one replica) or ``fraction`` (time-sliced or MPS shares,
each with a fraction of the GPU's time and a cap on its memory, summing to at most the GPU).
"""

from __future__ import annotations

from dataclasses import dataclass

from boltforge.core.sharing import mig

MIG, FRACTION = "mig", "fraction"
EPSILON = 1e-9


@dataclass(frozen=True, slots=True)
class ShareAsk:
    """One replica's request: a MIG ``profile`` (``1g.10gb``), or a ``fraction`` of a GPU
    in (0, 1) with at most ``memory_gb`` of its memory (0: the fraction of its memory)."""

    profile: str = ""
    fraction: float = 0.0
    memory_gb: float = 0.0

    @property
    def mode(self) -> str:
        return MIG if self.profile else FRACTION

    def describe(self) -> str:
        if self.profile:
            return f"a MIG {self.profile} instance"
        cap = f" with {self.memory_gb:g} GB" if self.memory_gb else ""
        return f"{self.fraction:g} of a GPU{cap}"


@dataclass(frozen=True, slots=True)
class Share:
    """What one replica holds on GPU ``gpu`` of its host: the MIG instance (``profile`` at
    ``start``) or its ``fraction`` and memory cap. ``weight`` is the part of the GPU it
    counts as (compute slices of seven for MIG), what meters bill."""

    gpu: int
    profile: str = ""
    start: int = -1
    fraction: float = 0.0
    memory_gb: float = 0.0
    weight: float = 0.0

    @property
    def mode(self) -> str:
        return MIG if self.profile else FRACTION

    @property
    def instance(self) -> mig.Instance:
        return mig.Instance(self.start, self.profile)

    def describe(self) -> str:
        if self.profile:
            return f"MIG {self.profile} at slice {self.start} of GPU {self.gpu}"
        return f"{self.fraction:g} of GPU {self.gpu} ({self.memory_gb:g} GB cap)"

    def to_json(self) -> dict[str, object]:
        return {
            "gpu": self.gpu,
            "profile": self.profile,
            "start": self.start,
            "fraction": self.fraction,
            "memory_gb": self.memory_gb,
            "weight": self.weight,
        }

    @classmethod
    def from_json(cls, data: dict[str, object]) -> Share:
        def num(key: str, default: float) -> float:
            value = data.get(key, default)
            return float(value) if isinstance(value, int | float | str) else default

        return cls(
            gpu=int(num("gpu", 0)),
            profile=str(data.get("profile", "")),
            start=int(num("start", -1)),
            fraction=num("fraction", 0.0),
            memory_gb=num("memory_gb", 0.0),
            weight=num("weight", 0.0),
        )


@dataclass(frozen=True, slots=True)
class GpuUse:
    """The shares one GPU holds now, by job: its mode and who holds what."""

    mode: str
    shares: tuple[tuple[str, Share], ...]

    def with_share(self, job: str, share: Share) -> GpuUse:
        return GpuUse(self.mode, (*self.shares, (job, share)))

    def without(self, job: str, share: Share) -> GpuUse | None:
        """This use less ``job``'s ``share`` (None when no share is left)."""
        left = list(self.shares)
        left.remove((job, share))
        return GpuUse(self.mode, tuple(left)) if left else None

    @property
    def instances(self) -> mig.Carve:
        return tuple(sorted(s.instance for _, s in self.shares if s.profile))

    @property
    def fraction(self) -> float:
        return sum(s.fraction for _, s in self.shares)

    @property
    def memory_gb(self) -> float:
        return sum(s.memory_gb for _, s in self.shares)


def room_for(
    use: GpuUse | None, share: Share, model: str | None, gpu_memory_gb: float
) -> str | None:
    """Why ``share`` cannot join ``use`` on a GPU (of MIG ``model`` with ``gpu_memory_gb``),
    or None when it can: same mode, a valid MIG geometry, fractions and memory within the GPU."""
    if use is not None and use.mode != share.mode:
        return f"GPU {share.gpu} is shared in {use.mode} mode"
    if share.profile:
        if model is None:
            return f"GPU {share.gpu} has no MIG"
        carve = (*(use.instances if use else ()), share.instance)
        bad = mig.problems(model, tuple(sorted(carve)))
        return f"GPU {share.gpu}: {bad[0]}" if bad else None
    fraction = (use.fraction if use else 0.0) + share.fraction
    memory = (use.memory_gb if use else 0.0) + share.memory_gb
    if fraction > 1.0 + EPSILON or memory > gpu_memory_gb + EPSILON:
        return f"GPU {share.gpu} has no room for {share.describe()}"
    return None

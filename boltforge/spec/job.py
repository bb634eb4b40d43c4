"""The job spec: a gang of roles, or one role given as total GPUs (``64xH100``, ``per_node``)."""

from __future__ import annotations

import re
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any, Self

from pydantic import (
    BeforeValidator,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from boltforge.core.model.gang import SpotPolicy, TopologyRule
from boltforge.core.model.levels import Level
from boltforge.core.sharing.share import ShareAsk
from boltforge.spec.bounds import (
    MAX_GPUS,
    MAX_GPUS_PER_REPLICA,
    MAX_ITEMS,
    MAX_REPLICAS,
    Command,
    Cpus,
    Date,
    Duration,
    Env,
    GpuMemoryGb,
    Item,
    MemoryGb,
    Text,
)
from boltforge.spec.errors import SpecError, SpecProblem, from_validation
from boltforge.spec.loader import read_yaml
from boltforge.spec.strict import Strict

# How `priority: high|normal|low` maps onto priority classes (0 serving, 1 production training,
# 2 interactive/debug, 3 batch/research). An integer 0-3 names a class directly.
PRIORITY_CLASSES = {"serving": 0, "high": 1, "normal": 2, "interactive": 2, "low": 3, "batch": 3}
MIG_PROFILE = re.compile(r"^[1-7]g\.\d+gb$")  # e.g. 1g.10gb, 3g.40gb
SHORTHAND = re.compile(r"^\s*(\d+)\s*[xX]\s*([A-Za-z0-9][A-Za-z0-9_.-]*)\s*$")
NAME = r"^[a-z0-9][a-z0-9_.-]{0,62}$"
MAX_GPUS_TEXT = 80  # characters of a `gpus` value such as `64xH100-80GB`
# Restarts after failures not of the job's making (its node died or stopped it) before it fails.
DEFAULT_MAX_RESTARTS = 3


class Parallelism(Strict):
    """Tensor-parallel group size (one NVLink island), pipeline stages, data-parallel replicas."""

    tensor: int = Field(1, ge=1, le=MAX_GPUS_PER_REPLICA)
    pipeline: int = Field(1, ge=1, le=MAX_REPLICAS)
    data: int = Field(0, ge=0, le=MAX_REPLICAS)


class TopologySpec(Strict):
    """``required``: one domain of that level or do not start; ``preferred``: try one."""

    required: str | None = None
    preferred: str | None = None

    @field_validator("required", "preferred")
    @classmethod
    def _level(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                Level.parse(value)
            except ValueError:
                raise ValueError(
                    "must be one of island, host, rack, pod, spine. To fix: e.g. `rack`"
                ) from None
        return value

    def to_rule(self) -> TopologyRule:
        req = Level.parse(self.required) if self.required else None
        pref = Level.parse(self.preferred) if self.preferred else None
        return TopologyRule(req, pref)


class Elastic(Strict):
    """Replica range an elastic job may be resized within."""

    min: int = Field(ge=1, le=MAX_REPLICAS)
    max: int = Field(ge=1, le=MAX_REPLICAS)


class Checkpoint(Strict):
    """Seconds a job gets to checkpoint when bumped, and how often it checkpoints anyway."""

    grace: Duration = 120.0
    interval: Duration | None = None


class HealthSpec(Strict):
    """How the job's progress is judged. ``progress_timeout``: fail the job when no rank has
    reported a step (``boltforge.sdk.report``) for this long, judged from the start even if
    it never reports; 0 turns judging off. Unset: the server's ``--progress-timeout``, only
    once the job has reported in its current allocation."""

    progress_timeout: Duration | None = None


class GpuNeed(Strict):
    """Which GPUs a role accepts: model names (prefixes like ``A100`` match ``A100-80GB``).

    Or part of one GPU per replica: ``mig``, a MIG profile (``1g.10gb``, ``3g.40gb``, ...),
    or ``fraction`` of a GPU (time-sliced or MPS) with at most ``memory_gb`` of its memory
    (unset: that fraction of the GPU's memory)."""

    types: list[Item] = Field([], max_length=MAX_ITEMS)
    min_memory_gb: GpuMemoryGb = 0
    mig: str | None = Field(None, max_length=20)
    fraction: float | None = Field(None, gt=0, lt=1)
    memory_gb: GpuMemoryGb | None = Field(None, gt=0)

    @field_validator("mig")
    @classmethod
    def _profile(cls, value: str | None) -> str | None:
        if value is not None and not MIG_PROFILE.match(value):
            raise ValueError(
                "must be a MIG profile, COMPUTEg.MEMORYgb. To fix: e.g. `1g.10gb` or `3g.40gb`"
            )
        return value

    @model_validator(mode="after")
    def _one_share(self) -> Self:
        if self.mig and self.fraction is not None:
            raise ValueError(
                "asks for both a MIG instance and a fraction. To fix: keep `mig` or `fraction`"
            )
        if self.memory_gb is not None and self.fraction is None:
            raise ValueError(
                "memory_gb caps a fractional share. To fix: add `fraction: 0.5`, or use "
                "`min_memory_gb` for whole GPUs"
            )
        return self

    def share(self) -> ShareAsk | None:
        """The part of a GPU each replica asks for (None: whole GPUs)."""
        if self.mig:
            return ShareAsk(profile=self.mig)
        if self.fraction is not None:
            return ShareAsk(fraction=self.fraction, memory_gb=self.memory_gb or 0.0)
        return None


def _gpu_field(value: Any) -> Any:
    if isinstance(value, str) and MIG_PROFILE.match(value):
        return {"mig": value}
    if isinstance(value, str):
        return {"types": [value]}
    if isinstance(value, list):
        return {"types": value}
    return value


class RoleSpec(Strict):
    """One role of a gang: ``replicas`` x (``gpus`` per replica, CPUs, memory)."""

    name: str = Field("worker", pattern=NAME)
    replicas: int = Field(1, ge=1, le=MAX_REPLICAS)
    gpus: int = Field(
        0, ge=0, le=MAX_GPUS_PER_REPLICA, description="GPUs per replica (one host each)"
    )
    cpus: Cpus = 0
    memory_gb: MemoryGb = 0
    storage_gb: MemoryGb = Field(0, description="local storage per replica (storage nodes)")
    gpu: Annotated[GpuNeed, BeforeValidator(_gpu_field)] = GpuNeed()
    min_gpu_memory_gb: GpuMemoryGb = 0
    parallelism: Parallelism = Parallelism()
    command: Command = None
    image: Text | None = None

    @model_validator(mode="after")
    def _tensor_divides(self) -> Self:
        if self.gpu.share() is not None and self.gpus > 1:
            raise ValueError(
                f"each replica holds one share of a GPU, not {self.gpus} GPUs. To fix: drop "
                "`gpus` and set `replicas` to the number of shares"
            )
        tp = self.parallelism.tensor
        if tp > 1 and (self.gpus == 0 or self.gpus % tp):
            raise ValueError(
                f"parallelism.tensor {tp} must divide the {self.gpus} GPUs of each replica. "
                f"To fix: set gpus to a multiple of {tp} or lower tensor"
            )
        return self


def _priority(value: Any) -> int | str:
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 3:
        return value
    if isinstance(value, str) and value in PRIORITY_CLASSES:
        return value
    words = ", ".join(PRIORITY_CLASSES)
    raise ValueError(f"must be a class 0-3 or one of {words}. To fix: e.g. `priority: high`")


class JobSpec(Strict):
    """A job as users write it. Either ``roles`` or the one-role form (``gpus``, ``per_node``)."""

    name: str = Field(pattern=NAME)
    team: str = Field(pattern=NAME)
    project: str | None = Field(None, max_length=63)
    priority: Annotated[int | str, BeforeValidator(_priority)] = "normal"
    gpus: int | str | None = None
    per_node: int | None = Field(None, ge=1, le=MAX_GPUS_PER_REPLICA)
    cpus: Cpus = 0
    memory_gb: MemoryGb = 0
    storage_gb: MemoryGb = Field(0, description="local storage per replica (storage nodes)")
    gpu: Annotated[GpuNeed, BeforeValidator(_gpu_field)] = GpuNeed()
    min_gpu_memory_gb: GpuMemoryGb = 0
    parallelism: Parallelism = Parallelism()
    roles: list[RoleSpec] = Field([], max_length=MAX_ITEMS)
    topology: TopologySpec = TopologySpec()
    elastic: Elastic | None = None
    preemptible: bool = True
    max_restarts: int = Field(
        DEFAULT_MAX_RESTARTS,
        ge=0,
        le=1000,
        description="restarts after node failures before the job fails (preemptions are free)",
    )
    checkpoint: Checkpoint = Checkpoint()
    health: HealthSpec = HealthSpec()
    deadline: Date | None = None
    time_limit: Duration | None = None
    spot: SpotPolicy = SpotPolicy.ALLOWED
    pools: list[Item] = Field([], max_length=MAX_ITEMS)
    command: Command = None
    image: Text | None = None
    workdir: str | None = Field(None, max_length=4096)
    env: Env = Field(default_factory=dict)
    outputs: list[Annotated[str, Field(min_length=1, max_length=4096)]] = Field(
        [],
        max_length=64,
        description="files or directories collected after each replica as artifacts "
        "(a container's under /scratch or /bolt/checkpoint; a process's under its workdir)",
    )

    @field_validator("outputs")
    @classmethod
    def _outputs(cls, value: list[str]) -> list[str]:
        for path in value:
            if ".." in path.split("/"):
                raise ValueError(
                    f"{path!r} leaves its directory. To fix: name a path under it, without .."
                )
        return value

    @field_validator("gpus")
    @classmethod
    def _gpus(cls, value: int | str | None) -> int | str | None:
        if value is None:
            return value
        parsed = parse_gpus(value)
        if parsed is None:
            raise ValueError("must be a count or COUNTxTYPE. To fix: e.g. `64` or `64xH100`")
        if parsed[0] < 1:
            raise ValueError("must be at least 1. To fix: ask for 1 or more GPUs, or omit it")
        if parsed[0] > MAX_GPUS:
            raise ValueError(
                f"must be at most {MAX_GPUS} (no fleet is larger). To fix: ask for fewer GPUs"
            )
        return value

    @field_validator("deadline", mode="before")
    @classmethod
    def _deadline(cls, value: object) -> object:
        if isinstance(value, str):
            try:
                datetime.fromisoformat(value)
            except ValueError:
                raise ValueError(
                    "must be a date and time. To fix: e.g. `2026-12-01T18:00:00Z` or `2026-12-01`"
                ) from None
        return value

    @model_validator(mode="after")
    def _one_form(self) -> Self:
        if self.roles and self.gpus is not None:
            raise ValueError(
                "give either `roles` or the one-role `gpus`, not both. "
                "To fix: move the GPUs into a role"
            )
        if self.gpu.share() is not None and self.gpus not in (None, 1, "1"):
            raise ValueError(
                "a job asking for part of a GPU runs one replica. To fix: drop `gpus`, or use "
                "`roles` with `replicas` for several shares"
            )
        shared = self.gpu.share() is not None
        if not self.roles and self.gpus is None and not (self.cpus or self.storage_gb or shared):
            raise ValueError(
                "the job asks for nothing. To fix: add `gpus: 8`, `cpus: 4` or `storage_gb` "
                "(or `roles`)"
            )
        if self.elastic and self.elastic.min > self.elastic.max:
            raise ValueError("elastic.min is above elastic.max. To fix: swap them")
        return self

    @property
    def priority_class(self) -> int:
        p = self.priority
        return p if isinstance(p, int) else PRIORITY_CLASSES[p]

    def total_gpus(self) -> tuple[int, str | None]:
        """The one-role form's GPU count and the GPU model named by the shorthand, if any."""
        if self.gpus is None:
            return 0, None
        parsed = parse_gpus(self.gpus)
        assert parsed is not None  # the validator let only parseable values through
        return parsed


def parse_job(data: object, source: str = "job") -> JobSpec:
    """Validate already-loaded YAML data as a job spec, or raise ``SpecError``."""
    if not isinstance(data, dict):
        raise SpecError(
            source,
            [
                SpecProblem(
                    "job",
                    type(data).__name__,
                    "must be a mapping of fields. To fix: write the job as `field: value` "
                    "lines, e.g. `name: train`, `team: nlp`, `gpus: 8`",
                )
            ],
        )
    if data.get("kind") == "service":
        message = "this file is a service. To fix: run it with `bolt serve FILE`"
        raise SpecError(source, [SpecProblem("job.kind", "service", message)])
    try:
        return JobSpec.model_validate(data)
    except ValidationError as e:
        raise from_validation(source, "job", e) from None


def load_job(path: str | Path) -> JobSpec:
    return parse_job(read_yaml(path), str(path))


def parse_gpus(value: int | str) -> tuple[int, str | None] | None:
    """``gpus`` as (count, GPU model or None): ``64`` and ``"64"`` give (64, None),
    ``"64xH100"`` gives (64, "H100"); None for text of neither form."""
    if isinstance(value, int):
        return value, None
    if len(value) > MAX_GPUS_TEXT:
        return None
    if value.strip().isascii() and value.strip().isdigit():
        return int(value), None
    m = SHORTHAND.match(value)
    return (int(m.group(1)), m.group(2)) if m else None

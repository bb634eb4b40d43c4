"""The service spec: an inference service, its replica template and how it autoscales.

A service file is a job spec in its one-role form (what each replica runs and holds: whole
GPUs, a MIG profile or a fraction, CPUs, memory, command or image) plus::

    kind: service
    replicas: {min: 0, max: 8}
    autoscale:
      target_queue: 4          # requests waiting per replica
      rps_per_replica: 20      # capacity, for the throughput target and the forecast
      target_utilization: 0.7
      latency_slo_ms: 500
      kv_cache_high: 0.9
      scale_down_window: 5m
      idle_to_zero: 15m
      cold_start: 90s
      predictive: true

Each replica is a job of its own at priority ``serving`` (unless the file says otherwise),
not preemptible, so serving takes GPUs from training by the class rules and gives them back
when it scales down.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from boltforge.core.serving.autoscale import Autoscale
from boltforge.spec.bounds import MAX_DURATION_S, Duration
from boltforge.spec.errors import _MISSING, SpecError, SpecProblem, from_validation
from boltforge.spec.job import JobSpec, parse_job
from boltforge.spec.loader import read_yaml
from boltforge.spec.strict import Strict

MAX_REPLICAS = 1000
MAX_RATE = 1e9  # requests per second, or waiting, per replica


class Replicas(Strict):
    """How many replicas the service may run: ``min`` (0 lets it scale to zero) to ``max``."""

    min: int = Field(1, ge=0, le=MAX_REPLICAS)
    max: int = Field(1, ge=1, le=MAX_REPLICAS)

    @model_validator(mode="after")
    def _ordered(self) -> Self:
        if self.min > self.max:
            raise ValueError(f"min {self.min} is above max {self.max}. To fix: swap them")
        return self


class AutoscaleSpec(Strict):
    """The signals' targets and the scaler's timing (``core/serving/autoscale.py``)."""

    target_queue: float = Field(4.0, gt=0, le=MAX_RATE)
    rps_per_replica: float | None = Field(None, gt=0, le=MAX_RATE)
    target_utilization: float = Field(0.7, gt=0, le=1)
    latency_slo_ms: float | None = Field(None, gt=0, le=MAX_DURATION_S * 1000)
    kv_cache_high: float = Field(0.9, gt=0, le=1)
    tolerance: float = Field(0.1, ge=0, lt=1)
    scale_down_window: Duration = 300.0
    idle_to_zero: Duration = 900.0
    cold_start: Duration = 60.0
    predictive: bool = True


class ServiceFields(Strict):
    """The fields a service adds to its replica template."""

    kind: Literal["service"]
    replicas: Replicas = Replicas()
    autoscale: AutoscaleSpec = AutoscaleSpec()


class ServiceSpec(BaseModel):
    """A validated service: its own fields and the job spec each replica is submitted as."""

    model_config = ConfigDict(frozen=True)

    service: ServiceFields
    template: JobSpec

    @property
    def name(self) -> str:
        return self.template.name

    @property
    def team(self) -> str:
        return self.template.team

    def rules(self) -> Autoscale:
        """The autoscaler's rules for this service."""
        a, r = self.service.autoscale, self.service.replicas
        return Autoscale(
            min_replicas=r.min,
            max_replicas=r.max,
            target_queue=a.target_queue,
            rps_per_replica=a.rps_per_replica,
            target_utilization=a.target_utilization,
            latency_slo_ms=a.latency_slo_ms,
            kv_cache_high=a.kv_cache_high,
            tolerance=a.tolerance,
            scale_down_window_s=a.scale_down_window,
            idle_to_zero_s=a.idle_to_zero,
            cold_start_s=a.cold_start,
            predictive=a.predictive,
        )

    def replica_spec(self) -> dict[str, Any]:
        """The job spec (as stored) each replica is submitted with."""
        return self.template.model_dump(mode="json", exclude_defaults=True)


SERVICE_KEYS = ("kind", "replicas", "autoscale")


def parse_service(data: object, source: str = "service") -> ServiceSpec:
    """Validate loaded YAML as a service, or raise ``SpecError`` naming each field and fix."""
    if not isinstance(data, dict) or data.get("kind") != "service":
        raise SpecError(
            source,
            [
                SpecProblem(
                    "service.kind",
                    data.get("kind") if isinstance(data, dict) else type(data).__name__,
                    "must be `service`. To fix: add `kind: service` (a plain job goes to "
                    "`bolt submit`)",
                )
            ],
        )
    own = {k: v for k, v in data.items() if k in SERVICE_KEYS}
    rest = {k: v for k, v in data.items() if k not in SERVICE_KEYS}
    rest.setdefault("priority", "serving")
    rest.setdefault("preemptible", False)
    if "elastic" in rest or "roles" in rest:
        field = "elastic" if "elastic" in rest else "roles"
        raise SpecError(
            source,
            [
                SpecProblem(
                    f"service.{field}",
                    _MISSING,
                    "a service's replicas are one role, scaled by `replicas` and `autoscale`. "
                    f"To fix: remove `{field}`",
                )
            ],
        )
    try:
        fields = ServiceFields.model_validate(own)
    except ValidationError as e:
        raise from_validation(source, "service", e) from None
    template = parse_job(rest, source)
    _one_replica(template, source)
    return ServiceSpec(service=fields, template=template)


def _one_replica(template: JobSpec, source: str) -> None:
    """Each replica of a service is one host's worth: at most one host's GPUs."""
    total, _ = template.total_gpus()
    per = template.per_node or total
    if total and per < total:
        raise SpecError(
            source,
            [
                SpecProblem(
                    "service.gpus",
                    total,
                    "a replica runs on one host. To fix: ask for the GPUs of one replica "
                    "and scale with `replicas`",
                )
            ],
        )


def load_service(path: str | Path) -> ServiceSpec:
    return parse_service(read_yaml(path), str(path))

"""The services API's bodies: creating a service, its status, and load from a gateway."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

MAX_LOAD = 1e12  # requests per second, requests waiting or milliseconds a gateway reports


class ServiceRequest(BaseModel):
    """``POST /v1/services``: a service spec, as parsed JSON (``spec``) or YAML text
    (``yaml``); ``source`` names it in errors. Creates the service, or updates one of the
    same name (its replicas follow the new spec as they are replaced)."""

    model_config = ConfigDict(extra="forbid")

    spec: dict[str, Any] | None = None
    yaml: str | None = Field(None, max_length=1_000_000)
    source: str | None = Field(None, max_length=500)


class GatewayLoad(BaseModel):
    """``POST /v1/services/{name}/load``: what a gateway in front of the service sees, for a
    service with no replica to report (scaled to zero) or one whose replicas do not."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    requests_per_s: float = Field(0.0, ge=0, le=MAX_LOAD)
    queued: float = Field(0.0, ge=0, le=MAX_LOAD)
    p99_ms: float | None = Field(None, ge=0, le=MAX_LOAD)


class ServiceLoad(BaseModel):
    """A service's load as its autoscaler last read it: summed over its replicas' reports
    (and the gateway's), p99 and KV cache the worst replica's; ``at``: when it was read."""

    at: float
    requests_per_s: float = 0.0
    queued: float = 0.0
    p99_ms: float | None = None
    kv_cache: float | None = None
    reporting: int = 0


class ServiceSummary(BaseModel):
    """A service now: its replica range, what the autoscaler asks for and why, its replicas
    (live: waiting or holding GPUs; running; ready: running and reporting load), its load
    and whether it meets its latency SLO (None: no SLO or no p99 reported)."""

    name: str
    team: str
    state: str
    min_replicas: int
    max_replicas: int
    desired: int
    live: int
    running: int
    ready: int
    reason: str
    scaled_at: float | None
    scale_events: int
    latency_slo_ms: float | None
    slo_met: bool | None
    load: ServiceLoad | None
    replica_jobs: list[str]


class ServiceList(BaseModel):
    services: list[ServiceSummary]

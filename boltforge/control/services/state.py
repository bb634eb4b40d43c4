"""A service's stored parts read back: its spec, its scaler's carried state, its replicas'
jobs and the load they report (``rank_progress`` metrics written through the SDK's
``report_load``), summed into the ``Load`` the autoscaler reads."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from boltforge.control.scheduling.lifecycle import LIVE
from boltforge.control.store.models import JobRow, RankProgressRow, ServiceRow
from boltforge.core.serving.autoscale import Load, RateHistory, ScaleState
from boltforge.spec.service import ServiceSpec, parse_service
from boltforge.wire.services import ServiceLoad, ServiceSummary

LOAD_KEYS = ("requests_per_s", "queued", "p99_ms", "kv_cache")


@dataclass(frozen=True, slots=True)
class Replicas:
    """A service's replica jobs that are live, by state, oldest first."""

    live: list[JobRow]

    @property
    def running(self) -> list[JobRow]:
        return [j for j in self.live if j.state == "running"]


def spec_of(row: ServiceRow) -> ServiceSpec:
    return parse_service(row.spec, f"service {row.name}")


def replicas_of(s: Session, name: str) -> Replicas:
    q = select(JobRow).where(JobRow.service == name, JobRow.state.in_(LIVE)).order_by(JobRow.num)
    return Replicas(list(s.scalars(q)))


def read_load(row: ServiceRow, reports: list[RankProgressRow], now: float, fresh_s: float) -> Load:
    """The service's load now: its running replicas' fresh ``reports`` (``fresh_reports``)
    plus the gateway's (no older than ``fresh_s``), rates and queues summed, p99 and KV
    cache the worst."""
    parts = [dict(p.metrics) for p in reports]
    gateway = (row.load or {}).get("gateway")
    if gateway and now - float(gateway.get("at", 0.0)) <= fresh_s:
        parts.append(gateway)
    return Load(
        now,
        sum(float(p.get("requests_per_s", 0.0)) for p in parts),
        sum(float(p.get("queued", 0.0)) for p in parts),
        _worst(parts, "p99_ms"),
        _worst(parts, "kv_cache"),
    )


def fresh_reports(
    s: Session, replicas: Replicas, now: float, fresh_s: float
) -> list[RankProgressRow]:
    """The running replicas' load reports no older than ``fresh_s``: a replica with one is
    ready to serve."""
    ids = [j.id for j in replicas.running]
    if not ids:
        return []
    q = select(RankProgressRow).where(RankProgressRow.job_id.in_(ids))
    return [
        p for p in s.scalars(q) if now - p.at <= fresh_s and any(k in p.metrics for k in LOAD_KEYS)
    ]


def _worst(parts: list[dict[str, Any]], key: str) -> float | None:
    values = [float(p[key]) for p in parts if p.get(key) is not None]
    return max(values) if values else None


def scaler_of(row: ServiceRow) -> ScaleState:
    data = row.scaler or {}
    index, total, count = data.get("current", [-1, 0.0, 0])
    history = RateHistory(
        buckets=tuple((int(b), float(r)) for b, r in data.get("history", [])),
        current=(int(index), float(total), int(count)),
    )
    return ScaleState(
        int(data.get("replicas", row.desired)),
        tuple((float(t), int(n)) for t, n in data.get("recent", [])),
        float(data.get("last_busy", row.created_at)),
        history,
    )


def scaler_json(state: ScaleState) -> dict[str, Any]:
    return {
        "replicas": state.replicas,
        "recent": [list(r) for r in state.recent],
        "last_busy": state.last_busy,
        "history": [list(b) for b in state.history.buckets],
        "current": list(state.history.current),
    }


def load_json(load: Load, count: int) -> dict[str, Any]:
    return {
        "at": load.at,
        "requests_per_s": load.requests_per_s,
        "queued": load.queued,
        "p99_ms": load.p99_ms,
        "kv_cache": load.kv_cache,
        "reporting": count,
    }


def summary(s: Session, row: ServiceRow, now: float, fresh_s: float) -> ServiceSummary:
    """``row`` as ``bolt serve`` and the console show it."""
    spec = spec_of(row)
    replicas = replicas_of(s, row.name)
    ready = {p.job_id for p in fresh_reports(s, replicas, now, fresh_s)}
    seen = {k: v for k, v in (row.load or {}).items() if k != "gateway"}
    load = ServiceLoad.model_validate(seen) if "at" in seen else None
    slo = spec.service.autoscale.latency_slo_ms
    met = None if slo is None or load is None or load.p99_ms is None else load.p99_ms <= slo
    return ServiceSummary(
        name=row.name,
        team=row.team,
        state=row.state,
        min_replicas=spec.service.replicas.min,
        max_replicas=spec.service.replicas.max,
        desired=row.desired,
        live=len(replicas.live),
        running=len(replicas.running),
        ready=len(ready),
        reason=row.reason,
        scaled_at=row.scaled_at,
        scale_events=row.scale_events,
        latency_slo_ms=slo,
        slo_met=met,
        load=load,
        replica_jobs=[j.id for j in replicas.live],
    )

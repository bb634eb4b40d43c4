"""Inference services: create or update, list, inspect, delete, and load from a gateway."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.concurrency import run_in_threadpool
from sqlalchemy import select
from sqlalchemy.orm import Session

from boltforge.control.api.deps import Actors, People, Rt
from boltforge.control.api.errors import ERRORS, ApiError
from boltforge.control.audit import audit
from boltforge.control.auth import Caller
from boltforge.control.jobs.cancel import cancel_jobs
from boltforge.control.jobs.submit import check_fit
from boltforge.control.runtime import Runtime
from boltforge.control.services.state import replicas_of, summary
from boltforge.control.store.models import ServiceRow
from boltforge.spec.errors import _MISSING, SpecError, SpecProblem
from boltforge.spec.loader import parse_yaml
from boltforge.spec.service import ServiceSpec, parse_service
from boltforge.wire.services import (
    GatewayLoad,
    ServiceList,
    ServiceRequest,
    ServiceSummary,
)

router = APIRouter(prefix="/v1/services", tags=["services"], responses=ERRORS)
FRESH_S = 30.0  # a replica's load report counts this long


@router.post("", status_code=201)
async def apply(req: ServiceRequest, who: Actors, rt: Rt) -> ServiceSummary:
    """Create a service, or update the one of that name. Bad input: 422 naming each field
    and its fix, and nothing is stored; a replica no node could ever run is refused too."""
    data, spec = _parse(req)
    if not who.acts_for_team(spec.team):
        raise ApiError(
            403,
            f"you may run services only for team {who.team}, not {spec.team}. "
            f"To fix: set `team: {who.team}`",
        )
    fleet = rt.known_fleet() or await run_in_threadpool(rt.fleet)
    check_fit(spec.template, fleet, req.source or "service")
    return await run_in_threadpool(_store, rt, who, spec, data)


def _parse(req: ServiceRequest) -> tuple[dict[str, Any], ServiceSpec]:
    """The spec as sent (what is stored) and as validated."""
    source = req.source or "service"
    if (req.spec is None) == (req.yaml is None):
        message = "send the spec once, as `spec` (JSON) or as `yaml` (text)"
        raise SpecError(source, [SpecProblem("spec", _MISSING, message)])
    data = req.spec if req.spec is not None else parse_yaml(req.yaml or "", source)
    spec = parse_service(data, source)  # refuses anything but a mapping
    return dict(data), spec


def _store(rt: Runtime, who: Caller, spec: ServiceSpec, data: dict[str, Any]) -> ServiceSummary:
    now = rt.clock()
    with rt.db.session() as s:
        row = s.get(ServiceRow, spec.name)
        if row is not None and row.state == "active" and row.team != spec.team:
            raise ApiError(
                409, f"service {spec.name} belongs to team {row.team}. To fix: rename it"
            )
        start = max(spec.service.replicas.min, 1)
        if row is None:
            row = ServiceRow(name=spec.name, created_at=now, scale_events=0, scaler={}, load={})
            s.add(row)
        elif row.state != "active":
            row.created_at, row.scaler, row.load, row.scale_events = now, {}, {}, 0
        else:
            start = min(max(row.desired, spec.service.replicas.min), spec.service.replicas.max)
        row.team, row.state, row.spec = spec.team, "active", data
        row.desired, row.reason, row.scaled_at = start, "applied", now
        audit(s, who, "serve", spec.name, now, min=start, max=spec.service.replicas.max)
        s.flush()
        return summary(s, row, now, FRESH_S)


@router.get("")
def list_services(who: People, rt: Rt) -> ServiceList:
    """Every active service the caller may see, with replicas, load and SLO."""
    now = rt.clock()
    with rt.db.session() as s:
        rows = s.scalars(
            select(ServiceRow).where(ServiceRow.state == "active").order_by(ServiceRow.name)
        )
        shown = [summary(s, r, now, FRESH_S) for r in rows if who.sees_team(r.team)]
    return ServiceList(services=shown)


@router.get("/{name}")
def get_service(name: str, who: People, rt: Rt) -> ServiceSummary:
    with rt.db.session() as s:
        row = _visible(s, name, who)
        return summary(s, row, rt.clock(), FRESH_S)


@router.delete("/{name}")
def delete(name: str, who: Actors, rt: Rt) -> ServiceSummary:
    """Stop a service: its replicas are cancelled (checkpoint signal, then their grace)."""
    now = rt.clock()
    with rt.scheduler.lock, rt.db.session() as s:
        row = _visible(s, name, who)
        _owned(row, who)
        touched = cancel_jobs(s, replicas_of(s, name).live, who.name, now)
        row.state, row.desired, row.reason, row.scaled_at = "deleted", 0, "deleted", now
        audit(s, who, "delete-service", name, now)
        out = summary(s, row, now, FRESH_S)
    rt.scheduler.announce(touched)
    rt.scheduler.wake()
    return out


@router.post("/{name}/load")
def gateway_load(name: str, load: GatewayLoad, who: Actors, rt: Rt) -> ServiceSummary:
    """Load seen by a gateway in front of the service (counts for ``FRESH_S`` seconds): how a
    service scaled to zero learns that requests are waiting."""
    now = rt.clock()
    with rt.db.session() as s:
        row = _visible(s, name, who)
        _owned(row, who)
        row.load = {**(row.load or {}), "gateway": {**load.model_dump(), "at": now}}
        return summary(s, row, now, FRESH_S)


def _visible(s: Session, name: str, who: Caller) -> ServiceRow:
    row = s.get(ServiceRow, name)
    if row is None or row.state != "active" or not who.sees_team(row.team):
        raise ApiError(404, f"no service {name}. To fix: list them with `bolt serve --list`")
    return row


def _owned(row: ServiceRow, who: Caller) -> None:
    if not who.acts_for_team(row.team):
        raise ApiError(403, f"service {row.name} belongs to team {row.team}")

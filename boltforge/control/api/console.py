"""The console's reads: the fleet map, a host, a job's ranks, teams, utilization and
simulation reports. Same tokens and roles as the rest of the API; a member sees other teams'
work only as its team."""

from __future__ import annotations

from pathlib import Path
from statistics import median
from typing import Annotated

from fastapi import APIRouter, Query
from fastapi.responses import FileResponse
from sqlalchemy import select
from sqlalchemy.orm import Session

from boltforge.control.api.deps import People, Rt
from boltforge.control.api.errors import ERRORS, ApiError
from boltforge.control.api.jobs import visible_job
from boltforge.control.nodes.health import STRAGGLER
from boltforge.control.runtime import Runtime
from boltforge.control.store.models import EventRow, NodeRow, RankProgressRow
from boltforge.control.views import simreports
from boltforge.control.views.fleetmap import fleet_map, host_detail
from boltforge.control.views.teams import standings
from boltforge.wire.console import (
    FleetMap,
    HostDetail,
    RankOut,
    RankPage,
    ReportList,
    ReportOut,
    TeamsOut,
    UtilSeries,
)

router = APIRouter(prefix="/v1", tags=["console"], responses=ERRORS)


@router.get("/console/map")
def console_map(
    who: People,
    rt: Rt,
    hosts: Annotated[
        str | None,
        Query(
            max_length=8000,
            pattern=r"^[A-Za-z0-9_.,-]*$",
            description="Comma-separated host names: only these.",
        ),
    ] = None,
) -> FleetMap:
    """Every host by pod and rack (or only ``hosts``), each GPU pointing at the job (or, for
    a member, the other team) holding it."""
    now = rt.clock()
    only = {h for h in hosts.split(",") if h} if hosts is not None else None
    with rt.db.session() as s:
        frag = _fragmentation(rt, s, now)
        return fleet_map(s, who, frag, now, only)


def _fragmentation(rt: Runtime, s: Session, now: float) -> float:
    """The latest sample's fragmentation index if it is recent, else measured now."""
    recent = rt.history.since(now - 2 * rt.config.sample_every_s)
    if recent:
        return recent[-1].fragmentation
    return rt.fragmentation(now)


@router.get("/console/hosts/{name}")
def console_host(name: str, who: People, rt: Rt) -> HostDetail:
    """One host: its GPUs and their holders, its jobs, its health and cordon state."""
    with rt.db.session() as s:
        node = s.get(NodeRow, name)
        if node is None:
            raise ApiError(404, f"no node {name}. To fix: check the name with `bolt nodes`")
        return host_detail(s, node, who, rt.clock())


@router.get("/jobs/{job_id}/ranks")
def job_ranks(job_id: str, who: People, rt: Rt) -> RankPage:
    """Each rank's last step and recent step times in the job's current allocation, with the
    stragglers the health check flagged there."""
    with rt.db.session() as s:
        job = visible_job(s, job_id, who)
        q = select(RankProgressRow).where(
            RankProgressRow.job_id == job_id, RankProgressRow.epoch == job.epoch
        )
        rows = list(s.scalars(q.order_by(RankProgressRow.rank)))
        flagged_q = select(EventRow.data).where(
            EventRow.job_id == job_id, EventRow.kind == STRAGGLER
        )
        flagged = {
            int(d["rank"]) for d in s.scalars(flagged_q) if (d or {}).get("epoch") == job.epoch
        }
    ranks = [
        RankOut(
            rank=r.rank,
            node=r.node,
            step=r.step,
            at=r.at,
            step_times=list(r.step_times),
            median_s=median(r.step_times) if r.step_times else None,
            straggler=r.rank in flagged,
        )
        for r in rows
    ]
    medians = [r.median_s for r in ranks if r.median_s is not None]
    return RankPage(
        job=job_id,
        epoch=job.epoch,
        peer_median_s=median(medians) if medians else None,
        ranks=ranks,
    )


@router.get("/console/teams")
def console_teams(who: People, rt: Rt) -> TeamsOut:
    """Every team's quota against its use, fair-share standing, and spend against budget."""
    quotas = rt.scheduler.quotas
    lent = set(quotas.lent) if quotas else set()
    now = rt.clock()
    with rt.db.session() as s:
        gpus = sum(s.scalars(select(NodeRow.gpus)))
        teams = standings(
            s,
            rt.config.teams,
            rt.config.budgets,
            lent,
            gpus,
            rt.scheduler.policy.order.half_life_s,
            now,
        )
    return TeamsOut(teams=teams)


@router.get("/console/utilization")
def console_utilization(
    who: People,
    rt: Rt,
    window_s: Annotated[float, Query(gt=0, le=7 * 86400)] = 3600.0,
) -> UtilSeries:
    """The samples of the last ``window_s`` seconds (kept since the server started)."""
    return UtilSeries(
        step_s=rt.config.sample_every_s, samples=rt.history.since(rt.clock() - window_s)
    )


def _reports_root(rt: Runtime) -> Path:
    if rt.config.reports_dir is None:
        raise ApiError(
            404,
            "this server has no reports folder. To fix: start it with "
            "`bolt server --reports DIR` and write reports there with `bolt simulate --report`",
        )
    return Path(rt.config.reports_dir)


@router.get("/console/reports")
def console_reports(who: People, rt: Rt) -> ReportList:
    """The simulation reports in the server's reports folder, newest first (none without
    one)."""
    root = rt.config.reports_dir
    return ReportList(reports=simreports.listing(Path(root)) if root else [])


@router.get("/console/reports/{name}")
def console_report(name: str, who: People, rt: Rt) -> ReportOut:
    """One report's comparison table and plot files."""
    try:
        return simreports.report(_reports_root(rt), name)
    except simreports.ReportError as e:
        raise ApiError(404, str(e)) from None


@router.get("/console/reports/{name}/files/{file}", response_class=FileResponse)
def console_report_file(name: str, file: str, who: People, rt: Rt) -> FileResponse:
    """One plot of a report (PNG)."""
    try:
        path = simreports.plot(_reports_root(rt), name, file)
    except simreports.ReportError as e:
        raise ApiError(404, str(e)) from None
    return FileResponse(path, media_type="image/png")

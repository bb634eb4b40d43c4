"""Nodes and the fleet at a glance (``bolt nodes``, ``bolt top``)."""

from __future__ import annotations

from collections import Counter, defaultdict

from fastapi import APIRouter
from sqlalchemy import select

from boltforge.control.api.deps import People, Rt
from boltforge.control.api.errors import ERRORS
from boltforge.control.lifecycle import LIVE
from boltforge.control.models import JobRow, NodeRow, ReplicaRow
from boltforge.control.views import HELD, node_out
from boltforge.control.world import load_world
from boltforge.core.fragmentation import measure
from boltforge.wire.jobs import FleetOut, NodeList

router = APIRouter(prefix="/v1", tags=["nodes"], responses=ERRORS)


@router.get("/nodes")
def nodes(who: People, rt: Rt) -> NodeList:
    """Every registered node with its state, GPUs in use and (visible) jobs."""
    with rt.db.session() as s:
        rows = list(s.scalars(select(NodeRow).order_by(NodeRow.pod, NodeRow.rack, NodeRow.name)))
        used: Counter[str] = Counter()
        jobs: dict[str, set[str]] = defaultdict(set)
        live = select(JobRow.id, JobRow.team).where(JobRow.state.in_(LIVE))
        teams = {job_id: team for job_id, team in s.execute(live)}
        for r in s.scalars(select(ReplicaRow).where(ReplicaRow.state.in_(HELD))):
            used[r.node] += len(r.gpus)
            if who.sees_team(teams.get(r.job_id, "")):
                jobs[r.node].add(r.job_id)
    return NodeList(nodes=[node_out(n, used[n.name], sorted(jobs[n.name])) for n in rows])


@router.get("/fleet")
def fleet(who: People, rt: Rt) -> FleetOut:
    """Capacity, use, queue and the loop's last pass: what ``bolt top`` draws."""
    with rt.db.session() as s:
        world = load_world(s, rt.clock(), rt.scheduler.caches)
        states = Counter(s.scalars(select(JobRow.state).where(JobRow.state.in_(LIVE))))
        by_team: Counter[str] = Counter()
        for team, gpus in s.execute(
            select(JobRow.team, JobRow.gpus).where(JobRow.state.in_(("scheduled", "running")))
        ):
            by_team[team] += gpus
        nodes = list(s.scalars(select(NodeRow)))
    tree = world.fleet.tree
    used = tree.total_gpus - int(world.state.host_free.sum())
    stats = rt.scheduler.stats
    return FleetOut(
        nodes=len(nodes),
        nodes_ready=sum(n.state == "ready" and not n.cordoned for n in nodes),
        gpus=tree.total_gpus,
        gpus_used=used,
        jobs_running=states["running"] + states["scheduled"] + states["preempting"],
        jobs_pending=states["pending"] + states["requeued"],
        fragmentation=round(measure(world.state).index, 4) if tree.total_gpus else 0.0,
        by_team=dict(by_team),
        by_state=dict(states),
        last_cycle_ms=round(stats.last_cycle_ms, 3) if stats.last_cycle_ms else None,
        cycles=stats.cycles,
    )

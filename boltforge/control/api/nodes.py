"""Nodes and the fleet at a glance (``bolt nodes``, ``bolt top``)."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable
from typing import Any

import numpy as np
from fastapi import APIRouter
from sqlalchemy import select
from sqlalchemy.orm import Session

from boltforge.control.api.deps import Admins, People, Rt
from boltforge.control.api.errors import ERRORS, ApiError
from boltforge.control.audit import audit
from boltforge.control.auth import Caller
from boltforge.control.nodes import quarantine, spot
from boltforge.control.runtime import Runtime
from boltforge.control.scheduling.actuate import Touched
from boltforge.control.scheduling.lifecycle import LIVE
from boltforge.control.store.models import HELD, JobRow, NodeRow, ReplicaRow
from boltforge.control.views.jobs import node_out
from boltforge.core.placement.fragmentation import measure
from boltforge.wire.jobs import FleetOut, LoopOut, NodeList, NodeOut, Spread
from boltforge.wire.reclaim import ReclaimedJob, ReclaimReply, ReclaimRequest

router = APIRouter(prefix="/v1", tags=["nodes"], responses=ERRORS)


@router.get("/nodes")
def nodes(who: People, rt: Rt) -> NodeList:
    """Every registered node with its state, GPUs in use and (visible) jobs."""
    with rt.db.session() as s:
        rows = list(s.scalars(select(NodeRow).order_by(NodeRow.pod, NodeRow.rack, NodeRow.name)))
        return NodeList(nodes=_rows_out(s, who, rows, rt.clock()))


def _rows_out(s: Session, who: Caller, rows: list[NodeRow], now: float) -> list[NodeOut]:
    used: Counter[str] = Counter()
    jobs: dict[str, set[str]] = defaultdict(set)
    live = select(JobRow.id, JobRow.team).where(JobRow.state.in_(LIVE))
    teams = {job_id: team for job_id, team in s.execute(live)}
    held = select(ReplicaRow).where(
        ReplicaRow.state.in_(HELD), ReplicaRow.node.in_([n.name for n in rows])
    )
    for r in s.scalars(held):
        used[r.node] += len(r.gpus)
        if who.sees_team(teams.get(r.job_id, "")):
            jobs[r.node].add(r.job_id)
    return [node_out(n, used[n.name], sorted(jobs[n.name]), now) for n in rows]


@router.post("/nodes/{node}/cordon")
def cordon(node: str, who: Admins, rt: Rt) -> NodeOut:
    """Give the node no new work; what runs there keeps running (404: no such node)."""
    return _quarantine(rt, who, node, "cordon", lambda s, now: quarantine.cordon(s, node))


@router.post("/nodes/{node}/drain")
def drain(node: str, who: Admins, rt: Rt) -> NodeOut:
    """Cordon the node and move its jobs off at their next checkpoint: each gets the
    checkpoint signal and its grace period, then requeues and resumes elsewhere from its last
    step (404: no such node)."""
    return _quarantine(rt, who, node, "drain", lambda s, now: quarantine.drain(s, node, now))


@router.post("/nodes/{node}/uncordon")
def uncordon(node: str, who: Admins, rt: Rt) -> NodeOut:
    """Return a cordoned or drained node to service (404: no such node)."""
    return _quarantine(rt, who, node, "uncordon", lambda s, now: quarantine.uncordon(s, node))


@router.post("/nodes/{node}/reclaim")
def reclaim(node: str, body: ReclaimRequest, who: Admins, rt: Rt) -> ReclaimReply:
    """A spot reclaim notice: the node's cloud takes it back in ``in_s`` seconds. The node
    is cordoned and every job on it is asked to checkpoint now, with a grace cut to the time
    left, then requeues to resume elsewhere; once that time passes the node is gone and what
    is left there requeues from its last checkpoint, charged no restart (404: no such node).
    A cloud notice adapter calls this with an admin token (or one made for it)."""
    told: list[spot.Notice] = []

    def change(s: Session, now: float) -> Touched:
        told.append(spot.notice(s, node, body.in_s, now))
        return told[0].touched

    out = _quarantine(rt, who, node, "reclaim", change, in_s=body.in_s)
    jobs = [ReclaimedJob(job=j, grace_s=g) for j, g in told[0].jobs.items()]
    return ReclaimReply(node=out, reclaim_at=told[0].reclaim_at, jobs=jobs)


def _quarantine(
    rt: Runtime,
    who: Caller,
    node: str,
    action: str,
    change: Callable[[Session, float], Touched],
    **detail: Any,
) -> NodeOut:
    """Apply ``change`` under the scheduler's lock, audit it (with ``detail``), then wake the
    loop (a full pass: the fleet the scheduler may use changed) and the nodes and jobs it
    touched."""
    now = rt.clock()
    with rt.scheduler.lock, rt.db.session() as s:
        try:
            touched = change(s, now)
        except quarantine.UnknownNode:
            raise ApiError(
                404, f"no node {node}. To fix: check the name with `bolt nodes`"
            ) from None
        audit(s, who, action, node, now, **detail)
        s.flush()
        row = s.get(NodeRow, node)
        assert row is not None
        [out] = _rows_out(s, who, [row], now)
    rt.scheduler.announce(touched)
    rt.scheduler.wake()
    return out


@router.get("/fleet")
def fleet(who: People, rt: Rt) -> FleetOut:
    """Capacity, use, queue and the loop's passes: what ``bolt top`` draws. Read from the
    in-memory world, never the store."""
    world = rt.world(rt.clock())
    with rt.mirror.reading():
        nodes = list(rt.mirror.nodes.values())
        jobs = list(rt.mirror.jobs.values())
    states = Counter(j.state for j in jobs)
    by_team: Counter[str] = Counter()
    for j in jobs:
        if j.state in ("scheduled", "running"):
            by_team[j.team] += j.gpus
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
        loop=LoopOut(
            full_pass_ms=spread(stats.full_ms),
            pass_ms=spread(stats.cycle_ms),
            world_read_ms=spread(stats.world_ms),
            world_refresh_ms=spread(stats.refresh_ms),
            full_passes=stats.full_cycles,
            binds=stats.binds,
            evictions=stats.evictions,
        ),
    )


def spread(samples: list[float]) -> Spread:
    """``samples``' median and 99th percentile, rounded to microseconds."""
    if not samples:
        return Spread()
    p50, p99 = np.percentile(np.asarray(samples), [50, 99])
    return Spread(p50=round(float(p50), 3), p99=round(float(p99), 3), count=len(samples))

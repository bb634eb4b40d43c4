"""The agent protocol's endpoints (see ``boltforge.wire.agent``)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from fastapi.concurrency import run_in_threadpool

from boltforge.control import agents as protocol
from boltforge.control import spot
from boltforge.control.actuate import Touched
from boltforge.control.api.deps import Agents, Rt
from boltforge.control.api.errors import ERRORS, ApiError
from boltforge.control.audit import audit
from boltforge.control.reports import apply_events, apply_logs, apply_progress
from boltforge.control.runtime import Runtime
from boltforge.wire.agent import (
    AgentReport,
    DesiredState,
    Heartbeat,
    Lease,
    Registration,
    ReportReply,
)

router = APIRouter(prefix="/v1/agents", tags=["agents"], responses=ERRORS)
MAX_WAIT_S = 60.0
_REREGISTER = "the node's session is not current. To fix: register again"


@router.post("/register")
def register(reg: Registration, who: Agents, rt: Rt) -> Lease:
    """Register a node (or re-register after a restart); reconciles what it still runs."""
    now = rt.clock()
    with rt.scheduler.lock, rt.db.session() as s:
        lease, touched = protocol.register(s, reg, rt.config.terms, now)
        audit(
            s,
            who,
            "register",
            reg.inventory.name,
            now,
            gpus=reg.inventory.gpus,
            pool=reg.inventory.pool,
        )
    rt.forget_fleet()
    _changed(rt, touched)
    return lease


@router.post("/{node}/heartbeat")
def heartbeat(node: str, hb: Heartbeat, who: Agents, rt: Rt) -> Lease:
    """Renew the node's lease (409: register again)."""
    with rt.scheduler.lock, rt.db.session() as s:
        try:
            lease, touched = protocol.heartbeat(s, node, hb, rt.config.terms, rt.clock())
        except protocol.SessionMismatch:
            raise ApiError(409, _REREGISTER) from None
    if touched.nodes or touched.jobs:
        _changed(rt, touched)
    return lease


@router.get("/{node}/desired")
async def desired(
    node: str,
    who: Agents,
    rt: Rt,
    since: Annotated[int, Query(ge=-1)] = -1,
    wait: Annotated[float, Query(ge=0, le=MAX_WAIT_S)] = 0.0,
) -> DesiredState:
    """What the node should run; held open up to ``wait`` s until its version passes ``since``."""
    key = f"node:{node}"
    deadline = rt.clock() + wait
    while True:
        seen = rt.notifier.count(key)
        state = await run_in_threadpool(_desired, rt, node)
        left = deadline - rt.clock()
        if state.version > since or left <= 0:
            return state
        await rt.notifier.wait(key, seen, left)


def _desired(rt: Runtime, node: str) -> DesiredState:
    with rt.db.session() as s:
        state = protocol.desired(s, node)
    if state is None:
        raise ApiError(404, f"no node {node}. To fix: register it first")
    return state


@router.post("/{node}/report")
def report(node: str, body: AgentReport, who: Agents, rt: Rt) -> ReportReply:
    """Replica events, log chunks and progress from a node; stale epochs are refused. A job
    this requeues after a spot reclaim notice gets its lost work on its timeline."""
    now = rt.clock()
    with rt.scheduler.lock, rt.db.session() as s:
        try:
            row = protocol.current(s, node, body.session)
        except protocol.SessionMismatch:
            raise ApiError(409, _REREGISTER) from None
        refused, touched = apply_events(s, row, body.events)
        refused += apply_logs(s, row, body.logs, now)
        refused += apply_progress(s, row, body.progress)
        spot.settle(s, touched.jobs | {p.job for p in body.progress if p.checkpoint})
    keys = [f"logs:{c.job}" for c in body.logs] + [
        f"job:{p.job}" for p in body.progress if p.checkpoint
    ]
    rt.notifier.notify(set(keys))
    if body.events:
        _changed(rt, touched)
    return ReportReply(refused=sorted(set(refused)))


def _changed(rt: Runtime, touched: Touched) -> None:
    rt.scheduler.announce(touched)
    rt.scheduler.wake()

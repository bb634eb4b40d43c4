"""The agent protocol's endpoints (see ``boltforge.wire.agent``).

A fleet's agents call these thousands of times a second between them, so each route checks
its caller itself (``agent``) and takes the runtime from the app rather than through
FastAPI dependencies, whose per-request bookkeeping costs more than the check.

An agent token speaks only for its own nodes (``control/auth.py``): a call naming another
node is refused (403, and a batch naming one is refused whole), and the batched desired
states list only the token's nodes."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request

from boltforge.control.api.deps import for_nodes, role
from boltforge.control.api.errors import ERRORS, ApiError
from boltforge.control.auth import Caller
from boltforge.control.nodes import agents as protocol
from boltforge.control.notify import ANY
from boltforge.control.runtime import Runtime
from boltforge.wire.agent import (
    AgentReport,
    DesiredChanges,
    DesiredState,
    Heartbeat,
    Heartbeats,
    HeartbeatsReply,
    Lease,
    Registration,
    ReportReply,
    Reports,
    ReportsReply,
)

router = APIRouter(prefix="/v1/agents", tags=["agents"], responses=ERRORS)
MAX_WAIT_S = 60.0
_REREGISTER = "the node's session is not current. To fix: register again"
agent = role("admin", "agent")


def _runtime(request: Request) -> Runtime:
    rt: Runtime = request.app.state.runtime
    return rt


@router.post("/register")
async def register(reg: Registration, request: Request) -> Lease:
    """Register a node (or re-register after a restart); reconciles what it still runs.
    Registrations arriving together are stored in one transaction (``control/store/batch.py``)."""
    who = await agent(request)
    await for_nodes(request, who, [reg.inventory.name], registering=True)
    rt = _runtime(request)
    return await rt.feed.register(reg, who, rt.clock())


@router.post("/{node}/heartbeat")
async def heartbeat(node: str, hb: Heartbeat, request: Request) -> Lease:
    """Renew the node's lease (409: register again). Heartbeats arriving together are
    stored in one transaction."""
    await for_nodes(request, await agent(request), [node])
    rt = _runtime(request)
    try:
        return await rt.feed.heartbeat(node, hb, rt.clock())
    except protocol.SessionMismatch:
        raise ApiError(409, _REREGISTER) from None


@router.post("/heartbeats")
async def heartbeats(body: Heartbeats, request: Request) -> HeartbeatsReply:
    """Renew many nodes' leases in one call (a bridge speaking for a whole cluster); each is
    applied as its own heartbeat, all in the same group commit. A node whose session is not
    current is listed in ``lost``: it must register again."""
    await for_nodes(request, await agent(request), list(body.beats))
    rt = _runtime(request)
    renewed = await rt.feed.heartbeats(body.beats, rt.clock())
    return HeartbeatsReply(leases=renewed.leases, lost=renewed.lost)


@router.get("/desired")
async def desired_changes(
    request: Request,
    since: Annotated[int, Query(ge=-1)] = -1,
    wait: Annotated[float, Query(ge=0, le=MAX_WAIT_S)] = 0.0,
) -> DesiredChanges:
    """The desired states of the caller's nodes whose intent may have changed after change
    ``since`` (every one of its nodes when ``since`` is -1 or too old), held open up to
    ``wait`` s until one has. An agent token's nodes are those it may act for; an admin's,
    every node."""
    who = await agent(request)
    rt = _runtime(request)
    deadline = rt.clock() + wait
    while True:
        seen = rt.notifier.count(ANY)
        seq, keys = rt.notifier.since(since) if since >= 0 else (rt.notifier.seq, None)
        if keys is None:
            with rt.mirror.reading():
                names = list(rt.mirror.nodes)
        else:
            names = sorted(k[5:] for k in keys if k.startswith("node:"))
        names = _own(rt, who, names)
        states = [s for s in (protocol.desired(rt.mirror, n) for n in names) if s is not None]
        left = deadline - rt.clock()
        if states or keys is None or left <= 0 or rt.notifier.closed:
            return DesiredChanges(seq=seq, full=keys is None, nodes=states)
        since = seq
        await rt.notifier.wait(ANY, seen, left)


@router.get("/{node}/desired")
async def desired(
    node: str,
    request: Request,
    since: Annotated[int, Query(ge=-1)] = -1,
    wait: Annotated[float, Query(ge=0, le=MAX_WAIT_S)] = 0.0,
) -> DesiredState:
    """What the node should run; held open up to ``wait`` s until its version passes ``since``."""
    await for_nodes(request, await agent(request), [node])
    rt = _runtime(request)
    key = f"node:{node}"
    deadline = rt.clock() + wait
    while True:
        seen = rt.notifier.count(key)
        state = _desired(rt, node)  # memory only: no thread needed
        left = deadline - rt.clock()
        if state.version > since or left <= 0 or rt.notifier.closed:
            return state
        await rt.notifier.wait(key, seen, left)


def _desired(rt: Runtime, node: str) -> DesiredState:
    state = protocol.desired(rt.mirror, node)
    if state is None:
        raise ApiError(404, f"no node {node}. To fix: register it first")
    return state


@router.post("/{node}/report")
async def report(node: str, body: AgentReport, request: Request) -> ReportReply:
    """Replica events, log chunks and progress from a node; stale epochs are refused. A job
    this requeues after a spot reclaim notice gets its lost work on its timeline. Reports
    arriving together are stored in one transaction. Starts wake no pass; an exit asks for
    one (the GPUs a bound gang waits for may be free, and the plan may change)."""
    await for_nodes(request, await agent(request), [node])
    rt = _runtime(request)
    try:
        refused, _ = await rt.feed.report(node, body, rt.clock())
    except protocol.SessionMismatch:
        raise ApiError(409, _REREGISTER) from None
    rt.notifier.notify(_followed([body]))
    return ReportReply(refused=sorted(set(refused)))


@router.post("/reports")
async def reports(body: Reports, request: Request) -> ReportsReply:
    """Many nodes' reports in one call (a bridge speaking for a whole cluster), applied in
    one change of the store. A node whose session is not current is listed in ``lost``,
    and nothing of its report is applied: it must register again."""
    await for_nodes(request, await agent(request), list(body.reports))
    rt = _runtime(request)
    done = await rt.feed.reports(body.reports, rt.clock())
    applied = [b for n, b in body.reports.items() if n not in done.lost]
    rt.notifier.notify(_followed(applied))
    refused = {n: sorted(set(r)) for n, r in done.refused.items() if r}
    return ReportsReply(refused=refused, lost=done.lost)


def _own(rt: Runtime, who: Caller, names: list[str]) -> list[str]:
    """Those of ``names`` the caller may see the desired state of (read with its newest
    claims: a node it registered during a long poll is included)."""
    if who.role == "admin":
        return names
    scope = rt.tokens.latest(who).nodes
    return scope.select(names) if scope is not None else []


def _followed(bodies: list[AgentReport]) -> set[str]:
    """The notifier keys that followers of these reports wait on: new log lines, and
    checkpoints."""
    return {f"logs:{c.job}" for b in bodies for c in b.logs} | {
        f"job:{p.job}" for b in bodies for p in b.progress if p.checkpoint
    }

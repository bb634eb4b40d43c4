"""The console's live updates: a server-sent event stream of what changed.

Contract: ``GET /v1/console/stream`` answers ``text/event-stream``. It starts with ``event:
hello`` and then sends ``event: change`` with ``{"seq", "jobs", "logs", "nodes", "all"}``
whenever jobs, their logs or nodes change: the ids of the jobs whose state or timeline moved
(``jobs``) or that wrote output (``logs``), the nodes touched, and ``all: true`` when the
listener fell too far behind to be told exactly (refresh everything). A member is told only
about its own team's jobs (another team's change shows as ``all: false`` with no ids, which
still tells the map to refresh). Changes are gathered for ``COALESCE_S`` before each event, so
a busy fleet sends a few events a second, not one per change; a comment line is sent every
``KEEPALIVE_S`` seconds of quiet so proxies keep the connection open. It is left out of the
OpenAPI document, which cannot describe a reply that never ends (docs/console.md has it).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import StreamingResponse
from sqlalchemy import select

from boltforge.control.api.deps import People, Rt
from boltforge.control.api.errors import ERRORS
from boltforge.control.auth import Caller
from boltforge.control.notify import ANY
from boltforge.control.runtime import Runtime
from boltforge.control.store.models import JobRow

router = APIRouter(prefix="/v1/console", tags=["console"], responses=ERRORS)

COALESCE_S = 0.25
KEEPALIVE_S = 15.0


@router.get("/stream", response_class=StreamingResponse, include_in_schema=False)
async def stream(request: Request, who: People, rt: Rt) -> StreamingResponse:
    """Server-sent events naming what changed (see the module docstring)."""
    return StreamingResponse(
        _events(request, who, rt),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


async def _events(request: Request, who: Caller, rt: Runtime) -> AsyncIterator[str]:
    seq = rt.notifier.seq
    yield _event("hello", {"seq": seq, "who": who.name})
    while not rt.notifier.closed and not await request.is_disconnected():
        seen = rt.notifier.count(ANY)
        latest, keys = rt.notifier.since(seq)
        if keys is None or keys:
            seq = latest
            body = await run_in_threadpool(_change, rt, who, keys)
            if body is not None:
                yield _event("change", {"seq": seq, **body})
            await asyncio.sleep(COALESCE_S)
            continue
        if not await rt.notifier.wait(ANY, seen, KEEPALIVE_S):
            yield ": keepalive\n\n"


def _change(rt: Runtime, who: Caller, keys: set[str] | None) -> dict[str, object] | None:
    """The event's body for ``keys`` (None: the log overflowed), or None when nothing in it
    concerns the console."""
    if keys is None:
        return {"jobs": [], "logs": [], "nodes": [], "all": True}
    jobs = {k.split(":", 1)[1] for k in keys if k.startswith("job:")}
    logs = {k.split(":", 1)[1] for k in keys if k.startswith("logs:")}
    nodes = sorted(k.split(":", 1)[1] for k in keys if k.startswith("node:"))
    if not (jobs or logs or nodes or "jobs" in keys):
        return None
    if who.role not in ("admin", "viewer") and (jobs or logs):
        mine = _own(rt, who, jobs | logs)
        jobs, logs = jobs & mine, logs & mine
    return {"jobs": sorted(jobs), "logs": sorted(logs), "nodes": nodes, "all": False}


def _own(rt: Runtime, who: Caller, ids: set[str]) -> set[str]:
    with rt.db.session() as s:
        q = select(JobRow.id, JobRow.team).where(JobRow.id.in_(ids))
        return {job for job, team in s.execute(q) if who.sees_team(team)}


def _event(kind: str, body: dict[str, object]) -> str:
    return f"event: {kind}\ndata: {json.dumps(body, separators=(',', ':'))}\n\n"

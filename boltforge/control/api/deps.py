"""Request plumbing: the server's runtime, the authenticated caller, and role checks.

Each is one flat dependency that reads the request itself (no sub-dependencies to solve per
request: that bookkeeping costs more than the check). They are coroutines so FastAPI runs
them on the event loop rather than handing each to a worker thread; a token not seen before
is looked up in the store in a thread.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated

from fastapi import Depends, Request
from fastapi.concurrency import run_in_threadpool

from boltforge.control.api.errors import ApiError
from boltforge.control.api.headers import header
from boltforge.control.auth import Caller
from boltforge.control.runtime import Runtime


async def runtime(request: Request) -> Runtime:
    rt: Runtime = request.app.state.runtime
    return rt


async def caller(request: Request) -> Caller:
    """The caller named by ``Authorization: Bearer <token>``, or 401."""
    rt: Runtime = request.app.state.runtime
    scheme, _, token = (header(request.scope, b"authorization") or "").partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise ApiError(
            401,
            "no API token. To fix: send `Authorization: Bearer <token>` "
            "(bolt reads it from BOLT_TOKEN)",
        )
    found = rt.known_caller(token) or await run_in_threadpool(rt.caller, token)
    if found is None:
        raise ApiError(401, "unknown API token. To fix: ask an admin for a token")
    source = request.client.host if request.client else ""
    return Caller(found.name, found.role, found.team, source)


def role(*allowed: str) -> Callable[[Request], Awaitable[Caller]]:
    """A dependency that lets only callers with ``allowed`` roles through (401 without a
    known token, 403 with another role)."""

    async def check(request: Request) -> Caller:
        who = await caller(request)
        if who.role not in allowed:
            raise ApiError(
                403,
                f"role {who.role} may not do this (needs {' or '.join(allowed)}). "
                "To fix: use a token with that role",
            )
        return who

    return check


actor = role("admin", "member")  # called directly where a route takes no dependencies
People = Annotated[Caller, Depends(role("admin", "member", "viewer"))]
Actors = Annotated[Caller, Depends(actor)]
Admins = Annotated[Caller, Depends(role("admin"))]
Rt = Annotated[Runtime, Depends(runtime)]

"""Request plumbing: the server's runtime, the authenticated caller, and role checks.

The dependencies are coroutines so FastAPI runs them on the event loop rather than handing
each to a worker thread; the one that may read the store does so in a thread.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated

from fastapi import Depends, Header, Request
from fastapi.concurrency import run_in_threadpool

from boltforge.control.api.errors import ApiError
from boltforge.control.auth import Caller
from boltforge.control.runtime import Runtime


async def runtime(request: Request) -> Runtime:
    rt: Runtime = request.app.state.runtime
    return rt


async def caller(
    request: Request,
    rt: Annotated[Runtime, Depends(runtime)],
    authorization: Annotated[str | None, Header()] = None,
) -> Caller:
    """The caller named by ``Authorization: Bearer <token>``, or 401."""
    scheme, _, token = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise ApiError(
            401,
            "no API token. To fix: send `Authorization: Bearer <token>` "
            "(bolt reads it from BOLT_TOKEN)",
        )
    found = rt.known_caller(token.strip()) or await run_in_threadpool(rt.caller, token.strip())
    if found is None:
        raise ApiError(401, "unknown API token. To fix: ask an admin for a token")
    source = request.client.host if request.client else ""
    return Caller(found.name, found.role, found.team, source)


def role(*allowed: str) -> Callable[[Caller], Awaitable[Caller]]:
    """A dependency that lets only ``allowed`` roles through (403 otherwise)."""

    async def check(who: Annotated[Caller, Depends(caller)]) -> Caller:
        if who.role not in allowed:
            raise ApiError(
                403,
                f"role {who.role} may not do this (needs {' or '.join(allowed)}). "
                "To fix: use a token with that role",
            )
        return who

    return check


People = Annotated[Caller, Depends(role("admin", "member", "viewer"))]
Actors = Annotated[Caller, Depends(role("admin", "member"))]
Admins = Annotated[Caller, Depends(role("admin"))]
Agents = Annotated[Caller, Depends(role("admin", "agent"))]
Rt = Annotated[Runtime, Depends(runtime)]

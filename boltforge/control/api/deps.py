"""Request plumbing: the server's runtime, the authenticated caller, and role checks.

Each is one flat dependency that reads the request itself (no sub-dependencies to solve per
request: that bookkeeping costs more than the check). They are coroutines so FastAPI runs
them on the event loop rather than handing each to a worker thread; a token not seen before
is looked up in the store in a thread, and so is a remembered one every few seconds
(``control/tokencache.py``: revoked tokens stop working within that).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from typing import Annotated

from fastapi import Depends, Request
from fastapi.concurrency import run_in_threadpool

from boltforge.control.api.errors import ApiError
from boltforge.control.api.headers import header
from boltforge.control.auth import Caller, claiming
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
    found: Caller | str | None = rt.tokens.current(token)
    if found is None:
        found = await run_in_threadpool(rt.tokens.lookup, token)
    if not isinstance(found, Caller):
        raise ApiError(401, f"{found} API token. To fix: ask an admin for a token")
    source = request.client.host if request.client else ""
    return replace(found, source=source)


async def for_nodes(
    request: Request, who: Caller, nodes: Sequence[str], registering: bool = False
) -> None:
    """403 unless ``who`` may speak for every one of ``nodes`` in the agent protocol (see
    ``control/auth.py``): checked in memory, and in the store (where a claiming token
    claims a node no live token holds) only for a node its remembered scope does not allow,
    or when it registers one. The store is read and written in the agent protocol's group
    commit, so a fleet registering at once claims its nodes in a few transactions."""
    if who.role == "admin":
        return
    outside = list(nodes) if registering else [n for n in nodes if not who.acts_for_node(n)]
    if not outside:
        return
    rt: Runtime = request.app.state.runtime
    tokens = rt.tokens
    found = await rt.feed.writes.write_async(
        lambda s: tokens.claim_in(s, who, outside, registering),
        frozenset(claiming(n) for n in outside),
    )
    refused = tokens.settle(found)
    if refused:
        first = f"{len(refused)} nodes refused; the first: " if len(refused) > 1 else ""
        raise ApiError(403, first + refused[0])
    rt.notifier.notify(f"node:{n}" for n in outside)


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

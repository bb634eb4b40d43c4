"""A call that needs the store while it is away is answered 503, never 500.

Contract: an error an endpoint raises that ``outage.fault_of`` recognises (the store cannot
be reached, is read-only, timed out on a lock, or has no disk space left) marks the store
away in ``StoreStatus`` and is answered ``503`` with ``Retry-After`` and the API's error body,
whose ``error`` names the cause and since when the store is away, plus a ``store`` object
(``available``, ``since`` as ISO 8601 UTC, ``reason``). Nothing was changed by such a call:
its transaction did not commit, so the client may send it again (with the same
``Idempotency-Key``). Any other database error is not handled here (a 500, with its
traceback logged once by the server).
"""

from __future__ import annotations

from datetime import UTC, datetime

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from sqlalchemy import exc as sa_exc
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from boltforge.control.store.outage import (
    DISK_FULL,
    RETRY_AFTER_S,
    StoreFault,
    StoreStatus,
    StoreUnavailable,
    fault_of,
)


def install(app: FastAPI, status: StoreStatus) -> None:
    """Answer the store's expected faults with 503 on ``app`` (see the module docstring):
    those endpoints raise, through exception handlers, and those raised by middleware that
    reads the store (a token looked up before the body is read), through ``StoreFaults``.
    Add it right after that middleware."""

    async def unavailable(_: Request, e: Exception) -> JSONResponse:
        fault = fault_of(e)
        if fault is None:
            raise e
        status.failed(fault)
        return reply(status, fault)

    for kind in (sa_exc.DBAPIError, sa_exc.TimeoutError, StoreUnavailable):
        app.add_exception_handler(kind, unavailable)
    app.add_middleware(StoreFaults, status=status)


class StoreFaults:
    """ASGI middleware: a store fault raised inside ``app`` before it began its reply is
    answered 503 (``reply``); anything else passes through untouched."""

    def __init__(self, app: ASGIApp, status: StoreStatus) -> None:
        self.app, self.status = app, status

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def sending(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, sending)
        except Exception as e:
            fault = fault_of(e)
            if fault is None or started:
                raise
            self.status.failed(fault)
            await reply(self.status, fault)(scope, receive, send)


def reply(status: StoreStatus, fault: StoreFault) -> JSONResponse:
    """The 503 for a call that met ``fault``."""
    since = iso(status.since)
    what = "has no disk space left" if fault.kind == DISK_FULL else "is unavailable"
    message = (
        f"the store {what} since {since} ({fault}); nothing was changed. To fix: wait "
        "Retry-After seconds and send it again (with the same Idempotency-Key)"
    )
    body = {
        "error": message,
        "problems": [],
        "store": {"available": False, "since": since, "reason": str(fault)},
    }
    return JSONResponse(body, status_code=503, headers={"Retry-After": str(RETRY_AFTER_S)})


def iso(at: float | None) -> str:
    """``at`` (epoch seconds) as ISO 8601 UTC to the second; ``now`` when unknown."""
    if at is None:
        return "now"
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def health(status: StoreStatus) -> dict[str, str]:
    """What ``/healthz`` adds about the store: nothing while it is available, else
    ``status: degraded`` with the reason and since when."""
    fault = status.fault
    if fault is None:
        return {}
    return {"status": "degraded", "reason": f"store {fault}", "since": iso(status.since)}

"""Every failure a client can cause becomes a 4xx with ``{"error", "problems"}``, each problem
naming the field, the value and the fix; never a stack trace."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from boltforge.control.api.methods import allowed
from boltforge.spec.errors import SpecError, _Missing
from boltforge.wire.jobs import ErrorReply, Problem

ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorReply, "description": what}
    for status, what in (
        (400, "A body that is not valid JSON"),
        (401, "No token, or an unknown one"),
        (403, "The token's role or team may not do this, or the team's budget is spent"),
        (404, "No such job or node"),
        (409, "A conflict: a stale agent session, or an idempotency key reused"),
        (413, "A request body over the server's limit (`--max-body`, `--max-agent-body`)"),
        (422, "Invalid input: each problem names the field, the value and the fix"),
    )
}


class ApiError(Exception):
    """A request the server refuses, with the status and a sentence that ends with the fix."""

    def __init__(self, status: int, message: str, problems: list[Problem] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.problems = problems or []


def install(app: FastAPI) -> None:
    """Register the handlers that turn errors into ``ErrorReply`` bodies."""

    @app.exception_handler(ApiError)
    async def _api(_: Request, e: ApiError) -> JSONResponse:
        return _reply(e.status, e.message, e.problems)

    @app.exception_handler(SpecError)
    async def _spec(_: Request, e: SpecError) -> JSONResponse:
        problems = [
            Problem(field=p.field, value=_plain(p.value), message=p.message) for p in e.problems
        ]
        return _reply(422, f"{e.source}: {len(problems)} problem(s)", problems)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, e: RequestValidationError) -> JSONResponse:
        problems = [_problem(err) for err in e.errors()]
        return _reply(422, f"invalid request: {len(problems)} problem(s)", problems)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, e: StarletteHTTPException) -> JSONResponse:
        headers = dict(e.headers or {})
        if e.status_code == 405:
            headers["Allow"] = allowed(app.router.routes, request.scope)
        return _reply(e.status_code, str(e.detail), [], headers)


class AsciiJSONResponse(JSONResponse):
    """JSON with every non-ASCII character escaped: an error may quote the client's input,
    which can hold lone surrogates that UTF-8 cannot encode."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, separators=(",", ":")).encode("ascii")


def _reply(
    status: int, message: str, problems: list[Problem], headers: Mapping[str, str] | None = None
) -> JSONResponse:
    body = ErrorReply(error=message, problems=problems).model_dump(mode="json")
    return AsciiJSONResponse(status_code=status, content=body, headers=dict(headers or {}))


def _plain(value: Any) -> Any:
    """A JSON-safe, short rendering of an offending value."""
    if value is None or isinstance(value, _Missing):
        return None
    if isinstance(value, bool | int | float):
        return value
    text = str(value)
    return text if len(text) <= 200 else text[:197] + "..."


def _problem(err: Any) -> Problem:
    """One of FastAPI's validation errors as a ``Problem``: the field's dotted path, or
    ``body`` for a body that is not JSON at all (its error names only a character offset)."""
    if err.get("type") == "json_invalid":
        return Problem(
            field="body",
            value=None,
            message=f"is not valid JSON ({err.get('ctx', {}).get('error', 'cannot be decoded')}"
            f" at character {err.get('loc', ('', '?'))[-1]}). To fix: send a JSON object",
        )
    return Problem(
        field=".".join(str(p) for p in err.get("loc", ()) if p != "body") or "body",
        value=_plain(err.get("input")),
        message=f"{err.get('msg', 'is invalid')}. To fix: correct this field",
    )

"""The request-body gate: who sends a body is checked before it is read, and how much is read
is bounded, before any of it is parsed.

Contract (``BodyGate``, a pure ASGI middleware inside ``Overload``):

* Only requests under ``/v1/`` that carry a body (a ``Content-Length`` above 0, or a
  ``Transfer-Encoding``) are gated; everything else goes straight on, and its route checks
  its caller as before.
* The caller first: a gated request without a token the server accepts is answered 401 (the
  API's usual error body) before a byte of its body is read. The check is the routes' own
  (``deps.caller``), so a token that works for a route works here.
* Then the size: more than ``Limits.people`` bytes (``Limits.agents`` on the agent protocol,
  ``/v1/agents/``, whose batched heartbeats and reports carry many nodes at once) is answered
  413, from ``Content-Length`` when it says so, else once the bytes streamed in pass the limit
  (a missing or false ``Content-Length`` is no way around it). Nothing of such a request
  reaches the application, so nothing of it is stored.
* Then, for people's requests, the JSON nesting: deeper than ``MAX_JSON_DEPTH`` is answered
  422 naming the body, before it is parsed (deep nesting would exhaust the parser's stack).
* Artifact uploads (``PUT /v1/agents/{node}/artifacts/...``) stream to the artifact store,
  which bounds them itself; they are checked for the caller only.
* What passes is handed to the application as it was received.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from fastapi import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from boltforge.control.api.deps import caller
from boltforge.control.api.errors import ApiError, AsciiJSONResponse
from boltforge.control.api.headers import raw_header
from boltforge.wire.jobs import ErrorReply, Problem

MAX_BODY = 2 << 20
MAX_AGENT_BODY = 64 << 20
MAX_JSON_DEPTH = 64
API = "/v1/"
AGENTS = "/v1/agents/"
ARTIFACTS = re.compile(r"^/v1/agents/[^/]+/artifacts/")
# A string (one left open runs to the end, so no byte is scanned twice), or a bracket.
_JSON_TOKENS = re.compile(rb'(?s)"(?:[^"\\]|\\.)*(?:"|\\?\Z)|[\[\]{}]')


@dataclass(frozen=True)
class Limits:
    """The most bytes a request body may hold: a person's (``bolt server --max-body``) and
    the agent protocol's (``--max-agent-body``)."""

    people: int = MAX_BODY
    agents: int = MAX_AGENT_BODY


class TooLarge(Exception):
    """The body went past the limit while it was read."""


class BodyGate:
    """ASGI middleware enforcing the module docstring's contract in front of ``app``."""

    def __init__(self, app: ASGIApp, limits: Limits) -> None:
        self.app = app
        self.limits = limits

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not _gated(scope):
            await self.app(scope, receive, send)
            return
        try:
            await caller(Request(scope))
        except ApiError as e:
            await _answer(scope, receive, send, e.status, e.message)
            return
        path: str = scope["path"]
        if scope["method"] == "PUT" and ARTIFACTS.match(path):
            await self.app(scope, receive, send)
            return
        agent = path.startswith(AGENTS)
        limit = self.limits.agents if agent else self.limits.people
        try:
            body = await _read(scope, receive, limit)
        except TooLarge:
            await _answer(scope, receive, send, 413, _too_large(limit, agent))
            return
        if not agent and too_deep(body, MAX_JSON_DEPTH):
            await _answer(scope, receive, send, 422, "invalid request: 1 problem(s)", _deep())
            return
        await self.app(scope, _replay(body, receive), send)


def _gated(scope: Scope) -> bool:
    """Whether the request carries a body to an API route."""
    if not scope["path"].startswith(API):
        return False
    if raw_header(scope, b"transfer-encoding") is not None:
        return True
    length = raw_header(scope, b"content-length")
    return length is not None and length.strip() not in (b"", b"0")


async def _read(scope: Scope, receive: Receive, limit: int) -> bytes:
    """The whole body; ``TooLarge`` as soon as it is known to hold more than ``limit``
    bytes (by ``Content-Length``, or by what has arrived)."""
    declared = raw_header(scope, b"content-length")
    if declared is not None and declared.strip().isdigit() and int(declared) > limit:
        raise TooLarge
    parts: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break  # the client went away: the route sees an empty or partial body
        chunk: bytes = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise TooLarge
        parts.append(chunk)
        if not message.get("more_body", False):
            break
    return b"".join(parts)


def _replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that hands over ``body`` once, then waits on the client as before."""
    done = False

    async def again() -> Message:
        nonlocal done
        if done:
            return await receive()
        done = True
        return {"type": "http.request", "body": body, "more_body": False}

    return again


def too_deep(body: bytes, limit: int) -> bool:
    """Whether JSON ``body`` nests arrays and objects deeper than ``limit`` (brackets inside
    strings do not count). Text that is not JSON is left for the parser to refuse."""
    if body.count(b"[") + body.count(b"{") <= limit:
        return False
    depth = 0
    for match in _JSON_TOKENS.finditer(body):
        token = match.group()
        if token in (b"[", b"{"):
            depth += 1
            if depth > limit:
                return True
        elif token in (b"]", b"}"):
            depth -= 1
    return False


def _too_large(limit: int, agent: bool) -> str:
    flag = "--max-agent-body" if agent else "--max-body"
    return (
        f"the request body is larger than {limit} bytes. To fix: send less (split the work "
        f"into several requests), or ask an admin to raise `bolt server {flag}`"
    )


def _deep() -> list[Problem]:
    return [
        Problem(
            field="body",
            message=f"nests arrays and objects deeper than {MAX_JSON_DEPTH} levels. "
            "To fix: flatten it",
        )
    ]


async def _answer(
    scope: Scope,
    receive: Receive,
    send: Send,
    status: int,
    message: str,
    problems: list[Problem] | None = None,
) -> None:
    """Answer with the API's error body; the request body is left unread."""
    body = ErrorReply(error=message, problems=problems or []).model_dump(mode="json")
    headers = {"Connection": "close"}
    await AsciiJSONResponse(body, status, headers=headers)(scope, receive, send)

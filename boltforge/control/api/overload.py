"""Overload protection: a caller that floods the API is refused at once with 429 and a
``Retry-After`` header instead of stalling every other caller, and a server past its
capacity refuses new work with 503 rather than queueing without end.

Contract:

* ``Overload`` is a pure ASGI middleware. It decides from the request line and headers
  alone, before the request body is read and before the application sees the request, so
  a refused request had no effect: a refused submission was not accepted and may be sent
  again (with its ``Idempotency-Key``, if it had one).
* A refusal is ``{"error": "<what and the fix>", "problems": []}`` (the API's usual error
  body) with ``Retry-After`` in whole seconds, at least 1: 429 when the caller is past its
  own limit (requests in flight, or its request rate), 503 when the server as a whole is
  (whoever sends next is refused, whose fault it is not).
* Never limited: ``/healthz``, ``/metrics``, the console's event stream and the agents'
  desired-state long-polls (``GET /v1/agents/{node}/desired`` with ``wait`` above 0), which
  wait without holding a worker thread and whose refusal would cut a node off its orders.
* People's requests (and anything unauthenticated) are counted per caller: the digest of the
  ``Authorization`` header, else the client's address; and in a pool of their own with a
  server-wide cap. The agent protocol's calls (``/v1/agents/...`` with a token the server
  knows as an agent's or an admin's) are counted per node named in the path and in a
  second pool with its own cap, so a flood of submissions never sheds a heartbeat.
* A slot is given back when the application returns, whether it answered, failed or the
  client went away. Counts are kept under a lock, so several event loops may share one
  ``Limiter``. A limit of 0 turns that limit off.
"""

from __future__ import annotations

import hashlib
import json
import math
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from starlette.types import ASGIApp, Receive, Scope, Send

from boltforge.control.api.headers import raw_header

if TYPE_CHECKING:
    from fastapi import FastAPI

    from boltforge.control.runtime import Runtime

REASONS = ("caller", "rate", "server", "node", "agents")
"""Why a request was shed: its caller's in-flight limit, its caller's rate, the server-wide
cap on people's requests, its node's in-flight limit, the cap on agents' requests."""

EXEMPT = frozenset({"/healthz", "/metrics", "/v1/console/stream"})
AGENTS = "/v1/agents/"
AGENT_ROLES = frozenset({"agent", "admin"})
MAX_BUCKETS = 10_000  # rate buckets kept before the full (idle) ones are dropped


@dataclass(frozen=True)
class Limits:
    """How much is let in at once (0 turns a limit off). ``per_caller``: people's requests in
    flight per token (or address); ``total``: people's requests in flight in all;
    ``per_node``: agent calls in flight per node; ``agents``: agent calls in flight in all;
    ``rate``: people's requests per second per caller, a token bucket holding ``burst``
    (0: one second's worth; at least 1 either way)."""

    per_caller: int = 256
    total: int = 1024
    per_node: int = 16
    agents: int = 4096
    rate: float = 0.0
    burst: float = 0.0


class Ticket(NamedTuple):
    """An admitted request's slots: its caller's or node's (``key``) and its pool's."""

    key: bytes | str | None
    pool: str


class Shed(NamedTuple):
    """A refusal: the status, whole seconds to wait, the reason (one of ``REASONS``) and
    the sentence the client is told."""

    status: int
    retry_after: int
    reason: str
    message: str


class Limiter:
    """Counts requests in flight and decides who is let in (see the module docstring).
    ``role_of(token)`` is the role of a token the server already knows (None if unknown, or
    without one: any token on an agent path counts as an agent's); ``clock`` drives the
    rate buckets. ``shed`` counts refusals by reason."""

    def __init__(
        self,
        limits: Limits,
        role_of: Callable[[str], str | None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limits = limits
        self.role_of = role_of
        self.clock = clock
        self.shed: Counter[str] = Counter(dict.fromkeys(REASONS, 0))  # never grows: safe to copy
        self._lock = threading.Lock()
        self._counts: dict[bytes | str, int] = {}
        self._pools = {"people": 0, "agents": 0}
        self._buckets: dict[bytes, tuple[float, float]] = {}

    def admit(self, scope: Scope) -> Ticket | Shed | None:
        """None for a request never limited; else a ``Ticket`` to ``release`` when it ends,
        or the ``Shed`` to answer it with. Reads only the path, query and headers."""
        path: str = scope["path"]
        if path in EXEMPT or _long_poll(scope):
            return None
        auth = raw_header(scope, b"authorization")
        if path.startswith(AGENTS) and auth is not None and self._is_agent(auth):
            return self._admit_agent(_node_of(path))
        return self._admit_person(_caller_key(auth, scope), auth is not None)

    def release(self, ticket: Ticket) -> None:
        """Give back the slots ``admit`` took for ``ticket``."""
        with self._lock:
            self._pools[ticket.pool] -= 1
            if ticket.key is not None:
                left = self._counts[ticket.key] - 1
                if left:
                    self._counts[ticket.key] = left
                else:
                    del self._counts[ticket.key]

    def in_flight(self, key: bytes | str | None = None) -> int:
        """Requests in flight for ``key`` (a caller's digest or a node's name), or for both
        pools together."""
        with self._lock:
            if key is None:
                return sum(self._pools.values())
            return self._counts.get(key, 0)

    def _is_agent(self, auth: bytes) -> bool:
        if self.role_of is None:
            return True
        scheme, _, token = auth.decode("latin-1").partition(" ")
        return scheme.lower() == "bearer" and self.role_of(token.strip()) in AGENT_ROLES

    def _admit_person(self, key: bytes, token: bool) -> Ticket | Shed:
        """Admit a person's request under its caller's limits and the people's cap."""
        lim, who = self.limits, "token" if token else "address"
        with self._lock:
            if _full(self._counts.get(key, 0), lim.per_caller):
                return self._refuse(429, 1, "caller", _too_many_caller(who, lim.per_caller))
            if _full(self._pools["people"], lim.total):
                return self._refuse(503, 1, "server", _too_many_server("", lim.total))
            wait = self._take_token(key)
            if wait > 0:
                return self._refuse(429, math.ceil(wait), "rate", _too_fast(who, lim))
            return self._take(key, "people")

    def _admit_agent(self, node: str | None) -> Ticket | Shed:
        """Admit an agent call under its node's limit and the agents' cap."""
        lim = self.limits
        with self._lock:
            if node is not None and _full(self._counts.get(node, 0), lim.per_node):
                return self._refuse(429, 1, "node", _too_many_node(node, lim.per_node))
            if _full(self._pools["agents"], lim.agents):
                return self._refuse(503, 1, "agents", _too_many_server("agent ", lim.agents))
            return self._take(node, "agents")

    def _take(self, key: bytes | str | None, pool: str) -> Ticket:
        """Count one more request for ``key`` and ``pool`` (the lock is held)."""
        self._pools[pool] += 1
        if key is not None:
            self._counts[key] = self._counts.get(key, 0) + 1
        return Ticket(key, pool)

    def _refuse(self, status: int, retry_after: int, reason: str, message: str) -> Shed:
        self.shed[reason] += 1
        return Shed(status, max(1, retry_after), reason, message)

    def _take_token(self, key: bytes) -> float:
        """0 when ``key``'s bucket had a token (now taken), else the seconds until it has
        one. Always 0 without a rate (the lock is held)."""
        rate = self.limits.rate
        if rate <= 0:
            return 0.0
        size = _bucket_size(self.limits)
        now = self.clock()
        tokens, at = self._buckets.get(key, (size, now))
        tokens = min(size, tokens + (now - at) * rate)
        if tokens < 1.0:
            self._buckets[key] = (tokens, now)
            return (1.0 - tokens) / rate
        self._buckets[key] = (tokens - 1.0, now)
        if len(self._buckets) > MAX_BUCKETS:
            self._prune(now, rate, size)
        return 0.0

    def _prune(self, now: float, rate: float, size: float) -> None:
        """Drop the buckets that are full again (a missing bucket is a full one); if that
        is not enough, drop them all (every caller gets a full bucket: generous, not harsh)."""
        self._buckets = {
            k: (t, at) for k, (t, at) in self._buckets.items() if t + (now - at) * rate < size
        }
        if len(self._buckets) > MAX_BUCKETS:
            self._buckets.clear()


class Overload:
    """ASGI middleware that asks ``limiter`` before passing each HTTP request on to ``app``,
    answers a refusal itself, and gives the slot back however the request ends."""

    def __init__(self, app: ASGIApp, limiter: Limiter) -> None:
        self.app = app
        self.limiter = limiter

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        ticket = self.limiter.admit(scope) if scope["type"] == "http" else None
        if ticket is None:
            await self.app(scope, receive, send)
        elif isinstance(ticket, Shed):
            await refuse(send, ticket)
        else:
            try:
                await self.app(scope, receive, send)
            finally:
                self.limiter.release(ticket)


async def refuse(send: Send, shed: Shed) -> None:
    """Answer with ``shed``'s status, ``Retry-After`` and the API's error body."""
    body = json.dumps({"error": shed.message, "problems": []}, separators=(",", ":")).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"retry-after", str(shed.retry_after).encode()),
    ]
    await send({"type": "http.response.start", "status": shed.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def limits_of(rt: Runtime) -> Limits:
    """The limits in ``rt``'s server configuration."""
    c = rt.config
    return Limits(
        per_caller=c.max_in_flight_per_caller,
        total=c.max_in_flight,
        per_node=c.max_in_flight_per_node,
        agents=c.max_in_flight_agents,
        rate=c.rate_per_caller,
        burst=c.rate_burst,
    )


def install(app: FastAPI, rt: Runtime) -> Limiter:
    """Put an ``Overload`` middleware with ``rt``'s limits outside every other one the app
    has so far (add it last), and keep its ``Limiter`` at ``app.state.overload`` (where the
    metrics read the shed counts)."""

    def role_of(token: str) -> str | None:
        known = rt.known_caller(token)
        return known.role if known is not None else None

    limiter = Limiter(limits_of(rt), role_of)
    app.state.overload = limiter
    app.add_middleware(Overload, limiter=limiter)
    return limiter


def _bucket_size(lim: Limits) -> float:
    """Requests a caller may send at once under the rate: ``burst``, else one second's worth;
    at least 1, or no request would ever pass."""
    return max(lim.burst or lim.rate, 1.0)


def _full(count: int, limit: int) -> bool:
    return limit > 0 and count >= limit


def _caller_key(auth: bytes | None, scope: Scope) -> bytes:
    """A short digest of the ``Authorization`` value (the token is not kept), else the
    client's address."""
    if auth is not None:
        return hashlib.blake2b(auth, digest_size=16).digest()
    client = scope.get("client")
    return b"@" + (client[0].encode() if client else b"")


def _long_poll(scope: Scope) -> bool:
    """Whether this is an agent's desired-state read that may wait (``wait`` above 0)."""
    path: str = scope["path"]
    if scope["method"] != "GET" or not path.startswith(AGENTS) or not path.endswith("/desired"):
        return False
    for part in scope["query_string"].split(b"&"):
        if part.startswith(b"wait="):
            try:
                return float(part[5:]) > 0
            except ValueError:
                return False
    return False


def _node_of(path: str) -> str | None:
    """The node an agent call names (``/v1/agents/{node}/...``); None for ``register``."""
    node, slash, _ = path[len(AGENTS) :].partition("/")
    return node if slash else None


def _too_many_caller(who: str, limit: int) -> str:
    return (
        f"too many requests in flight for this {who} (limit {limit}). "
        "To fix: wait Retry-After seconds, or send fewer at once"
    )


def _too_fast(who: str, lim: Limits) -> str:
    return (
        f"too many requests per second for this {who} (limit {lim.rate:g}/s, bursts of "
        f"{_bucket_size(lim):g}). To fix: wait Retry-After seconds, or send them more slowly"
    )


def _too_many_server(kind: str, limit: int) -> str:
    return (
        f"the server has too many {kind}requests in flight (limit {limit}). "
        "To fix: wait Retry-After seconds and send it again"
    )


def _too_many_node(node: str, limit: int) -> str:
    return (
        f"too many agent requests in flight for node {node} (limit {limit}). "
        "To fix: wait Retry-After seconds; an agent needs one heartbeat and one report at a time"
    )

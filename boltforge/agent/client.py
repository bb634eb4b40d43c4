"""The HTTP client for the agent endpoints of the control plane.

Every call returns the reply's model or raises one of three errors, which say what to do next:
``SessionLost`` (409: register again), ``Refused`` (another 4xx: the request itself is wrong,
sending it again will not help) and ``Unreachable`` (no answer, a 5xx, or a reply that is not
the expected body: try again later). ``StoreAway``, a kind of ``Unreachable``, is the
server's 503 while its store is away; reports refused so are sent again in place, after the
server's ``Retry-After``, for up to ``STORE_WAIT_S``, so they land as soon as it is back.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import BinaryIO, TypeVar
from urllib.parse import quote

import httpx
from pydantic import BaseModel, ValidationError

from boltforge.addresses import CONNECT_S, Addresses
from boltforge.tls import certificate_problem, verify_with
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

M = TypeVar("M", bound=BaseModel)
STORE_WAIT_S = 30.0  # how long a report refused because the server's store is away is resent


class AgentClientError(Exception):
    """A call to the control plane did not return its reply."""


class SessionLost(AgentClientError):
    """409: the session is unknown or superseded. Register again, then resend."""


class Unreachable(AgentClientError):
    """No usable answer (connection, timeout, 5xx, malformed body). Retry with backoff."""


class StoreAway(Unreachable):
    """503: the server's store is away; nothing was stored. ``retry_after``: the seconds the
    server asked to wait before sending again."""

    def __init__(self, message: str, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class Untrusted(Unreachable):
    """The server's TLS certificate did not verify against the CA the agent trusts. Retried
    like any unanswered call (the server's certificate may be replaced); the message says
    how to give the agent the right CA."""


class Refused(AgentClientError):
    """A 4xx other than 409: the server's ``error`` and ``problems`` say why."""

    def __init__(self, status: int, error: str, problems: list[str]) -> None:
        self.status = status
        self.error = error
        self.problems = problems
        detail = "; ".join(problems)
        super().__init__(f"{status} {error}" + (f": {detail}" if detail else ""))


async def _chunks(f: BinaryIO, size: int = 1 << 20) -> AsyncIterator[bytes]:
    """``f``'s bytes in chunks, for a streamed upload."""
    while chunk := f.read(size):
        yield chunk


class Backoff:
    """Delays that double from ``first_s`` up to ``max_s``, with jitter; ``reset`` on success."""

    def __init__(self, first_s: float = 0.2, max_s: float = 10.0) -> None:
        self.first_s, self.max_s, self._next = first_s, max_s, first_s

    def next(self) -> float:
        delay, self._next = self._next, min(self._next * 2, self.max_s)
        return delay * random.uniform(0.8, 1.2)

    def reset(self) -> None:
        self._next = self.first_s


class ServerClient:
    """Calls ``/v1/agents/...`` on ``base_url`` with ``Authorization: Bearer <token>``;
    ``base_url`` may list several replicas' addresses, comma-separated (``addresses.py``).
    An https server's certificate is verified against the CA bundle ``ca`` (a PEM file)
    when given, else against the system's trusted CAs; a ``ca`` that cannot be loaded raises
    ``boltforge.tls.BadCA``. ``transport`` lets tests substitute httpx's mock transport."""

    def __init__(
        self,
        base_url: str,
        token: str,
        timeout_s: float = 10.0,
        transport: httpx.AsyncBaseTransport | None = None,
        ca: str | Path | None = None,
    ) -> None:
        self.timeout_s = timeout_s
        self.addresses = Addresses(base_url)
        self._http = httpx.AsyncClient(
            base_url=self.addresses.current,
            headers={"Authorization": f"Bearer {token}"},
            timeout=timeout_s,
            transport=transport,
            verify=verify_with(ca),
        )

    async def register(self, body: Registration) -> Lease:
        return await self._call("POST", "/v1/agents/register", Lease, body)

    async def heartbeat(self, node: str, body: Heartbeat, timeout_s: float) -> Lease:
        return await self._call("POST", _node(node, "heartbeat"), Lease, body, timeout_s)

    async def desired(self, node: str, since: int, wait_s: float) -> DesiredState:
        """Long-poll: answered once the node's version passes ``since`` or after ``wait_s``."""
        path = f"{_node(node, 'desired')}?since={since}&wait={wait_s:g}"
        return await self._call("GET", path, DesiredState, None, wait_s + self.timeout_s)

    async def heartbeats(self, beats: dict[str, Heartbeat], timeout_s: float) -> HeartbeatsReply:
        """Many nodes' heartbeats in one call (a bridge speaking for a whole cluster)."""
        body = Heartbeats(beats=beats)
        return await self._call("POST", "/v1/agents/heartbeats", HeartbeatsReply, body, timeout_s)

    async def desired_changes(self, since: int, wait_s: float) -> DesiredChanges:
        """Long-poll: the desired states of the nodes changed after change ``since`` (every
        node for -1), answered once there is one or after ``wait_s``."""
        path = f"/v1/agents/desired?since={since}&wait={wait_s:g}"
        return await self._call("GET", path, DesiredChanges, None, wait_s + self.timeout_s)

    async def report(self, node: str, body: AgentReport) -> ReportReply:
        """Send ``node``'s report; while the server's store is away, again in place (see
        the module docstring)."""
        path = _node(node, "report")
        return await _patiently(lambda: self._call("POST", path, ReportReply, body))

    async def reports(self, reports: dict[str, AgentReport]) -> ReportsReply:
        """Many nodes' reports in one call (a bridge speaking for a whole cluster); sent
        again in place while the server's store is away."""
        body = Reports(reports=reports)
        path = "/v1/agents/reports"
        return await _patiently(lambda: self._call("POST", path, ReportsReply, body))

    async def upload_artifact(
        self, node: str, replica: str, name: str, path: Path, sha256: str
    ) -> None:
        """Send file ``path`` as artifact ``name`` of ``replica`` (``X-Sha256``), streamed.
        Raises ``Refused`` when the server will never keep it, ``Unreachable`` otherwise."""
        url = f"{_node(node, 'artifacts')}/{quote(replica, safe='')}/{quote(name)}"
        headers = {"X-Sha256": sha256, "Content-Type": "application/octet-stream"}
        try:
            with path.open("rb") as f:
                r = await self._http.put(url, content=_chunks(f), headers=headers, timeout=None)
        except (httpx.HTTPError, OSError) as e:
            raise Unreachable(f"artifact upload: {e}") from None
        if r.status_code >= 500:
            raise Unreachable(f"artifact upload: {r.status_code}")
        if r.status_code >= 400:
            raise Refused(r.status_code, r.text[:300], [])

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _call(
        self,
        method: str,
        path: str,
        model: type[M],
        body: BaseModel | None,
        timeout_s: float | None = None,
    ) -> M:
        content = None
        if body is not None:  # defaults are not sent: a server that predates a field takes it
            content = body.model_dump_json(exclude_defaults=True).encode()
        headers = {"Content-Type": "application/json"} if body is not None else {}
        seconds = timeout_s if timeout_s is not None else self.timeout_s
        timeout = httpx.Timeout(seconds, connect=min(CONNECT_S, seconds))
        tries = len(self.addresses)
        while True:
            try:
                reply = await self._http.request(
                    method, path, content=content, headers=headers, timeout=timeout
                )
                break
            except (httpx.ConnectError, httpx.ConnectTimeout) as e:  # never delivered
                error, tries = self._unanswered(f"{method} {path}", e), tries - 1
                self.addresses.move_on(self._http)
                if not tries:
                    raise error from e
            except httpx.HTTPError as e:
                error = self._unanswered(f"{method} {path}", e)
                self.addresses.move_on(self._http)
                raise error from e
        if reply.status_code == 503:  # a replica with no leader behind it
            self.addresses.move_on(self._http)
        _raise_for(reply)
        try:
            return model.model_validate_json(reply.content)
        except ValidationError as e:
            raise Unreachable(
                f"{method} {path}: unexpected reply ({e.error_count()} errors)"
            ) from e

    @property
    def base_url(self) -> str:
        """The server address in use (of those given)."""
        return self.addresses.current

    def _unanswered(self, what: str, error: httpx.HTTPError) -> Unreachable:
        """``Untrusted`` when the server's certificate did not verify, else ``Unreachable``."""
        problem = certificate_problem(error)
        if problem:
            return Untrusted(
                f"{what}: cannot verify the TLS certificate of {self.base_url}: {problem}. "
                "To fix: start the agent with --ca and the CA certificate that signed it "
                "(or set BOLT_CA)"
            )
        return Unreachable(f"{what}: {type(error).__name__} {error}".strip())


def _node(node: str, what: str) -> str:
    return f"/v1/agents/{quote(node, safe='')}/{what}"


async def _patiently(call: Callable[[], Awaitable[M]]) -> M:
    """``call()``, made again after the server's ``Retry-After`` while it raises
    ``StoreAway``, for up to ``STORE_WAIT_S``; then its last error is raised."""
    deadline = time.monotonic() + STORE_WAIT_S
    while True:
        try:
            return await call()
        except StoreAway as e:
            if time.monotonic() + e.retry_after > deadline:
                raise
            await asyncio.sleep(e.retry_after)


def _raise_for(reply: httpx.Response) -> None:
    status = reply.status_code
    if status < 400:
        return
    if status == 409:
        raise SessionLost(_error(reply)[0])
    away = _store_away(reply)
    if away is not None:
        raise away
    if status >= 500 or status in (408, 429):
        raise Unreachable(f"{status} {_error(reply)[0]}")
    raise Refused(status, *_error(reply))


def _store_away(reply: httpx.Response) -> StoreAway | None:
    """The ``StoreAway`` a 503 whose body describes the server's store and that carries a
    ``Retry-After`` is; None for any other reply."""
    if reply.status_code != 503:
        return None
    try:
        wait = float(reply.headers.get("retry-after", ""))
        away = isinstance(reply.json().get("store"), dict)
    except (ValueError, AttributeError):
        return None
    return StoreAway(f"503 {_error(reply)[0]}", min(max(wait, 0.1), 10.0)) if away else None


def _error(reply: httpx.Response) -> tuple[str, list[str]]:
    try:
        data = reply.json()
    except ValueError:
        return reply.text[:200], []
    if not isinstance(data, dict):
        return str(data)[:200], []
    problems = data.get("problems") or []
    listed = [str(p) for p in problems] if isinstance(problems, list) else [str(problems)]
    return str(data.get("error", "")), listed

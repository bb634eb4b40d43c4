"""Server replicas on one store: one leads (schedules, actuates, answers), the others wait.

A replica started with leader election (``bolt server --replica NAME --advertise URL``)
follows until it takes the lease (``store/leadership.py``). While it follows, it forwards
every call but ``/healthz`` to the leader's advertised address and streams the answer
back, so a client may call any replica; ``503`` with ``Retry-After`` while no leader is
known or answers (clients given several addresses try the next). Once it leads, it
recovers from the store exactly as a restarted server does (the mirror, the nodes'
leases, the jobs' state) and acts. A leader that cannot renew its lease within the renew
deadline, or whose write the store refused for an older term, stops at once (the process
exits with ``EXIT_DEPOSED``): it must not act past its lease, and its successor recovers
what it left.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import sys
import threading
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

import httpx
from starlette.types import ASGIApp, Receive, Scope, Send

from boltforge.control.store.leadership import Leadership
from boltforge.tls import verify_with

log = logging.getLogger(__name__)
EXIT_DEPOSED = 75  # EX_TEMPFAIL: a supervisor restarts it, and it follows
OPEN_PATHS = ("/healthz",)
LONGEST_CALL_S = 120.0  # a forwarded call (long-polls included) that takes longer fails


def stop_acting(why: str) -> None:
    """Leave at once: no pass, reply or write may follow a lost lease. Written straight to
    stderr (a logging handler's lock could be held by a thread that will never finish)."""
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.write(f"stopping: {why}\n")
        sys.stderr.flush()
    os._exit(EXIT_DEPOSED)


async def follow_then_lead(
    leadership: Leadership,
    start: Callable[[], Coroutine[Any, Any, None]],
    on_lost: Callable[[str], None] = stop_acting,
) -> None:
    """Wait for the lease, then ``start`` acting (recovery, which may take a while) and
    keep the lease until cancelled. The lease is renewed by a thread of its own, so that
    neither a busy event loop nor busy worker threads can keep a replica that lost it
    acting: ``on_lost`` (by default the process exits) as soon as the lease is lost, has
    not been renewed in time, or the start failed."""
    every = leadership.times.renew_every_s
    while not await _acquired(leadership):
        await asyncio.sleep(every)
    keeper = Keeper(leadership, on_lost)
    keeper.start()
    try:
        try:
            await start()
        except Exception as e:
            keeper.lost(f"{leadership.holder} could not start leading: {e}")
            return
        await asyncio.Event().wait()  # until cancelled
    finally:
        keeper.stop()


async def _acquired(leadership: Leadership) -> bool:
    """One try for the lease; a store that cannot be reached is tried again later."""
    try:
        return await asyncio.to_thread(leadership.try_acquire)
    except Exception as e:
        log.warning("trying for the leader lease failed: %s", e)
        return False


class Keeper(threading.Thread):
    """Renews the lease every ``renew_every_s``; tells ``on_lost`` once, and stops, when
    this replica may no longer act."""

    def __init__(self, leadership: Leadership, on_lost: Callable[[str], None]) -> None:
        super().__init__(name="leader-lease", daemon=True)
        self.leadership, self.on_lost = leadership, on_lost
        self._stop = threading.Event()

    def run(self) -> None:
        while not self._stop.wait(self.leadership.times.renew_every_s):
            why = self._renew()
            if why:
                self.lost(why)

    def _renew(self) -> str:
        """Renew the lease; why this replica must stop acting ('' while it may go on)."""
        leadership = self.leadership
        try:
            leadership.renew()
        except Exception as e:  # the store is unreachable: keep trying until the deadline
            log.warning("renewing the leader lease failed: %s", e)
        if leadership.term is None:
            return f"{leadership.holder}'s term is over: another replica leads"
        if not leadership.leading:
            return f"{leadership.holder} could not renew its leader lease in time"
        return ""

    def lost(self, why: str) -> None:
        if not self._stop.is_set():
            self._stop.set()
            self.on_lost(why)

    def stop(self) -> None:
        self._stop.set()


class FollowerForward:
    """ASGI middleware: while this replica does not lead, forward each call to the one
    that does, streaming the reply back (long-polls and event streams included); ``503``
    with ``Retry-After`` while no leader is known or the leader cannot be reached. The
    leader sees the caller's address in ``X-Forwarded-For``. ``acting`` is set once this
    replica, leading, has recovered and acts."""

    def __init__(self, app: ASGIApp, leadership: Leadership, acting: asyncio.Event) -> None:
        self.app, self.leadership, self.acting = app, leadership, acting
        self._http: httpx.AsyncClient | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        mine = self.leadership.leading and self.acting.is_set()
        if scope["type"] != "http" or mine or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        leader = await asyncio.to_thread(self.leadership.leader)
        if leader is None or leader.holder == self.leadership.holder or not leader.url:
            await _answer(send, 503, "no replica leads yet")
            return
        try:
            await self._forward(leader.url, scope, receive, send)
        except httpx.TransportError:
            await _answer(send, 503, f"the leader ({leader.holder}) does not answer")

    async def _forward(self, leader: str, scope: Scope, receive: Receive, send: Send) -> None:
        if self._http is None:
            timeout = httpx.Timeout(LONGEST_CALL_S, connect=2.0)
            ca = os.environ.get("BOLT_CA")  # replicas serving https verify each other
            self._http = httpx.AsyncClient(timeout=timeout, verify=verify_with(ca))
        url = leader.rstrip("/") + scope["path"]
        if scope.get("query_string"):
            url += "?" + scope["query_string"].decode("latin-1")
        headers = [(k, v) for k, v in scope["headers"] if k.lower() not in HOP_BY_HOP]
        client = scope.get("client")
        if client:
            headers.append((b"x-forwarded-for", client[0].encode()))
        request = self._http.build_request(
            scope["method"], url, headers=headers, content=_body(receive)
        )
        reply = await self._http.send(request, stream=True)
        try:
            head = [(k, v) for k, v in reply.headers.raw if k.lower() not in HOP_BY_HOP]
            start = {"type": "http.response.start", "status": reply.status_code, "headers": head}
            await send(start)
            async for chunk in reply.aiter_raw():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
        finally:
            await reply.aclose()


HOP_BY_HOP = {
    b"connection",
    b"keep-alive",
    b"transfer-encoding",
    b"te",
    b"trailer",
    b"upgrade",
    b"host",
    b"proxy-authorization",
    b"proxy-connection",
}


async def _body(receive: Receive) -> AsyncIterator[bytes]:
    """The request's body as it arrives."""
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return
        yield message.get("body", b"")
        if not message.get("more_body"):
            return


async def _answer(send: Send, status: int, text: str) -> None:
    body = json.dumps({"error": f"{text}. To fix: retry in a second"}).encode()
    head = [
        (b"content-type", b"application/json"),
        (b"retry-after", b"1"),
        (b"content-length", str(len(body)).encode()),
    ]
    await send({"type": "http.response.start", "status": status, "headers": head})
    await send({"type": "http.response.body", "body": body})

"""Watches, as kube-apiserver streams them: one JSON event per line,
``{"type": ADDED|MODIFIED|DELETED|BOOKMARK|ERROR, "object": {...}}``, in a chunked
``application/json`` response, each event (or each run of events already waiting) written
and flushed as it happens.

Each watch is a store subscriber with its own asyncio queue on the server's loop; the store
hands it every change to its resource (in order, under the store lock) and the watch's own
task filters and encodes them, so a change costs the writer one queue hand-off per watch.
Against a label or field selector, an object that stops matching arrives as DELETED (its
previous state, under the new ``resourceVersion``) and one that starts matching as ADDED, as
kube-apiserver's watch cache sends them. Bookmarks carry the newest ``resourceVersion``:
every change before it has been sent first."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from boltforge.testing.kubeapi.objects import JSON
from boltforge.testing.kubeapi.resources import Resource
from boltforge.testing.kubeapi.selectors import FieldSelector, LabelSelector
from boltforge.testing.kubeapi.store import (
    ADDED,
    DELETED,
    MODIFIED,
    Change,
    Store,
    Stored,
    with_version,
)

END, DROP = object(), object()
BATCH = 256
INITIAL_EVENTS_END = "k8s.io/initial-events-end"
Render = Callable[[Stored], bytes]


class WatchDropped(Exception):
    """Raised out of a watch response to cut its connection without ending the stream."""


@dataclass(frozen=True)
class Bookmark:
    rv: int
    initial_end: bool = False


@dataclass(frozen=True)
class Filter:
    """Which objects a watch (or a list) wants."""

    namespace: str | None
    labels: LabelSelector | None
    fields: FieldSelector | None

    def matches(self, obj: JSON) -> bool:
        if self.namespace is not None and obj["metadata"].get("namespace") != self.namespace:
            return False
        if self.labels is not None and not self.labels.matches_object(obj):
            return False
        return self.fields is None or self.fields.matches(obj)


def frame(kind: str, raw: bytes) -> bytes:
    return b'{"type":"' + kind.encode() + b'","object":' + raw + b"}\n"


class Watcher:
    """One open watch on ``res`` through ``filter``; built on the server's loop. ``render``
    writes an object for an event (default its JSON; kubectl's ``get -w`` wants a
    one-row Table)."""

    def __init__(
        self, store: Store, res: Resource, filter: Filter, render: Render | None = None
    ) -> None:
        self.resource = res.plural
        self._res, self._store, self._filter = res, store, filter
        self._render = render or Stored.raw
        self._loop = asyncio.get_running_loop()
        self._thread = threading.get_ident()
        self._queue: asyncio.Queue[object] = asyncio.Queue()
        self._timeout: asyncio.TimerHandle | None = None
        self._tick: asyncio.TimerHandle | None = None

    def offer(self, item: object) -> None:
        """Queue ``item`` (a Change, a Bookmark, END or DROP) from any thread, keeping the
        order in which offers were made."""
        try:
            if threading.get_ident() == self._thread:
                self._loop.call_soon(self._queue.put_nowait, item)
            else:
                self._loop.call_soon_threadsafe(self._queue.put_nowait, item)
        except RuntimeError:  # the loop is closed: the server is gone
            pass

    def start(self, timeout_s: float | None, bookmark_s: float | None) -> None:
        """End the stream after ``timeout_s``; send a bookmark every ``bookmark_s``."""
        if timeout_s:
            self._timeout = self._loop.call_later(timeout_s, self.offer, END)
        if bookmark_s:
            self._tick = self._loop.call_later(bookmark_s, self._bookmark, bookmark_s)

    def _bookmark(self, every: float) -> None:
        with self._store.lock:
            self.offer(Bookmark(self._store.rv))
        self._tick = self._loop.call_later(every, self._bookmark, every)

    def close(self) -> None:
        for timer in (self._timeout, self._tick):
            if timer is not None:
                timer.cancel()
        self._store.unsubscribe(self)

    def added(self, objects: list[Stored]) -> list[bytes]:
        """ADDED events for the current objects that match."""
        return [frame(ADDED, self._render(s)) for s in objects if self._filter.matches(s.obj)]

    def encode(self, change: Change) -> bytes | None:
        """The event ``change`` is to this watch, or None."""
        was = change.old is not None and self._filter.matches(change.old.obj)
        if change.type == DELETED:
            return frame(DELETED, self._render(change.new)) if was else None
        if self._filter.matches(change.new.obj):
            return frame(MODIFIED if was else ADDED, self._render(change.new))
        if was and change.old is not None:
            return frame(DELETED, self._render(Stored(with_version(change.old, change.rv))))
        return None

    def bookmark(self, mark: Bookmark) -> bytes:
        md: JSON = {"resourceVersion": str(mark.rv)}
        if mark.initial_end:
            md["annotations"] = {INITIAL_EVENTS_END: "true"}
        obj = {"kind": self._res.kind, "apiVersion": self._res.api_version, "metadata": md}
        return frame("BOOKMARK", json.dumps(obj, separators=(",", ":")).encode())

    async def frames(self, initial: list[bytes]) -> AsyncIterator[bytes]:
        """The response body: ``initial`` events, then changes as they come. Ends at END;
        raises WatchDropped at DROP."""
        for start in range(0, len(initial), BATCH):
            yield b"".join(initial[start : start + BATCH])
        while True:
            batch, done = self._take(await self._queue.get())
            if batch:
                yield b"".join(batch)
            if done:
                return

    def _take(self, item: object) -> tuple[list[bytes], bool]:
        batch: list[bytes] = []
        while True:
            if item is DROP:
                raise WatchDropped()
            if item is END:
                return batch, True
            encoded = self.bookmark(item) if isinstance(item, Bookmark) else None
            if isinstance(item, Change):
                encoded = self.encode(item)
            if encoded is not None:
                batch.append(encoded)
            if self._queue.empty() or len(batch) >= BATCH:
                return batch, False
            item = self._queue.get_nowait()


Send = Callable[[dict[str, Any]], Awaitable[None]]
Receive = Callable[[], Awaitable[dict[str, Any]]]
HEADERS = [(b"content-type", b"application/json"), (b"cache-control", b"no-cache, private")]


class WatchStream:
    """The ASGI response of one watch: streams ``watcher``'s frames until it ends, the
    client goes, or the watch is dropped (the exception cuts the connection)."""

    def __init__(self, watcher: Watcher, initial: list[bytes]) -> None:
        self.watcher, self.initial = watcher, initial

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": HEADERS})
        waiter = asyncio.ensure_future(self._until_disconnect(receive))
        try:
            async for chunk in self.watcher.frames(self.initial):
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            waiter.cancel()
            self.watcher.close()

    async def _until_disconnect(self, receive: Receive) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        self.watcher.offer(END)

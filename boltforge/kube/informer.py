"""List, then watch: one kind of object kept current in memory, as client-go's informers do.

A thread lists the objects once (their ``resourceVersion`` is the list's), then watches from
that version: each event changes the cache and calls ``on_change``. A watch that ends
(``timeoutSeconds``, a dropped connection) is resumed from the last version seen, so no event
is lost or seen twice; a watch answered 410 Gone (the server forgot that version) lists
again. Errors back off from 0.2 s to 10 s; nothing busy-loops. Objects are parsed from the
server's JSON (``_preload_content=False``) by ``parse``."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

from kubernetes.client.exceptions import ApiException
from kubernetes.watch.watch import iter_resp_lines
from urllib3.exceptions import HTTPError as Urllib3Error

from boltforge.agent.client import Backoff

log = logging.getLogger("boltforge.kube")
T = TypeVar("T")
GONE = 410


class Expired(Exception):
    """The server no longer has the version a watch asked for: list again."""


class Informer(Generic[T]):
    """A cache of one kind of object, by ``namespace/name`` (or ``name``). ``lister`` is a
    client list call (``CoreV1Api.list_pod_for_all_namespaces``, a ``CustomObjectsApi`` list
    bound to its group), called with the watch arguments; ``selectors`` go to both the list
    and the watch. ``lists`` counts the lists made (the first and every relist). With
    ``absent`` (the words to log), a list answered 404 means the kind is not installed: the
    cache is synced and empty, ``absent`` is True, and the list is tried again every
    ``recheck_s`` (see ``_not_served``); without it, a 404 is retried like any error."""

    def __init__(
        self,
        kind: str,
        lister: Callable[..., Any],
        parse: Callable[[Mapping[str, Any]], T],
        on_change: Callable[[], None],
        *,
        watch_s: int = 240,
        selectors: Mapping[str, str] | None = None,
        absent: str = "",
        recheck_s: float = 30.0,
    ) -> None:
        self.kind, self.lister, self.parse, self.on_change = kind, lister, parse, on_change
        self.watch_s = watch_s
        self.absent_words, self.recheck_s = absent, recheck_s
        self.absent = False  # the server does not serve this kind (its list answered 404)
        self.selectors = dict(selectors or {})
        self.items: dict[str, T] = {}
        self.lock = threading.Lock()
        self.synced = threading.Event()
        self.version: str | None = None
        self.lists = 0
        self._changed: set[str] | None = None  # None: listed anew since ``changes``
        self._stop = threading.Event()
        self._response: Any = None

    def snapshot(self) -> dict[str, T]:
        with self.lock:
            return dict(self.items)

    def changes(self) -> tuple[dict[str, T], set[str] | None]:
        """``snapshot`` and the keys that changed (added, modified or deleted) since the last
        call, or None when any may have (the first call, and after a relist). For one
        consumer: each call starts the next change set."""
        with self.lock:
            changed, self._changed = self._changed, set()
            return dict(self.items), changed

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self.run, name=f"informer-{self.kind}", daemon=True)
        thread.start()
        return thread

    def stop(self) -> None:
        """Stop at once, from any thread: a watch waiting for data is cut off by shutting its
        socket down (closing the response instead would wait for the server's next line)."""
        self._stop.set()
        response = self._response
        if response is not None:
            response.shutdown()

    def run(self) -> None:
        """List and watch until ``stop``."""
        backoff = Backoff()
        while not self._stop.is_set():
            try:
                if self.version is None:
                    self._list()
                self._watch()
                backoff.reset()
            except Expired:
                log.info("%s watch expired at %s: listing again", self.kind, self.version)
                self.version = None
            except (ApiException, Urllib3Error, OSError, ValueError) as e:
                if isinstance(e, ApiException) and e.status == GONE:
                    self.version = None
                    continue
                if isinstance(e, ApiException) and e.status == 404 and self.absent_words:
                    self._not_served()
                    self._stop.wait(self.recheck_s)
                    continue
                if not self._stop.is_set():
                    log.warning("%s watch failed, retrying: %s", self.kind, _short(e))
                    self._stop.wait(backoff.next())

    def _not_served(self) -> None:
        """The server answered 404 to the list: the kind is not installed (a CRD). Counts
        as synced with no objects, says so once (``absent``), and is listed again every
        ``recheck_s`` so that installing it later is noticed."""
        self.version = None
        if not self.absent:
            log.error("%s: %s", self.kind, self.absent_words)
            with self.lock:
                self.items, self._changed, self.absent = {}, None, True
        self.synced.set()
        self.on_change()

    def _list(self) -> None:
        response = self.lister(_preload_content=False, _request_timeout=30, **self.selectors)
        body = json.loads(response.data)
        items = {_key(o): self.parse(o) for o in body.get("items") or []}
        if self.absent:
            log.info("%s: served now; listed %d", self.kind, len(items))
        with self.lock:
            self.absent = False
            self.items = items
            self._changed = None
            self.version = body["metadata"]["resourceVersion"]
        self.lists += 1
        self.synced.set()
        self.on_change()

    def _watch(self) -> None:
        response = self.lister(
            watch=True,
            resource_version=self.version,
            timeout_seconds=self.watch_s,
            allow_watch_bookmarks=True,
            _preload_content=False,
            _request_timeout=(10, self.watch_s + 30),
            **self.selectors,
        )
        self._response = response
        try:
            if self._stop.is_set():  # stopped while it opened: ``stop`` saw no response
                return
            for line in iter_resp_lines(response):
                if self._stop.is_set():
                    return
                if line:
                    self._apply(json.loads(line))
        finally:
            self._response = None
            response.release_conn()

    def _apply(self, event: Mapping[str, Any]) -> None:
        kind, obj = event.get("type"), event.get("object") or {}
        if kind == "ERROR":
            if obj.get("code") == GONE:
                raise Expired()
            raise ApiException(status=obj.get("code"), reason=obj.get("message"))
        version = (obj.get("metadata") or {}).get("resourceVersion")
        if kind != "BOOKMARK":
            key = _key(obj)
            parsed = None if kind == "DELETED" else self.parse(obj)
            with self.lock:
                if parsed is None:
                    self.items.pop(key, None)
                else:
                    self.items[key] = parsed
                if self._changed is not None:
                    self._changed.add(key)
        if version:
            self.version = version
        if kind != "BOOKMARK":
            self.on_change()


def _key(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    ns = meta.get("namespace")
    return f"{ns}/{meta.get('name')}" if ns else str(meta.get("name"))


def _short(e: Exception) -> str:
    if isinstance(e, ApiException):
        return f"{e.status} {e.reason}"
    return f"{type(e).__name__}: {e}"

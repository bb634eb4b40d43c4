"""The object store: every object by resource, namespace and name; one global
``resourceVersion`` counter (etcd's revision: each create, update and delete takes the next
one); and a bounded log of changes that watches replay from.

Contract: one re-entrant lock (``Store.lock``) guards everything; callers that read, decide
and write hold it across the three. Stored objects are never changed in place: a write puts a
new dict, so a ``Stored`` may be shared by lists, the log and watchers, and caches its JSON
once. Subscribers (watches) and listeners (the kubelet emulation, the disruption controller)
hear each change under the lock, in order, and must only hand it on."""

from __future__ import annotations

import json
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from boltforge.testing.kubeapi.errors import ApiError
from boltforge.testing.kubeapi.objects import JSON, meta

ADDED, MODIFIED, DELETED = "ADDED", "MODIFIED", "DELETED"


class Stored:
    """One version of one object, with its JSON encoding made at most once."""

    __slots__ = ("_raw", "obj")

    def __init__(self, obj: JSON) -> None:
        self.obj = obj
        self._raw: bytes | None = None

    def raw(self) -> bytes:
        if self._raw is None:
            self._raw = json.dumps(self.obj, separators=(",", ":")).encode()
        return self._raw

    def copy(self) -> JSON:
        """A deep copy the caller may change."""
        copied: JSON = json.loads(self.raw())
        return copied

    @property
    def rv(self) -> int:
        return int(self.obj["metadata"]["resourceVersion"])


@dataclass(frozen=True, slots=True)
class Change:
    """One entry of the log: ``new`` is the object after the change (for DELETED, its last
    state carrying the deletion's ``resourceVersion``); ``old`` the one before."""

    rv: int
    resource: str
    type: str
    new: Stored
    old: Stored | None

    @property
    def namespace(self) -> str:
        return str(self.new.obj["metadata"].get("namespace", ""))


class Subscriber(Protocol):
    """A watch: ``offer`` is called under the store lock and must not block."""

    resource: str

    def offer(self, item: object) -> None: ...


Listener = Callable[[Change], None]


class Store:
    """Objects, the revision counter, the change log (``log_size`` entries) and watchers."""

    def __init__(self, log_size: int = 10_000) -> None:
        self.lock = threading.RLock()
        self._rv = 0
        self._data: dict[str, dict[str, dict[str, Stored]]] = {}
        self._log: deque[Change] = deque()
        self._log_size = log_size
        self._floor = 0
        self._subscribers: dict[str, set[Subscriber]] = {}
        self._listeners: list[Listener] = []

    @property
    def rv(self) -> int:
        """The newest ``resourceVersion`` given out."""
        return self._rv

    def get(self, resource: str, namespace: str, name: str) -> Stored | None:
        return self._data.get(resource, {}).get(namespace, {}).get(name)

    def items(self, resource: str, namespace: str | None = None) -> list[Stored]:
        """Every object of ``resource`` (in ``namespace`` unless None), by namespace, name."""
        with self.lock:
            spaces = self._data.get(resource, {})
            names = [namespace] if namespace is not None else sorted(spaces)
            return [
                s
                for ns in names
                for _, s in sorted(spaces.get(ns, {}).items(), key=lambda kv: kv[0])
            ]

    def count(self, resource: str, namespace: str) -> int:
        return len(self._data.get(resource, {}).get(namespace, {}))

    def put(self, resource: str, obj: JSON) -> Stored:
        """Create or replace ``obj`` (which the store now owns) under the next version."""
        with self.lock:
            md = meta(obj)
            bucket = self._data.setdefault(resource, {}).setdefault(md.get("namespace", ""), {})
            old = bucket.get(md["name"])
            self._rv += 1
            md["resourceVersion"] = str(self._rv)
            new = bucket[md["name"]] = Stored(obj)
            self._record(Change(self._rv, resource, MODIFIED if old else ADDED, new, old))
            return new

    def remove(self, resource: str, namespace: str, name: str) -> Stored | None:
        """Delete an object; its last state, under the deletion's version, or None."""
        with self.lock:
            old = self._data.get(resource, {}).get(namespace, {}).pop(name, None)
            if old is None:
                return None
            self._rv += 1
            gone = Stored(with_version(old, self._rv))
            self._record(Change(self._rv, resource, DELETED, gone, old))
            return gone

    def _record(self, change: Change) -> None:
        self._log.append(change)
        while len(self._log) > self._log_size:
            self._floor = self._log.popleft().rv
        for sub in self._subscribers.get(change.resource, ()):
            sub.offer(change)
        for listener in self._listeners:
            listener(change)

    def listen(self, listener: Listener) -> None:
        with self.lock:
            self._listeners.append(listener)

    def compact(self) -> int:
        """Forget every change up to now (a watch from an older version gets 410)."""
        with self.lock:
            self._log.clear()
            self._floor = self._rv
            return self._rv

    def subscribe_since(self, sub: Subscriber, since: int) -> list[Change]:
        """Register ``sub`` and return the changes to its resource after ``since``; raises
        410 Expired when the log no longer reaches back that far."""
        with self.lock:
            if since < self._floor:
                message = f"too old resource version: {since} ({self._floor})"
                raise ApiError(410, message, "Expired")
            replay = []
            for change in reversed(self._log):
                if change.rv <= since:
                    break
                if change.resource == sub.resource:
                    replay.append(change)
            self._subscribers.setdefault(sub.resource, set()).add(sub)
            return replay[::-1]

    def subscribe_now(self, sub: Subscriber, namespace: str | None) -> tuple[int, list[Stored]]:
        """Register ``sub``; the newest version and the current objects of its resource."""
        with self.lock:
            self._subscribers.setdefault(sub.resource, set()).add(sub)
            return self._rv, self.items(sub.resource, namespace)

    def unsubscribe(self, sub: Subscriber) -> None:
        with self.lock:
            self._subscribers.get(sub.resource, set()).discard(sub)

    def subscribers(self) -> list[Subscriber]:
        with self.lock:
            return [s for subs in self._subscribers.values() for s in subs]


def with_version(stored: Stored, rv: int) -> JSON:
    """A copy of ``stored`` carrying ``resourceVersion`` ``rv``."""
    obj = stored.copy()
    obj["metadata"]["resourceVersion"] = str(rv)
    return obj


def without_version(obj: Any) -> Any:
    """``obj`` with its ``resourceVersion`` left out, to tell a write that changes nothing."""
    if not isinstance(obj, dict) or not isinstance(obj.get("metadata"), dict):
        return obj
    md = {k: v for k, v in obj["metadata"].items() if k != "resourceVersion"}
    return {**obj, "metadata": md}

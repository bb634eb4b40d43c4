"""Wake-ups for long-polls: a waiter on a key returns as soon as the key is notified.

Notifications come from worker threads (the scheduling pass, request handlers); waiters are
coroutines on the server's event loop. A waiter reads the key's counter before it checks the
store and waits for it to move, so a notification between the two is never missed.

Every notification also bumps ``ANY`` and is logged with a sequence number, so a follower of
all changes (the console's event stream) asks ``since(seq)`` for the keys notified after what
it has seen; past ``LOG_SIZE`` keys behind, it is told to refresh everything.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import Iterable

ANY = "*"
LOG_SIZE = 10_000


class Notifier:
    """Per-key counters and waiters, safe to notify from any thread."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._counts: dict[str, int] = {}
        self._waiters: dict[str, list[asyncio.Future[None]]] = {}
        self._lock = threading.Lock()
        self._seq = 0
        self._log: deque[tuple[int, str]] = deque(maxlen=LOG_SIZE)
        self._closed = False

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    @property
    def closed(self) -> bool:
        """Whether the server is shutting down: long-polls answer with what they have."""
        return self._closed

    def close(self) -> None:
        """The server is shutting down: wake every waiter, and let none wait again (call
        on the event loop)."""
        self._closed = True
        waiting, self._waiters = self._waiters, {}
        for futures in waiting.values():
            for fut in futures:
                if not fut.done():
                    fut.set_result(None)

    def count(self, key: str) -> int:
        with self._lock:
            return self._counts.get(key, 0)

    def notify(self, keys: Iterable[str]) -> None:
        """Bump each key and wake its waiters (callable from any thread)."""
        keys = list(keys)
        if not keys:
            return
        keys.append(ANY)
        with self._lock:
            for k in keys:
                self._counts[k] = self._counts.get(k, 0) + 1
            for k in keys[:-1]:
                self._seq += 1
                self._log.append((self._seq, k))
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._wake, keys)

    def _wake(self, keys: list[str]) -> None:
        for k in keys:
            for fut in self._waiters.pop(k, []):
                if not fut.done():
                    fut.set_result(None)

    @property
    def seq(self) -> int:
        """The sequence number of the last logged key."""
        with self._lock:
            return self._seq

    def since(self, seq: int) -> tuple[int, set[str] | None]:
        """The keys notified after ``seq`` and the latest sequence number; None instead of the
        keys when some of them already left the log."""
        with self._lock:
            if self._seq - seq > len(self._log):
                return self._seq, None
            keys: set[str] = set()
            for n, k in reversed(self._log):
                if n <= seq:
                    break
                keys.add(k)
            return self._seq, keys

    async def wait(self, key: str, seen: int, timeout: float) -> bool:
        """Wait until ``key``'s counter differs from ``seen`` or ``close`` is called (True),
        or ``timeout`` (False); False at once once closed (the caller answers with what it
        has)."""
        if self._closed:
            return False
        if self.count(key) != seen:
            return True
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(key, []).append(fut)
        if self.count(key) != seen:
            return True
        try:
            await asyncio.wait_for(fut, timeout)
        except TimeoutError:
            return False
        finally:
            waiting = self._waiters.get(key)
            if waiting and fut in waiting:
                waiting.remove(fut)
        return True

"""Group commit for the agent protocol: many small changes, one transaction.

At fleet scale the agents' traffic is thousands of tiny writes a second (2,048 nodes each
heartbeating every 2 s, a report per replica start or exit, every node registering at once
after a restart). Each in a transaction of its own would spend its time committing and
queueing for the scheduler's lock. The ``Batcher`` is one writer thread: requests hand it a
change (a function of a session) and wait; it applies every change waiting at that moment,
up to ``MAX_GROUP``, in one transaction under the scheduler's lock, and commits once. A
change that raises is not the group's problem: the group is rolled back and each change is
applied again in a transaction of its own, so every change lands whole or not at all, and
the caller gets its own result or its own error. A group that fails because the store is
away (``outage.fault_of``) is not tried again change by change: each caller gets that error.

Changes must be functions of the session and their arguments only (they may run twice when
a neighbour fails); what they return is handed back after the commit, so the caller wakes
nodes and the loop only for what is stored. A change may name the rows it will read
(``reads``); the batcher's ``warm`` function reads those of the whole group in a few
statements before any change runs, so a storm of reports costs a few queries per group
rather than a few per report.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from sqlalchemy.orm import Session

from boltforge.control.store.db import Database
from boltforge.control.store.outage import fault_of

log = logging.getLogger("boltforge.batch")
MAX_GROUP = 256
T = TypeVar("T")
Q = TypeVar("Q")


@dataclass
class Change(Generic[T]):
    """One change and where its result goes."""

    apply: Callable[[Session], T]
    reads: frozenset[str] = frozenset()
    done: Future[T] = field(default_factory=Future)


def next_group(items: queue.Queue[Q | None], most: int) -> list[Q] | None:
    """Wait for the next item of ``items``, then take every one waiting behind it, up to
    ``most`` in all: a group writer's next group. None once the queue is closed (a None put
    in it; it is left there for the next taker)."""
    first = items.get()
    if first is None:
        items.put(None)
        return None
    group = [first]
    while len(group) < most:
        try:
            more = items.get_nowait()
        except queue.Empty:
            break
        if more is None:
            items.put(None)
            break
        group.append(more)
    return group


class Batcher:
    """The group-commit writer (a thread). ``lock`` is held while a group is applied.
    ``warm(s, reads)``, if given, is called in the group's transaction, before its changes
    run, with every key the group's changes read; what it loads must stay valid for the
    whole transaction (the session's identity map holds the rows it keeps)."""

    def __init__(
        self,
        db: Database,
        lock: AbstractContextManager[Any],
        name: str,
        warm: Callable[[Session, set[str]], None] | None = None,
    ) -> None:
        self.db, self.lock, self.warm = db, lock, warm
        self._changes: queue.Queue[Change[Any] | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()
        self.groups = 0
        self.changes = 0
        self._taken = 0  # changes taken into the group being applied

    def write(self, apply: Callable[[Session], T], reads: frozenset[str] = frozenset()) -> T:
        """Apply ``apply`` in a group and return its result (or raise its error); ``reads``
        are the keys it will read (see ``warm``)."""
        change = Change(apply, reads)
        self._changes.put(change)
        return change.done.result()

    async def write_async(
        self, apply: Callable[[Session], T], reads: frozenset[str] = frozenset()
    ) -> T:
        """``write`` for coroutines: waits without holding a worker thread. ``reads`` are
        the keys ``apply`` will read (see ``warm``)."""
        change = Change(apply, reads)
        self._changes.put(change)
        return await asyncio.wrap_future(change.done)

    def waiting(self) -> int:
        """How many changes wait to be applied: queued, or taken into the group that is
        waiting for the lock (roughly: others may be arriving)."""
        return self._changes.qsize() + self._taken

    def close(self) -> None:
        self._changes.put(None)
        self._thread.join(10)

    def _run(self) -> None:
        while (group := next_group(self._changes, MAX_GROUP)) is not None:
            self._taken = len(group)
            self._apply(group)
            self._taken = 0

    def _apply(self, group: list[Change[Any]]) -> None:
        try:
            with self.lock, self.db.session() as s:
                reads = set().union(*(c.reads for c in group))
                if reads and self.warm is not None:
                    self.warm(s, reads)
                results = [c.apply(s) for c in group]
        except Exception as e:
            if len(group) == 1 or fault_of(e) is not None:  # the store is away: for all
                for change in group:
                    change.done.set_exception(e)
            else:
                for change in group:
                    self._apply([change])
            return
        self.groups += 1
        self.changes += len(group)
        for change, result in zip(group, results, strict=True):
            change.done.set_result(result)

"""The replay's waiting jobs, by id and in arrival order at once.

A full pass orders the whole queue (``core.queueing.ordering``), and every order breaks its
ties by arrival: submit time, then id. ``PendingJobs`` keeps the waiting jobs sorted that way
as they come and go, so a pass is handed them already in arrival order
(``Snapshot.in_arrival_order``) and the ordering skips the sort that would put them so. It
keeps their numbers too (``QueueColumns``), a column per job in the same order, so a pass
reads arrays instead of every waiting job.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterator

import numpy as np

from boltforge.core.model.workload import Job
from boltforge.core.queueing.columns import FIELDS, QueueColumns, row


class PendingJobs:
    """Waiting jobs by id (``in``, ``[]``, ``len``, iteration in the order they were put),
    and ``in_arrival_order``: the same jobs sorted by (submit time, id). Submit times must
    not be NaN. ``columns``: their numbers, in arrival order."""

    __slots__ = ("_by_id", "_codes", "_jobs", "_keys", "_queue", "_table")

    def __init__(self) -> None:
        self._by_id: dict[str, Job] = {}
        self._keys: list[tuple[float, str]] = []  # (submit time, id), sorted
        self._jobs: list[Job] = []  # the job of each key, in step with ``_keys``
        # each job's ``row`` in a column of ``_table`` and its queue's code in ``_queue``,
        # in step with ``_keys`` (the first ``len`` of them; the rest is room to grow)
        self._table = np.zeros((len(FIELDS), 64))
        self._queue = np.zeros(64, dtype=np.int64)
        self._codes: dict[str, int] = {}  # quota queue: its code, in the order first seen

    def __contains__(self, key: object) -> bool:
        return key in self._by_id

    def __getitem__(self, key: str) -> Job:
        return self._by_id[key]

    def __len__(self) -> int:
        return len(self._by_id)

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_id)

    def values(self) -> list[Job]:
        """The jobs in the order they were put (``update`` keeps each one's place)."""
        return list(self._by_id.values())

    def put(self, job: Job) -> None:
        """Queue ``job``; none of its id may be waiting (``ValueError``)."""
        if job.id in self._by_id:
            raise ValueError(f"job {job.id!r} is already waiting")
        self._by_id[job.id] = job
        key = (job.submit_time, job.id)
        i = bisect_left(self._keys, key)
        self._keys.insert(i, key)
        self._jobs.insert(i, job)
        self._open(i)
        self._write(i, job)

    def pop(self, key: str) -> Job:
        """Take ``key``'s job out of the queue and return it (``KeyError``: not waiting)."""
        job = self._by_id.pop(key)
        i = bisect_left(self._keys, (job.submit_time, key))
        del self._keys[i], self._jobs[i]
        n = len(self._jobs)  # the columns after ``i`` move down one
        self._table[:, i:n] = self._table[:, i + 1 : n + 1]
        self._queue[i:n] = self._queue[i + 1 : n + 1]
        return job

    def update(self, change: Callable[[Job], Job]) -> None:
        """Replace each job by ``change(job)``, which keeps its id and submit time."""
        for i, job in enumerate(self._jobs):
            new = change(job)
            if new is not job:
                assert (new.submit_time, new.id) == self._keys[i]
                self._jobs[i] = self._by_id[job.id] = new
                self._write(i, new)

    def in_arrival_order(self) -> tuple[Job, ...]:
        """The waiting jobs sorted by submit time, then id."""
        return tuple(self._jobs)

    def columns(self) -> QueueColumns:
        """The waiting jobs' numbers in arrival order: ``QueueColumns.of`` of
        ``in_arrival_order()``, but for which code each queue has (an own copy)."""
        n = len(self._jobs)
        return QueueColumns(self._table[:, :n].copy(), self._queue[:n].copy(), tuple(self._codes))

    def _open(self, i: int) -> None:
        """Make room for a column at ``i``: the ones from there on move up one."""
        n = len(self._jobs) - 1  # the columns before this job came
        if n == self._queue.size:
            self._table = np.concatenate([self._table, np.zeros_like(self._table)], axis=1)
            self._queue = np.concatenate([self._queue, np.zeros_like(self._queue)])
        self._table[:, i + 1 : n + 1] = self._table[:, i:n]
        self._queue[i + 1 : n + 1] = self._queue[i:n]

    def _write(self, i: int, job: Job) -> None:
        self._table[:, i] = row(job)
        self._queue[i] = self._codes.setdefault(job.queue, len(self._codes))

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

    __slots__ = ("_by_id", "_codes", "_jobs", "_keys", "_numbers")

    def __init__(self) -> None:
        self._by_id: dict[str, Job] = {}
        self._keys: list[tuple[float, str]] = []  # (submit time, id), sorted
        self._jobs: list[Job] = []  # the job of each key, in step with ``_keys``
        # each job's ``row`` and its queue's code, a column each, in step with ``_keys``
        self._numbers = _Columns(len(FIELDS) + 1)
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
        self._numbers.insert(i, self._column(job))

    def pop(self, key: str) -> Job:
        """Take ``key``'s job out of the queue and return it (``KeyError``: not waiting)."""
        job = self._by_id.pop(key)
        i = bisect_left(self._keys, (job.submit_time, key))
        del self._keys[i], self._jobs[i]
        self._numbers.delete(i)
        return job

    def update(self, change: Callable[[Job], Job]) -> None:
        """Replace each job by ``change(job)``, which keeps its id and submit time."""
        for i, job in enumerate(self._jobs):
            new = change(job)
            if new is not job:
                assert (new.submit_time, new.id) == self._keys[i]
                self._jobs[i] = self._by_id[job.id] = new
                self._numbers.write(i, self._column(new))

    def in_arrival_order(self) -> tuple[Job, ...]:
        """The waiting jobs sorted by submit time, then id."""
        return tuple(self._jobs)

    def columns(self) -> QueueColumns:
        """The waiting jobs' numbers in arrival order: ``QueueColumns.of`` of
        ``in_arrival_order()``, but for which code each queue has. The numbers are a view
        of the queue's own, good until the queue next changes (a pass reads them at once)."""
        numbers = self._numbers.view()
        return QueueColumns(numbers[:-1], numbers[-1].astype(np.int64), tuple(self._codes))

    def _column(self, job: Job) -> tuple[float, ...]:
        return (*row(job), self._codes.setdefault(job.queue, len(self._codes)))


class _Columns:
    """Columns of numbers, one row per number, with room kept at both ends: a column put or
    taken at a position moves the columns on its shorter side only, so a queue that is
    served from its front and fed at its back (a strict order's) moves almost nothing."""

    __slots__ = ("_data", "_lo", "_n")

    def __init__(self, rows: int) -> None:
        self._data = np.zeros((rows, 64))
        self._lo, self._n = 32, 0  # the columns in use are ``_data[:, _lo : _lo + _n]``

    def view(self) -> np.ndarray:
        return self._data[:, self._lo : self._lo + self._n]

    def write(self, i: int, column: tuple[float, ...]) -> None:
        self._data[:, self._lo + i] = column

    def insert(self, i: int, column: tuple[float, ...]) -> None:
        """Put ``column`` at position ``i`` (0 to the number of columns)."""
        n = self._n
        front = i < n - i
        no_room = self._lo == 0 if front else self._lo + n == self._data.shape[1]
        if no_room:
            self._recenter()
        lo, data = self._lo, self._data
        if front:  # those before ``i`` move down one
            data[:, lo - 1 : lo + i - 1] = data[:, lo : lo + i]
            self._lo = lo = lo - 1
        else:  # those from ``i`` on move up one
            data[:, lo + i + 1 : lo + n + 1] = data[:, lo + i : lo + n]
        data[:, lo + i] = column
        self._n = n + 1

    def delete(self, i: int) -> None:
        """Take out the column at position ``i``."""
        lo, n, data = self._lo, self._n, self._data
        if i < n - 1 - i:  # those before ``i`` move up one
            data[:, lo + 1 : lo + i + 1] = data[:, lo : lo + i]
            self._lo = lo + 1
        else:  # those after ``i`` move down one
            data[:, lo + i : lo + n - 1] = data[:, lo + i + 1 : lo + n]
        self._n = n - 1

    def _recenter(self) -> None:
        """Put the columns in the middle, in twice the room when they fill half of it."""
        rows, room = self._data.shape
        if 2 * (self._n + 1) > room:
            room *= 2
        data = np.zeros((rows, room))
        lo = (room - self._n) // 2
        data[:, lo : lo + self._n] = self.view()
        self._data, self._lo = data, lo

"""The replay's waiting jobs, by id and in arrival order at once.

A full pass orders the whole queue (``core.queueing.ordering``), and every order breaks its
ties by arrival: submit time, then id. ``PendingJobs`` keeps the waiting jobs sorted that way
as they come and go, so a pass is handed them already in arrival order
(``Snapshot.in_arrival_order``) and the ordering skips the sort that would put them so.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterator

from boltforge.core.model.workload import Job


class PendingJobs:
    """Waiting jobs by id (``in``, ``[]``, ``len``, iteration in the order they were put),
    and ``in_arrival_order``: the same jobs sorted by (submit time, id). Submit times must
    not be NaN."""

    __slots__ = ("_by_id", "_jobs", "_keys")

    def __init__(self) -> None:
        self._by_id: dict[str, Job] = {}
        self._keys: list[tuple[float, str]] = []  # (submit time, id), sorted
        self._jobs: list[Job] = []  # the job of each key, in step with ``_keys``

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

    def pop(self, key: str) -> Job:
        """Take ``key``'s job out of the queue and return it (``KeyError``: not waiting)."""
        job = self._by_id.pop(key)
        i = bisect_left(self._keys, (job.submit_time, key))
        del self._keys[i], self._jobs[i]
        return job

    def update(self, change: Callable[[Job], Job]) -> None:
        """Replace each job by ``change(job)``, which keeps its id and submit time."""
        for i, job in enumerate(self._jobs):
            new = change(job)
            if new is not job:
                assert (new.submit_time, new.id) == self._keys[i]
                self._jobs[i] = self._by_id[job.id] = new

    def in_arrival_order(self) -> tuple[Job, ...]:
        """The waiting jobs sorted by submit time, then id."""
        return tuple(self._jobs)

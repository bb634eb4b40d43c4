"""A waiting queue's numbers, one array per number, in step with its jobs.

The orders (``ordering``, ``fairshare``) and the pass's tail (``cycle/tail.py``) read a few
numbers of every waiting job each pass. ``QueueColumns.of`` reads them off the jobs; a caller
that keeps its queue from pass to pass (the simulator's ``PendingJobs``) keeps the columns
too, writing a job's column (``row``) as it comes and moving the rest as it goes, so a pass
on a long queue reads arrays instead of every job.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from boltforge.core.model.topology import BoolArray, FloatArray, IntArray
from boltforge.core.model.workload import Job
from boltforge.core.queueing.shortest import work_left

# The rows of ``QueueColumns.table``, in this order (``row`` gives a job's numbers so).
FIELDS = (
    "submit",  # submit time
    "gpus",  # the gang's GPUs
    "priority",  # its class
    "cpus",  # the gang's CPUs
    "memory",  # the gang's memory, GB
    "work",  # ``shortest.work_left``
    "deadline",  # NaN without one
    "runtime",  # the expected runtime, 0 when unknown (what ``fairshare.slack`` counts)
    "attained",  # GPU-seconds attained before a preemption or failure
    "held",  # 1 when GPUs are held for its restart
    "elastic",  # 1 when it is elastic
)


def row(job: Job) -> tuple[float, ...]:
    """``job``'s numbers in the order of ``FIELDS``."""
    gang = job.gang
    return (
        job.submit_time,
        gang.total_gpus,
        gang.priority,
        gang.total_cpus,
        gang.total_memory_gb,
        work_left(job),
        math.nan if job.deadline is None else job.deadline,
        job.expected_runtime() or 0.0,
        job.attained_gpu_seconds,
        job.held is not None,
        job.elastic is not None,
    )


@dataclass(frozen=True, slots=True)
class QueueColumns:
    """The numbers of a queue of jobs: ``table`` has one row per name in ``FIELDS`` and one
    column per job, in the queue's order; ``queue`` is each job's quota queue as a position
    in ``queues``. Read it, never change it."""

    table: FloatArray
    queue: IntArray
    queues: tuple[str, ...]

    @staticmethod
    def of(jobs: Sequence[Job]) -> QueueColumns:
        """The columns of ``jobs``, read off each job."""
        table = np.array([row(j) for j in jobs], dtype=np.float64).reshape(len(jobs), len(FIELDS))
        codes: dict[str, int] = {}
        queue = np.fromiter((codes.setdefault(j.queue, len(codes)) for j in jobs), np.int64)
        return QueueColumns(np.ascontiguousarray(table.T), queue, tuple(codes))

    def __len__(self) -> int:
        return len(self.queue)

    def take(self, positions: IntArray) -> QueueColumns:
        """The columns of the jobs at ``positions``, in that order."""
        return QueueColumns(self.table[:, positions], self.queue[positions], self.queues)

    def since(self, start: int) -> QueueColumns:
        """The columns of the jobs from position ``start`` on (a view of these)."""
        return QueueColumns(self.table[:, start:], self.queue[start:], self.queues)

    def _field(self, name: str) -> FloatArray:
        out: FloatArray = self.table[FIELDS.index(name)]
        return out

    @property
    def submit(self) -> FloatArray:
        return self._field("submit")

    @property
    def gpus(self) -> IntArray:
        return self._field("gpus").astype(np.int64)

    @property
    def priority(self) -> IntArray:
        return self._field("priority").astype(np.int64)

    @property
    def cpus(self) -> FloatArray:
        return self._field("cpus")

    @property
    def memory(self) -> FloatArray:
        return self._field("memory")

    @property
    def work(self) -> FloatArray:
        return self._field("work")

    @property
    def deadline(self) -> FloatArray:
        return self._field("deadline")

    @property
    def runtime(self) -> FloatArray:
        return self._field("runtime")

    @property
    def attained(self) -> FloatArray:
        return self._field("attained")

    @property
    def held(self) -> BoolArray:
        out: BoolArray = self._field("held") != 0
        return out

    @property
    def elastic(self) -> BoolArray:
        out: BoolArray = self._field("elastic") != 0
        return out

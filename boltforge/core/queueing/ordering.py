"""The order a cycle considers pending jobs in, for each policy's ordering rule."""

from __future__ import annotations

from collections.abc import Callable
from operator import attrgetter

import numpy as np

from boltforge.core.model.topology import IntArray
from boltforge.core.model.workload import Job
from boltforge.core.policy import Ordering, Policy
from boltforge.core.queueing.columns import QueueColumns

FairOrder = Callable[[list[Job]], list[Job]]
FairPositions = Callable[[QueueColumns], IntArray]  # ``fairshare.positions``, bound


def order_jobs(
    jobs: list[Job], policy: Policy, now: float, fair: FairOrder | None, arrived: bool = False
) -> list[Job]:
    """Sort ``jobs`` by ``policy``'s rule; a deterministic total order (ties end on job id).

    FIFO: arrival. PRIORITY: class, then arrival. LAS (Tiresias): the discrete queue of the
    job's attained GPU-seconds (fewest first), a job waiting past ``starvation_s`` promoted to
    the first queue, then arrival; it uses no runtime estimates. FAIR: ``fair`` (hierarchical
    fair share with DRF, from ``fairshare.order``), or PRIORITY when none is given.

    ``arrived``: ``jobs`` is already in arrival order (submit time, then id), so FIFO keeps it
    and the other rules sort it stably by what they rank before arrival alone; the order is
    the same as from any other order of ``jobs``.
    """
    if policy.order.by == Ordering.FIFO:
        return list(jobs) if arrived else sorted(jobs, key=_ARRIVAL)
    if policy.order.by == Ordering.LAS:
        if arrived:
            return sorted(jobs, key=lambda j: las_queue(j, policy, now))
        return sorted(jobs, key=lambda j: (las_queue(j, policy, now), j.submit_time, j.id))
    if policy.order.by == Ordering.FAIR and fair is not None:
        return fair(jobs)
    return sorted(jobs, key=_CLASS if arrived else _CLASS_ARRIVAL)


def order_positions(
    columns: QueueColumns, policy: Policy, now: float, fair: FairPositions | None
) -> IntArray:
    """``order_jobs`` for a queue in arrival order, read off its ``columns``: the position
    of each job in the order, first to last (``fair`` as there, on the columns)."""
    if policy.order.by == Ordering.FIFO:
        return np.arange(len(columns))
    if policy.order.by == Ordering.LAS:
        return np.argsort(las_queues(columns, policy, now), kind="stable")
    if policy.order.by == Ordering.FAIR and fair is not None:
        return fair(columns)
    return np.argsort(columns.priority, kind="stable")


_ARRIVAL = attrgetter("submit_time", "id")
_CLASS = attrgetter("gang.priority")  # ``Job.priority``
_CLASS_ARRIVAL = attrgetter("gang.priority", "submit_time", "id")  # ``Job.priority`` first


def las_queue(job: Job, policy: Policy, now: float, started: float | None = None) -> int:
    """Tiresias' discrete queue for ``job`` (0 is served first): how many of the policy's
    thresholds its attained GPU-seconds have passed. A running job (``started`` set) attains
    its GPUs times its time running; a waiting job past ``starvation_s`` is promoted to 0."""
    attained = job.attained_gpu_seconds
    if started is not None:
        attained += job.gpus * max(now - started, 0.0)
    elif now - job.submit_time >= policy.order.starvation_s:
        return 0
    return len([t for t in policy.order.las_thresholds if attained >= t])


def las_queues(columns: QueueColumns, policy: Policy, now: float) -> IntArray:
    """``las_queue`` of each waiting job whose ``columns`` these are."""
    thresholds = np.asarray(policy.order.las_thresholds, dtype=np.float64)
    queues: IntArray = (columns.attained[:, None] >= thresholds[None, :]).sum(axis=1)
    queues[now - columns.submit >= policy.order.starvation_s] = 0
    return queues

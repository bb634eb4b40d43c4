"""The job order of ``core.queueing.fairshare``, one job at a time: the definition the
vectorized ``order`` and ``positions`` are checked against (they compute every key at once
from a queue's columns)."""

from __future__ import annotations

import numpy as np

from boltforge.core.model.workload import Job
from boltforge.core.queueing.fairshare import URGENT_SLACK_S, Resources, dominant_shares

OrderKey = tuple[int, int, float, float, float, float, str]


def dominant_share(demand: Resources, capacity: Resources) -> float:
    """DRF: the largest share of any resource (GPUs, CPUs, memory GB) that ``demand`` takes."""
    return float(dominant_shares(np.array([demand], dtype=np.float64), capacity)[0])


def job_resources(job: Job) -> Resources:
    """What the whole gang asks for: GPUs, CPUs and memory (GB)."""
    gang = job.gang
    return (float(gang.total_gpus), gang.total_cpus, gang.total_memory_gb)


def slack(job: Job, now: float) -> float | None:
    """Seconds to spare before the deadline if the job started now; None without a deadline."""
    if job.deadline is None:
        return None
    return job.deadline - now - (job.expected_runtime() or 0.0)


def order_key(
    job: Job, factor: float, dominant: float, now: float, size_rank: float | None = None
) -> OrderKey:
    """Sort key: class, urgency (least slack first), factor desc, dominant share, submit, id;
    with ``size_rank`` (``shortest.rank``), that rank ascending in the factor's place."""
    spare = slack(job, now)
    urgent = spare is not None and spare < URGENT_SLACK_S
    return (
        job.priority,
        0 if urgent else 1,
        spare if urgent and spare is not None else 0.0,
        -factor if size_rank is None else size_rank,
        dominant,
        job.submit_time,
        job.id,
    )

"""Rough start estimates for waiting jobs that the when-and-where mode did not reach."""

from __future__ import annotations

import numpy as np

from boltforge.core.decisions import Waiting, WaitReason
from boltforge.core.model.state import FleetState
from boltforge.core.model.workload import Job
from boltforge.core.placement.modes import by_end

CAPACITY_BASIS = "capacity"


def fill_estimates(
    waiting: list[Waiting], jobs: dict[str, Job], state: FleetState, now: float
) -> list[Waiting]:
    """Give every waiting job without an estimate a capacity-only one, in queue order.

    A job whose queue position has ``ahead`` GPUs of waiting jobs before it is estimated to
    start when running jobs with known ends have freed ``ahead + its GPUs - free now`` GPUs
    (at least the next end, since something must change for it to start). This ignores
    topology and quota, so it is marked ``estimate_basis = "capacity"``; jobs that can never
    run, or that need more than known ends free, keep no estimate.
    """
    ending = [a for a in by_end(state) if a.expected_end is not None and a.expected_end > now]
    times = np.array([a.expected_end for a in ending], dtype=np.float64)
    freed = np.cumsum([a.gpus for a in ending], dtype=np.int64)
    free_now = int(state.free[~state.cordoned].sum())
    line = sorted(waiting, key=lambda w: w.position)
    gpus = np.fromiter(
        (jobs[w.job].gpus if w.job in jobs else 0 for w in line), np.int64, len(line)
    )
    ahead = np.cumsum(gpus) - gpus  # GPUs of the jobs before each, in queue order
    at = np.searchsorted(freed, np.maximum(ahead + gpus - free_now, 1)).tolist()
    out = []
    for w, i in zip(line, at, strict=True):
        if w.estimated_start is None and w.reason != WaitReason.NEVER and i < times.size:
            start = float(times[i])
            w = Waiting(w.job, w.position, w.reason, w.detail, start, CAPACITY_BASIS)
        out.append(w)
    return out

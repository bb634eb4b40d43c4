"""Rough start estimates for waiting jobs that the when-and-where mode did not reach."""

from __future__ import annotations

from dataclasses import replace

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
    ahead = 0
    out = []
    for w in sorted(waiting, key=lambda w: w.position):
        gpus = jobs[w.job].gpus if w.job in jobs else 0
        if w.estimated_start is None and w.reason != WaitReason.NEVER and times.size:
            need = max(ahead + gpus - free_now, 1)
            i = int(np.searchsorted(freed, need))
            if i < times.size:
                w = replace(w, estimated_start=float(times[i]), estimate_basis=CAPACITY_BASIS)
        ahead += gpus
        out.append(w)
    return out

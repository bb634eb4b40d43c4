"""Trace jobs as the scheduling core sees them: a gang per job, a time limit, a queue."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from boltforge.core.gang import Gang, Role
from boltforge.core.workload import BATCH, Job
from boltforge.sim.records import TraceJob

# Time limits users typically ask for, in hours; a job asks for the smallest that covers its
# runtime with LIMIT_MARGIN to spare (so limits overestimate, as real ones do).
LIMIT_HOURS = (1, 2, 4, 8, 12, 24, 48, 72, 168, 336, 720)
LIMIT_MARGIN = 1.2


def per_replica(gpus: int, host_gpus: int) -> int:
    """GPUs per replica: the whole job on one host when it fits, else the largest divisor of
    ``gpus`` that one host holds (so the gang asks for exactly ``gpus``)."""
    if gpus <= host_gpus:
        return gpus
    return max(d for d in range(1, host_gpus + 1) if gpus % d == 0)


def time_limit(duration_s: float) -> float:
    """The limit a user would ask for: the first of ``LIMIT_HOURS`` covering the runtime with
    margin, else the runtime with margin itself."""
    need = duration_s * LIMIT_MARGIN
    for hours in LIMIT_HOURS:
        if hours * 3600.0 >= need:
            return hours * 3600.0
    return need


def to_job(
    t: TraceJob, host_gpus: int, checkpoint_interval_s: float, restart_overhead_s: float
) -> Job:
    """The core ``Job`` for trace job ``t``: batch class, charged to its team's queue, spot
    capacity allowed, with ``t``'s deadline if it has one."""
    g = per_replica(t.gpus, host_gpus)
    gang = Gang(t.id, (Role("main", t.gpus // g, g),), team=t.team, priority=BATCH)
    return Job(
        t.id,
        gang,
        t.team,
        t.submit_s,
        time_limit=time_limit(t.duration_s),
        checkpoint_interval=checkpoint_interval_s,
        restart_overhead=restart_overhead_s,
        deadline=t.deadline_s,
    )


def with_deadlines(trace: list[TraceJob], slack: float, share: float, seed: int) -> list[TraceJob]:
    """``trace`` with a deadline of ``submit + slack * duration`` on a seeded ``share`` of its
    jobs (each job drawn independently with probability ``share``); the others keep theirs.
    The same trace, share and seed pick the same jobs, whatever ``slack`` is."""
    if not 0.0 <= share <= 1.0:
        raise ValueError(f"deadline share {share} is not between 0 and 1")
    if slack <= 0:
        raise ValueError(f"deadline slack {slack} must be positive")
    draws = np.random.default_rng([seed, 104729]).random(len(trace))
    return [
        replace(t, deadline_s=t.submit_s + slack * t.duration_s) if u < share else t
        for t, u in zip(trace, draws, strict=True)
    ]

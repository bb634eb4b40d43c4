"""Trace jobs as the scheduling core sees them: a gang per job, a time limit, a queue."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from boltforge.core.model.gang import Gang, Role
from boltforge.core.model.workload import Job
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
    """The core ``Job`` for trace job ``t``: one role of ``per_replica`` GPUs per replica, of
    ``t``'s class, charged to its team's queue, spot capacity allowed, with ``t``'s deadline
    and elastic range if it has them (see ``elastic_range``)."""
    g = per_replica(t.gpus, host_gpus)
    replicas = t.gpus // g
    gang = Gang(t.id, (Role("main", replicas, g),), team=t.team, priority=t.priority)
    return Job(
        t.id,
        gang,
        t.team,
        t.submit_s,
        time_limit=time_limit(t.duration_s),
        checkpoint_interval=checkpoint_interval_s,
        restart_overhead=restart_overhead_s,
        deadline=t.deadline_s,
        elastic=elastic_range(t.elastic, replicas),
    )


def elastic_range(declared: tuple[int, int] | None, replicas: int) -> tuple[int, int] | None:
    """The replica range the core gets for a job of ``replicas`` declared ``declared``: at
    least one replica, and always including the requested size (a range declared for another
    host size is widened to it). None when the job is rigid or the range is just its size."""
    if declared is None:
        return None
    low = max(1, min(declared[0], replicas))
    high = max(declared[1], replicas)
    return None if low == high else (low, high)


def with_elastic(
    trace: list[TraceJob],
    share: float,
    seed: int,
    host_gpus: int,
    fleet_gpus: int | None = None,
) -> list[TraceJob]:
    """``trace`` with a seeded ``share`` of its multi-replica jobs made elastic.

    A job is multi-replica when it needs more than one host of ``host_gpus`` GPUs (it is split
    into ``R`` replicas of ``per_replica`` GPUs). The chosen ones get the range half to twice
    their size: ``(ceil(R / 2), 2 R)`` replicas, the top clipped to what ``fleet_gpus`` holds
    (never below ``R``). Exactly ``share x multi-replica jobs`` (rounded half up) are chosen,
    the first of one seeded shuffle, so the same trace and seed always pick the same jobs and
    a larger share picks a superset; other jobs keep their ``elastic`` as it was. Raises
    ``ValueError`` when ``share`` is not between 0 and 1 or ``host_gpus`` is not positive.
    """
    if not 0.0 <= share <= 1.0:
        raise ValueError(f"elastic share {share} is not between 0 and 1")
    if host_gpus <= 0:
        raise ValueError(f"host size {host_gpus} must be a positive number of GPUs")
    multi = [i for i, t in enumerate(trace) if t.gpus > host_gpus]
    order = np.random.default_rng([seed, 7919]).permutation(len(multi))
    chosen = {multi[k] for k in order[: math.floor(share * len(multi) + 0.5)]}
    out = list(trace)
    for i in sorted(chosen):
        out[i] = replace(trace[i], elastic=_half_to_double(trace[i].gpus, host_gpus, fleet_gpus))
    return out


def _half_to_double(gpus: int, host_gpus: int, fleet_gpus: int | None) -> tuple[int, int]:
    """``(ceil(R / 2), 2 R)`` replicas for a job of ``gpus``, the top clipped to the fleet."""
    g = per_replica(gpus, host_gpus)
    replicas = gpus // g
    high = 2 * replicas
    if fleet_gpus is not None:
        high = max(replicas, min(high, fleet_gpus // g))
    return (replicas + 1) // 2, high


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

"""What one simulation achieved: completion times, utilization, fairness and cost.

``compute`` turns a ``SimResult`` into a ``Metrics``; ``to_json`` makes it plain JSON.

Definitions (all times in simulated seconds):

* **Window.** ``start`` is the first submit. ``end`` is the last finish when every job finished;
  otherwise (unfinished jobs) the later of the last sample time and the last finish. With no jobs
  the window is the samples' range. ``makespan_s = end - start``.
* **Samples as steps.** Each sample's values hold from its ``t`` until the next sample's ``t``;
  the last holds until ``end``. Before the first sample nothing is allocated.
* **Empty sets.** A statistic over an empty set (no finished jobs, no started jobs, no
  allocation) is ``None``, never NaN. Ratios over a zero-length window or an empty fleet
  (utilization, fragmentation) are ``0.0``.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields

import numpy as np
import numpy.typing as npt

from boltforge.sim.records import JobRecord, Sample, SimResult

BOUND_S = 10.0
"""Floor on a job's runtime in bounded slowdown and isolated time, so tiny jobs don't dominate."""

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class TeamMetrics:
    """One team's outcome.

    ``share_received``: the team's allocated GPU-seconds over all teams' allocated GPU-seconds.
    ``entitlement``: the team's max-min fair (water-filled) share of those GPU-seconds, capped by
    its demand (sum of ``gpus * duration_s`` of its jobs), as a fraction of the total; the
    entitlements sum to less than 1 when every team's demand fits in the total.
    ``mean_ftf``: mean finish-time fairness rho over the team's finished jobs (see ``Metrics``).
    """

    jobs: int
    finished: int
    avg_jct_s: float | None
    share_received: float
    entitlement: float
    gpu_hours: float
    dollars: float
    mean_ftf: float | None


@dataclass(frozen=True)
class Metrics:
    """One policy's results over one trace.

    * ``jct`` (job completion time) = ``finish_s - submit_s``, over finished jobs; ``avg``,
      ``median`` and ``p99`` use ``np.percentile`` with linear interpolation.
    * ``queue`` (queueing delay) = first ``start_s - submit_s``, over started jobs.
    * ``avg_bounded_slowdown`` = mean over finished jobs of
      ``max(1, jct / max(duration_s, BOUND_S))``.
    * ``util_allocated`` = time integral of the samples' ``allocated_gpus`` over the window /
      (``total_gpus * makespan_s``).
    * ``util_productive`` = sum of the jobs' ``productive_gpu_s`` / (``total_gpus * makespan_s``):
      taken from the job records, which count productive work exactly, rather than from the
      samples. ``util_productive_samples`` is the same integral over the samples'
      ``productive_gpus``, kept as a cross-check: they agree when no job is interrupted; the
      samples count a run at its productive rate from its start, so restart warm-up and work
      later lost to a preemption or failure make them read higher.
    * ``util_productive_contended``: the samples' ``productive_gpus`` integrated over the time
      at least one job waits (``queued > 0``), over ``total_gpus`` times that time: how much of
      the fleet does useful work when there is work to do. ``util_productive`` cannot tell
      policies apart once every job finishes, since the productive work is then the trace's
      work and only the makespan differs; this can. ``0.0`` if no job ever waits.
    * ``preemptions``, ``failures``: sums over jobs; ``gpu_hours_lost`` = sum ``lost_gpu_s`` / 3600.
    * ``elastic_starts``, ``grows``, ``shrinks``: sums over jobs of the runs started below the
      requested size and of the in-place resizes of running elastic jobs (a shrink is not a
      preemption: the job keeps running).
    * ``gpu_hours_slowed`` = sum of ``allocated_gpu_s - productive_gpu_s - lost_gpu_s`` / 3600:
      GPU time held beyond the work done because placements ran slower than ideal.
    * ``dollars`` = sum of ``dollars_by_pool``.
    * ``reclaims``: spot hosts taken back; ``jobs_reclaimed``: runs those reclaims stopped (sum
      of the jobs' ``reclaims``); ``gpu_hours_lost_reclaim`` = sum ``reclaim_lost_gpu_s`` / 3600
      (work since the last checkpoint, also inside ``gpu_hours_lost``).
    * ``deadline_jobs``: jobs with a deadline; ``deadlines_met``: those that finished at or
      before it; ``deadline_hit_rate`` = met / with a deadline (``None`` when none has one). A
      job still unfinished when the simulation stops has missed its deadline.
    * ``avg_fragmentation``: time-weighted mean of the samples' fragmentation from the first
      sample (or ``start``, if later) to ``end``; the last sample's value if that span is empty.
    * ``jain_fairness``: Jain's index ``(sum x)^2 / (n * sum x^2)`` over teams with a positive
      entitlement, where ``x = share_received / entitlement`` (see ``TeamMetrics``). 1.0 means
      every team got the same multiple of its fair share; ``None`` when nothing was allocated.
    * ``worst_ftf`` (Themis-style finish-time fairness): per finished job
      ``rho = jct / t_iso`` with ``t_iso = max(duration_s, BOUND_S) * max(1, gpus / fair_gpus)``
      and ``fair_gpus = total_gpus / teams in the trace`` (the job's runtime on its team's equal
      slice of the fleet). Per team, the mean rho over its finished jobs; ``worst_ftf`` is the
      largest team mean (``None`` without finished jobs). Lower is fairer.
    """

    jobs: int
    finished: int
    started: int
    avg_jct_s: float | None
    median_jct_s: float | None
    p99_jct_s: float | None
    avg_queue_s: float | None
    median_queue_s: float | None
    p99_queue_s: float | None
    avg_bounded_slowdown: float | None
    util_allocated: float
    util_productive: float
    util_productive_samples: float
    util_productive_contended: float
    makespan_s: float
    preemptions: int
    failures: int
    elastic_starts: int
    grows: int
    shrinks: int
    gpu_hours_lost: float
    gpu_hours_slowed: float
    dollars: float
    dollars_by_pool: dict[str, float]
    reclaims: int
    jobs_reclaimed: int
    gpu_hours_lost_reclaim: float
    deadline_jobs: int
    deadlines_met: int
    deadline_hit_rate: float | None
    avg_fragmentation: float
    jain_fairness: float | None
    worst_ftf: float | None
    teams: dict[str, TeamMetrics]
    events: int
    cycles: int
    wall_s: float


def compute(result: SimResult) -> Metrics:
    """Metrics of one simulation result; never raises on empty or unfinished traces."""
    jobs = result.jobs
    done = [j for j in jobs if j.finish_s is not None]
    jct = [_jct(j) for j in done]
    queue = [j.start_s - j.submit_s for j in jobs if j.start_s is not None]
    start, end = window(result)
    span = end - start
    samples = sorted(result.samples, key=lambda s: s.t)
    capacity = result.total_gpus * span
    teams = _teams(jobs, result.total_gpus)
    due = [j for j in jobs if j.deadline_s is not None]
    met = sum(1 for j in due if met_deadline(j))
    return Metrics(
        jobs=len(jobs),
        finished=len(done),
        started=len(queue),
        avg_jct_s=_mean(jct),
        median_jct_s=_percentile(jct, 50),
        p99_jct_s=_percentile(jct, 99),
        avg_queue_s=_mean(queue),
        median_queue_s=_percentile(queue, 50),
        p99_queue_s=_percentile(queue, 99),
        avg_bounded_slowdown=_mean([bounded_slowdown(j) for j in done]),
        util_allocated=_ratio(_integral(samples, "allocated_gpus", start, end), capacity),
        util_productive=_ratio(sum(j.productive_gpu_s for j in jobs), capacity),
        util_productive_samples=_ratio(_integral(samples, "productive_gpus", start, end), capacity),
        util_productive_contended=_contended(samples, result.total_gpus, start, end),
        makespan_s=span,
        preemptions=sum(j.preemptions for j in jobs),
        failures=sum(j.failures for j in jobs),
        elastic_starts=sum(j.elastic_starts for j in jobs),
        grows=sum(j.grows for j in jobs),
        shrinks=sum(j.shrinks for j in jobs),
        gpu_hours_lost=sum(j.lost_gpu_s for j in jobs) / 3600.0,
        gpu_hours_slowed=sum(_slowed(j) for j in jobs) / 3600.0,
        dollars=sum(result.dollars_by_pool.values()),
        dollars_by_pool=dict(sorted(result.dollars_by_pool.items())),
        reclaims=result.reclaims,
        jobs_reclaimed=sum(j.reclaims for j in jobs),
        gpu_hours_lost_reclaim=sum(j.reclaim_lost_gpu_s for j in jobs) / 3600.0,
        deadline_jobs=len(due),
        deadlines_met=met,
        deadline_hit_rate=met / len(due) if due else None,
        avg_fragmentation=_avg_fragmentation(samples, start, end),
        jain_fairness=_jain(teams.values()),
        worst_ftf=max((t.mean_ftf for t in teams.values() if t.mean_ftf is not None), default=None),
        teams=teams,
        events=result.events,
        cycles=result.cycles,
        wall_s=result.wall_s,
    )


def window(result: SimResult) -> tuple[float, float]:
    """The ``(start, end)`` the time-weighted metrics cover (see the module docstring)."""
    jobs, ts = result.jobs, [s.t for s in result.samples]
    finishes = [j.finish_s for j in jobs if j.finish_s is not None]
    start = min(j.submit_s for j in jobs) if jobs else min(ts, default=0.0)
    if jobs and len(finishes) == len(jobs):
        end = max(finishes)
    else:
        end = max([*ts, *finishes], default=start)
    return start, max(start, end)


def met_deadline(job: JobRecord) -> bool:
    """Whether ``job`` has a deadline and finished at or before it."""
    if job.deadline_s is None or job.finish_s is None:
        return False
    return job.finish_s <= job.deadline_s


def bounded_slowdown(job: JobRecord) -> float:
    """``max(1, jct / max(duration, BOUND_S))`` of a finished job."""
    return max(1.0, _jct(job) / max(job.duration_s, BOUND_S))


def water_fill(demands: Mapping[str, float], capacity: float) -> dict[str, float]:
    """Max-min fair split of ``capacity`` over ``demands``: nobody gets more than it asks for,
    and what the small asks leave is split equally among the rest. Sums to
    ``min(capacity, sum(demands))``."""
    out: dict[str, float] = {}
    left = max(capacity, 0.0)
    ordered = sorted(demands.items(), key=lambda kv: kv[1])
    for i, (name, demand) in enumerate(ordered):
        out[name] = min(max(demand, 0.0), left / (len(ordered) - i))
        left -= out[name]
    return out


def jain(xs: Sequence[float]) -> float | None:
    """Jain's fairness index ``(sum x)^2 / (n * sum x^2)`` in ``[1/n, 1]``; ``None`` if empty
    or all zero."""
    top = max((abs(x) for x in xs), default=0.0)
    if top <= 0.0:
        return None
    scaled = [x / top for x in xs]  # the index is scale-free; scaling keeps tiny values' squares
    return sum(scaled) ** 2 / (len(scaled) * sum(x * x for x in scaled))


def to_json(m: Metrics) -> dict[str, object]:
    """``m`` as plain JSON values: floats rounded (seconds and dollars to 2 decimals, ratios
    to 4), ``None`` kept as ``null``, teams as nested objects."""
    out: dict[str, object] = {}
    for f in fields(m):
        value = getattr(m, f.name)
        if f.name == "teams":
            out[f.name] = {team: _team_json(t) for team, t in value.items()}
        elif f.name == "dollars_by_pool":
            out[f.name] = {pool: _round(f.name, d) for pool, d in value.items()}
        else:
            out[f.name] = _round(f.name, value)
    return out


def _team_json(t: TeamMetrics) -> dict[str, object]:
    return {f.name: _round(f.name, getattr(t, f.name)) for f in fields(t)}


def _round(name: str, value: object) -> object:
    """Floats rounded by kind; non-finite floats become ``None``; other values unchanged."""
    if not isinstance(value, float):
        return value
    if not math.isfinite(value):
        return None
    digits = 2 if name.endswith("_s") or "dollars" in name else 4
    return round(value, digits)


def _jct(job: JobRecord) -> float:
    assert job.finish_s is not None
    return job.finish_s - job.submit_s


def _mean(xs: Sequence[float]) -> float | None:
    return float(np.mean(xs)) if xs else None


def _percentile(xs: Sequence[float], q: float) -> float | None:
    return float(np.percentile(np.asarray(xs, dtype=np.float64), q)) if xs else None


def _ratio(num: float, den: float) -> float:
    return num / den if den > 0 else 0.0


def _step_durations(ts: FloatArray, lo: float, hi: float) -> FloatArray:
    """How long each sample's value holds inside ``[lo, hi]`` (the last one holds until ``hi``)."""
    ends: FloatArray = np.append(ts[1:], max(hi, float(ts[-1])))
    held: FloatArray = np.clip(ends, lo, hi) - np.clip(ts, lo, hi)
    return np.maximum(held, 0.0)


def _integral(samples: Sequence[Sample], attr: str, lo: float, hi: float) -> float:
    """Integral over ``[lo, hi]`` of one sample attribute read as a step function."""
    if not samples or hi <= lo:
        return 0.0
    ts = np.array([s.t for s in samples], dtype=np.float64)
    vs = np.array([getattr(s, attr) for s in samples], dtype=np.float64)
    return float(np.dot(vs, _step_durations(ts, lo, hi)))


def _contended(samples: Sequence[Sample], total_gpus: int, lo: float, hi: float) -> float:
    """Mean productive fraction of the fleet over the time inside ``[lo, hi]`` that a job waits."""
    if not samples or hi <= lo:
        return 0.0
    ts = np.array([s.t for s in samples], dtype=np.float64)
    waiting = np.array([s.queued > 0 for s in samples], dtype=np.float64)
    useful = np.array([s.productive_gpus for s in samples], dtype=np.float64)
    held = _step_durations(ts, lo, hi) * waiting
    return _ratio(float(np.dot(useful, held)), total_gpus * float(held.sum()))


def _slowed(job: JobRecord) -> float:
    """GPU-seconds ``job`` held beyond its useful and its lost work: slow placements' cost."""
    return max(job.allocated_gpu_s - job.productive_gpu_s - job.lost_gpu_s, 0.0)


def _avg_fragmentation(samples: Sequence[Sample], start: float, end: float) -> float:
    """Time-weighted mean fragmentation from the first sample (or ``start``) to ``end``."""
    if not samples:
        return 0.0
    lo = max(start, samples[0].t)
    covered = end - lo
    if covered <= 0:
        return samples[-1].fragmentation
    return _integral(samples, "fragmentation", lo, end) / covered


def _teams(jobs: Sequence[JobRecord], total_gpus: int) -> dict[str, TeamMetrics]:
    """Per-team outcome, teams sorted by name (see ``TeamMetrics``)."""
    by_team: dict[str, list[JobRecord]] = defaultdict(list)
    for j in jobs:
        by_team[j.team].append(j)
    received = {t: sum(j.allocated_gpu_s for j in js) for t, js in by_team.items()}
    total = sum(received.values())
    demand = {t: sum(j.gpus * j.duration_s for j in js) for t, js in by_team.items()}
    fair = water_fill(demand, total)
    fair_gpus = total_gpus / len(by_team) if by_team else 0.0
    return {
        team: TeamMetrics(
            jobs=len(js),
            finished=sum(1 for j in js if j.finish_s is not None),
            avg_jct_s=_mean([_jct(j) for j in js if j.finish_s is not None]),
            share_received=_ratio(received[team], total),
            entitlement=_ratio(fair[team], total),
            gpu_hours=received[team] / 3600.0,
            dollars=sum(j.dollars for j in js),
            mean_ftf=_mean([_ftf(j, fair_gpus) for j in js if j.finish_s is not None]),
        )
        for team, js in sorted(by_team.items())
    }


def _ftf(job: JobRecord, fair_gpus: float) -> float:
    """Finish-time fairness rho of a finished job: jct over its time on an equal fleet slice."""
    slices = job.gpus / fair_gpus if fair_gpus > 0 else 1.0
    return _jct(job) / (max(job.duration_s, BOUND_S) * max(1.0, slices))


def _jain(teams: Iterable[TeamMetrics]) -> float | None:
    """Jain's index of received share over entitlement, teams with an entitlement only."""
    return jain([t.share_received / t.entitlement for t in teams if t.entitlement > 0])

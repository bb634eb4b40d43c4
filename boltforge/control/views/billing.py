"""Cost accounting over the store: every job's meter from its runs (``boltforge.core.billing.meter``
holds the rules), grouped by team, project or job, and shown as the caller may see it."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from sqlalchemy import select
from sqlalchemy.orm import Session

from boltforge.control.auth import Caller
from boltforge.control.store.models import JobRow, RunRow
from boltforge.core.billing.meter import Meter, Stretch, interrupted, last_checkpoint, meter_job
from boltforge.wire.cost import CostBy, CostRow

CHUNK = 500


@dataclass(frozen=True, slots=True)
class JobMeter:
    """One job's meter over a window, with what it is attributed to."""

    job: str
    name: str
    team: str
    project: str | None
    meter: Meter


def runs_in(s: Session, since: float, now: float, team: str | None = None) -> list[RunRow]:
    """Runs that held GPUs at some point of ``[since, now]`` (open ones included)."""
    q = select(RunRow).where(
        RunRow.started_at < now, RunRow.ended_at.is_(None) | (RunRow.ended_at > since)
    )
    if team is not None:
        q = q.where(RunRow.team == team)
    return list(s.scalars(q.order_by(RunRow.id)))


class JobFacts(Protocol):
    """What the meter needs of a job: a ``JobRow`` or a row of its columns."""

    epoch: int
    state: str
    finished_at: float | None
    last_checkpoint_at: float | None


def stretch(run: RunRow, job: JobFacts) -> Stretch:
    """``run`` as the meter sees it, given its job's current epoch, state, finish and
    latest checkpoint."""
    ckpt = last_checkpoint(run.checkpoint_at, job.last_checkpoint_at, run.started_at, run.ended_at)
    lost = interrupted(run.epoch, run.ended_at, job.epoch, job.state, job.finished_at)
    return Stretch(
        run.held_gpus,
        run.dollars_per_hour,
        run.started_at,
        run.ended_at,
        ckpt,
        lost,
        run.cpus or 0.0,
    )


def job_meters(s: Session, since: float, now: float) -> list[JobMeter]:
    """The meter over ``[since, now]`` of every job that held GPUs in it, in job order."""
    runs: dict[str, list[RunRow]] = defaultdict(list)
    for run in runs_in(s, since, now):
        runs[run.job_id].append(run)
    out = []
    for job in _jobs(s, list(runs)):
        meter = meter_job((stretch(r, job) for r in runs[job.id]), since, now)
        out.append(JobMeter(job.id, job.name, job.team, job.project, meter))
    return out


def job_meter(s: Session, job: JobRow, now: float) -> Meter:
    """One job's meter over its whole life, up to ``now``."""
    q = select(RunRow).where(RunRow.job_id == job.id, RunRow.started_at < now)
    return meter_job((stretch(r, job) for r in s.scalars(q)), float("-inf"), now)


def _jobs(s: Session, ids: Sequence[str]) -> list[Any]:
    cols = (
        JobRow.id,
        JobRow.num,
        JobRow.name,
        JobRow.team,
        JobRow.project,
        JobRow.epoch,
        JobRow.state,
        JobRow.finished_at,
        JobRow.last_checkpoint_at,
    )
    rows: list[Any] = []
    for i in range(0, len(ids), CHUNK):
        rows += s.execute(select(*cols).where(JobRow.id.in_(ids[i : i + CHUNK]))).all()
    return sorted(rows, key=lambda r: (r.num, r.id))


def group(meters: Iterable[JobMeter], by: CostBy) -> list[CostRow]:
    """One row per team, ``team/project`` (``team/-`` for jobs without a project) or job,
    sorted by dollars, highest first (then by key)."""
    rows: dict[str, CostRow] = {}
    totals: dict[str, Meter] = defaultdict(Meter)
    for m in meters:
        key = _key(m, by)
        if key not in rows:
            rows[key] = CostRow(
                key=key,
                team=m.team,
                project=m.project if by in ("project", "job") else None,
                job=m.job if by == "job" else None,
                name=m.name if by == "job" else None,
            )
        rows[key].jobs += 1
        totals[key] += m.meter
    out = [_filled(rows[k], totals[k]) for k in rows]
    return sorted(out, key=lambda r: (-r.dollars, r.key))


def total(rows: Iterable[CostRow]) -> CostRow:
    """The sum of ``rows`` (key ``total``)."""
    out = CostRow(key="total", team="")
    for r in rows:
        out.jobs += r.jobs
        out.gpu_hours += r.gpu_hours
        out.dollars += r.dollars
        out.productive_gpu_hours += r.productive_gpu_hours
        out.vcpu_hours += r.vcpu_hours
        out.productive_vcpu_hours += r.productive_vcpu_hours
        out.productive_dollars += r.productive_dollars
    return out


def visible(meters: list[JobMeter], who: Caller, by: CostBy) -> tuple[list[CostRow], list[CostRow]]:
    """The rows ``who`` sees in detail and the other teams' totals. Everyone sees every team's
    total; a member sees projects and jobs of their own team only."""
    if by == "team":
        return group(meters, "team"), []
    mine = [m for m in meters if who.sees_team(m.team)]
    theirs = [m for m in meters if not who.sees_team(m.team)]
    return group(mine, by), group(theirs, "team")


def _key(m: JobMeter, by: CostBy) -> str:
    if by == "team":
        return m.team
    if by == "project":
        return f"{m.team}/{m.project or '-'}"
    return m.job


def _filled(row: CostRow, m: Meter) -> CostRow:
    row.gpu_hours = m.gpu_hours
    row.dollars = m.dollars
    row.productive_gpu_hours = m.productive_gpu_hours
    row.productive_dollars = m.productive_dollars
    row.vcpu_hours = m.vcpu_hours
    row.productive_vcpu_hours = m.productive_vcpu_hours
    return row

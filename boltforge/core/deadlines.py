"""Whether a job's deadline looks reachable, judged at submit by the when-and-where mode."""

from __future__ import annotations

from dataclasses import dataclass

from boltforge.core.modes import when_and_where
from boltforge.core.placement import Outcome
from boltforge.core.state import FleetState
from boltforge.core.workload import Job


@dataclass(frozen=True, slots=True)
class Outlook:
    """``reachable`` is None when the job has no deadline or no runtime estimate."""

    reachable: bool | None
    start: float | None
    finish: float | None
    message: str


def deadline_outlook(state: FleetState, job: Job, now: float) -> Outlook:
    """Expected start and finish of ``job`` if nothing else arrives, against its deadline."""
    decision = when_and_where(state, job.gang, now)
    runtime = job.expected_runtime()
    if decision.outcome == Outcome.NEVER:
        return Outlook(False, None, None, "the job can never run on this fleet")
    start = decision.start_time
    if start is None:
        return Outlook(None, None, None, "no start can be promised: running jobs have no ends")
    if runtime is None:
        return Outlook(None, start, None, f"starts at t={start:.0f}; no runtime to judge by")
    finish = start + runtime
    if job.deadline is None:
        return Outlook(None, start, finish, f"starts at t={start:.0f}, ends at t={finish:.0f}")
    slack = job.deadline - finish
    verdict = "reachable" if slack >= 0 else "not reachable"
    return Outlook(
        slack >= 0,
        start,
        finish,
        f"deadline {verdict}: starts at t={start:.0f}, ends at t={finish:.0f}, "
        f"{abs(slack) / 60:.0f} min {'to spare' if slack >= 0 else 'late'}",
    )

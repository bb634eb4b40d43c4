"""Whether a job's deadline looks reachable: its expected start (a waiting job's by the
when-and-where mode, a running job's bind time) plus its expected runtime, against
``Job.deadline``.

Times are seconds on the caller's clock (the server's is epoch seconds). The numbers are for
callers to render; ``Outlook.message`` gives the same verdict in words, with every time as a
duration from ``now``, so it reads right on any clock.
"""

from __future__ import annotations

from dataclasses import dataclass

from boltforge.core.model.state import FleetState
from boltforge.core.model.workload import Job, Running
from boltforge.core.placement.modes import when_and_where
from boltforge.core.placement.place import Outcome
from boltforge.core.preempt.text import span

NEVER_RUNS = "the job can never run on this fleet"
NO_START = "no start can be promised (the jobs in its way have no expected end)"
NO_RUNTIME = (
    "no runtime to judge by (the job has no time_limit, and none is learned yet from jobs like it)"
)


@dataclass(frozen=True, slots=True)
class Outlook:
    """A job's deadline as seen from ``at``.

    ``start`` and ``finish`` are the expected start and finish (None when unknown; ``gap``
    then says why, and is empty otherwise). ``slack`` is the deadline minus the finish in
    seconds: positive to spare, negative late (None without a deadline or a finish).
    ``reachable`` is whether the finish meets the deadline: None when the job has no
    deadline or it cannot be judged, False also when the job can never run on the fleet.
    """

    at: float
    deadline: float | None
    reachable: bool | None
    start: float | None
    finish: float | None
    slack: float | None
    gap: str
    message: str


def deadline_outlook(
    state: FleetState, job: Job, now: float, not_before: float | None = None
) -> Outlook:
    """The outlook of waiting ``job`` if nothing else arrives: the when-and-where start on
    ``state`` (never earlier than ``not_before``, a start known otherwise, such as an
    estimate that counts the jobs ahead in line) plus its expected runtime. ``state`` is not
    changed."""
    decision = when_and_where(state, job.gang, now)
    if decision.outcome == Outcome.NEVER:
        return _unjudged(job, now, None, NEVER_RUNS, never=True)
    start = decision.start_time
    if start is None:
        return _unjudged(job, now, None, NO_START)
    if not_before is not None:
        start = max(start, not_before)
    return judge(job, start, now)


def running_outlook(run: Running, now: float) -> Outlook:
    """The outlook of a job holding its GPUs since ``run.start_time``: that start plus its
    expected runtime."""
    return judge(run.job, run.start_time, now)


def judge(job: Job, start: float, now: float) -> Outlook:
    """The outlook of ``job`` if it starts at ``start``: it finishes ``expected_runtime()``
    later (unknown without one), and meets its deadline if that finish is not after it."""
    runtime = job.expected_runtime()
    if runtime is None:
        return _unjudged(job, now, start, NO_RUNTIME)
    finish = start + runtime
    timing = f"expected start {_from(start, now)}, finish {_from(finish, now)}"
    if job.deadline is None:
        return Outlook(now, None, None, start, finish, None, "", timing)
    slack = job.deadline - finish
    verdict = "reachable" if slack >= 0 else "not reachable"
    spare = f"{span(abs(slack))} {'to spare' if slack >= 0 else 'late'}"
    message = f"deadline {verdict}: {timing}; due {_from(job.deadline, now)}, {spare}"
    return Outlook(now, job.deadline, slack >= 0, start, finish, slack, "", message)


def _unjudged(job: Job, now: float, start: float | None, gap: str, never: bool = False) -> Outlook:
    """An outlook without a finish: ``gap`` says what is missing."""
    reachable = False if never and job.deadline is not None else None
    parts = [] if start is None else [f"expected start {_from(start, now)}"]
    if job.deadline is not None:
        parts.append(f"due {_from(job.deadline, now)}")
    verdict = "deadline not reachable" if reachable is False else "deadline unknown"
    head = verdict if job.deadline is not None else "outlook unknown"
    message = f"{head}: {gap}" + "".join(f"; {p}" for p in parts)
    return Outlook(now, job.deadline, reachable, start, None, None, gap, message)


def _from(at: float, now: float) -> str:
    """``at`` as a duration from ``now``: ``now``, ``in 2.0 h`` or ``30 min ago``."""
    left = at - now
    if abs(left) < 1:
        return "now"
    return f"in {span(left)}" if left > 0 else f"{span(-left)} ago"

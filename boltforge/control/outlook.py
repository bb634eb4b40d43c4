"""A job's deadline outlook for ``GET /v1/jobs/{id}`` (``bolt status``, ``bolt explain``),
judged on read from the world the server holds for replies: never in a scheduling pass."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from boltforge.control.scheduling.lifecycle import HOLDING, WAITING
from boltforge.control.scheduling.world import World
from boltforge.core.queueing.deadlines import Outlook, deadline_outlook, running_outlook
from boltforge.wire.jobs import DeadlineOutlook, JobDetail, Verdict


def has_outlook(state: str, spec: Mapping[str, Any], learned: bool = False) -> bool:
    """Whether a job in ``state`` with ``spec`` gets an outlook: it waits or holds GPUs, and
    its spec sets a ``deadline`` or a ``time_limit``, or a runtime was ``learned`` for it
    from jobs like it (without any of them there is nothing to judge and no finish to
    give)."""
    live = state in WAITING or state in HOLDING
    told = spec.get("deadline") is not None or spec.get("time_limit") is not None
    return live and (told or learned)


def with_outlook(
    job: JobDetail,
    world_at: Callable[[float], World],
    now: float,
    learned: Callable[[str, str, int], float | None] | None = None,
) -> JobDetail:
    """``job`` with its outlook filled in, reading the world (``world_at(now)``) only when
    the job gets one; ``learned`` (``Mirror.estimate``) says whether a runtime is learned
    for a job without a time limit."""
    knows = learned is not None and learned(job.team, job.name, job.gpus) is not None
    if not has_outlook(job.state, job.spec, knows):
        return job
    found = job_outlook(world_at(now), job.id, job.estimated_start)
    return job.model_copy(update={"outlook": found})


def job_outlook(world: World, job_id: str, not_before: float | None) -> DeadlineOutlook | None:
    """The outlook of ``job_id`` in ``world`` at ``world.now``: waiting, from the earliest
    start the fleet allows (never before ``not_before``); holding GPUs, from its bind time.
    None when the world does not hold it as either (a spec the fleet cannot resolve, or a
    job between states)."""
    for job in world.pending:
        if job.id == job_id:
            return wire(deadline_outlook(world.state, job, world.now, not_before))
    for run in world.running:
        if run.job.id == job_id:
            return wire(running_outlook(run, world.now))
    return None


def wire(outlook: Outlook) -> DeadlineOutlook:
    """The core's outlook as the API gives it."""
    return DeadlineOutlook(
        at=outlook.at,
        verdict=verdict(outlook),
        deadline=outlook.deadline,
        expected_start=outlook.start,
        expected_finish=outlook.finish,
        slack_s=outlook.slack,
        note=outlook.gap,
    )


def verdict(outlook: Outlook) -> Verdict | None:
    """``reachable``, ``not reachable`` or ``unknown``; None without a deadline."""
    if outlook.deadline is None:
        return None
    if outlook.reachable is None:
        return "unknown"
    return "reachable" if outlook.reachable else "not reachable"

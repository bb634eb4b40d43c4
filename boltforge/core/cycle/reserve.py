"""Reservation and backfill: a start promised to the first blocked jobs, and the hosts
later jobs must then keep off.

Contract. A full pass reserves a start for as many blocked jobs as the policy's backfill part
says (``Backfill.depth``; ``reservation_left``). ``blocked_hosts`` reads the pass's
``reservations`` and returns the hosts a job must avoid: those reserved for a start before the
job would finish (a job's own reservation never fences it off); that is backfill. ``reserve``
and ``_promise`` append a ``Reserve`` and the job's ``Waiting`` (reason RESERVED).
``waits_for_tight`` leaves a job waiting for a tight placement that finishes sooner than the
wide one it could take now (the placement part's patience), reserving it in a full pass. None
of them allocates on ``work``.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable
from operator import attrgetter

from boltforge.core.cycle.state import PassState
from boltforge.core.decisions import Reserve, Waiting, WaitReason
from boltforge.core.model.gang import Gang
from boltforge.core.model.workload import Job
from boltforge.core.placement.answers import Placement
from boltforge.core.placement.modes import when_and_where
from boltforge.core.placement.patience import tighter, worth_waiting
from boltforge.core.placement.place import Decision, Outcome
from boltforge.core.preempt.text import span


def reservation_left(p: PassState) -> bool:
    """Whether the policy's backfill part leaves a reservation to give in this pass."""
    return len(p.reservations) < p.policy.backfill.depth


def blocked_hosts(p: PassState, job: Job) -> frozenset[int]:
    """Hosts ``job`` must avoid: those reserved for a start before ``job`` would finish."""
    runtime = job.expected_runtime()
    end = None if runtime is None else p.now + runtime
    fences = _fences(p)
    if job.id in fences.holders:  # its own reservation does not fence it off
        return Fences(p.reservations, job.id).before(end)
    return fences.before(end)


def _fences(p: PassState) -> Fences:
    """The pass's reservations as ``Fences``, made again only when one was added (a pass
    only ever appends reservations)."""
    if p.fences is None or p.fences.count != len(p.reservations):
        p.fences = Fences(p.reservations)
    return p.fences


class Fences:
    """The hosts reserved in ``reservations`` (but those of ``owner``), by start: each union
    of those that start before some time is made once, and the same frozenset (its hash
    known) handed out again."""

    def __init__(self, reservations: list[Reserve], owner: str | None = None) -> None:
        mine = sorted((r for r in reservations if r.job != owner), key=_START)
        self.count = len(reservations)
        self.holders = frozenset(r.job for r in reservations)
        self.starts = [r.start for r in mine]
        self.unions: list[frozenset[int]] = [frozenset()]
        for r in mine:
            self.unions.append(self.unions[-1] | r.hosts)

    def before(self, end: float | None) -> frozenset[int]:
        """The hosts of the reservations that start before ``end`` (None: all of them)."""
        return self.unions[-1 if end is None else bisect_left(self.starts, end)]


_START = attrgetter("start")


def reserve(p: PassState, job: Job, position: int, reasons: tuple[str, ...]) -> bool:
    """Reserve the earliest start for ``job`` that no earlier reservation's hosts block."""
    decision = _earliest_unreserved(p, job.gang)
    if decision is None:
        return False
    _promise(p, job, position, decision, reasons)
    return True


def _earliest_unreserved(p: PassState, gang: Gang) -> Decision | None:
    """When and where ``gang`` starts earliest outside every reservation's hosts, when that
    is later than now (None: now, or never)."""
    with p.work.fenced(_fences(p).before(None)):
        decision = when_and_where(p.work, gang, p.now, p.explain)
    if decision.outcome != Outcome.LATER or decision.placement is None:
        return None
    return decision


def _promise(
    p: PassState, job: Job, position: int, decision: Decision, reasons: tuple[str, ...]
) -> None:
    """Reserve ``decision``'s start and placement for ``job``, which waits for it."""
    assert decision.placement is not None
    start = decision.start_time if decision.start_time is not None else p.now
    hosts = frozenset(g.host for g in decision.placement.grants)
    p.reservations.append(Reserve(job.id, start, decision.placement, hosts))
    when = span(max(start - p.now, 0.0))
    detail = (*reasons, f"reserved: starts in {when} (as of this pass) on {len(hosts)} host(s)")
    p.waiting.append(Waiting(job.id, position, WaitReason.RESERVED, detail, start, "reservation"))


def waits_for_tight(
    p: PassState, job: Job, placement: Placement, position: int, may_reserve: bool
) -> bool:
    """Leave ``job`` waiting for a tight placement instead of starting it on the wider
    ``placement`` now, when the tight one finishes sooner (``placement/patience.py``). A
    full pass reserves the tight placement, so only a job a reservation is left for waits; an
    arrival's pass reserves nothing, so the job waits for the next full pass to. A job with
    no expected runtime starts now, and so does one whose tight start waits for a job past
    its own expected end (``_overdue``)."""
    tight = tighter(p.work.tree, job.gang, placement)
    if tight is None:
        return False
    runtime = job.expected_runtime()
    if runtime is None or (may_reserve and not reservation_left(p)):
        return False
    decision = _earliest_unreserved(p, tight.gang)
    if decision is None or decision.start_time is None or _overdue(p, decision.waits_for):
        return False
    start = decision.start_time
    if not worth_waiting(runtime, tight.factor, start, p.now):
        return False
    wait, level = start - p.now, tight.level
    why = (
        f"waits for one {level}: started now it would span {level}s and run "
        f"{tight.factor:.1f}x slower, done in {span(runtime * tight.factor)}; in one "
        f"{level} it starts in {span(wait)}, done in {span(wait + runtime)}",
    )
    if may_reserve:
        _promise(p, job, position, decision, why)
    else:
        basis = "when-and-where"
        p.waiting.append(Waiting(job.id, position, WaitReason.TOPOLOGY, why, start, basis))
    return True


def _overdue(p: PassState, jobs: Iterable[str]) -> bool:
    """Whether one of ``jobs`` runs past its expected end: when it ends is then unknown, so
    a start that waits for it is no promise (and waiting could go on for ever)."""
    for job in jobs:
        held = p.work.allocations.get(job)
        if held is not None and held.expected_end is not None and held.expected_end <= p.now:
            return True
    return False

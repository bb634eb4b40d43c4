"""The pass itself: ``run_cycle`` (a full pass) and ``schedule_arrival`` (one new job).

Contract. Both take a ``Snapshot`` and a ``Policy``, make a ``PassState`` (``_new_pass``),
walk the jobs through the phases one at a time (``_consider``), and return a ``CycleResult``;
they never change the snapshot. ``_consider`` is the order in which a job meets the phases:
strict order, restart hold, hopeless, fenced hosts, shape already failed, place, patience,
admit and bind; else never-fits, start smaller, preempt, reserve, wait.
"""

from __future__ import annotations

from dataclasses import replace

from boltforge.core.cycle.admit import admit_placement
from boltforge.core.cycle.order import order_pending
from boltforge.core.cycle.place import (
    apart,
    bind,
    one_island_replica,
    place,
    repeat,
    shape_key,
    upcoming_gangs,
)
from boltforge.core.cycle.preempt import preempt, preempt_rules
from boltforge.core.cycle.reserve import blocked_hosts, reservation_left, reserve, waits_for_tight
from boltforge.core.cycle.resize import grow_elastic, start_smaller
from boltforge.core.cycle.restart import keep_hold, recover_held, release_hold, say_held
from boltforge.core.cycle.snapshot import Snapshot
from boltforge.core.cycle.state import PassState, count_open_gpus
from boltforge.core.cycle.tail import Tail
from boltforge.core.cycle.wait import classify, estimate_start, hopeless
from boltforge.core.decisions import CycleResult, Reserve, Waiting, WaitReason
from boltforge.core.model.gang import Gang
from boltforge.core.model.workload import Job
from boltforge.core.placement.modes import could_ever_fit, fits_empty
from boltforge.core.placement.routing import route_job
from boltforge.core.policy import Policy
from boltforge.core.queueing.estimates import fill_estimates
from boltforge.core.sharing.place import as_placement, place_shares, whole_gpu_gang


def run_cycle(
    snap: Snapshot,
    policy: Policy,
    reservations: tuple[Reserve, ...] = (),
    explain: bool = True,
) -> CycleResult:
    """Decide what to start, reserve and leave waiting (the phases: the package docstring).

    ``reservations`` carries promises from an earlier pass that should still hold; a full pass
    normally starts with none and makes its own. ``explain=False`` leaves out what no
    decision depends on, for callers nobody reads it to, such as the simulator: waiting jobs'
    reasons and start estimates, and any look at a job that cannot start (``hopeless``);
    once no job left in the queue can start (``Tail``) the pass ends, and ``waiting`` lists
    only the jobs it looked at.
    """
    holdings = snap.own_holdings()
    ordered, columns, at = order_pending(snap, policy, holdings)  # 1.
    p = _new_pass(snap, policy, holdings)  # 2. snapshot
    p.reservations = list(reservations)
    p.estimates_left = policy.backfill.estimate_waits if explain else 0
    p.explain = explain
    tail = None if explain else Tail(ordered, policy, snap.now, columns, at)
    # lookahead looks at the jobs before this position
    ahead = len(ordered[: policy.placement.lookahead])
    for position, job in enumerate(ordered):
        if tail is not None and tail.none_can_start(p, position):
            p.unseen = len(ordered) - position  # they wait; nobody reads why
            break
        upcoming = upcoming_gangs(ordered, position, ahead) if position + 1 < ahead else ()
        _consider(p, job, position, upcoming=upcoming)  # 3-8, one job at a time
    resizes = grow_elastic(p)  # 9. grow elastic jobs into what nobody waiting can use
    waiting = p.waiting
    if explain:
        waiting = fill_estimates(waiting, {j.id: j for j in ordered}, p.work, p.now)
    return CycleResult(
        binds=tuple(p.binds),
        evictions=tuple(p.evictions),
        resizes=tuple(resizes),
        reservations=tuple(p.reservations),
        waiting=tuple(waiting),
    )


def schedule_arrival(
    snap: Snapshot,
    job: Job,
    policy: Policy,
    reservations: tuple[Reserve, ...],
    explain: bool = True,
) -> CycleResult:
    """Incremental pass for one arrival: place ``job`` now if it fits without delaying any
    reservation of the last full pass, else leave it waiting with its reason (and, with
    ``explain``, a start estimate; without, as in ``run_cycle``, neither). Jobs already
    pending keep their places; the next full pass re-orders everything."""
    p = _new_pass(snap, policy, snap.own_holdings())
    p.reservations = list(reservations)
    p.estimates_left = 1 if explain else 0
    p.explain = explain
    _consider(p, job, len(snap.pending), may_reserve=False)
    return CycleResult(
        binds=tuple(p.binds),
        evictions=tuple(p.evictions),
        waiting=tuple(p.waiting),
        reservations=tuple(p.reservations),
    )


def _new_pass(snap: Snapshot, policy: Policy, holdings: dict[str, dict[str, int]]) -> PassState:
    """The state a pass over ``snap`` under ``policy`` starts from (``holdings``: the GPUs the
    queues hold, a copy the pass may change)."""
    running = {r.job.id: r for r in snap.running}
    p = PassState(policy, snap.now, snap.state.copy(), running, snap.quota, holdings)
    p.recent = list(snap.recent_preemptions)
    p.routing = snap.routing
    p.preempt_attempts = 0 if policy.preemption is None else policy.preemption.attempts
    p.rules = preempt_rules(policy)
    p.max_class = max((r.job.priority for r in snap.running), default=None)
    p.borrowing = any(r.borrowed for r in snap.running)
    return p


def _consider(
    p: PassState,
    job: Job,
    position: int,
    may_reserve: bool = True,
    upcoming: tuple[Gang, ...] = (),
) -> None:
    """Take ``job``, at ``position`` in the order, through the pass: under strict order behind
    a blocked head it waits; with GPUs held for its restart it is restarted on them first
    (``restart.py``); else it meets the phases (``_consider_one``). ``may_reserve``: False in
    an arrival's pass; ``upcoming``: the gangs lookahead checks its placement against."""
    if p.head_blocked is not None:
        detail = (f"strict order: waits behind {p.head_blocked}",)
        p.waiting.append(Waiting(job.id, position, WaitReason.BEHIND, detail))
        return
    hold = release_hold(p, job)
    if hold is None or not recover_held(p, job, position):
        bound = len(p.binds)
        _consider_one(p, job, position, may_reserve, upcoming)
        if hold is not None and len(p.binds) == bound:
            keep_hold(p, hold)
            say_held(p, job, hold)
    if p.policy.order.strict and p.waiting and p.waiting[-1].job == job.id:
        p.head_blocked = job.id


def _consider_one(
    p: PassState, job: Job, position: int, may_reserve: bool, upcoming: tuple[Gang, ...]
) -> None:
    """Take one job of whole GPUs through the phases, in the order of the package docstring;
    it ends bound, reserved or waiting with its reason."""
    policy = p.policy
    if job.gang.shared:
        _consider_shared(p, job, position)
        return
    if hopeless(p, job, may_reserve):
        p.waiting.append(Waiting(job.id, position, WaitReason.CAPACITY, ()))
        return
    blocked = blocked_hosts(p, job)
    shape = shape_key(p, job, blocked)
    route = None if p.routing is None else route_job(p.work.tree, job, p.routing, p.now)
    if (
        route is not None
    ):  # cost-aware routing (core/placement/routing.py): the route is part of the shape
        shape = (*shape, route.key)
    failed = p.failed_shapes.get(shape)
    if failed is not None:
        p.waiting.append(Waiting(job.id, position, *failed, None))
        return
    placement = None if upcoming or route is not None or job.spread else repeat(p, job, shape)
    reasons: tuple[str, ...] = ()
    never = False
    # 3. place; when nobody reads why, a job larger than every free GPU together skips it
    if placement is None and job.spread and (p.explain or job.gpus <= count_open_gpus(p)):
        placement = apart(p, job, blocked, route)
    if placement is None and (p.explain or job.gpus <= count_open_gpus(p)):
        placement, reasons, never = place(p, job.gang, blocked, upcoming, route)
    if placement is not None:
        if policy.placement.patience and waits_for_tight(p, job, placement, position, may_reserve):
            return
        verdict = admit_placement(p, job, placement)  # 4. admit
        if not verdict.ok:
            p.waiting.append(Waiting(job.id, position, WaitReason.QUOTA, (verdict.reason,)))
            return
        bind(p, job, placement, position, borrowed=verdict.borrowed)
        p.last_host = (shape, placement) if one_island_replica(job.gang, placement) else None
        return
    if not never and not fits_empty(p.work.tree, job.gang):
        ever = could_ever_fit(p.work.tree, job.gang)
        never, reasons = True, (*ever.reasons, *(f"To fix: {f}" for f in ever.fixes))
    if never:
        p.failed_shapes[shape] = (WaitReason.NEVER, reasons)
        p.waiting.append(Waiting(job.id, position, WaitReason.NEVER, reasons))
        return
    # 5. start smaller
    if policy.elastic is not None and job.elastic and start_smaller(p, job, position, blocked):
        return
    if policy.preemption is not None:  # 6. preempt
        bumped, why_not = preempt(p, job, position, blocked)
        if bumped:
            return
        reasons = (*reasons, *why_not)
    if may_reserve and reservation_left(p) and reserve(p, job, position, reasons):  # 7. reserve
        return
    reason = classify(p, job, blocked)
    estimate = estimate_start(p, job)
    basis = "when-and-where" if estimate is not None else ""
    p.failed_shapes.setdefault(shape, (reason, reasons))
    p.waiting.append(Waiting(job.id, position, reason, reasons, estimate, basis))  # 8. wait


def _consider_shared(p: PassState, job: Job, position: int) -> None:
    """A job of GPU shares (MIG instances, fractions; ``core/sharing/place.py``): bound now;
    else, under a preempting policy, bound on GPUs freed from jobs it may bump, as a job of
    one whole GPU per replica would free them (``preempt``); else left waiting. It does not
    reserve, and like any job it stays off hosts reserved for a start it would delay."""
    blocked = blocked_hosts(p, job)
    with p.work.fenced(blocked):
        plan = place_shares(p.work, job.gang)
    if plan.grants is None:
        reasons = plan.notes
        if not plan.never and p.policy.preemption is not None:
            seeker = replace(job, gang=whole_gpu_gang(p.work.tree, job.gang))
            bumped, why_not = preempt(p, job, position, blocked, seeker)
            if bumped:
                return
            reasons = (*reasons, *why_not)
        reason = WaitReason.NEVER if plan.never else WaitReason.CAPACITY
        p.waiting.append(Waiting(job.id, position, reason, reasons))
        return
    placement = as_placement(p.work, job.id, job.gang, plan)
    verdict = admit_placement(p, job, placement)
    if not verdict.ok:
        p.waiting.append(Waiting(job.id, position, WaitReason.QUOTA, (verdict.reason,)))
        return
    bind(p, job, placement, position, borrowed=verdict.borrowed)

"""The scheduling cycle: one pure function from a fleet snapshot to decisions.

A full pass runs these phases, one call each::

    # 1. order     pending jobs by the policy's rule (fair share, FIFO, priority, LAS)
    # 2. snapshot  a scratch copy of the fleet state that the pass fills in
    # 3. place     each job now, outside hosts reserved for jobs ahead of it (backfill rule);
    #              near the head of the queue, lookahead keeps it from stranding the next jobs
    # 4. admit     against its queue's guaranteed and burst quota
    # 5. elastic   start smaller when that finishes sooner than waiting for the full size
    # 6. preempt   free a topology-valid placement at the least lost work, when that beats
    #              waiting; victims are evicted (or shrunk) in the same pass
    # 7. reserve   the first blocked jobs get a when-and-where reservation
    # 8. wait      every other job carries its reason, position and, near the head, an estimate
    # 9. grow      running elastic jobs take what no waiting job can use, when that pays

The same inputs always give the same decisions: nothing here reads a clock or draws a random
number, and every tie is broken by job id. ``schedule_arrival`` is the incremental pass for one
new job against the reservations of the last full pass.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from operator import attrgetter

import numpy as np

from boltforge.core.decisions import (
    Bind,
    CycleResult,
    Evict,
    Reserve,
    Resize,
    Waiting,
    WaitReason,
)
from boltforge.core.elastic import grow, growth_id
from boltforge.core.model.gang import Gang
from boltforge.core.model.state import Allocation, Conflict, FleetState, Grant
from boltforge.core.model.topology import BoolArray, IntArray, TopologyTree
from boltforge.core.model.workload import Job, Running, Usage
from boltforge.core.placement.answers import Placement
from boltforge.core.placement.firstfit import first_fit
from boltforge.core.placement.lookahead import place_with_lookahead
from boltforge.core.placement.modes import (
    could_ever_fit,
    fits_empty,
    place_now,
    when_and_where,
)
from boltforge.core.placement.patience import tighter, worth_waiting
from boltforge.core.placement.place import Decision, Outcome
from boltforge.core.placement.recovery import recover
from boltforge.core.placement.routing import Route, RoutingFacts, fences, note_for, route_job
from boltforge.core.placement.single import plan_on_host
from boltforge.core.policy import Backfill, Ordering, Policy
from boltforge.core.preempt.bump import TIERS, Margins, needs_s, tier, worth_bumping
from boltforge.core.preempt.bump import standing as bump_standing
from boltforge.core.preempt.choose import (
    NoVictims,
    Screens,
    Victims,
    churn_note,
    find_victims,
    preemption_worth_it,
    release_victims,
    spent_for_all,
)
from boltforge.core.preempt.text import span
from boltforge.core.preempt.victims import PreemptRules, saved_within, standing_of
from boltforge.core.queueing.columns import QueueColumns
from boltforge.core.queueing.estimates import fill_estimates
from boltforge.core.queueing.fairshare import Resources
from boltforge.core.queueing.fairshare import order as fair_order
from boltforge.core.queueing.fairshare import positions as fair_positions
from boltforge.core.queueing.ordering import las_queue, las_queues, order_jobs, order_positions
from boltforge.core.queueing.quota import Holdings, QuotaTree, Verdict, admit, reclaimable_for
from boltforge.core.queueing.shortest import SizeRule
from boltforge.core.sharing.place import as_placement, place_shares, whole_gpu_gang

# Lookahead window: how many jobs behind the one being placed it checks (policy.lookahead
# bounds how far down the queue lookahead runs at all).
WINDOW = 4


@dataclass(frozen=True)
class Snapshot:
    """What a cycle sees. ``state`` holds every running job's allocation under its job id,
    with ``expected_end`` set where the job's runtime is known. ``quota`` is the queue tree
    (None: no quotas, one flat fair share); ``usage`` the decayed usage per queue.
    ``promised``: the jobs the last full pass reserved a start for; under a policy that ranks
    by size they keep their place ahead of the rest of their class (``promised_first``).
    ``in_arrival_order``: ``pending`` is sorted by submit time, then id (the caller keeps it
    so; the ordering then skips the sort that would put it so); it must be, when set.
    ``columns``: the numbers of the ``pending`` jobs, in step with them (``QueueColumns``),
    which the orders and the pass's tail then read instead of each job; only with
    ``in_arrival_order``, and the caller must keep them equal to ``QueueColumns.of(pending)``."""

    state: FleetState
    pending: tuple[Job, ...]
    running: tuple[Running, ...]
    now: float
    quota: QuotaTree | None = None
    usage: Usage = field(default_factory=Usage)
    recent_preemptions: tuple[tuple[float, int], ...] = ()
    routing: RoutingFacts | None = None
    promised: frozenset[str] = frozenset()
    known_held: dict[str, dict[str, int]] | None = field(default=None, repr=False, compare=False)
    in_arrival_order: bool = False
    columns: QueueColumns | None = field(default=None, repr=False, compare=False)

    @cached_property
    def held(self) -> dict[str, dict[str, int]]:
        """GPUs held per leaf queue and pool by the running jobs (computed once; read-only).
        ``known_held``, when the caller keeps that count itself (one arrival after another
        on the same world), stands for it: it must equal ``holdings()``."""
        return self.known_held if self.known_held is not None else self.holdings()

    def holdings(self) -> dict[str, dict[str, int]]:
        """GPUs held per leaf queue and pool by the running jobs, as a fresh dict."""
        return holdings_of(self.state.tree, self.running)

    def own_holdings(self) -> dict[str, dict[str, int]]:
        """``held`` as a fresh dict the caller may change."""
        return {q: dict(pools) for q, pools in self.held.items()}


@dataclass
class _Pass:
    """Mutable bookkeeping of one pass; never escapes the cycle."""

    policy: Policy
    now: float
    work: FleetState
    running: dict[str, Running]
    quota: QuotaTree | None = None
    holdings: dict[str, dict[str, int]] = field(default_factory=dict)
    binds: list[Bind] = field(default_factory=list)
    evictions: list[Evict] = field(default_factory=list)
    reservations: list[Reserve] = field(default_factory=list)
    waiting: list[Waiting] = field(default_factory=list)
    failed_shapes: dict[tuple[object, ...], tuple[WaitReason, tuple[str, ...]]] = field(
        default_factory=dict
    )
    estimates_left: int = 0
    head_blocked: str | None = None
    recent: list[tuple[float, int]] = field(default_factory=list)
    preempt_attempts: int = 0
    last_host: tuple[tuple[object, ...], Placement] | None = None
    evicted: set[str] = field(default_factory=set)
    routing: RoutingFacts | None = None
    explain: bool = True
    max_class: int | None = None
    borrowing: bool = False
    open_gpus: int | None = None  # free GPUs on hosts taking work; None: count again
    standing: dict[str, tuple[int, ...]] | None = None  # under LAS, by job id
    spread: dict[str, Counter[int]] | None = None  # jobs per host per spread group (``_apart``)
    unseen: int = 0  # jobs left waiting unlooked-at (``_Tail``)
    alive: _Alive | None = None  # the running jobs as victim searches see them (``_alive``)
    fences: _Fences | None = None  # the reservations' hosts, for ``_blocked_hosts``
    rules: PreemptRules = field(default_factory=PreemptRules)  # ``_rules`` of the policy
    churn: tuple[int, bool] | None = None  # ``_churn_spent``, as of that many ``recent``
    margins: Margins | None = None  # the running jobs' time left, under bumping (``_margins``)


def run_cycle(
    snap: Snapshot,
    policy: Policy,
    reservations: tuple[Reserve, ...] = (),
    explain: bool = True,
) -> CycleResult:
    """Decide what to start, reserve and leave waiting (see the module docstring for phases).

    ``reservations`` carries promises from an earlier pass that should still hold; a full pass
    normally starts with none and makes its own. ``explain=False`` leaves out what no
    decision depends on, for callers nobody reads it to, such as the simulator: waiting jobs'
    reasons and start estimates, and any look at a job that cannot start (``_hopeless``);
    once no job left in the queue can start (``_Tail``) the pass ends, and ``waiting`` lists
    only the jobs it looked at.
    """
    holdings = snap.own_holdings()
    ordered, columns, at = _order(snap, policy, holdings)  # 1.
    p = _new_pass(snap, policy, holdings)  # 2. snapshot
    p.reservations = list(reservations)
    p.estimates_left = policy.estimate_waits if explain else 0
    p.explain = explain
    tail = None if explain else _Tail(ordered, policy, snap.now, columns, at)
    ahead = len(ordered[: policy.lookahead])  # lookahead looks at the jobs before this position
    for position, job in enumerate(ordered):
        if tail is not None and tail.none_can_start(p, position):
            p.unseen = len(ordered) - position  # they wait; nobody reads why
            break
        upcoming = _upcoming(ordered, position, ahead) if position + 1 < ahead else ()
        _consider(p, job, position, upcoming=upcoming)  # 3-8, one job at a time
    resizes = _grow(p)  # 9. grow elastic jobs into what nobody waiting can use
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


_HELD, _ELASTIC = attrgetter("held"), attrgetter("elastic")
_JOB_GPUS, _JOB_CLASS = attrgetter("gang.total_gpus"), attrgetter("gang.priority")
_BY_CLASS = (Ordering.FAIR, Ordering.PRIORITY)  # orders that rank by class first


def _upcoming(ordered: list[Job], position: int, ahead: int) -> tuple[Gang, ...]:
    """The gangs lookahead checks the job at ``position`` against: up to ``WINDOW`` jobs
    behind it, none at or past position ``ahead``."""
    return tuple(j.gang for j in ordered[position + 1 : ahead][:WINDOW])


class _Tail:
    """What the jobs from each queue position to the end need at least, so that a pass
    nobody reads the reasons of can stop once none of them can start: the fewest GPUs any of
    them wants, the most important class and standing among them, and whether any is
    elastic or has GPUs held for its restart (those take paths of their own).

    The suffixes are built (once each, vectorized, from the first position that needs them
    on) only when a job too big for the free GPUs is reached and no reservation is left to
    give: while the job at a position can start by size or takes a path of its own, no job
    from there on is ruled out, and most passes end before the suffixes are ever needed. The
    classes and standings are built only under a preempting policy, the one that reads them.
    Under strict order a job of whole GPUs needs none: when it cannot start, it holds back
    every job behind it.
    """

    def __init__(
        self,
        ordered: list[Job],
        policy: Policy,
        now: float,
        columns: QueueColumns | None,
        at: IntArray | None,
    ) -> None:
        self.ordered, self.policy, self.now = ordered, policy, now
        # the snapshot's columns, if any, and the position in them of each of ``ordered``
        # (None: in step with it)
        self.columns, self.at = columns, at
        self._base: int | None = None  # the position the suffixes start at
        self._fits: tuple[np.ndarray, np.ndarray] | None = None  # fewest GPUs, own path
        self._ranks: tuple[np.ndarray, np.ndarray] | None = None  # class, standing code
        self._tail: QueueColumns | None = None  # ``_columns``, once taken

    def none_can_start(self, p: _Pass, i: int) -> bool:
        """Whether no job from position ``i`` on can start in this pass: strict order is
        blocked, or none of them can start by size, reserve, take a path of its own or bump
        a running job (``_bumps_none_of``)."""
        if p.head_blocked is not None:
            return True
        job = self.ordered[i]
        if job.gpus <= _open_gpus(p) or _own_path(self.policy, job):
            return False  # this one may start, so the rest are not ruled out
        if self.policy.strict_order and not job.gang.shared:  # it waits, and all behind it
            return _cannot_start(p, job.gpus, job.priority, False, True)
        if _may_reserve(p):
            return False
        k = i - self._start(i)
        min_gpus, own_path = self._fit_suffixes()
        if own_path[k] or min_gpus[k] <= _open_gpus(p):
            return False
        if not p.policy.preemption:
            return True
        min_class, min_mark = self._rank_suffixes()
        return _bumps_none_of(p, int(min_class[k]), self._mark(int(min_mark[k])))

    def _mark(self, code: int) -> tuple[int, ...]:
        """The standing a ``_standing_code`` stands for."""
        finer = _finer(self.policy)
        return (code,) if finer is None else divmod(code, finer)

    def _start(self, i: int) -> int:
        """The position the suffixes start at: ``i`` at the first call."""
        if self._base is None:
            self._base = i
        return self._base

    def _columns(self) -> QueueColumns | None:
        """The columns of the jobs from the base on, when the snapshot has them (taken once,
        for both suffixes)."""
        if self.columns is None or self._tail is not None:
            return self._tail
        base = self._base or 0
        at = self.at
        self._tail = self.columns.since(base) if at is None else self.columns.take(at[base:])
        return self._tail

    def _fit_suffixes(self) -> tuple[np.ndarray, np.ndarray]:
        """From the base on: the fewest GPUs any job from each position wants, and whether
        any of them takes a path of its own."""
        if self._fits is None:
            jobs, columns = self.ordered[self._base :], self._columns()
            if columns is None:
                gpus = np.fromiter(map(_JOB_GPUS, jobs), np.int64, len(jobs))[::-1]
                own = _own_paths(jobs, self.policy)[::-1]
            else:
                gpus = columns.gpus[::-1]
                own = (columns.held | (self.policy.elastic & columns.elastic))[::-1]
            self._fits = (
                np.minimum.accumulate(gpus)[::-1],
                np.logical_or.accumulate(own)[::-1],
            )
        return self._fits

    def _rank_suffixes(self) -> tuple[np.ndarray, np.ndarray]:
        """From the base on: the most important class and standing (``_standing_codes``)
        of any job from each position."""
        if self._ranks is None:
            jobs, columns = self.ordered[self._base :], self._columns()
            if columns is None:
                klass = np.fromiter(map(_JOB_CLASS, jobs), np.int64, len(jobs))
                queues = None
            else:
                klass = columns.priority
                queues = _sublevels(columns, self.policy, self.now)
            marks = _standing_codes(jobs, self.policy, self.now, klass, queues)[::-1]
            self._ranks = (
                np.minimum.accumulate(klass[::-1])[::-1],
                np.minimum.accumulate(marks)[::-1],
            )
        return self._ranks


def _own_paths(jobs: list[Job], policy: Policy) -> np.ndarray:
    """``_own_path`` of each of ``jobs``, as booleans (no job is looked at one by one when
    none has a hold and none is elastic or the policy uses no elasticity)."""
    n = len(jobs)
    no_holds = not any(map(_HELD, jobs))  # a ``Hold`` is always true
    if no_holds and (not policy.elastic or list(map(_ELASTIC, jobs)).count(None) == n):
        return np.zeros(n, dtype=np.bool_)
    return np.fromiter((_own_path(policy, j) for j in jobs), np.bool_, n)


def _finer(policy: Policy) -> int | None:
    """How many levels a class splits into when a policy ranks standing finer than class:
    LAS queues under Tiresias, tiers of time left under bumping; None: class alone."""
    if policy.ordering == Ordering.LAS:
        return len(policy.las_thresholds) + 1
    return TIERS if policy.bump is not None else None


def _sublevels(columns: QueueColumns, policy: Policy, now: float) -> IntArray | None:
    """Each waiting job's level inside its class (``_finer``), read off its ``columns``."""
    if policy.ordering == Ordering.LAS:
        return las_queues(columns, policy, now)
    if policy.bump is None:
        return None
    left = columns.work / np.maximum(columns.gpus, 1)
    return np.fromiter(map(tier, left.tolist()), np.int64, len(columns))


def _standing_codes(
    jobs: list[Job], policy: Policy, now: float, klass: IntArray, levels: IntArray | None
) -> IntArray:
    """Each waiting job's standing (``_standing``) as one integer ordered as the standings
    are: its class, or under a finer standing (``_finer``) its class times the number of
    levels plus its level (``_Tail._mark`` turns a code back). ``levels``: the jobs' levels,
    when the caller has them."""
    finer = _finer(policy)
    if finer is None:
        return klass
    if levels is None:
        levels = np.fromiter((_own_standing(policy, j, now)[1] for j in jobs), np.int64, len(jobs))
    return klass * finer + levels


def _bumps_none_of(p: _Pass, priority: int, mark: tuple[int, ...]) -> bool:
    """Whether no waiting job of class ``priority`` and standing ``mark`` or less important
    ones can bump anybody in this pass: ``_bumps_nobody``, or the pass's preemption attempts
    are used up, or no running job borrows or stands lower than ``mark`` (``_preempt``
    returns before a search for each of them), or the churn budget is spent and every
    victim would free a GPU (each search finds nothing)."""
    if _bumps_nobody(p, priority) or p.preempt_attempts <= 0 or _churn_spent(p):
        return True
    alive = _alive(p, _running_standing(p))
    return not alive.borrowing and not alive.any_bumpable(mark)


def _churn_spent(p: _Pass) -> bool:
    """Whether the churn budget is spent (``churn_note``) and every grant of every running
    job holds a GPU, so that no victim search of the pass finds any (``find_victims``).
    The budget is counted again only when the pass preempted since (a pass only ever adds
    to ``recent``)."""
    if p.churn is None or p.churn[0] != len(p.recent):
        churn = churn_note(p.work, p.rules, p.recent, p.now)
        p.churn = (len(p.recent), spent_for_all(churn, p.running.values()))
    return p.churn[1]


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


def _order(
    snap: Snapshot, policy: Policy, holdings: dict[str, dict[str, int]]
) -> tuple[list[Job], QueueColumns | None, IntArray | None]:
    """1. The pending jobs in the order the pass looks at them (``order_jobs``, then
    ``promised_first``); when the snapshot has their columns, those too, with each job's
    position in them in that order (None: the columns' own order)."""
    fair = _fair(snap, holdings, policy)
    arrived = snap.in_arrival_order
    pending, columns = snap.pending, snap.columns
    if columns is None:

        def by_share(jobs: list[Job]) -> list[Job]:
            return fair_order(jobs, *fair, arrived=arrived)

        ordered = order_jobs(list(pending), policy, snap.now, by_share, arrived)
        return promised_first(ordered, policy, snap.promised), None, None
    if policy.ordering == Ordering.FIFO and policy.size is None:
        return list(pending), columns, None  # arrival order, which the columns are in
    at = order_positions(columns, policy, snap.now, lambda c: fair_positions(c, *fair))
    at = _promised_first_at(at, columns.priority, columns.held, policy, pending, snap.promised)
    return [pending[i] for i in at.tolist()], columns, at


def promised_first(ordered: list[Job], policy: Policy, promised: frozenset[str]) -> list[Job]:
    """Under a size-ranked order, jobs holding a reservation from the last full pass, and
    jobs whose GPUs are held for their restart after a host failure, go first within their
    class (in the order given), so later, smaller arrivals never push back a start that was
    promised. Other orders are returned as given (arrival order keeps those jobs ahead)."""
    if policy.size is None:
        return ordered
    n = len(ordered)
    priority = np.fromiter(map(_JOB_CLASS, ordered), np.int64, n)
    held = np.fromiter((j.held is not None for j in ordered), np.bool_, n)
    at = _promised_first_at(np.arange(n), priority, held, policy, ordered, promised)
    return [ordered[i] for i in at.tolist()]


def _promised_first_at(
    at: IntArray,
    priority: IntArray,
    held: BoolArray,
    policy: Policy,
    jobs: Sequence[Job],
    promised: frozenset[str],
) -> IntArray:
    """``promised_first`` on the positions ``at`` of ``jobs`` (each job's class and whether
    GPUs are held for it in ``priority`` and ``held``): a stable sort by class, then
    promised or held before the rest, as one integer key."""
    if policy.size is None:
        return at
    if not promised and not held.any() and policy.ordering in _BY_CLASS:
        return at  # every key is its class's, in class order already
    rest = ~held
    if promised:
        rest[[i for i, job in enumerate(jobs) if job.id in promised]] = False
    keys = priority * 2 + rest
    return at[np.argsort(keys[at], kind="stable")]


def _new_pass(snap: Snapshot, policy: Policy, holdings: dict[str, dict[str, int]]) -> _Pass:
    running = {r.job.id: r for r in snap.running}
    p = _Pass(policy, snap.now, snap.state.copy(), running, snap.quota, holdings)
    p.recent = list(snap.recent_preemptions)
    p.routing = snap.routing
    p.preempt_attempts = policy.preempt_attempts
    p.rules = _rules(policy)
    p.max_class = max((r.job.priority for r in snap.running), default=None)
    p.borrowing = any(r.borrowed for r in snap.running)
    return p


def _fair(snap: Snapshot, holdings: dict[str, dict[str, int]], policy: Policy) -> _FairArgs:
    """What ``fairshare.order`` and ``positions`` take after the jobs: hierarchical fair
    share with DRF over the snapshot's queues (one flat tree if none), shortest work first
    inside a class when the policy has a size rule."""
    tree = snap.quota or QuotaTree.build([])
    fleet = snap.state.tree
    capacity = (
        float(fleet.total_gpus),
        float(fleet.host_cpus.sum()),
        float(fleet.host_memory.sum()),
    )
    return (tree, snap.usage, capacity, snap.now, holdings, policy.half_life_s, policy.size)


_FairArgs = tuple[QuotaTree, Usage, Resources, float, Holdings, float, SizeRule | None]


def _consider(
    p: _Pass,
    job: Job,
    position: int,
    may_reserve: bool = True,
    upcoming: tuple[Gang, ...] = (),
) -> None:
    if p.head_blocked is not None:
        detail = (f"strict order: waits behind {p.head_blocked}",)
        p.waiting.append(Waiting(job.id, position, WaitReason.BEHIND, detail))
        return
    hold = _release_hold(p, job)
    if hold is None or not _recover(p, job, position):
        bound = len(p.binds)
        _consider_one(p, job, position, may_reserve, upcoming)
        if hold is not None and len(p.binds) == bound:
            _keep_hold(p, hold)
            _say_held(p, job, hold)
    if p.policy.strict_order and p.waiting and p.waiting[-1].job == job.id:
        p.head_blocked = job.id


def _consider_one(
    p: _Pass, job: Job, position: int, may_reserve: bool, upcoming: tuple[Gang, ...]
) -> None:
    if job.gang.shared:
        _consider_shared(p, job, position)
        return
    if _hopeless(p, job, may_reserve):
        p.waiting.append(Waiting(job.id, position, WaitReason.CAPACITY, ()))
        return
    blocked = _blocked_hosts(p, job)
    shape = _shape(job.gang, blocked)
    route = None if p.routing is None else route_job(p.work.tree, job, p.routing, p.now)
    if (
        route is not None
    ):  # cost-aware routing (core/placement/routing.py): the route is part of the shape
        shape = (*shape, route.key)
    failed = p.failed_shapes.get(shape)
    if failed is not None:
        p.waiting.append(Waiting(job.id, position, *failed, None))
        return
    placement = None if upcoming or route is not None or job.spread else _repeat(p, job, shape)
    reasons: tuple[str, ...] = ()
    never = False
    # 3. place; when nobody reads why, a job larger than every free GPU together skips it
    if placement is None and job.spread and (p.explain or job.gpus <= _open_gpus(p)):
        placement = _apart(p, job, blocked, route)
    if placement is None and (p.explain or job.gpus <= _open_gpus(p)):
        placement, reasons, never = _place(p, job.gang, blocked, upcoming, route)
    if placement is not None:
        if p.policy.patience and _waits_for_tight(p, job, placement, position, may_reserve):
            return
        verdict = _admit(p, job, placement)  # 4. admit
        if not verdict.ok:
            p.waiting.append(Waiting(job.id, position, WaitReason.QUOTA, (verdict.reason,)))
            return
        _bind(p, job, placement, position, borrowed=verdict.borrowed)
        p.last_host = (shape, placement) if _one_island_replica(job.gang, placement) else None
        return
    if not never and not fits_empty(p.work.tree, job.gang):
        ever = could_ever_fit(p.work.tree, job.gang)
        never, reasons = True, (*ever.reasons, *(f"To fix: {f}" for f in ever.fixes))
    if never:
        p.failed_shapes[shape] = (WaitReason.NEVER, reasons)
        p.waiting.append(Waiting(job.id, position, WaitReason.NEVER, reasons))
        return
    if p.policy.elastic and job.elastic and _start_smaller(p, job, position, blocked):  # 5.
        return
    if p.policy.preemption:  # 6. preempt
        bumped, why_not = _preempt(p, job, position, blocked)
        if bumped:
            return
        reasons = (*reasons, *why_not)
    if may_reserve and _may_reserve(p) and _reserve(p, job, position, reasons):  # 7. reserve
        return
    reason = _classify(p, job, blocked)
    estimate = _estimate(p, job)
    basis = "when-and-where" if estimate is not None else ""
    p.failed_shapes.setdefault(shape, (reason, reasons))
    p.waiting.append(Waiting(job.id, position, reason, reasons, estimate, basis))  # 8. wait


def _consider_shared(p: _Pass, job: Job, position: int) -> None:
    """A job of GPU shares (MIG instances, fractions; ``core/sharing/place.py``): bound now;
    else, under a preempting policy, bound on GPUs freed from jobs it may bump, as a job of
    one whole GPU per replica would free them (``_preempt``); else left waiting. It does not
    reserve, and like any job it stays off hosts reserved for a start it would delay."""
    blocked = _blocked_hosts(p, job)
    with p.work.fenced(blocked):
        plan = place_shares(p.work, job.gang)
    if plan.grants is None:
        reasons = plan.notes
        if not plan.never and p.policy.preemption:
            seeker = replace(job, gang=whole_gpu_gang(p.work.tree, job.gang))
            bumped, why_not = _preempt(p, job, position, blocked, seeker)
            if bumped:
                return
            reasons = (*reasons, *why_not)
        reason = WaitReason.NEVER if plan.never else WaitReason.CAPACITY
        p.waiting.append(Waiting(job.id, position, reason, reasons))
        return
    placement = as_placement(p.work, job.id, job.gang, plan)
    verdict = _admit(p, job, placement)
    if not verdict.ok:
        p.waiting.append(Waiting(job.id, position, WaitReason.QUOTA, (verdict.reason,)))
        return
    _bind(p, job, placement, position, borrowed=verdict.borrowed)


def _release_hold(p: _Pass, job: Job) -> Allocation | None:
    """Give ``job`` back the GPUs held for its restart after a host failure (None: it has
    no hold in the state)."""
    if job.held is None or job.held.allocation.job not in p.work.allocations:
        return None
    p.open_gpus = None
    return p.work.release(job.held.allocation.job)


def _recover(p: _Pass, job: Job, position: int) -> bool:
    """Restart a job that lost hosts on the GPUs it kept, replacing only the lost replicas
    with the closest healthy hosts (``core/placement/recovery.py``), outside reserved hosts it would
    delay and within its quota. Returns whether it was bound.

    Its own held hosts are never fenced off: a reservation made on them counted on the hold
    running out, and the hold is there for exactly this restart."""
    assert job.held is not None
    held = {g.host for g in job.held.allocation.grants}
    with p.work.fenced(_blocked_hosts(p, job) - held):
        placement = recover(p.work, job.gang, job.held)
    if placement is None:
        return False
    verdict = _admit(p, job, placement)
    if not verdict.ok:
        return False
    _bind(p, job, placement, position, note=placement.notes[0], borrowed=verdict.borrowed)
    return True


def _keep_hold(p: _Pass, hold: Allocation) -> None:
    """Hold again what a job that stays waiting was given back (what is still free of it)."""
    grants = tuple(g for g in hold.grants if all(p.work.free[g.host, gpu] for gpu in g.gpus))
    if not grants:
        return
    p.open_gpus = None
    try:
        p.work.allocate(replace(hold, grants=grants))
    except Conflict:  # its CPUs or memory went to another job meanwhile: the hold lapses
        return


def _say_held(p: _Pass, job: Job, hold: Allocation) -> None:
    """Add to a waiting job's evidence which GPUs wait for its restart, and until when."""
    if not p.waiting or p.waiting[-1].job != job.id:
        return
    names = p.work.tree.hosts
    kept = sorted({names[g.host].name for g in hold.grants})
    line = f"its GPUs on {', '.join(kept)} are held for its restart"
    if hold.expected_end is not None:
        line += f" for {max(hold.expected_end - p.now, 0.0):.0f} s more"
    w = p.waiting[-1]
    p.waiting[-1] = w._replace(detail=(line, *w.detail))


def _one_island_replica(gang: Gang, placement: Placement) -> bool:
    """Whether ``placement`` is one replica of a one-role gang inside one NVLink island."""
    role = gang.roles[0]
    return (
        len(gang.roles) == 1
        and role.replicas == 1
        and role.gpus > 0
        and placement.cost.hops["host"] == 0
    )


def _repeat(p: _Pass, job: Job, shape: tuple[object, ...]) -> Placement | None:
    """The previous job's host for a job of the same shape, when it provably stays the best
    (see ``single.plan_on_host``); None sends the job through the full placement."""
    if p.last_host is None or p.last_host[0] != shape:
        return None
    previous = p.last_host[1].roles[0]
    host = previous.grants[0].host
    plan = plan_on_host(p.work, job.gang.roles[0], host, previous.gpu_type)
    if plan is None:
        return None
    return Placement(job.gang.name, (plan,), plan.cost)


def _blocked_hosts(p: _Pass, job: Job) -> frozenset[int]:
    """Hosts ``job`` must avoid: those reserved for a start before ``job`` would finish."""
    runtime = job.expected_runtime()
    end = None if runtime is None else p.now + runtime
    fences = _fences(p)
    if job.id in fences.holders:  # its own reservation does not fence it off
        return _Fences(p.reservations, job.id).before(end)
    return fences.before(end)


def _fences(p: _Pass) -> _Fences:
    """The pass's reservations as ``_Fences``, made again only when one was added (a pass
    only ever appends reservations)."""
    if p.fences is None or p.fences.count != len(p.reservations):
        p.fences = _Fences(p.reservations)
    return p.fences


class _Fences:
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


def _shape(gang: Gang, blocked: frozenset[int]) -> tuple[object, ...]:
    return (gang.shape, gang.priority, blocked)  # class: what it may preempt


def _place(
    p: _Pass,
    gang: Gang,
    blocked: frozenset[int],
    upcoming: tuple[Gang, ...] = (),
    route: Route | None = None,
) -> tuple[Placement | None, tuple[str, ...], bool]:
    """Place on the pass's state with ``blocked`` hosts fenced off; (placement, reasons, never).

    With ``upcoming`` gangs (the next jobs in line, near the head of the queue) the engine's
    choice is checked by lookahead and moved when it would strand one of them.
    """
    if route is not None:  # each group of pools in the route's order, then any mix of them
        tries, excluded = fences(p.work.tree, route)
        for fenced in tries:
            placement, _, _ = _place(p, gang, blocked | fenced, upcoming)
            if placement is not None:
                why = note_for(p.work.tree, route, placement)
                notes = (*placement.notes, why) if why else placement.notes
                return replace(placement, notes=notes), (), False
        blocked = blocked | excluded
    with p.work.fenced(blocked):
        if p.policy.topology_aware:
            decision = place_now(p.work, gang, p.explain)
            never = decision.outcome == Outcome.NEVER
            placement = decision.placement
            if placement is not None and upcoming:
                placement = place_with_lookahead(
                    p.work, gang, upcoming, len(upcoming), engine=placement
                )
            return placement, decision.reasons, never
        placed = first_fit(p.work, gang)
        return placed, () if placed else ("first-fit found no hosts with room",), False


def _apart(p: _Pass, job: Job, blocked: frozenset[int], route: Route | None) -> Placement | None:
    """``job``'s placement off the hosts that already hold half of its spread group (with it
    counted, rounded up): two jobs of a group go to two hosts, and no host failure takes more
    than half of a group that other hosts have room for. None: there is no such placement
    now (or nothing to keep apart from), and the caller places the job as any job."""
    held = _spread_hosts(p).get(job.spread)
    if not held:
        return None
    cap = (sum(held.values()) + 2) // 2  # half of the group with ``job`` in it, rounded up
    full = frozenset(h for h, n in held.items() if n >= cap)
    if not full:
        return None
    placement, _, _ = _place(p, job.gang, blocked | full, (), route)
    if placement is not None:
        why = f"kept off {len(full)} host(s) holding half of {job.spread}"
        placement = replace(placement, notes=(*placement.notes, why))
    return placement


def _spread_hosts(p: _Pass) -> dict[str, Counter[int]]:
    """Jobs per host per spread group among the running ones (made once a pass; ``_bind``
    adds what it binds)."""
    if p.spread is None:
        p.spread = {}
        for run in p.running.values():
            if run.job.spread:
                _count_spread(p.spread, run.job.spread, run.allocation.grants)
    return p.spread


def _count_spread(spread: dict[str, Counter[int]], group: str, grants: Iterable[Grant]) -> None:
    spread.setdefault(group, Counter()).update({g.host for g in grants})


_NO_QUOTA = Verdict(True, 0, "")  # every job's verdict where there are no quotas


def _admit(p: _Pass, job: Job, placement: Placement) -> Verdict:
    """Check the placement's GPUs per pool against the job's queue's burst limits."""
    if p.quota is None:
        return _NO_QUOTA
    return admit(p.quota, p.holdings, job.queue, _demand(p, placement))


def holdings_of(tree: TopologyTree, running: Iterable[Running]) -> dict[str, dict[str, int]]:
    """GPUs held per leaf queue and pool by ``running``."""
    out: dict[str, dict[str, int]] = {}
    for r in running:
        count_holding(out, tree, r)
    return out


def count_holding(held: dict[str, dict[str, int]], tree: TopologyTree, run: Running) -> None:
    """Add ``run``'s GPUs to ``held`` (per leaf queue and pool), in place."""
    pools = held.setdefault(run.job.queue, {})
    for pool, gpus in gpus_by_pool(tree, run.allocation.grants).items():
        pools[pool] = pools.get(pool, 0) + gpus


def gpus_by_pool(tree: TopologyTree, grants: Iterable[Grant]) -> dict[str, int]:
    """GPUs per pool name held by ``grants`` (what quotas count; a share of a GPU counts as
    one, so shares never let a queue past its quota)."""
    out: dict[str, int] = {}
    pool_name = tree.host_lists.pool_name
    for g in grants:
        if g.gpus or g.share is not None:
            name = pool_name[g.host]
            out[name] = out.get(name, 0) + (len(g.gpus) or 1)
    return out


def _demand(p: _Pass, placement: Placement) -> dict[str, int]:
    return gpus_by_pool(p.work.tree, placement.grants)


def _bind(
    p: _Pass,
    job: Job,
    placement: Placement,
    position: int,
    replicas: int | None = None,
    note: str = "",
    runtime: float | None = None,
    borrowed: int = 0,
) -> None:
    runtime = runtime if runtime is not None else job.expected_runtime()
    end = p.now + runtime if runtime is not None else None
    grants = placement.grants
    p.work.allocate(Allocation(job.id, grants, end, job.priority))
    if job.spread:
        _count_spread(_spread_hosts(p), job.spread, grants)
    p.open_gpus = None
    p.last_host = None  # the caller re-arms it for a plain one-host bind
    _charge(p, job, grants)
    p.binds.append(Bind(job.id, placement, replicas, borrowed, note, position))


def _preempt(
    p: _Pass, job: Job, position: int, blocked: frozenset[int], seeker: Job | None = None
) -> tuple[bool, tuple[str, ...]]:
    """Evict or shrink the cheapest victims that free a topology-valid placement, when the
    work they lose is less than the job's GPU time spent waiting. Returns (started, reasons).

    ``seeker``: a job of shares looks for victims as this job of whole GPUs (its size, its
    class, its standing), then takes its shares on what they free (``_shares_after``). In
    a pass nobody reads the reasons of, a spent churn budget (``_churn_spent``) answers at
    once: no search could find victims, and none of the pass's later ones either."""
    finder = seeker or job
    if _bumps_nobody(p, finder.priority) or (not p.explain and _churn_spent(p)):
        return False, ()
    standing = _standing(p, finder)
    alive = _alive(p, standing)
    reclaim = frozenset(r.job.id for r in alive.borrowing if _is_owed(p, finder, r))
    mine = standing_of(finder, standing)
    if not reclaim and not alive.any_below(mine):
        return False, ()  # nothing it may bump: nothing of lower standing, nothing owed to it
    if p.preempt_attempts <= 0:
        return False, ("preemption not tried: this pass's preemption attempts are used up",)
    p.preempt_attempts -= 1
    if not reclaim and not p.explain and not alive.any_bumpable(mine):
        return False, ()  # every job below it is a peer its checkpoint window shields
    if not p.explain and not _room_for_gain(p, finder, alive, reclaim):
        return False, ()  # every victim set a search finds is short or bumps a peer unpaid
    with p.work.fenced(blocked):
        found = find_victims(
            p.work,
            finder,
            alive.jobs,
            p.rules,
            p.now,
            p.recent,
            reclaim,
            alive.borrowers,
            standing,
            p.explain,
            alive.screens,
        )
    if isinstance(found, NoVictims):
        return False, found.reasons
    if not found.jobs and not found.shrink:
        return False, ()
    las = p.policy.ordering == Ordering.LAS
    wait = None if las else _wait(p, finder)  # Tiresias uses no estimates
    worth, sentence = _worth(p, found, finder, wait, reclaim)
    if not worth:
        return False, (sentence,)
    placement = found.placement if seeker is None else _shares_after(p, job, found, blocked)
    if placement is None:
        return False, ()
    verdict = _admit(p, job, placement)
    if not verdict.ok:
        return False, (verdict.reason,)
    _evict(p, job, found)
    note = "; ".join((sentence, *found.explanation))
    _bind(p, job, placement, position, note=note, borrowed=verdict.borrowed)
    return True, ()


def _worth(
    p: _Pass, found: Victims, job: Job, wait: float | None, reclaim: frozenset[str]
) -> tuple[bool, str]:
    """Whether evicting ``found`` for ``job`` pays: across classes, when the work lost is
    less than the job's time waiting (``preemption_worth_it``); when any victim is of the
    job's own class and not borrowing from its queue (``reclaim``), under the policy's bump
    rule (``worth_bumping``) as well."""
    worth, sentence = preemption_worth_it(found, job, wait)
    rule = p.policy.bump
    if rule is None or not worth:
        return worth, sentence
    peers = [
        p.running[v]
        for v in found.jobs
        if p.running[v].job.priority == job.priority and v not in reclaim
    ]
    if not peers:
        return worth, sentence
    return worth_bumping(peers, job, p.now, rule)


def _room_for_gain(p: _Pass, job: Job, alive: _Alive, reclaim: frozenset[str]) -> bool:
    """Whether some running job may be in a search's answer for ``job`` that passes
    ``_worth``, and the GPUs free now and those of every such job add up to ``job``'s GPUs
    (``bump.Margins.room``: open to bumps, and owed to its queue (``reclaim``), of a less
    important class, or a peer the bump rule lets go). False: any answer a search finds names
    victims (a job that places as things are gets none, and ``_preempt`` says no), and they
    free too little or include one refused or one the rule keeps; the search can be skipped.
    Always True without a bump rule."""
    rule, margins = p.policy.bump, alive.margins
    if rule is None or margins is None or alive.among is None:
        return True
    count, gpus = margins.room(job, needs_s(job, p.now), rule, reclaim, alive.among)
    return count > 0 and p.work.free_gpus + gpus >= job.gpus


def _shares_after(p: _Pass, job: Job, found: Victims, blocked: frozenset[int]) -> Placement | None:
    """Where ``job``'s shares go once ``found`` are evicted (off ``blocked`` hosts); None
    when they would still not fit."""
    freed = release_victims(p.work, found)
    with freed.fenced(blocked):
        plan = place_shares(freed, job.gang)
    return None if plan.grants is None else as_placement(freed, job.id, job.gang, plan)


@dataclass(frozen=True)
class _Alive:
    """The running jobs that still hold their allocations in a pass, as its victim searches
    see them (``_alive``): ``borrowing`` those on borrowed quota (``borrowers`` their ids),
    ``least`` the least important standing among them (None: there are none), ``reachable``
    the same with every job that the peer window shields from jobs of its own class
    (``PreemptRules.peer_window_s``) standing below its tiers, ``screens`` what the
    searches made of them so far, ``margins`` the pass's running jobs as the bump rule reads
    them (None without one; ``_room_for_gain``) and ``among`` which of them these are."""

    jobs: list[Running]
    borrowing: list[Running]
    borrowers: frozenset[str]
    least: tuple[int, ...] | None
    reachable: tuple[int, ...] | None
    screens: Screens
    margins: Margins | None = None
    among: BoolArray | None = None

    def any_below(self, mine: tuple[int, ...]) -> bool:
        """Whether one of the jobs stands lower (is less important) than ``mine``."""
        return self.least is not None and self.least > mine

    def any_bumpable(self, mine: tuple[int, ...]) -> bool:
        """Whether one of the jobs stands lower than ``mine`` and no peer window shields it
        from a job of standing ``mine``: a victim search can find one."""
        return self.reachable is not None and self.reachable > mine


def _alive(p: _Pass, standing: dict[str, tuple[int, ...]] | None) -> _Alive:
    """The pass's ``_Alive``, made at its first victim search and again after an eviction
    (``_evict`` drops it): jobs started in between are no victims and change none of it, and
    the running jobs' ``standing`` is the same at every search of a pass."""
    if p.alive is None:
        jobs = [r for r in p.running.values() if r.job.id in p.work.allocations]
        borrowing = [r for r in jobs if r.borrowed]
        marks = [standing_of(r.job, standing) for r in jobs]
        least = max(marks, default=None)
        window = p.rules.peer_window_s
        if window is not None:  # a shielded job stands below every tier of its own class
            shielded = [not saved_within(r, p.now, window) for r in jobs]
            marks = [(m[0], -1) if s else m for m, s in zip(marks, shielded, strict=True)]
        reachable = max(marks, default=None)
        borrowers = frozenset(r.job.id for r in borrowing)
        margins = None if p.policy.bump is None else _margins(p)
        among = None if margins is None else margins.holding(p.work.allocations)
        p.alive = _Alive(jobs, borrowing, borrowers, least, reachable, Screens(), margins, among)
    return p.alive


def _bumps_nobody(p: _Pass, priority: int) -> bool:
    """Whether a job of class ``priority`` (or a less important one) can bump nobody for
    sure, known without a scan of the running jobs: ranked by class alone (not LAS), nothing
    borrows, and no running job is of a lower class (``max_class`` is taken when the pass
    begins; evictions only lower it)."""
    if _finer(p.policy) is not None or p.borrowing:
        return False
    return p.max_class is None or priority >= p.max_class


def _rules(policy: Policy) -> PreemptRules:
    """The policy's preemption rules; shrinking elastic victims only where it uses elasticity."""
    rules = policy.preempt_rules
    return rules if policy.elastic or not rules.shrink else replace(rules, shrink=False)


def _wait(p: _Pass, job: Job) -> float | None:
    """Seconds until ``job`` could start without preempting, if running jobs end as expected."""
    later = when_and_where(p.work, job.gang, p.now, p.explain)
    return later.start_time - p.now if later.start_time is not None else None


def _standing(p: _Pass, job: Job) -> dict[str, tuple[int, ...]] | None:
    """Under a finer standing than class (``_finer``) a job stands at (class, level), so a job
    of a lower level may preempt one of its class at a higher level: under Tiresias (LAS
    ordering) the level is its attained-service queue, under bumping the tier of its time
    left; otherwise None (class)."""
    standing = _running_standing(p)
    if standing is not None:
        standing[job.id] = _own_standing(p.policy, job, p.now)
    return standing


def _own_standing(
    policy: Policy, job: Job, now: float, started: float | None = None
) -> tuple[int, int]:
    """``job``'s (class, level) under ``policy``'s finer standing (``started``: when its
    current run began, None while it waits)."""
    if policy.ordering == Ordering.LAS:
        return (job.priority, las_queue(job, policy, now, started))
    return bump_standing(job, now, started)


def _running_standing(p: _Pass) -> dict[str, tuple[int, ...]] | None:
    """Under a finer standing (``_finer``), the pass's standings (``_standing``), made with
    the running jobs' at its first use; otherwise None."""
    if _finer(p.policy) is None:
        return None
    if p.standing is None and p.policy.ordering != Ordering.LAS:  # tiers of time left
        left = _margins(p).left
        p.standing = {r.job.id: (r.job.priority, tier(left[r.job.id])) for r in p.running.values()}
    if p.standing is None:  # the running jobs' standings, once per pass
        policy, now = p.policy, p.now
        p.standing = {
            r.job.id: _own_standing(policy, r.job, now, r.start_time) for r in p.running.values()
        }
    return p.standing


def _margins(p: _Pass) -> Margins:
    """The pass's running jobs as bumping reads them (``bump.Margins``), once per pass."""
    if p.margins is None:
        p.margins = Margins(p.running.values(), p.now, p.rules)
    return p.margins


def _is_owed(p: _Pass, job: Job, victim: Running) -> bool:
    """Whether ``job``'s queue is owed capacity that ``victim`` (borrowing) may be holding."""
    if p.quota is None or victim.job.queue == job.queue:
        return False
    pools = {p.work.tree.pool_of(g.host).name for g in victim.allocation.grants if g.gpus}
    return any(reclaimable_for(p.quota, p.holdings, job.queue, pool) > 0 for pool in pools)


def _evict(p: _Pass, job: Job, found: Victims) -> None:
    """Release the victims from the pass's state and record the evictions (and shrinks),
    charging the preemption budget; the caller then binds ``job`` like any other bind."""
    p.work = release_victims(p.work, found)
    p.open_gpus = None
    p.alive = None
    for victim in (*found.jobs, *found.shrink):
        run = p.running[victim]
        freed = run.allocation.grants if victim in found.jobs else found.dropped.get(victim, ())
        gpus = sum(len(g.gpus) for g in freed)
        lost = (
            run.lost_gpu_seconds(p.now)
            if victim in found.jobs
            else (gpus * run.job.restart_overhead)
        )
        p.recent.append((p.now, gpus))
        keep = () if victim in found.jobs else _kept(run.allocation.grants, freed)
        p.evictions.append(Evict(victim, job.id, lost, found.shrink.get(victim), keep))
        held = p.holdings.get(run.job.queue, {})
        for g in freed:
            if g.gpus:
                name = p.work.tree.pool_of(g.host).name
                held[name] = held.get(name, 0) - len(g.gpus)


def _charge(p: _Pass, job: Job, grants: tuple[Grant, ...]) -> None:
    """Count ``grants``' GPUs per pool in what ``job``'s queue holds."""
    held = p.holdings.setdefault(job.queue, {})
    for pool, gpus in gpus_by_pool(p.work.tree, grants).items():
        held[pool] = held.get(pool, 0) + gpus


def _kept(grants: tuple[Grant, ...], freed: tuple[Grant, ...]) -> tuple[Grant, ...]:
    """The grants a shrunk job keeps: all it held but the ``freed`` ones."""
    gone = set(freed)
    return tuple(g for g in grants if g not in gone)


def _grow(p: _Pass) -> list[Resize]:
    """Grow running elastic jobs (``core/elastic.py``) when no job is left waiting; each
    growth is admitted against its queue's quota and charged like a bind."""
    kept = []
    waiting = len(p.waiting) + p.unseen
    for resize in grow(p.work, tuple(p.running.values()), p.policy, p.now, waiting):
        job = p.running[resize.job].job
        if not _admit(p, job, resize.added).ok:
            continue
        p.work.allocate(Allocation(growth_id(resize.job), resize.added.grants))
        _charge(p, job, resize.added.grants)
        kept.append(resize)
    return kept


def reservation_depth(policy: Policy) -> int:
    """How many waiting jobs a full pass reserves a start for: none without backfill, the
    head job under EASY, ``policy.reservations`` under conservative backfill."""
    if policy.backfill == Backfill.NONE:
        return 0
    return 1 if policy.backfill == Backfill.EASY else policy.reservations


def _may_reserve(p: _Pass) -> bool:
    return len(p.reservations) < reservation_depth(p.policy)


def _reserve(p: _Pass, job: Job, position: int, reasons: tuple[str, ...]) -> bool:
    """Reserve the earliest start for ``job`` that no earlier reservation's hosts block."""
    decision = _earliest_unreserved(p, job.gang)
    if decision is None:
        return False
    _promise(p, job, position, decision, reasons)
    return True


def _earliest_unreserved(p: _Pass, gang: Gang) -> Decision | None:
    """When and where ``gang`` starts earliest outside every reservation's hosts, when that
    is later than now (None: now, or never)."""
    with p.work.fenced(_fences(p).before(None)):
        decision = when_and_where(p.work, gang, p.now, p.explain)
    if decision.outcome != Outcome.LATER or decision.placement is None:
        return None
    return decision


def _promise(
    p: _Pass, job: Job, position: int, decision: Decision, reasons: tuple[str, ...]
) -> None:
    """Reserve ``decision``'s start and placement for ``job``, which waits for it."""
    assert decision.placement is not None
    start = decision.start_time if decision.start_time is not None else p.now
    hosts = frozenset(g.host for g in decision.placement.grants)
    p.reservations.append(Reserve(job.id, start, decision.placement, hosts))
    when = span(max(start - p.now, 0.0))
    detail = (*reasons, f"reserved: starts in {when} (as of this pass) on {len(hosts)} host(s)")
    p.waiting.append(Waiting(job.id, position, WaitReason.RESERVED, detail, start, "reservation"))


def _waits_for_tight(
    p: _Pass, job: Job, placement: Placement, position: int, may_reserve: bool
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
    if runtime is None or (may_reserve and not _may_reserve(p)):
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


def _overdue(p: _Pass, jobs: Iterable[str]) -> bool:
    """Whether one of ``jobs`` runs past its expected end: when it ends is then unknown, so
    a start that waits for it is no promise (and waiting could go on for ever)."""
    for job in jobs:
        held = p.work.allocations.get(job)
        if held is not None and held.expected_end is not None and held.expected_end <= p.now:
            return True
    return False


def _classify(p: _Pass, job: Job, blocked: frozenset[int]) -> WaitReason:
    free = _open_gpus(p)
    if blocked and free >= job.gpus:
        placement, _, _ = _place(p, job.gang, frozenset())
        if placement is not None:
            return WaitReason.RESERVATION
    return WaitReason.TOPOLOGY if free >= job.gpus else WaitReason.CAPACITY


def _hopeless(p: _Pass, job: Job, may_reserve: bool) -> bool:
    """Whether, in a pass nobody reads the reasons of, ``job`` can only wait and needs no
    look (``_cannot_start``)."""
    if p.explain:
        return False
    return _cannot_start(p, job.gpus, job.priority, _own_path(p.policy, job), may_reserve)


def _cannot_start(p: _Pass, gpus: int, priority: int, own_path: bool, may_reserve: bool) -> bool:
    """Whether a job of ``gpus`` GPUs and class ``priority`` cannot start in this pass, known
    without a look at it: it wants more GPUs than are free on every host taking work
    together, so it cannot start or start smaller; it can bump nobody; no reservation is left
    to give; and it takes no path of its own (``_own_path``)."""
    if own_path or gpus <= _open_gpus(p):
        return False
    if p.policy.preemption and not _bumps_nobody(p, priority):
        return False
    return not (may_reserve and _may_reserve(p))


def _own_path(policy: Policy, job: Job) -> bool:
    """Whether ``job`` is placed by a path of its own: a restart on GPUs held for it, or an
    elastic start at a smaller size."""
    return job.held is not None or (policy.elastic and job.elastic is not None)


def _open_gpus(p: _Pass) -> int:
    """Free GPUs on hosts that take work, counted once per change of the pass's state (every
    change goes through ``_bind``, ``_evict`` or a restart hold, which clear the count)."""
    if p.open_gpus is None:
        p.open_gpus = int(p.work.host_free[~p.work.cordoned].sum())
    return p.open_gpus


def _estimate(p: _Pass, job: Job) -> float | None:
    """When-and-where start for the first few waiting jobs (bounded work per pass)."""
    if p.estimates_left <= 0:
        return None
    p.estimates_left -= 1
    decision = when_and_where(p.work, job.gang, p.now, p.explain)
    return decision.start_time if decision.outcome == Outcome.LATER else None


def _start_smaller(p: _Pass, job: Job, position: int, blocked: frozenset[int]) -> bool:
    """Start an elastic job below its requested size when that finishes sooner than waiting.

    Sizes go down from the request to ``elastic[0]`` replicas; the first that fits now is
    compared with waiting for the full size (when-and-where): with runtime ``T`` at full size
    ``R``, starting ``r`` replicas now finishes at ``now + T * R / r``, waiting at
    ``start_full + T``. A job with no runtime estimate starts small.
    """
    assert job.elastic is not None
    full = job.gang.roles[0].replicas
    for replicas in range(full - 1, max(job.elastic[0], 1) - 1, -1):
        smaller = job.gang.resized(replicas)
        placement, _, _ = _place(p, smaller, blocked)
        if placement is None:
            continue
        runtime = job.expected_runtime()
        note = f"elastic start at {replicas} of {full} replicas"
        if runtime is not None:
            later = when_and_where(p.work, job.gang, p.now, p.explain)
            start_full = later.start_time if later.outcome == Outcome.LATER else None
            finish_small = p.now + runtime * full / replicas
            if start_full is not None and start_full + runtime <= finish_small:
                return False
            if start_full is not None:
                note += (
                    f": finishes in {span(finish_small - p.now)} instead of "
                    f"{span(start_full + runtime - p.now)} waiting for all {full}"
                )
        verdict = _admit(p, job, placement)
        if not verdict.ok:
            return False
        scaled = runtime * full / replicas if runtime is not None else None
        _bind(p, job, placement, position, replicas, note, scaled, verdict.borrowed)
        return True
    return False


__all__ = [
    "Bind",
    "CycleResult",
    "Evict",
    "Reserve",
    "Snapshot",
    "Waiting",
    "reservation_depth",
    "run_cycle",
    "schedule_arrival",
]

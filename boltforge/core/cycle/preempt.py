"""Preemption: victims for a blocked job, whether evicting them pays, and the eviction.

Contract. ``preempt`` runs only under a policy with preemption. It reads the running jobs
that still hold their allocations (``_alive``), their standing (class, or a finer level under
LAS or bumping: ``_standing``), the churn budget (``recent``) and ``preempt_attempts`` (it
spends one per search); it finds the cheapest victims (``core/preempt/``), weighs them
(``_worth``), and when that pays evicts them (``_evict``: released from ``work``, uncharged
from ``holdings``, appended to ``evictions`` and ``recent``) and binds the job. It returns
whether the job started and, if not, why. ``bumps_nobody`` and ``bumps_none_of`` answer,
without a search, that no job of a class (and standing) can bump anyone; in a pass nobody
reads the reasons of, ``_room_for_gain`` answers that no search for this job can end in a
bump that pays (``bump.Margins``, the running jobs' time left, made once per pass).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property

from boltforge.core.cycle.admit import admit_placement
from boltforge.core.cycle.place import bind
from boltforge.core.cycle.state import PassState
from boltforge.core.decisions import Evict
from boltforge.core.model.state import Grant
from boltforge.core.model.topology import BoolArray
from boltforge.core.model.workload import Job, Running
from boltforge.core.placement.answers import Placement
from boltforge.core.placement.modes import when_and_where
from boltforge.core.policy import Ordering, Policy
from boltforge.core.preempt.bump import TIERS, BumpRule, Margins, needs_s, worth_bumping
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
from boltforge.core.preempt.victims import PreemptRules, saved_within, standing_of
from boltforge.core.queueing.ordering import las_queue
from boltforge.core.queueing.quota import reclaimable_for
from boltforge.core.sharing.place import as_placement, place_shares


def preempt(
    p: PassState, job: Job, position: int, blocked: frozenset[int], seeker: Job | None = None
) -> tuple[bool, tuple[str, ...]]:
    """Evict or shrink the cheapest victims that free a topology-valid placement, when the
    work they lose is less than the job's GPU time spent waiting. Returns (started, reasons).

    ``seeker``: a job of shares looks for victims as this job of whole GPUs (its size, its
    class, its standing), then takes its shares on what they free (``_shares_after``). In
    a pass nobody reads the reasons of, a spent churn budget (``_churn_spent``) answers at
    once: no search could find victims, and none of the pass's later ones either."""
    finder = seeker or job
    if bumps_nobody(p, finder.priority) or (not p.explain and _churn_spent(p)):
        return False, ()
    standing = _standing(p, finder)
    alive = _alive(p, standing)
    reclaim = _owed_to(p, finder, alive)
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
    verdict = admit_placement(p, job, placement)
    if not verdict.ok:
        return False, (verdict.reason,)
    _evict(p, job, found)
    note = "; ".join((sentence, *found.explanation))
    bind(p, job, placement, position, note=note, borrowed=verdict.borrowed)
    return True, ()


def _worth(
    p: PassState, found: Victims, job: Job, wait: float | None, reclaim: frozenset[str]
) -> tuple[bool, str]:
    """Whether evicting ``found`` for ``job`` pays: across classes, when the work lost is
    less than the job's time waiting (``preemption_worth_it``); when any victim is of the
    job's own class and not borrowing from its queue (``reclaim``), under the policy's bump
    rule (``worth_bumping``) as well."""
    worth, sentence = preemption_worth_it(found, job, wait)
    rule = bump_rule(p.policy)
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


def _room_for_gain(p: PassState, job: Job, alive: Alive, reclaim: frozenset[str]) -> bool:
    """Whether some running job may be in a search's answer for ``job`` that passes
    ``_worth``, and the GPUs free now and those of every such job add up to ``job``'s GPUs
    (``bump.Margins.room``: open to bumps, and owed to its queue (``reclaim``), of a less
    important class, or a peer the bump rule lets go). False: any answer a search finds names
    victims (a job that places as things are gets none, and ``preempt`` says no), and they
    free too little or include one refused or one the rule keeps; the search can be skipped.
    Always True without a bump rule."""
    rule, margins = bump_rule(p.policy), alive.margins
    if rule is None or margins is None or alive.among is None:
        return True
    count, gpus = margins.room(job, needs_s(job, p.now), rule, reclaim, alive.among)
    return count > 0 and p.work.free_gpus + gpus >= job.gpus


def _shares_after(
    p: PassState, job: Job, found: Victims, blocked: frozenset[int]
) -> Placement | None:
    """Where ``job``'s shares go once ``found`` are evicted (off ``blocked`` hosts); None
    when they would still not fit."""
    freed = release_victims(p.work, found)
    with freed.fenced(blocked):
        plan = place_shares(freed, job.gang)
    return None if plan.grants is None else as_placement(freed, job.id, job.gang, plan)


@dataclass(frozen=True)
class Alive:
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
    pools_of: dict[str, frozenset[str]] = field(default_factory=dict)  # of each borrower's GPUs

    @cached_property
    def pools(self) -> frozenset[str]:
        """The pools where some job borrows."""
        return frozenset().union(*self.pools_of.values())

    def any_below(self, mine: tuple[int, ...]) -> bool:
        """Whether one of the jobs stands lower (is less important) than ``mine``."""
        return self.least is not None and self.least > mine

    def any_bumpable(self, mine: tuple[int, ...]) -> bool:
        """Whether one of the jobs stands lower than ``mine`` and no peer window shields it
        from a job of standing ``mine``: a victim search can find one."""
        return self.reachable is not None and self.reachable > mine


def _alive(p: PassState, standing: dict[str, tuple[int, ...]] | None) -> Alive:
    """The pass's ``Alive``, made at its first victim search and again after an eviction
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
        margins = None if bump_rule(p.policy) is None else _margins(p)
        among = None if margins is None else margins.holding(p.work.allocations)
        pools_of = {r.job.id: _pools(p, r) for r in borrowing}
        p.alive = Alive(
            jobs, borrowing, borrowers, least, reachable, Screens(), margins, among, pools_of
        )
    return p.alive


def bumps_nobody(p: PassState, priority: int) -> bool:
    """Whether a job of class ``priority`` (or a less important one) can bump nobody for
    sure, known without a scan of the running jobs: ranked by class alone (not LAS), nothing
    borrows, and no running job is of a lower class (``max_class`` is taken when the pass
    begins; evictions only lower it)."""
    if finer_levels(p.policy) is not None or p.borrowing:
        return False
    return p.max_class is None or priority >= p.max_class


def bumps_none_of(p: PassState, priority: int, mark: tuple[int, ...]) -> bool:
    """Whether no waiting job of class ``priority`` and standing ``mark`` or less important
    ones can bump anybody in this pass: ``bumps_nobody``, or the pass's preemption attempts
    are used up, or no running job borrows or stands lower than ``mark`` (``preempt``
    returns before a search for each of them), or the churn budget is spent and every
    victim would free a GPU (each search finds nothing)."""
    if bumps_nobody(p, priority) or p.preempt_attempts <= 0 or _churn_spent(p):
        return True
    alive = _alive(p, _running_standing(p))
    return not alive.borrowing and not alive.any_bumpable(mark)


def _churn_spent(p: PassState) -> bool:
    """Whether the churn budget is spent (``churn_note``) and every grant of every running
    job holds a GPU, so that no victim search of the pass finds any (``find_victims``).
    The budget is counted again only when the pass preempted since (a pass only ever adds
    to ``recent``)."""
    if p.churn is None or p.churn[0] != len(p.recent):
        churn = churn_note(p.work, p.rules, p.recent, p.now)
        p.churn = (len(p.recent), spent_for_all(churn, p.running.values()))
    return p.churn[1]


def preempt_rules(policy: Policy) -> PreemptRules:
    """The policy's preemption rules; shrinking elastic victims only where it uses elasticity
    (the defaults under a policy that never preempts, which no search then reads)."""
    if policy.preemption is None:
        return PreemptRules()
    rules = policy.preemption.rules
    return rules if policy.elastic is not None or not rules.shrink else replace(rules, shrink=False)


def bump_rule(policy: Policy) -> BumpRule | None:
    """The policy's rule for bumping a running job of the waiting job's own class (None: it
    preempts across classes only, or never)."""
    return None if policy.preemption is None else policy.preemption.bump


def _wait(p: PassState, job: Job) -> float | None:
    """Seconds until ``job`` could start without preempting, if running jobs end as expected."""
    later = when_and_where(p.work, job.gang, p.now, p.explain)
    return later.start_time - p.now if later.start_time is not None else None


def finer_levels(policy: Policy) -> int | None:
    """How many levels a class splits into when a policy ranks standing finer than class:
    LAS queues under Tiresias, tiers of time left under bumping; None: class alone."""
    if policy.order.by == Ordering.LAS:
        return len(policy.order.las_thresholds) + 1
    return TIERS if bump_rule(policy) is not None else None


def _standing(p: PassState, job: Job) -> dict[str, tuple[int, ...]] | None:
    """Under a finer standing than class (``finer_levels``) a job stands at (class, level), so a job
    of a lower level may preempt one of its class at a higher level: under Tiresias (LAS
    ordering) the level is its attained-service queue, under bumping the tier of its time
    left; otherwise None (class)."""
    standing = _running_standing(p)
    if standing is not None:
        standing[job.id] = own_standing(p.policy, job, p.now)
    return standing


def own_standing(
    policy: Policy, job: Job, now: float, started: float | None = None
) -> tuple[int, int]:
    """``job``'s (class, level) under ``policy``'s finer standing (``started``: when its
    current run began, None while it waits)."""
    if policy.ordering == Ordering.LAS:
        return (job.priority, las_queue(job, policy, now, started))
    return bump_standing(job, now, started)


def _running_standing(p: PassState) -> dict[str, tuple[int, ...]] | None:
    """Under a finer standing (``finer_levels``), the pass's standings (``_standing``), made with
    the running jobs' at its first use; otherwise None."""
    if finer_levels(p.policy) is None:
        return None
    if p.standing is not None:  # the running jobs' standings, once per pass
        return p.standing
    runs = p.running.values()
    if p.policy.ordering == Ordering.LAS:
        p.standing = {r.job.id: own_standing(p.policy, r.job, p.now, r.start_time) for r in runs}
    else:  # bumping: the tier of each one's time left, as the pass's margins have it
        p.standing = _margins(p).standing()
    return p.standing


def _margins(p: PassState) -> Margins:
    """The pass's running jobs as bumping reads them (``bump.Margins``), once per pass."""
    if p.margins is None:
        p.margins = Margins(p.running.values(), p.now, p.rules)
    return p.margins


def _pools(p: PassState, run: Running) -> frozenset[str]:
    """The pools where ``run`` holds GPUs (as it started the pass)."""
    pool_of = p.work.tree.pool_of
    return frozenset(pool_of(g.host).name for g in run.allocation.grants if g.gpus)


def _owed_to(p: PassState, job: Job, alive: Alive) -> frozenset[str]:
    """The borrowing jobs ``job``'s queue may reclaim from: those of other queues holding
    GPUs in a pool where its queue is owed capacity (``reclaimable_for``: guaranteed there
    and not held). Each pool is asked once per search, and each job's pools once per
    ``Alive``."""
    if p.quota is None or not alive.borrowing:
        return frozenset()
    quota, holdings = p.quota, p.holdings
    owed = {pool for pool in alive.pools if reclaimable_for(quota, holdings, job.queue, pool) > 0}
    if not owed:
        return frozenset()
    pools = alive.pools_of
    return frozenset(
        r.job.id
        for r in alive.borrowing
        if r.job.queue != job.queue and not owed.isdisjoint(pools[r.job.id])
    )


def _evict(p: PassState, job: Job, found: Victims) -> None:
    """Release the victims from the pass's state and record the evictions (and shrinks),
    charging the preemption budget; the caller then binds ``job`` like any other bind.

    A victim's grants are those it holds on the pass's state, not those it started the pass
    with: a job shrunk earlier in the pass keeps (or frees) only what that shrink left it."""
    held_now = {v: p.work.allocations[v].grants for v in (*found.jobs, *found.shrink)}
    p.work = release_victims(p.work, found)
    p.open_gpus = None
    p.alive = None
    for victim in (*found.jobs, *found.shrink):
        run = p.running[victim]
        grants = held_now[victim]
        freed = grants if victim in found.jobs else found.dropped.get(victim, ())
        gpus = sum(len(g.gpus) for g in freed)
        lost = (
            run.lost_gpu_seconds(p.now)
            if victim in found.jobs
            else (gpus * run.job.restart_overhead)
        )
        p.recent.append((p.now, gpus))
        keep = () if victim in found.jobs else _kept(grants, freed)
        p.evictions.append(Evict(victim, job.id, lost, found.shrink.get(victim), keep))
        held = p.holdings.get(run.job.queue, {})
        for g in freed:
            if g.gpus:
                name = p.work.tree.pool_of(g.host).name
                held[name] = held.get(name, 0) - len(g.gpus)


def _kept(grants: tuple[Grant, ...], freed: tuple[Grant, ...]) -> tuple[Grant, ...]:
    """The grants a shrunk job keeps: all it held but the ``freed`` ones."""
    gone = set(freed)
    return tuple(g for g in grants if g not in gone)

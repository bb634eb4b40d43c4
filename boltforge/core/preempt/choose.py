"""Choose preemption victims that free a topology-valid placement for a job at least cost.

``find_victims`` answers: if ``job`` may displace running work, which jobs should go (or shrink)
so that it places, losing the least work? Candidates come from ``victims`` (class rules,
protections, tiers, costs). Each rack, each pod and the whole fleet that could hold the gang
once its candidates are gone is a *domain option*; ``freeing`` makes room in one domain by
taking candidates in preference order until ``place_gang`` succeeds and pruning what the
placement does not need. Options are compared by tier-weighted lost work, then fewer victims,
then placement cost, then the tighter domain. Domains are tried in order of a lower bound on
their loss (a fractional knapsack over the GPUs needed), and the search stops once no remaining
domain's bound can beat the best option. The churn budget caps the GPUs preempted per window.

``preemption_worth_it`` weighs the lost work against the cost of waiting.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from boltforge.core.model.levels import Level
from boltforge.core.model.state import Allocation, FleetState, Grant
from boltforge.core.model.topology import FloatArray, IntArray
from boltforge.core.model.workload import Job, Running
from boltforge.core.placement.answers import Placement
from boltforge.core.placement.place import domain_column, place_gang
from boltforge.core.preempt.freeing import Domain, Need, Option, Shortfall, free_domain
from boltforge.core.preempt.text import (
    ChurnNote,
    Search,
    explain_option,
    gpu_hours,
    no_victims_reasons,
    span,
)
from boltforge.core.preempt.victims import (
    Action,
    Candidate,
    PreemptRules,
    Screening,
    Standing,
    evict,
    screen,
    shrink,
    shrink_candidates,
    standing_of,
)

__all__ = [
    "NoVictims",
    "PreemptRules",
    "Screens",
    "Victims",
    "churn_note",
    "find_victims",
    "preemption_worth_it",
    "release_victims",
    "spent_for_all",
]

EPS = 1e-6


@dataclass(frozen=True, slots=True)
class Victims:
    """Who to preempt and where the job then goes.

    ``jobs`` are evicted whole; ``shrink`` maps elastic jobs to their new replica count and
    ``dropped`` lists the grants (replicas of the job's first role) to take away, so that the
    caller frees exactly the GPUs the placement was computed on (``release_victims`` does this).
    ``placement`` is valid on the state once that is done. ``lost_gpu_seconds`` is the raw total
    of lost work; ``explanation`` shows the arithmetic in a user's terms.
    """

    jobs: tuple[str, ...]
    shrink: dict[str, int]
    placement: Placement
    lost_gpu_seconds: float
    explanation: tuple[str, ...]
    dropped: dict[str, tuple[Grant, ...]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class NoVictims:
    """Why preemption cannot make room for the job, in a user's terms."""

    reasons: tuple[str, ...]


def find_victims(
    state: FleetState,
    job: Job,
    running: list[Running],
    rules: PreemptRules,
    now: float,
    recent: Sequence[tuple[float, int]] = (),
    reclaim_from: frozenset[str] = frozenset(),
    over_quota: frozenset[str] = frozenset(),
    standing: Standing | None = None,
    explain: bool = True,
    screens: Screens | None = None,
) -> Victims | NoVictims:
    """The least costly set of evictions and shrinks after which ``job`` places on ``state``.

    ``state`` holds the running jobs' allocations (keyed by job id) and ``running`` their
    metadata; jobs without a record are never victims. ``recent`` lists earlier preemptions as
    (time, GPUs) for the churn budget. ``reclaim_from`` names jobs borrowing quota from the
    job's queue (reclaimable regardless of class, class 0 excepted, and preferred first);
    ``over_quota`` names jobs running over their queue's quota (preferred next); ``standing``
    ranks jobs finer than their class (see ``victims``). When the job
    already fits, the answer is ``Victims`` with nothing to preempt. ``explain=False`` leaves
    ``NoVictims.reasons`` empty, and once the churn budget is spent and every running job
    holds GPUs on each of its grants (any victim would free a GPU), answers ``NoVictims``
    without a search, as it does when the gang lacks more GPUs than the budget has left
    (``_lacking``). ``screens`` keeps what the search makes of the running jobs
    for later searches (see ``Screens`` for when it may be passed again). Nothing else passed
    in is changed; equal inputs give equal answers.
    """
    placement, _ = place_gang(state, job.gang)
    if placement is not None:
        return _victims(job, None, placement, Search(), now)
    screens = screens if screens is not None else Screens()
    churn = churn_note(state, rules, recent, now)
    if not explain and spent_for_all(churn, running):
        return NoVictims(())  # every action would free a GPU, and none is left to free
    need = Need.of(state, job.gang)
    if not explain and _lacking(need) > churn.limit - churn.used:
        return NoVictims(())  # every domain lacks more GPUs than the budget has left
    screening, table = screens.of(
        state, job, running, rules, now, reclaim_from, over_quota, standing
    )
    search = _search(state, need, job, table, churn)
    if search.best is None:
        if not explain:
            return NoVictims(())
        return NoVictims(no_victims_reasons(state, job, screening, search, rules))
    return _victims(job, search.best, search.best.placement, search, now)


def churn_note(
    state: FleetState, rules: PreemptRules, recent: Sequence[tuple[float, int]], now: float
) -> ChurnNote:
    """The churn budget at ``now``: GPUs preempted within the window (``recent``, as in
    ``find_victims``) against the most ``rules`` allow on ``state``'s fleet."""
    used = sum(gpus for t, gpus in recent if now - t < rules.churn_window_s)
    limit = math.floor(rules.churn_fraction * state.tree.total_gpus + EPS)
    return ChurnNote(used, limit, rules.churn_window_s)


def spent_for_all(churn: ChurnNote, running: Iterable[Running]) -> bool:
    """Whether the churn budget is spent and every grant of every job in ``running`` holds a
    GPU: evicting or shrinking any of them would free a GPU the budget no longer allows, so
    no victim search can find any."""
    if churn.used < churn.limit:
        return False
    return all(g.gpus for r in running for g in r.allocation.grants)


def release_victims(state: FleetState, victims: Victims) -> FleetState:
    """A copy of ``state`` with the victims evicted and the shrunk jobs' dropped replicas freed."""
    work = state.copy()
    for job in victims.jobs:
        work.release(job)
    for job, grants in victims.dropped.items():
        held = work.release(job)
        drop = set(grants)
        keep = tuple(g for g in held.grants if g not in drop)
        work.allocate(Allocation(held.job, keep, held.expected_end, held.priority))
    return work


def preemption_worth_it(victims: Victims, job: Job, wait_s: float | None) -> tuple[bool, str]:
    """Preempt when the work lost is less than the job's GPU time spent waiting.

    Waiting costs ``job.gpus x wait_s`` GPU-seconds; when the wait is unknown, preempt. Returns
    the decision and the arithmetic as a sentence.
    """
    lost = victims.lost_gpu_seconds
    if not victims.jobs and not victims.shrink:
        return True, "nothing to preempt: it fits now"
    if wait_s is None:
        return True, f"preempting loses {gpu_hours(lost)} GPU-hours; the wait is unknown: preempt"
    waiting = job.gpus * max(wait_s, 0.0)
    worth = lost < waiting
    return worth, (
        f"preempting loses {gpu_hours(lost)} GPU-hours; waiting ~{span(wait_s)} costs "
        f"{gpu_hours(waiting)} GPU-hours of the {job.gpus}-GPU job's time: "
        + ("preempt" if worth else "wait")
    )


class Screens:
    """What ``find_victims`` makes of the running jobs alone, kept for the searches that
    follow on the same jobs: the screening (``screen``) and the candidates' table, once per
    kind of preemptor (its class and standing, the jobs it may reclaim from, the jobs over
    quota) and of ``rules`` and ``now``. One may be passed again while ``running`` and the
    running jobs' standings are the same and those jobs hold the same allocations on the
    state: jobs started in between change nothing here, an eviction or a shrink calls for a
    new one."""

    __slots__ = ("_made",)

    def __init__(self) -> None:
        self._made: dict[tuple[object, ...], tuple[Screening, _Table]] = {}

    def of(
        self,
        state: FleetState,
        job: Job,
        running: list[Running],
        rules: PreemptRules,
        now: float,
        reclaim_from: frozenset[str],
        over_quota: frozenset[str],
        standing: Standing | None,
    ) -> tuple[Screening, _Table]:
        """``screen``'s answer for ``job`` and its table, made at the first call for its kind."""
        itself = job.id if job.id in state.allocations else None  # never its own candidate
        mark = standing_of(job, standing)
        key = (itself, job.priority, mark, standing is None, reclaim_from, over_quota, rules, now)
        made = self._made.get(key)
        if made is None:
            screening = screen(state, job, running, rules, now, reclaim_from, over_quota, standing)
            made = self._made[key] = (screening, _Table.of(screening.candidates, now))
        return made


def _lacking(need: Need) -> int:
    """GPUs the gang lacks even with every free GPU of its usable hosts: no domain lacks
    fewer (``_bounded_domains``' deficits), so every option preempts at least this many."""
    return need.gpus - int(need.free[need.usable].sum())


def _search(state: FleetState, need: Need, job: Job, table: _Table, churn: ChurnNote) -> Search:
    """Evaluate domain options best bound first; stop when no bound can beat the best."""
    search = Search(churn=churn)
    budget = churn.limit - churn.used
    for domain, bound, deficit in _bounded_domains(state, job, need, table, search):
        if search.best is not None and bound > search.best.cost + EPS:
            search.outbid += 1
            continue
        if deficit > budget:
            search.note_churn(churn.used + deficit)
            continue
        actions = _actions(domain, need, table, budget)
        found = _best_in(need, state, domain, table, actions, bound, budget)
        if isinstance(found, Shortfall):
            search.short[found] += 1
        elif found.gpus > budget:
            search.note_churn(churn.used + found.gpus)
        else:
            search.offer(found)
    return search


def _best_in(
    need: Need,
    state: FleetState,
    domain: Domain,
    table: _Table,
    actions: list[Action],
    bound: float,
    budget: int,
) -> Option | Shortfall:
    """Room in one domain: victims in preference order, then, when that left a gap to the
    lower bound (or broke the churn budget), in order of weighted loss per GPU freed there.

    The preference order follows the tiers; the second order can find a cheaper set when a
    costly job of a preferred tier frees many GPUs that cheaper jobs could have freed.
    """
    first = free_domain(need, state, domain, actions)
    if isinstance(first, Shortfall) or (first.cost <= bound + EPS and first.gpus <= budget):
        return first
    gpus = table.gpus_inside(domain, need)

    def value(a: Action) -> tuple[float, tuple[tuple[int, ...], float, int, str]]:
        freed = float(gpus[table.index[a.cand.id]]) if a.evicts else _inside(a, domain, need)
        return round(a.cost / (freed or 1e-9), 9), table.key(a)

    by_value = sorted(actions, key=value)
    second = free_domain(need, state, domain, by_value)
    if isinstance(second, Shortfall):
        return first
    within = [o for o in (first, second) if o.gpus <= budget]
    if not within:
        return min(first, second, key=lambda o: o.gpus)
    return min(within, key=Option.key)


def _inside(action: Action, domain: Domain, need: Need) -> float:
    """GPUs the action frees on the domain's usable hosts (infinitesimal when none)."""
    gpus = sum(len(g.gpus) for g in action.freed if domain.inside[g.host] and need.usable[g.host])
    return float(gpus) or 1e-9


def _levels(job: Job) -> list[Level]:
    """Racks, then pods, then the fleet, as far as the gang's required level allows."""
    required = job.gang.topology.required
    widest = Level.SPINE if required is None else max(required, Level.RACK)
    return [level for level in (Level.RACK, Level.POD, Level.SPINE) if level <= widest]


def _bounded_domains(
    state: FleetState, job: Job, need: Need, table: _Table, search: Search
) -> list[tuple[Domain, float, int]]:
    """Domains that could hold the gang once their candidates go, with a loss lower bound.

    The bound is a fractional knapsack: the GPUs missing in the domain, bought at each
    candidate's cheapest weighted loss per GPU inside the domain (evicting or shrinking).
    Domains too small to hold the gang even when empty are left out. Sorted by bound, then
    tightest domain first.
    """
    tree, cands = state.tree, table.cands
    keep = need.usable[table.hosts] & (table.sizes > 0)  # GPUs on hosts the gang may use
    who, hosts, sizes = table.who[keep], table.hosts[keep], table.sizes[keep]
    evict_cost, shrink_rate = table.evict_cost, table.shrink_rate
    free = np.where(need.usable, need.free, 0)
    size = np.where(need.usable, tree.host_gpus, 0)
    out: list[tuple[Domain, float, int]] = []
    for level in _levels(job):
        column = domain_column(tree, level)
        count = int(column.max()) + 1
        inside = np.zeros((len(cands), count), dtype=np.int64)
        np.add.at(inside, (who, column[hosts]), sizes)
        rate = np.full(inside.shape, np.inf)
        np.divide(evict_cost[:, None], inside, out=rate, where=inside > 0)
        rate = np.minimum(rate, shrink_rate[:, None])
        room = np.bincount(column, weights=free, minlength=count)
        capacity = np.bincount(column, weights=size, minlength=count)
        for d in range(count):
            if capacity[d] < need.gpus or _same_as_narrower(state, level, d):
                continue  # too small even when empty, or already tried as a narrower domain
            deficit = max(0, need.gpus - int(room[d]))
            bound = _knapsack(rate[:, d], inside[:, d], deficit)
            if bound is None:
                search.short[Shortfall.ROOM] += 1
                continue
            domain = Domain(level, d, tree.domain_name(level, d), column == d)
            out.append((domain, bound, deficit))
    out.sort(key=lambda item: (round(item[1], 6), int(item[0].level), item[0].index))
    return out


def _same_as_narrower(state: FleetState, level: Level, index: int) -> bool:
    """A pod of one rack is that rack; a fleet of one pod is that pod: no need to try twice."""
    tree = state.tree
    if level == Level.POD:
        return int((tree.pod_racks[index] >= 0).sum()) == 1
    return level == Level.SPINE and len(tree.pod_names) == 1


def _knapsack(rates: FloatArray, gpus: IntArray, deficit: int) -> float | None:
    """Least cost of ``deficit`` GPUs bought fractionally at ``rates`` (None: too few GPUs)."""
    if deficit <= 0:
        return 0.0
    some = gpus > 0
    rates, gpus = rates[some], gpus[some]
    order = np.argsort(rates, kind="stable")
    rates, gpus = rates[order], gpus[order]
    held = np.cumsum(gpus)
    if not len(held) or held[-1] < deficit:
        return None
    k = int(np.searchsorted(held, deficit))  # first k with held[k] >= deficit
    before = int(held[k - 1]) if k else 0
    return float((rates[:k] * gpus[:k]).sum() + (deficit - before) * rates[k])


@dataclass(frozen=True, slots=True)
class _Table:
    """One search's candidates with their evictions, and the candidate and host of each of
    their grants, so that finding the candidates inside a domain is one array lookup. Read
    only: ``Screens`` hands the same table to several searches."""

    cands: Sequence[Candidate]
    evictions: list[Action]
    keys: list[tuple[tuple[int, ...], float, int, str]]  # each eviction's ``Action.key``
    index: dict[str, int]  # candidate position by job id
    who: IntArray
    hosts: IntArray
    sizes: IntArray  # GPUs
    evict_cost: FloatArray  # each eviction's ``Action.cost``
    shrink_rate: FloatArray  # weighted loss per GPU a shrink frees (inf: it cannot shrink)

    @staticmethod
    def of(cands: Sequence[Candidate], now: float) -> _Table:
        rows = [(i, g.host, len(g.gpus)) for i, c in enumerate(cands) for g in c.grants]
        table = np.array(rows, dtype=np.int64).reshape(-1, 3)
        evictions = [evict(c, now) for c in cands]
        keys = [a.key() for a in evictions]
        index = {c.id: i for i, c in enumerate(cands)}
        evict_cost = np.array([a.cost for a in evictions], dtype=np.float64)
        shrink_rate = np.array(
            [c.run.job.restart_overhead * c.weight if c.spare else np.inf for c in cands],
            dtype=np.float64,
        )
        who, hosts, sizes = table[:, 0], table[:, 1], table[:, 2]
        return _Table(cands, evictions, keys, index, who, hosts, sizes, evict_cost, shrink_rate)

    def key(self, action: Action) -> tuple[tuple[int, ...], float, int, str]:
        """``action.key()``, looked up for an eviction."""
        return self.keys[self.index[action.cand.id]] if action.evicts else action.key()

    def gpus_inside(self, domain: Domain, need: Need) -> FloatArray:
        """Per candidate, its GPUs on the domain's hosts the gang may use."""
        mask = domain.inside[self.hosts] & need.usable[self.hosts]
        found = np.bincount(self.who[mask], weights=self.sizes[mask], minlength=len(self.cands))
        return found.astype(np.float64, copy=False)

    def inside(self, domain: Domain) -> list[int]:
        """The candidates with a grant in ``domain``, in candidate order."""
        found: list[int] = np.unique(self.who[domain.inside[self.hosts]]).tolist()
        return found


def _actions(domain: Domain, need: Need, table: _Table, budget: int) -> list[Action]:
    """Candidates' actions inside ``domain`` (shrink, then evict), in preference order.

    Actions that alone would preempt more GPUs than the churn ``budget`` left are left out.
    """
    out: list[Action] = []
    for i in table.inside(domain):
        cand = table.cands[i]
        if cand.spare > 0:
            drop = shrink_candidates(cand, domain.inside, need.free)
            if drop:
                out.append(shrink(cand, drop))
        out.append(table.evictions[i])
    out = [a for a in out if a.gpus <= budget]
    out.sort(key=table.key)
    return out


def _victims(
    job: Job, option: Option | None, placement: Placement, search: Search, now: float
) -> Victims:
    """The answer for ``option`` (None: the job fits as it is, at ``placement``)."""
    plan = option.plan if option is not None else ()
    jobs = tuple(a.cand.id for a in plan if a.drop is None)
    dropped = {a.cand.id: a.freed for a in plan if a.drop is not None}
    shrunk = {a.cand.id: a.cand.replicas - len(a.drop) for a in plan if a.drop is not None}
    lost = sum(a.lost for a in plan)
    text = explain_option(job, option, placement, search, now)
    return Victims(jobs, shrunk, placement, lost, text, dropped)

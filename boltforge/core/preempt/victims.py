"""Who a job may displace, in what order, and what displacing each one costs.

A running job is a *candidate victim* of a preemptor when the class rules allow it (class 0 is
never preempted; class 1 only by class 0; otherwise only jobs of strictly lower *standing*,
except borrowed work that the preemptor's queue reclaims) and no protection applies
(non-preemptible, inside its minimum runtime, or preempted within the cooldown). A job's
standing is its class, unless the caller ranks jobs finer (Tiresias adds the attained-service
queue after the class). Candidates fall into tiers: reclaimable borrowed work first, then
over-quota work, then lower standing first; within a tier the least lost work goes first. Lost
work is priced by ``Running.lost_gpu_seconds``; removing replicas of an elastic job loses only
the restart overhead of the removed GPUs.

An ``Action`` evicts a candidate or removes some replicas of its first role; a plan (job id to
action) is applied to a copy of the fleet state with ``apply_plan``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum

from boltforge.core.model.state import Allocation, FleetState, Grant
from boltforge.core.model.topology import BoolArray, IntArray
from boltforge.core.model.workload import Job, Running

# Tier weights: a GPU-second of reclaimed borrowed work or of over-quota work counts for less
# than one of in-quota work, and in-quota work of a more important class counts for more.
RECLAIM_WEIGHT = 0.25
OVER_QUOTA_WEIGHT = 0.5
LEAST_CLASS = 3  # classes at or below importance 3 (batch) weigh 1

# Standing per job id, compared as tuples: lower is more important. Jobs missing from the
# mapping stand at ``(class,)``.
Standing = Mapping[str, tuple[int, ...]]


def standing_of(job: Job, standing: Standing | None) -> tuple[int, ...]:
    """``job``'s standing: its entry in ``standing``, else its class alone."""
    if standing is not None and job.id in standing:
        return standing[job.id]
    return (job.priority,)


def class_weight(priority: int) -> float:
    """Weight of in-quota work of class ``priority``: 1 for batch, doubling per class above it."""
    return float(2 ** max(0, LEAST_CLASS - priority))


@dataclass(frozen=True, slots=True)
class PreemptRules:
    """Protections and budgets that bound preemption.

    ``min_runtime_s``: a job that started less than this ago is protected. ``cooldown_s``: a job
    preempted (or, for shrinking, resized) within this window is not touched again. At most
    ``churn_fraction`` of the fleet's GPUs may be preempted per ``churn_window_s``, counting
    the recent preemptions the caller passes in. ``shrink``: elastic jobs may be shrunk
    instead of evicted (off under a policy with elasticity off). ``peer_window_s``: a job of
    the preemptor's own class (reclaims aside) is displaced only within this long of its last
    checkpoint, so bumping a peer (``core/preempt/bump.py``) loses little work; a peer that
    never checkpointed is never displaced (None: no such rule).
    """

    min_runtime_s: float = 600.0
    cooldown_s: float = 3600.0
    churn_fraction: float = 0.05
    churn_window_s: float = 600.0
    shrink: bool = True
    peer_window_s: float | None = None


class Refusal(StrEnum):
    """Why a running job is not a candidate victim."""

    SERVING = "serving"
    PRODUCTION = "production"
    CASCADE = "cascade"
    PINNED = "pinned"
    YOUNG = "young"
    COOLDOWN = "cooldown"
    UNSAVED = "unsaved"
    UNKNOWN = "unknown"


class VictimTier(StrEnum):
    """Preference tiers among candidates, most preferred first."""

    RECLAIM = "reclaim"
    OVER_QUOTA = "over quota"
    CLASS = "class"


@dataclass(frozen=True, slots=True)
class Candidate:
    """A running job the preemptor may displace, with its grants on the current state.

    ``spare`` is how many replicas of the first role (``role``) may be removed by shrinking:
    current replicas minus the elastic minimum, 0 for rigid jobs or when recently resized.
    """

    run: Running
    grants: tuple[Grant, ...]
    tier: VictimTier
    weight: float
    spare: int
    role: str
    standing: tuple[int, ...] = ()

    @property
    def id(self) -> str:
        return self.run.job.id

    @property
    def priority(self) -> int:
        return self.run.job.priority

    @property
    def gpus(self) -> int:
        return sum(len(g.gpus) for g in self.grants)

    @property
    def replicas(self) -> int:
        """Current replicas of the first role (what a shrink counts down from)."""
        return sum(g.role == self.role for g in self.grants)

    def rank(self) -> tuple[int, ...]:
        """Position of this candidate's tier in the preference order (lower goes first)."""
        if self.tier == VictimTier.RECLAIM:
            return (0,)
        if self.tier == VictimTier.OVER_QUOTA:
            return (1,)
        return (2, *(-x for x in self.standing or (self.priority,)))  # lowest standing first


@dataclass(frozen=True, slots=True)
class Action:
    """Evict ``cand`` (``drop`` is None) or remove the replicas numbered ``drop`` of its role."""

    cand: Candidate
    drop: tuple[int, ...] | None
    lost: float

    @property
    def evicts(self) -> bool:
        return self.drop is None

    @property
    def freed(self) -> tuple[Grant, ...]:
        """The grants this action returns to the free pool."""
        if self.drop is None:
            return self.cand.grants
        drop = set(self.drop)
        return tuple(g for g in self.cand.grants if g.role == self.cand.role and g.replica in drop)

    @property
    def gpus(self) -> int:
        """GPUs preempted: the whole job for an eviction, the removed replicas for a shrink."""
        return sum(len(g.gpus) for g in self.freed)

    @property
    def cost(self) -> float:
        """Tier-weighted lost work, the quantity preemption minimizes."""
        return self.lost * self.cand.weight

    def key(self) -> tuple[tuple[int, ...], float, int, str]:
        """Preference order: tier, then least lost work, shrinks before evictions, then id."""
        return (self.cand.rank(), round(self.lost, 6), int(self.evicts), self.cand.id)


def evict(cand: Candidate, now: float) -> Action:
    """Evicting ``cand`` loses the work since its checkpoint plus its restart, on every GPU."""
    return Action(cand, None, cand.run.lost_gpu_seconds(now))


def shrink(cand: Candidate, drop: Iterable[int]) -> Action:
    """Removing replicas loses no checkpointed work: only the removed GPUs' restart overhead."""
    kept = tuple(sorted(drop))
    gpus = sum(len(g.gpus) for g in cand.grants if g.role == cand.role and g.replica in kept)
    return Action(cand, kept, gpus * cand.run.job.restart_overhead)


def refusal(
    run: Running,
    job: Job,
    rules: PreemptRules,
    now: float,
    reclaim_from: frozenset[str],
    standing: Standing | None = None,
) -> Refusal | None:
    """Why ``job`` may not displace ``run`` (None: it may)."""
    victim = run.job
    if victim.priority <= 0:
        return Refusal.SERVING
    if not victim.preemptible:
        return Refusal.PINNED
    if victim.id not in reclaim_from:
        if victim.priority == 1 and job.priority != 0:
            return Refusal.PRODUCTION
        if standing_of(victim, standing) <= standing_of(job, standing):
            return Refusal.CASCADE
    soon = too_soon(run, rules, now)
    if soon is not None:
        return soon
    peer = victim.priority == job.priority and victim.id not in reclaim_from
    if rules.peer_window_s is not None and peer and not saved_within(run, now, rules.peer_window_s):
        return Refusal.UNSAVED
    return None


def too_soon(run: Running, rules: PreemptRules, now: float) -> Refusal | None:
    """Whether ``run`` is protected at ``now`` whoever asks: it started less than the minimum
    runtime ago (``YOUNG``) or was preempted within the cooldown (``COOLDOWN``)."""
    if now - run.start_time < rules.min_runtime_s:
        return Refusal.YOUNG
    if run.last_preempted is not None and now - run.last_preempted < rules.cooldown_s:
        return Refusal.COOLDOWN
    return None


def open_to_bumps(run: Running, rules: PreemptRules, now: float) -> bool:
    """Whether some job could displace ``run`` at ``now`` (``refusal`` refuses every job a
    running job that serves, is pinned or is ``too_soon``)."""
    job = run.job
    return job.priority > 0 and job.preemptible and too_soon(run, rules, now) is None


def saved_within(run: Running, now: float, window: float) -> bool:
    """Whether ``run`` checkpointed no longer than ``window`` before ``now`` (the peer rule:
    ``PreemptRules.peer_window_s``)."""
    saved = run.checkpoint_before(now)
    return saved is not None and now - saved <= window


@dataclass(frozen=True, slots=True)
class Screening:
    """The candidates, and every other running job with why it is left alone. Jobs on the
    state without a ``Running`` record are in neither (``unknown``)."""

    candidates: tuple[Candidate, ...]
    refused: tuple[tuple[str, int, Refusal], ...]  # job id, class, why

    def unknown(self, state: FleetState, job: Job) -> list[tuple[str, int, Refusal]]:
        """The jobs holding resources on ``state`` that this screening (of ``job``'s victims
        there) knows nothing of, in job-id order, each refused as ``UNKNOWN``: nothing is
        known about what evicting them would cost. The preemptor itself is not among them."""
        known = {c.id for c in self.candidates} | {j for j, _, _ in self.refused}
        known.add(job.id)
        held = state.allocations
        return [(j, held[j].priority, Refusal.UNKNOWN) for j in sorted(held) if j not in known]


def screen(
    state: FleetState,
    job: Job,
    running: Iterable[Running],
    rules: PreemptRules,
    now: float,
    reclaim_from: frozenset[str],
    over_quota: frozenset[str],
    standing: Standing | None = None,
) -> Screening:
    """Sort the ``running`` jobs holding resources on ``state`` into candidates and refused
    jobs, each in job-id order. The preemptor itself is never a candidate. The answer
    depends on ``state`` only through those jobs' allocations (``Screening.unknown`` names
    the other jobs there)."""
    by_id = {r.job.id: r for r in running}
    candidates: list[Candidate] = []
    refused: list[tuple[str, int, Refusal]] = []
    held = state.allocations
    for job_id in sorted(j for j in by_id if j in held and j != job.id):
        run = by_id[job_id]
        why = refusal(run, job, rules, now, reclaim_from, standing)
        if why is not None:
            refused.append((job_id, run.job.priority, why))
            continue
        mark = standing_of(run.job, standing)
        candidates.append(_candidate(run, held[job_id], rules, now, reclaim_from, over_quota, mark))
    return Screening(tuple(candidates), tuple(refused))


def _candidate(
    run: Running,
    allocation: Allocation,
    rules: PreemptRules,
    now: float,
    reclaim_from: frozenset[str],
    over_quota: frozenset[str],
    standing: tuple[int, ...],
) -> Candidate:
    victim = run.job
    if victim.id in reclaim_from:
        tier, weight = VictimTier.RECLAIM, RECLAIM_WEIGHT
    elif victim.id in over_quota:
        tier, weight = VictimTier.OVER_QUOTA, OVER_QUOTA_WEIGHT
    else:
        tier, weight = VictimTier.CLASS, class_weight(victim.priority)
    role = victim.gang.roles[0].name if victim.gang.roles else ""
    spare = 0
    resized = run.last_resized is not None and now - run.last_resized < rules.cooldown_s
    if rules.shrink and victim.elastic is not None and not resized:
        current = sum(g.role == role for g in allocation.grants)
        spare = max(0, current - max(victim.elastic[0], 1))
    return Candidate(run, allocation.grants, tier, weight, spare, role, standing)


def apply_plan(state: FleetState, plan: Iterable[Action]) -> FleetState:
    """A copy of ``state`` with each action applied in turn: evictions released (each run
    of them at once, ``FleetState.release_many``), shrinks re-granted."""
    work = state.copy()
    evicted: list[str] = []
    for action in plan:
        if action.drop is None:
            evicted.append(action.cand.id)
            continue
        if evicted:
            work.release_many(evicted)
            evicted = []
        held = work.release(action.cand.id)
        freed = set(action.freed)
        keep = tuple(g for g in held.grants if g not in freed)
        work.allocate(Allocation(held.job, keep, held.expected_end, held.priority))
    if evicted:
        work.release_many(evicted)
    return work


def shrink_candidates(cand: Candidate, inside: BoolArray, free: IntArray) -> list[int]:
    """Replicas of an elastic candidate worth removing to make room in a domain.

    Up to ``spare`` replicas of its first role inside the domain, taken from the hosts that
    would end up freest first (so whole hosts open up), highest replica numbers first.
    """
    mine = [g for g in cand.grants if g.role == cand.role and inside[g.host]]
    on_host: dict[int, int] = {}
    for g in mine:
        on_host[g.host] = on_host.get(g.host, 0) + len(g.gpus)
    mine.sort(key=lambda g: (-(int(free[g.host]) + on_host[g.host]), g.host, -g.replica))
    return [g.replica for g in mine[: cand.spare]]

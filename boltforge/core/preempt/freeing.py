"""Free room for a gang inside one domain: displace candidates in preference order, then prune.

For one domain (a rack, a pod or the whole fleet) the gang is confined to the domain's hosts by
cordoning the rest on a scratch copy of the state. Actions (evictions and shrinks of the
candidates with GPUs in the domain) are taken in preference order until the gang places: a
cheap count of GPUs and replica slots finds the first prefix that could work, and ``place_gang``
is then tried at that prefix, galloping and bisecting upwards (more free capacity never makes
a gang unplaceable). The chosen actions are pruned: those whose grants share no host with the
placement go at once (the placement stays valid without them); each remaining one, most costly
first, is dropped (or an eviction downgraded to a shrink) when the gang still places, first by
checking that the current placement still fits, then, within a budget, by placing again.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum

import numpy as np

from boltforge.core.model.gang import Gang
from boltforge.core.model.levels import Level
from boltforge.core.model.state import FleetState, Grant
from boltforge.core.model.topology import BoolArray, FloatArray, IntArray
from boltforge.core.placement.answers import Placement
from boltforge.core.placement.hostfit import eligible_hosts
from boltforge.core.placement.place import place_gang, role_order
from boltforge.core.preempt.victims import Action, Candidate, apply_plan, shrink

# How many extra ``place_gang`` calls pruning may make per domain (placement checks are free).
PRUNE_PLACES = 12


@dataclass(frozen=True, slots=True)
class Domain:
    """A rack, a pod or the whole fleet, and which hosts it holds."""

    level: Level
    index: int
    name: str
    inside: BoolArray

    @property
    def label(self) -> str:
        return "the whole fleet" if self.level == Level.SPINE else f"{self.level.label} {self.name}"


@dataclass(frozen=True, slots=True)
class Need:
    """What the gang asks of a domain, for the cheap necessary check before placing.

    ``usable`` are the hosts the gang may use (an accepted pool, not cordoned); ``free`` the free
    GPUs per host; the main role needs ``replicas`` slots of ``per_replica`` GPUs.
    """

    gang: Gang
    usable: BoolArray
    free: IntArray
    gpus: int
    per_replica: int
    replicas: int

    @classmethod
    def of(cls, state: FleetState, gang: Gang) -> Need:
        roles = [r for r in gang.roles if r.gpus > 0]
        usable = np.zeros(len(state.tree.hosts), dtype=np.bool_)
        for role in roles:
            usable |= eligible_hosts(state, role)
        if not roles:
            usable[:] = True
        usable &= ~state.cordoned
        main = role_order(gang)[0] if gang.roles else None
        per_replica = main.gpus if main is not None else 0
        replicas = main.replicas if main is not None else 0
        free = state.free_gpus_per_host()
        return cls(gang, usable, free, gang.total_gpus, per_replica, replicas)


class Gauge:
    """Free GPUs and main-role slots on a domain's usable hosts, as grants are freed."""

    __slots__ = ("_free", "_need", "_usable", "gpus", "slots")

    def __init__(self, need: Need, inside: BoolArray) -> None:
        self._need = need
        self._usable = need.usable & inside
        self._free: dict[int, int] = {}
        hosts = need.free[self._usable]
        self.gpus = int(hosts.sum())
        self.slots = int((hosts // need.per_replica).sum()) if need.per_replica else 0

    def copy(self) -> Gauge:
        other = Gauge.__new__(Gauge)
        other._need, other._usable, other._free = self._need, self._usable, dict(self._free)
        other.gpus, other.slots = self.gpus, self.slots
        return other

    def add(self, grants: Iterable[Grant], sign: int = 1) -> None:
        """Count ``grants`` as freed (``sign`` 1) or as taken again (-1)."""
        g = self._need.per_replica
        for grant in grants:
            if not grant.gpus or not self._usable[grant.host]:
                continue
            old = self._free.get(grant.host, int(self._need.free[grant.host]))
            new = old + sign * len(grant.gpus)
            self._free[grant.host] = new
            self.gpus += sign * len(grant.gpus)
            if g:
                self.slots += new // g - old // g

    def enough(self) -> bool:
        """False when the gang surely cannot fit (too few GPUs or replica slots)."""
        n = self._need
        return self.gpus >= n.gpus and (not n.per_replica or self.slots >= n.replicas)


class Shortfall(StrEnum):
    """Why a domain cannot hold the gang even after displacing every candidate in it."""

    ROOM = "room"
    LAYOUT = "layout"


@dataclass(frozen=True, slots=True)
class Option:
    """One way to make room: the actions, in job-id order, and the placement they allow."""

    domain: Domain
    plan: tuple[Action, ...]
    placement: Placement

    @property
    def cost(self) -> float:
        return sum(a.cost for a in self.plan)

    @property
    def lost(self) -> float:
        return sum(a.lost for a in self.plan)

    @property
    def gpus(self) -> int:
        return sum(a.gpus for a in self.plan)

    def key(self) -> tuple[float, int, float, int, int]:
        """Least weighted loss, then fewest victims, cheapest placement, tightest domain."""
        return (
            round(self.cost, 6),
            len(self.plan),
            round(self.placement.cost.total, 6),
            int(self.domain.level),
            self.domain.index,
        )


Plan = dict[str, Action]


def merged(actions: Sequence[Action]) -> Plan:
    """One action per job: an eviction overrides a shrink of the same job."""
    plan: Plan = {}
    for a in actions:
        held = plan.get(a.cand.id)
        if held is None or not held.evicts:
            plan[a.cand.id] = a
    return plan


def free_domain(
    need: Need, state: FleetState, domain: Domain, actions: Sequence[Action]
) -> Option | Shortfall:
    """The cheapest room this greedy-then-prune pass finds for the gang inside ``domain``.

    ``actions`` are the candidates' actions in preference order (see ``victims``). Returns the
    option, or why even taking every action leaves no room.
    """
    base = state.copy()
    base.cordoned |= ~domain.inside
    gauge = Gauge(need, domain.inside)
    start = _first_enough(gauge.copy(), actions)
    if start is None:
        return Shortfall.ROOM
    found = _first_placing(need.gang, base, actions, start)
    if found is None:
        return Shortfall.LAYOUT
    plan, placement = _prune(need.gang, base, gauge, *found)
    ordered = tuple(plan[j] for j in sorted(plan))
    return Option(domain, ordered, placement)


def _first_enough(gauge: Gauge, actions: Sequence[Action]) -> int | None:
    """Length of the shortest prefix of ``actions`` after which ``gauge`` says enough."""
    if gauge.enough():
        return 0
    freed: dict[str, set[Grant]] = {}
    for k, a in enumerate(actions, start=1):
        done = freed.setdefault(a.cand.id, set())
        new = [g for g in a.freed if g not in done]
        done.update(new)
        gauge.add(new)
        if gauge.enough():
            return k
    return None


def _place(gang: Gang, base: FleetState, plan: Iterable[Action]) -> Placement | None:
    placement, _ = place_gang(apply_plan(base, plan), gang)
    return placement


def _first_placing(
    gang: Gang, base: FleetState, actions: Sequence[Action], start: int
) -> tuple[Plan, Placement] | None:
    """The shortest prefix (from ``start``) that places the gang: gallop, then bisect."""
    tried: dict[int, Placement | None] = {}

    def at(k: int) -> Placement | None:
        if k not in tried:
            tried[k] = _place(gang, base, merged(actions[:k]).values())
        return tried[k]

    lo, hi, step = start - 1, start, 1
    while at(hi) is None:
        if hi >= len(actions):
            return None
        lo, hi, step = hi, min(hi + step, len(actions)), step * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if at(mid) is not None:
            hi = mid
        else:
            lo = mid
    placement = at(hi)
    assert placement is not None
    return merged(actions[:hi]), placement


class Fit:
    """Whether one placement still fits as the plan that made room for it changes.

    Only what the placement needs and ``base`` lacks matters: those GPUs must be freed by the
    plan's actions, and the CPUs, memory and storage short on a host must be freed there. Each
    GPU is freed by at most one action (one action per job), so swapping one action for a
    lighter one is checked from that action alone, much cheaper than applying the plan and
    allocating.
    """

    __slots__ = ("_freed", "_gpus", "_hosts", "_short")

    def __init__(self, base: FleetState, placement: Placement, plan: Plan) -> None:
        self._hosts = {g.host for g in placement.grants}
        self._gpus = {
            (g.host, gpu) for g in placement.grants for gpu in g.gpus if not base.free[g.host, gpu]
        }
        cpus: dict[int, float] = {}
        memory: dict[int, float] = {}
        storage: dict[int, float] = {}
        for g in placement.grants:
            cpus[g.host] = cpus.get(g.host, 0.0) + g.cpus
            memory[g.host] = memory.get(g.host, 0.0) + g.memory_gb
            storage[g.host] = storage.get(g.host, 0.0) + g.storage_gb
        self._short = [_short(cpus, base.free_cpus), _short(memory, base.free_memory)]
        self._short.append(_short(storage, base.free_storage))
        # host: [CPUs, memory, storage] the plan frees there
        self._freed: dict[int, list[float]] = {}
        for action in plan.values():
            self._count(action, 1)

    def _count(self, action: Action | None, sign: int) -> None:
        for g in action.freed if action is not None else ():
            if g.host in self._hosts:
                held = self._freed.setdefault(g.host, [0.0, 0.0, 0.0])
                for i, amount in enumerate((g.cpus, g.memory_gb, g.storage_gb)):
                    held[i] += sign * amount

    def can_swap(self, old: Action, new: Action | None) -> bool:
        """Whether the placement still fits once ``old`` gives way to ``new`` (None: nothing)."""
        kept = {(g.host, gpu) for g in (new.freed if new else ()) for gpu in g.gpus}
        for g in old.freed:
            if g.host in self._hosts and any(
                (g.host, gpu) in self._gpus and (g.host, gpu) not in kept for gpu in g.gpus
            ):
                return False
        delta: dict[int, list[float]] = {}
        for sign, action in ((-1, old), (1, new)):
            for g in action.freed if action is not None else ():
                if g.host not in self._hosts:
                    continue
                d = delta.setdefault(g.host, [0.0, 0.0, 0.0])
                for i, amount in enumerate((g.cpus, g.memory_gb, g.storage_gb)):
                    d[i] += sign * amount
        for h, change in delta.items():
            held = self._freed.get(h, [0.0, 0.0, 0.0])
            for i, short in enumerate(self._short):
                if held[i] + change[i] + 1e-9 < short.get(h, 0.0):
                    return False
        return True

    def swap(self, old: Action, new: Action | None) -> None:
        self._count(old, -1)
        self._count(new, 1)


def _touching(plan: Plan, placement: Placement) -> Plan:
    """Only the actions that free something on the placement's hosts (shrinks trimmed to them)."""
    hosts = {g.host for g in placement.grants}
    kept: Plan = {}
    for job, a in plan.items():
        if a.drop is None:
            if any(g.host in hosts for g in a.freed):
                kept[job] = a
            continue
        drop = [g.replica for g in a.freed if g.host in hosts]
        if drop:
            kept[job] = a if len(drop) == len(a.drop) else shrink(a.cand, drop)
    return kept


def _prune(
    gang: Gang, base: FleetState, gauge: Gauge, plan: Plan, placement: Placement
) -> tuple[Plan, Placement]:
    """Drop actions the gang turns out not to need, most costly first (see module docstring)."""
    plan = _touching(plan, placement)
    fit = Fit(base, placement, plan)
    held = _gauged(gauge, plan)
    places = PRUNE_PLACES
    for job in sorted(plan, key=lambda j: (-plan[j].cost, j)):
        if job not in plan:
            continue
        old = plan[job]
        for lighter in _lighter(old, placement):
            trial = {j: a for j, a in plan.items() if j != job}
            if lighter is not None:
                trial[job] = lighter
            if fit.can_swap(old, lighter):
                plan = trial
                fit.swap(old, lighter)
                held.add(old.freed, -1)
                held.add(lighter.freed if lighter else ())
                break
            if places <= 0 or not _still_enough(held, old, lighter):
                continue
            places -= 1
            again = _place(gang, base, trial.values())
            if again is not None:
                plan, placement = _touching(trial, again), again
                fit, held = Fit(base, placement, plan), _gauged(gauge, plan)
                break
    return _fewer_replicas(fit, plan), placement


def _lighter(action: Action, placement: Placement) -> list[Action | None]:
    """What to try instead of ``action``: nothing, then (for an eviction) shrinking instead."""
    options: list[Action | None] = [None]
    cand = action.cand
    if action.evicts and cand.spare > 0:
        drop = _shrinkable(cand, {g.host for g in placement.grants})
        if drop:
            options.append(shrink(cand, drop))
    return options


def _shrinkable(cand: Candidate, hosts: set[int]) -> list[int]:
    """Up to ``spare`` replicas of the candidate's role on ``hosts``, highest numbers first."""
    mine = [g.replica for g in cand.grants if g.role == cand.role and g.host in hosts]
    return sorted(mine, reverse=True)[: cand.spare]


def _fewer_replicas(fit: Fit, plan: Plan) -> Plan:
    """Give back each removed replica the placement does not need (a cheap fit check)."""
    for job in sorted(j for j, a in plan.items() if a.drop is not None):
        current = plan[job]
        assert current.drop is not None
        for replica in sorted(current.drop, reverse=True):
            rest = [r for r in current.drop if r != replica]
            if not rest:
                continue
            lighter = shrink(current.cand, rest)
            if fit.can_swap(current, lighter):
                fit.swap(current, lighter)
                current = plan[job] = lighter
    return plan


def _gauged(gauge: Gauge, plan: Plan) -> Gauge:
    """The domain's gauge once ``plan``'s grants are freed."""
    held = gauge.copy()
    held.add(g for a in plan.values() for g in a.freed)
    return held


def _still_enough(held: Gauge, old: Action, new: Action | None) -> bool:
    """Whether the gauge still says enough once ``old`` gives way to ``new``."""
    trial = held.copy()
    trial.add(old.freed, -1)
    trial.add(new.freed if new else ())
    return trial.enough()


def _short(need: dict[int, float], free: FloatArray) -> dict[int, float]:
    """Per host, how much more of a resource ``need`` asks for than is ``free`` (hosts that
    have enough are left out)."""
    return {h: n - free[h] for h, n in need.items() if n > free[h]}

"""Grow running elastic jobs into capacity that no waiting job can use.

An elastic job (``Job.elastic = (min, max)``) runs between ``min`` and ``max`` replicas of its
gang's first role. The cycle starts such jobs smaller when that finishes sooner and shrinks them
instead of evicting them; ``grow`` is the other direction: once every pending job has been
considered, running elastic jobs below their maximum take free hosts, as many replicas as fit,
when finishing sooner outweighs the cost of the resize.

Rules, in the order they are applied:

* Growing never takes capacity a waiting job could use: when any job is still waiting in this
  pass (``pending_ahead > 0``) nothing grows, and a policy without an ``elastic`` part never
  grows.
* A candidate has a known expected end, holds resources in the state, is below its maximum and
  was not resized within the policy's ``elastic.resize_window_s`` (nor shrunk earlier in this
  pass), so no job is resized twice inside the window: no thrashing.
* New replicas go inside the racks the job already uses, else its pods, else anywhere its
  topology rule allows; each is a whole replica (tensor-parallel groups are never split).
* Growing from ``cur`` to ``new`` replicas cuts the remaining time ``R`` to ``R * cur / new``;
  it happens only when the time saved exceeds ``elastic.resize_cost_s``.

Like the rest of the core this is pure: the input state is never changed, and the same inputs
give the same resizes (candidates in a fixed order, ties broken by job id).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from boltforge.core.decisions import Resize
from boltforge.core.model.gang import Gang, Role
from boltforge.core.model.levels import Level
from boltforge.core.model.state import Allocation, FleetState, Grant
from boltforge.core.model.topology import BoolArray
from boltforge.core.model.workload import Running
from boltforge.core.placement.answers import Placement
from boltforge.core.placement.hostfit import eligible_hosts, host_fit
from boltforge.core.placement.place import domain_column, place_gang
from boltforge.core.policy import Elastic, Policy

__all__ = ["GROW_SUFFIX", "grow", "growth_id"]

# Added replicas are held under the job's id plus this suffix until the caller merges them.
GROW_SUFFIX = "+grow"

# Where new replicas may go, tightest first: the job's racks, its pods, the whole fleet.
_SCOPES = (Level.RACK, Level.POD, Level.SPINE)


def growth_id(job: str) -> str:
    """The allocation id under which the replicas added to ``job`` are held (``job+grow``)."""
    return job + GROW_SUFFIX


@dataclass(frozen=True, slots=True)
class _Candidate:
    """A running elastic job that may grow: its first role, size now, maximum and end."""

    run: Running
    role: Role
    held: tuple[Grant, ...]
    current: int
    maximum: int
    end: float

    @property
    def id(self) -> str:
        return self.run.job.id

    def key(self) -> tuple[int, float, str]:
        """Most important class first, then the smallest share of its maximum, then id."""
        return (self.run.job.priority, self.current / self.maximum, self.id)


def grow(
    state: FleetState,
    running: Sequence[Running],
    policy: Policy,
    now: float,
    pending_ahead: int = 0,
) -> list[Resize]:
    """Resizes that grow running elastic jobs into free capacity, best candidates first.

    ``state`` holds every running job's allocation under its id (growth already applied shows
    as a ``job+grow`` allocation and counts toward the job's size); it is not changed.
    ``pending_ahead`` is how many jobs are still waiting in this pass: when it is above zero
    nothing grows, so growing never takes capacity a waiting job could use. Each accepted
    growth is applied to a scratch copy before the next candidate is tried, so the added
    placements never overlap running allocations or each other. Each ``Resize`` carries the
    job's new replica count, the added replicas (numbered after the job's highest replica) and
    a note with the arithmetic.
    """
    elastic = policy.elastic
    if pending_ahead > 0 or elastic is None:
        return []
    work = state.copy()
    found = (_candidate(work, r, elastic, now) for r in running)
    resizes: list[Resize] = []
    for cand in sorted((c for c in found if c is not None), key=_Candidate.key):
        resize = _grow_one(work, cand, elastic, now)
        if resize is None:
            continue
        end = now + _remaining(cand, now) * cand.current / resize.replicas
        grants = resize.added.grants
        work.allocate(Allocation(growth_id(cand.id), grants, end, cand.run.job.priority))
        resizes.append(resize)
    return resizes


def _candidate(state: FleetState, run: Running, elastic: Elastic, now: float) -> _Candidate | None:
    """``run`` as a growth candidate, or None when it may not grow now (see the module rules)."""
    job = run.job
    end = run.expected_end()
    if job.elastic is None or not job.gang.roles or end is None:
        return None
    if job.gang.topology.required == Level.ISLAND:
        return None  # new replicas could not be promised the job's own NVLink island
    if run.last_resized is not None and now - run.last_resized < elastic.resize_window_s:
        return None
    allocation = state.allocations.get(job.id)
    if allocation is None or len(allocation.grants) < len(run.allocation.grants):
        return None  # ended, evicted or shrunk earlier in this pass
    extra = state.allocations.get(growth_id(job.id))
    held = allocation.grants + (extra.grants if extra else ())
    role = job.gang.roles[0]
    current = sum(g.role == role.name for g in held)
    if current < 1 or current >= job.elastic[1]:
        return None
    return _Candidate(run, role, held, current, job.elastic[1], end)


def _grow_one(state: FleetState, cand: _Candidate, elastic: Elastic, now: float) -> Resize | None:
    """The largest worthwhile growth of ``cand`` that fits, in its tightest scope, or None.

    Sizes go down from the maximum; the time saved shrinks with the size, so the first size
    that is not worth the resize ends the search.
    """
    masks = _scope_masks(state, cand)
    room = {scope: _room(state, cand, mask) for scope, mask in masks.items()}
    top = min(cand.maximum - cand.current, max(room.values(), default=0))
    for extra in range(top, 0, -1):
        if _gain(cand, cand.current + extra, now) <= elastic.resize_cost_s:
            return None
        gang = _growth_gang(cand, extra)
        for scope, mask in masks.items():
            if room[scope] < extra:
                continue
            placement = _place_within(state, gang, mask)
            if placement is not None:
                return _resize(cand, placement, elastic, now)
    return None


def _scope_masks(state: FleetState, cand: _Candidate) -> dict[Level, BoolArray]:
    """Hosts each scope allows, tightest first, within the job's required level (if any)."""
    required = cand.run.job.gang.topology.required
    if required is not None and required <= Level.HOST:
        scopes: tuple[Level, ...] = (Level.HOST,)
    else:
        scopes = tuple(s for s in _SCOPES if required is None or s <= required)
    hosts = np.array(sorted({g.host for g in cand.held}), dtype=np.int64)
    masks: dict[Level, BoolArray] = {}
    for scope in scopes:
        column = domain_column(state.tree, scope)
        masks[scope] = np.isin(column, column[hosts])
    return masks


def _room(state: FleetState, cand: _Candidate, mask: BoolArray) -> int:
    """An upper bound on the replicas of the job's first role that fit on ``mask`` now."""
    limit = cand.maximum - cand.current
    fit = host_fit(state, cand.role, eligible_hosts(state, cand.role) & mask, limit)
    return int(fit.slots.sum())


def _growth_gang(cand: _Candidate, extra: int) -> Gang:
    """A gang of ``extra`` replicas of the job's first role, under the job's topology rule."""
    role = replace(cand.role, replicas=extra)
    return replace(cand.run.job.gang, name=cand.id, roles=(role,))


def _place_within(state: FleetState, gang: Gang, mask: BoolArray) -> Placement | None:
    """Place ``gang`` on the hosts of ``mask`` only (others cordoned meanwhile, then restored)."""
    with state.fenced(~mask):
        placement, _ = place_gang(state, gang)
    return placement


def _resize(cand: _Candidate, placement: Placement, elastic: Elastic, now: float) -> Resize:
    """The decision for a growth found at ``placement``, its replicas numbered after the job's."""
    added = _renumber(placement, 1 + max(g.replica for g in cand.held if g.role == cand.role.name))
    new = cand.current + len(added.grants)
    plan = added.main
    note = (
        f"grow {cand.current}->{new} replicas: finishes {_duration(_gain(cand, new, now))} "
        f"sooner, resize costs {_duration(elastic.resize_cost_s)}; adds {len(added.grants)} "
        f"replica(s) inside {plan.level.label} {plan.domain}"
    )
    return Resize(cand.id, new, added, note)


def _renumber(placement: Placement, base: int) -> Placement:
    """``placement`` with its grants numbered ``base``, ``base + 1``, ... in order."""
    roles = []
    number = base
    for plan in placement.roles:
        grants = []
        for g in plan.grants:
            grants.append(replace(g, replica=number))
            number += 1
        roles.append(replace(plan, grants=tuple(grants)))
    return replace(placement, roles=tuple(roles))


def _remaining(cand: _Candidate, now: float) -> float:
    """Seconds left at the current size (0 once the expected end has passed)."""
    return max(cand.end - now, 0.0)


def _gain(cand: _Candidate, new: int, now: float) -> float:
    """Seconds saved by running ``new`` replicas instead of ``current``: ``R - R * cur / new``."""
    remaining = _remaining(cand, now)
    return remaining - remaining * cand.current / new


def _duration(seconds: float) -> str:
    """``45 s``, ``52 min`` or ``3.5 h``."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 3 * 3600:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"

"""Full passes decided beside the arrivals: a plan is computed on a world read at one moment,
while the loop goes on serving arrivals and reports, and is applied later, keeping only the
decisions that still hold.

A full pass over thousands of waiting jobs on a 16,384-GPU fleet takes the core most of a
second. Holding the scheduler's lock for all of it would make every arrival, report and
heartbeat that comes meanwhile wait. So the loop reads the world (under the lock), hands the
core's cycle to a planner thread, and applies the result when it is done (under the lock
again). Between the two the world may have moved: arrivals bound GPUs, replicas exited, jobs
were cancelled. ``still_valid`` keeps a bind only if its job still waits and its GPUs are
free now (or held by victims this plan evicts that still hold them, in the same allocation),
and its hosts still take new work, and keeps evictions only with their bind; the rest is
left to the next pass. The jobs'
reasons pass through: they are advice, rewritten by the next pass.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, replace

from boltforge.control.scheduling.lifecycle import HOLDING, WAITING
from boltforge.control.scheduling.world import World
from boltforge.core.decisions import Bind, CycleResult, Evict
from boltforge.core.model.state import Allocation, Conflict, FleetState


@dataclass
class Plan:
    """A full pass in flight: the world it read (at ``version`` and ``fleet_version`` of the
    mirror) and, once computed, its result. Times in milliseconds."""

    world: World
    version: int
    fleet_version: int
    result: CycleResult | None = None
    read_ms: float = 0.0
    compute_ms: float = 0.0
    compute_cpu_ms: float = 0.0  # of it, the planning thread's own CPU time


def still_valid(result: CycleResult, planned: World, current: World) -> CycleResult:
    """The decisions of ``result``, made on ``planned``, that still hold on ``current`` (a
    world read now, over the same fleet, holding at least the rows of the jobs ``result``
    binds): see the module docstring. ``current.state`` is used up."""
    victims: dict[str, list[Evict]] = defaultdict(list)
    for ev in result.evictions:
        victims[ev.for_job].append(ev)
    binds: list[Bind] = []
    evictions: list[Evict] = []
    for b in result.binds:
        evs = victims.get(b.job, [])
        holders = all(_same_holder(planned, current, e.job) for e in evs)
        if _waits(current, b.job) and holders and _fits(current.state, b, [e.job for e in evs]):
            binds.append(b)
            evictions += evs
    bound = {b.job for b in result.binds}
    evictions += [
        e
        for e in result.evictions
        if e.for_job not in bound and _same_holder(planned, current, e.job)
    ]
    return replace(result, binds=tuple(binds), evictions=tuple(evictions))


def _waits(current: World, job: str) -> bool:
    row = current.rows.get(job)
    return row is not None and row.state in WAITING


def _same_holder(planned: World, current: World, job: str) -> bool:
    """Whether ``job`` still holds GPUs in the allocation the plan saw."""
    before, now = planned.rows.get(job), current.rows.get(job)
    if before is None or now is None or now.state not in HOLDING:
        return False
    return before.epoch == now.epoch


def _fits(state: FleetState, b: Bind, victims: list[str]) -> bool:
    """Allocate ``b`` in ``state`` once ``victims`` are out of it; False (and ``state`` as it
    was) when its GPUs are taken, or one of its hosts takes no new work now (cordoned,
    draining, suspect or dead)."""
    if any(state.cordoned[g.host] for g in b.placement.grants):
        return False
    released = [state.release(v) for v in victims if v in state.allocations]
    try:
        state.allocate(Allocation(b.job, b.placement.grants, None, 0))
    except Conflict:
        for allocation in released:
            state.allocate(allocation)
        return False
    return True

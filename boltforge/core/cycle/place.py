"""Placement and start: where a job goes now, and binding it there.

Contract. ``place`` places a gang on the pass's ``work`` with the given hosts fenced off
(topology-aware placement with lookahead near the head of the queue, or first fit, per the
policy's placement part; under cost-aware routing, each group of pools in turn) and changes
nothing. ``apart`` keeps a job of a spread group off hosts holding half of its group.
``repeat`` reuses the previous job's host for a job of the same shape when that provably stays
the best. ``bind`` is the one way a job starts: it allocates on ``work``, counts the job's
spread group, charges its queue (``charge``), clears ``open_gpus`` and ``last_host``, and
appends the ``Bind``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import replace

from boltforge.core.cycle.admit import charge
from boltforge.core.cycle.state import PassState
from boltforge.core.decisions import Bind
from boltforge.core.model.gang import Gang
from boltforge.core.model.state import Allocation, Grant
from boltforge.core.model.workload import Job
from boltforge.core.placement.answers import Placement
from boltforge.core.placement.firstfit import first_fit
from boltforge.core.placement.lookahead import place_with_lookahead
from boltforge.core.placement.modes import place_now
from boltforge.core.placement.place import Outcome
from boltforge.core.placement.routing import Route, fences, note_for
from boltforge.core.placement.single import plan_on_host

# Lookahead window: how many jobs behind the one being placed it checks (policy.placement.lookahead
# bounds how far down the queue lookahead runs at all).
WINDOW = 4


def upcoming_gangs(ordered: list[Job], position: int, ahead: int) -> tuple[Gang, ...]:
    """The gangs lookahead checks the job at ``position`` against: up to ``WINDOW`` jobs
    behind it, none at or past position ``ahead``."""
    return tuple(j.gang for j in ordered[position + 1 : ahead][:WINDOW])


def shape_key(p: PassState, job: Job, blocked: frozenset[int]) -> tuple[object, ...]:
    """What a job's failure to start is remembered by for the rest of the pass
    (``failed_shapes``): its gang's shape, its class (what it may preempt) and the hosts
    fenced off for it; under quotas that limit or guarantee, also its queue, which decides
    what it may take and reclaim, so one queue's refusal is never another's."""
    key = (job.gang.shape, job.gang.priority, blocked)
    return key if p.quota is None or not p.quota.limits_any else (*key, job.queue)


def place(
    p: PassState,
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
            placement, _, _ = place(p, gang, blocked | fenced, upcoming)
            if placement is not None:
                why = note_for(p.work.tree, route, placement)
                notes = (*placement.notes, why) if why else placement.notes
                return replace(placement, notes=notes), (), False
        blocked = blocked | excluded
    with p.work.fenced(blocked):
        if p.policy.placement.topology_aware:
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


def apart(p: PassState, job: Job, blocked: frozenset[int], route: Route | None) -> Placement | None:
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
    placement, _, _ = place(p, job.gang, blocked | full, (), route)
    if placement is not None:
        why = f"kept off {len(full)} host(s) holding half of {job.spread}"
        placement = replace(placement, notes=(*placement.notes, why))
    return placement


def _spread_hosts(p: PassState) -> dict[str, Counter[int]]:
    """Jobs per host per spread group among the running ones (made once a pass; ``bind``
    adds what it binds)."""
    if p.spread is None:
        p.spread = {}
        for run in p.running.values():
            if run.job.spread:
                _count_spread(p.spread, run.job.spread, run.allocation.grants)
    return p.spread


def _count_spread(spread: dict[str, Counter[int]], group: str, grants: Iterable[Grant]) -> None:
    spread.setdefault(group, Counter()).update({g.host for g in grants})


def repeat(p: PassState, job: Job, shape: tuple[object, ...]) -> Placement | None:
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


def one_island_replica(gang: Gang, placement: Placement) -> bool:
    """Whether ``placement`` is one replica of a one-role gang inside one NVLink island."""
    role = gang.roles[0]
    return (
        len(gang.roles) == 1
        and role.replicas == 1
        and role.gpus > 0
        and placement.cost.hops["host"] == 0
    )


def bind(
    p: PassState,
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
    charge(p, job, grants)
    p.binds.append(Bind(job.id, placement, replicas, borrowed, note, position))

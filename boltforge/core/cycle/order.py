"""Phase 1, order: the pending jobs in the order the pass looks at them.

Contract. Reads the snapshot, the policy and the queues' holdings; changes nothing.
``order_pending`` returns the jobs (``order_jobs`` by the policy's ordering, then
``promised_first``) and, when the snapshot carries the jobs' columns, those columns with each
job's position in them. ``promised_first`` keeps jobs a start was promised to (a reservation
of the last full pass, or GPUs held for a restart) first within their class under a size-ranked
order.
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import attrgetter

import numpy as np

from boltforge.core.cycle.snapshot import Snapshot
from boltforge.core.model.topology import BoolArray, IntArray
from boltforge.core.model.workload import Job, Usage
from boltforge.core.policy import Ordering, Policy
from boltforge.core.queueing.columns import QueueColumns
from boltforge.core.queueing.fairshare import Resources
from boltforge.core.queueing.fairshare import order as fair_order
from boltforge.core.queueing.fairshare import positions as fair_positions
from boltforge.core.queueing.ordering import order_jobs, order_positions
from boltforge.core.queueing.quota import Holdings, QuotaTree
from boltforge.core.queueing.shortest import SizeRule

JOB_CLASS = attrgetter("gang.priority")
_BY_CLASS = (Ordering.FAIR, Ordering.PRIORITY)  # orders that rank by class first


def order_pending(
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
    if policy.order.by == Ordering.FIFO and policy.order.size is None:
        return list(pending), columns, None  # arrival order, which the columns are in
    at = order_positions(columns, policy, snap.now, lambda c: fair_positions(c, *fair))
    at = _promised_first_at(at, columns.priority, columns.held, policy, pending, snap.promised)
    return [pending[i] for i in at.tolist()], columns, at


def promised_first(ordered: list[Job], policy: Policy, promised: frozenset[str]) -> list[Job]:
    """Under a size-ranked order, jobs holding a reservation from the last full pass, and
    jobs whose GPUs are held for their restart after a host failure, go first within their
    class (in the order given), so later, smaller arrivals never push back a start that was
    promised. Other orders are returned as given (arrival order keeps those jobs ahead)."""
    if policy.order.size is None:
        return ordered
    n = len(ordered)
    priority = np.fromiter(map(JOB_CLASS, ordered), np.int64, n)
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
    if policy.order.size is None:
        return at
    if not promised and not held.any() and policy.order.by in _BY_CLASS:
        return at  # every key is its class's, in class order already
    rest = ~held
    if promised:
        rest[[i for i, job in enumerate(jobs) if job.id in promised]] = False
    keys = priority * 2 + rest
    return at[np.argsort(keys[at], kind="stable")]


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
    order = policy.order
    return (tree, snap.usage, capacity, snap.now, holdings, order.half_life_s, order.size)


_FairArgs = tuple[QuotaTree, Usage, Resources, float, Holdings, float, SizeRule | None]

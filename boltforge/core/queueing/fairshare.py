"""Fair share: decayed usage, the hierarchical fair-share factor, DRF and the job order.

**Usage** is GPU-seconds per queue, charged to the job's queue and to every path above it, the
root ``""`` included, so the root's usage is the cluster's total. It halves every half-life.
``boltforge.core.queueing.usage`` computes it exactly from the stretches each queue held
GPUs, for the server and the simulator alike.

**Fair-share factor** (Slurm's classic formula): ``F = 2 ** (-U / S)``.

- ``S``, the normalized share, is computed along the path from the root: at each level the
  queue's weight over the sum of its siblings' weights (itself included), multiplied down the
  path. Shares follow **weights**, not guarantees: guarantees are per pool (or ``"*"``) and many
  queues have none, while a weight is one number every queue has; guarantees govern admission
  and reclaim (``quota``), weights govern order. Set weights in proportion to guarantees to make
  the two agree.
- ``U``, the normalized usage, is the queue's decayed usage over the root's (the total). When
  the total is zero it is over ``capacity_gpus x half_life_s`` instead, the most a full cluster
  could have accrued in one half-life, so the factor is defined on a fresh cluster.

A queue at its share gets ``F = 0.5``, one at twice its share ``0.25``, an unused one ``1``.
Unknown queues are judged as their nearest existing ancestor (``QuotaTree.resolve``).

**Order.** ``order`` (and ``positions``, on a queue's columns) sorts by priority class (0
first), then deadline urgency, then fair-share factor (highest first), then dominant share
(DRF: the largest share of GPUs, CPUs or memory; smallest first), then submit time, then id.
A job is *urgent* when its slack, ``deadline - now - expected runtime`` (the runtime counts
as 0 when unknown), is below ``URGENT_SLACK_S``; urgent jobs go first within their class,
least slack first (overdue jobs included). Urgency never lifts a job above a more important
class.
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import pairwise
from operator import attrgetter

import numpy as np

from boltforge.core.model.topology import IntArray
from boltforge.core.model.workload import Job, Usage
from boltforge.core.queueing.columns import QueueColumns
from boltforge.core.queueing.quota import Holdings, QuotaTree, held_by, lineage
from boltforge.core.queueing.shortest import SizeRule, aged_works_of, fair_weight

DEFAULT_HALF_LIFE_S = 7 * 86400.0
URGENT_SLACK_S = 3600.0

Resources = tuple[float, float, float]  # GPUs, CPUs, memory in GB
_ID = attrgetter("id")


def normalized_share(tree: QuotaTree, queue: str) -> float:
    """``S``: the product, down the path to the resolved queue, of weight over siblings' weights
    (remembered per tree and queue: the tree never changes)."""
    key = ("normalized-share", queue)
    known = tree.answers.get(key)
    if known is None:
        known = tree.answers[key] = _normalized_share(tree, queue)
    assert isinstance(known, float)
    return known


def _normalized_share(tree: QuotaTree, queue: str) -> float:
    share = 1.0
    for q in tree.ancestors(queue)[:-1]:
        parent = lineage(q)[1]
        share *= tree.weight(q) / sum(tree.weight(s) for s in tree.children(parent))
    return share


def fair_share_factor(
    tree: QuotaTree,
    usage: Usage,
    queue: str,
    capacity_gpus: float,
    half_life_s: float = DEFAULT_HALF_LIFE_S,
) -> float:
    """``2 ** (-U / S)`` for the resolved queue, in (0, 1]; higher means more deserving."""
    q = tree.resolve(queue)
    total = usage.by_queue.get("", 0.0)
    scale = total if total > 0 else capacity_gpus * half_life_s
    used = usage.by_queue.get(q, 0.0) / scale if scale > 0 else 0.0
    return float(2.0 ** (-used / normalized_share(tree, q)))


def order(
    jobs: Iterable[Job],
    tree: QuotaTree,
    usage: Usage,
    capacity: Resources,
    now: float,
    holdings: Holdings,
    half_life_s: float = DEFAULT_HALF_LIFE_S,
    size: SizeRule | None = None,
    arrived: bool = False,
) -> list[Job]:
    """``jobs`` in the order the cycle should consider them (see the module docstring).

    With a ``size`` rule, the fair-share factor's place in the key goes to the job's rank
    under it (``core/queueing/shortest.py``: aged work left, scaled by the factor); class and
    deadline urgency still come first.

    The factor is the job's queue's. The dominant share is the queue's as it stands: the GPUs
    its queue (and the queues below) holds, against the job's own CPUs and memory, since
    holdings record GPUs only. The job's own GPUs are left out on purpose: counting them would
    order a queue's small jobs ahead of its big ones and starve the big ones. Job ids must be
    unique (``ValueError``), which makes the order total: any permutation of ``jobs`` gives
    the same list. ``arrived``: ``jobs`` is already in arrival order (submit time, then id),
    which breaks the ties after every other key as the sort by id would.
    """
    pending = _by_id_within_submit(jobs, arrived)
    if not pending:
        return []
    at = positions(
        QueueColumns.of(pending), tree, usage, capacity, now, holdings, half_life_s, size
    )
    return [pending[i] for i in at.tolist()]


def positions(
    columns: QueueColumns,
    tree: QuotaTree,
    usage: Usage,
    capacity: Resources,
    now: float,
    holdings: Holdings,
    half_life_s: float = DEFAULT_HALF_LIFE_S,
    size: SizeRule | None = None,
) -> IntArray:
    """``order`` for the jobs whose ``columns`` these are: the position of each job in the
    order, first to last. Jobs tied on every key, submit time included, keep their order
    in ``columns``, so the jobs must be in arrival order, or sorted by id, for the ties to
    go by id."""
    present = np.flatnonzero(np.bincount(columns.queue, minlength=len(columns.queues)))
    middles = np.zeros(len(columns.queues))  # the factor negated, or its weight on aged work
    held = np.zeros(len(columns.queues))
    for code in present.tolist():
        q = columns.queues[code]
        factor = fair_share_factor(tree, usage, q, capacity[0], half_life_s)
        middles[code] = -factor if size is None else fair_weight(factor, size)
        held[code] = float(sum(held_by(holdings, q).values()))
    middle = middles[columns.queue]
    if size is not None:  # each job's aged work times its queue's weight
        middle = aged_works_of(columns.work, columns.submit, now, size) * middle
    queue_gpus = held[columns.queue]
    demand = np.stack([queue_gpus, columns.cpus, columns.memory], axis=1)
    dominant = dominant_shares(demand, capacity)
    spare = columns.deadline - now - columns.runtime  # NaN without a deadline
    urgent = spare < URGENT_SLACK_S  # NaN is never urgent
    keys = (columns.submit, dominant, middle, np.where(urgent, spare, 0.0), ~urgent)
    return np.lexsort((*keys, columns.priority))


def _by_id_within_submit(jobs: Iterable[Job], arrived: bool) -> list[Job]:
    """``jobs`` in an order whose ties of equal submit time go by id (sorted by id, unless
    ``arrived`` says they are in arrival order already); ``ValueError`` on a repeated id."""
    if arrived:
        pending = list(jobs)
        if len(set(map(_ID, pending))) != len(pending):
            raise ValueError("job ids must be unique to order jobs")
        return pending
    pending = sorted(jobs, key=_ID)  # ties after every other key: by id
    if any(a.id == b.id for a, b in pairwise(pending)):
        raise ValueError("job ids must be unique to order jobs")
    return pending


def dominant_shares(demand: np.ndarray, capacity: Resources) -> np.ndarray:
    """DRF per row of ``demand`` (one row per job: GPUs, CPUs, memory GB): the largest
    share of any resource of ``capacity`` that the row takes. A resource the cluster has
    none of counts as an infinite share when demanded, else not at all."""
    if demand.size and (demand.min() < 0 or min(capacity) < 0):
        raise ValueError(f"demands and capacity {capacity} must not be negative")
    cap = np.array(capacity, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        shares = np.where(cap > 0, demand / np.where(cap > 0, cap, 1.0), np.inf)
    shares = np.where((cap <= 0) & (demand <= 0), 0.0, shares)
    return np.asarray(shares.max(axis=1))

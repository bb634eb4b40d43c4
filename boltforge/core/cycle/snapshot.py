"""What a cycle sees: ``Snapshot``, and the count of GPUs held per queue and pool.

Contract. Nothing here changes its inputs. ``Snapshot`` is frozen; ``Snapshot.held`` is
computed once and must be treated as read-only (``own_holdings`` gives a copy to change).
``holdings_of``, ``count_holding`` and ``gpus_by_pool`` are the one way the cycle, the
control plane, the simulator and the meter count GPUs against quotas (a share of a GPU counts
as one).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cached_property

from boltforge.core.model.state import FleetState, Grant
from boltforge.core.model.topology import TopologyTree
from boltforge.core.model.workload import Job, Running, Usage
from boltforge.core.placement.routing import RoutingFacts
from boltforge.core.queueing.columns import QueueColumns
from boltforge.core.queueing.quota import QuotaTree


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


def holdings_of(tree: TopologyTree, running: Iterable[Running]) -> dict[str, dict[str, int]]:
    """GPUs held per leaf queue and pool by ``running``."""
    out: dict[str, dict[str, int]] = {}
    for r in running:
        count_holding(out, tree, r)
    return out


def count_holding(
    held: dict[str, dict[str, int]], tree: TopologyTree, run: Running, sign: int = 1
) -> None:
    """Add ``run``'s GPUs to ``held`` (per leaf queue and pool), in place; with ``sign`` -1,
    take them out again."""
    pools = held.setdefault(run.job.queue, {})
    for pool, gpus in gpus_by_pool(tree, run.allocation.grants).items():
        pools[pool] = pools.get(pool, 0) + sign * gpus


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

"""Prometheus metrics on ``GET /metrics``: fleet health, read from the store at each scrape.

Contract:

* ``install(app, rt)`` adds ``GET /metrics`` (Prometheus text format 0.0.4), left out of the
  OpenAPI document. It needs no token, because Prometheus scrapes without one by default;
  in exchange it exports aggregates only: pools, priority classes, teams, job and node
  states and counts. No job id or name and no user name ever appears in a label.
* Each app has its own ``CollectorRegistry`` (never the process-wide default), so several
  servers in one process do not collide.
* Gauges are read afresh at every scrape. The counters and the histogram fold in the
  ``placed`` and ``preempted`` timeline events past a cursor, each event exactly once. The
  cursor starts at 0, so a restarted server counts the store's whole history again and its
  counters carry on from where they were. This relies on those two kinds of event being
  written only by scheduling passes, which run one at a time: their ids rise in commit order.

Series (every name starts with ``bolt_``):

=====================================  ==================  ===================================
series                                 labels              meaning
=====================================  ==================  ===================================
``bolt_gpus``                          pool, state         GPUs on live (ready or suspect)
                                                           nodes (``total``) and GPUs held by
                                                           jobs' replicas (``allocated``)
``bolt_utilization_allocated_ratio``   pool                allocated / total (0 with no total)
``bolt_queue_depth``                   priority_class,     pending and requeued jobs
                                       team
``bolt_jobs``                          state               jobs in each state (all of them,
                                                           every state listed, zeros included)
``bolt_nodes``                         state               ready, suspect, dead, cordoned (a
                                                           cordoned live node counts only there)
``bolt_fragmentation_index``           pool                the core's fragmentation index over
                                                           the pool's hosts (0 to 1)
``bolt_time_to_schedule_seconds``      (histogram)         submit to first placement, per job
``bolt_preemptions_total``             -                   evictions to make room (elastic
                                                           shrinks included)
``bolt_gpu_hours_lost_total``          -                   GPU-hours of work lost by evictions
``bolt_scheduling_passes_total``       -                   passes this server process ran
``bolt_team_spend_dollars``            team                allocated dollars this calendar
                                                           month (UTC), running jobs up to now
``bolt_team_budget_dollars``           team, limit         a budgeted team's monthly (``hard``)
                                                           and ``soft`` limits
``bolt_api_shed_total``                reason              requests refused for overload (429
                                                           or 503), by ``overload.REASONS``
``bolt_store_available``               -                   1 while the store takes writes, 0
                                                           while it is away (``outage.py``)
``bolt_store_unavailable_seconds``     -                   how long it has been away (0: up)
``bolt_store_outages_total``           -                   times it went away since the start
=====================================  ==================  ===================================

``bolt_gpu_hours_lost_total`` sums what the scheduler priced each eviction at when it made it
(recorded on the ``preempted`` event): the victim's GPUs times the time since its last
checkpoint (the one it reported, else the last tick of its declared checkpoint interval, else
its start), plus its restart overhead; for a shrink, the restart overhead of the replicas
dropped. A victim that checkpoints again inside its grace period loses less than this.
"""

from __future__ import annotations

import contextlib
import threading
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator

from fastapi import FastAPI, Response
from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.registry import Collector
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from boltforge.control.api.overload import REASONS, Limiter
from boltforge.control.jobs.budgets import spend
from boltforge.control.jobs.submit import PRIORITY_NAMES
from boltforge.control.runtime import Runtime
from boltforge.control.scheduling.fleet import Fleet
from boltforge.control.scheduling.lifecycle import ALLOWED, WAITING
from boltforge.control.scheduling.world import USABLE_NODES, Caches, load_fleet
from boltforge.control.store.models import HELD, EventRow, JobRow, NodeRow, ReplicaRow
from boltforge.control.store.outage import StoreStatus, fault_of
from boltforge.core.model.state import Allocation, Conflict, FleetState, Grant
from boltforge.core.placement.fragmentation import index_over

BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 600, 1800, 3600)
NODE_STATES = ("ready", "suspect", "dead", "cordoned")
FOLLOWED = ("placed", "preempted")


class FleetCollector(Collector):
    """Reads the store of ``rt`` at scrape time (see the module docstring for the series).
    Scrapes may come from several threads; they take turns."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self._lock = threading.Lock()
        self._cursor = 0
        self._preemptions = 0
        self._lost_gpu_s = 0.0
        self._caches = Caches()
        self._schedule = Histogram(
            "bolt_time_to_schedule_seconds",
            "Seconds from a job's submission to its first placement.",
            buckets=BUCKETS,
            registry=None,
        )

    def collect(self) -> Iterator[Metric]:
        """Every series; those read from the store are left out while it is away."""
        try:
            with self._lock, self.rt.db.session() as s:
                self._follow(s)
                families = [*self._capacity(s), self._queue(s), self._jobs(s), *self._spend(s)]
        except Exception as e:
            if fault_of(e) is None:
                raise
            families = []
        yield from families
        yield from self._schedule.collect()
        yield CounterMetricFamily(
            "bolt_preemptions", "Jobs evicted to make room.", value=self._preemptions
        )
        yield CounterMetricFamily(
            "bolt_gpu_hours_lost",
            "GPU-hours of work since the last checkpoint, lost by evictions.",
            value=self._lost_gpu_s / 3600.0,
        )
        yield CounterMetricFamily(
            "bolt_scheduling_passes",
            "Scheduling passes this server process ran.",
            value=self.rt.scheduler.stats.cycles,
        )

    def _follow(self, s: Session) -> None:
        """Fold in the placed and preempted events written since the last scrape."""
        q = (
            select(EventRow.id, EventRow.kind, EventRow.at, EventRow.data, JobRow.submitted_at)
            .join(JobRow, JobRow.id == EventRow.job_id)
            .where(EventRow.id > self._cursor, EventRow.kind.in_(FOLLOWED))
            .order_by(EventRow.id)
        )
        for event_id, kind, at, data, submitted in s.execute(q):
            self._cursor = event_id
            data = data or {}
            if kind == "placed" and data.get("epoch") == 1:
                self._schedule.observe(max(at - submitted, 0.0))
            elif kind == "preempted":
                self._preemptions += 1
                self._lost_gpu_s += float(data.get("lost_gpu_s") or 0.0)

    def _capacity(self, s: Session) -> Iterable[Metric]:
        """GPUs, utilization, nodes and fragmentation, by pool or node state."""
        fleet: Fleet | None = None
        nodes: dict[str, NodeRow] = {}
        if s.scalar(select(NodeRow.name).limit(1)) is not None:
            fleet, nodes = load_fleet(s, self._caches)
        held: dict[str, set[int]] = defaultdict(set)
        q = select(ReplicaRow.node, ReplicaRow.gpus).where(ReplicaRow.state.in_(HELD))
        for name, indices in s.execute(q):
            held[name].update(indices)
        total: Counter[str] = Counter()
        allocated: Counter[str] = Counter()
        states: Counter[str] = Counter(dict.fromkeys(NODE_STATES, 0))
        for n in nodes.values():
            live = n.state in USABLE_NODES
            total[n.pool] += n.gpus if live else 0
            allocated[n.pool] += len(held.get(n.name, ()))
            states["cordoned" if live and n.cordoned else n.state] += 1
        gpus = GaugeMetricFamily("bolt_gpus", "GPUs by pool.", labels=["pool", "state"])
        ratio = GaugeMetricFamily(
            "bolt_utilization_allocated_ratio",
            "Allocated GPUs over GPUs on live nodes.",
            labels=["pool"],
        )
        for pool in sorted({n.pool for n in nodes.values()}):
            gpus.add_metric([pool, "total"], total[pool])
            gpus.add_metric([pool, "allocated"], allocated[pool])
            ratio.add_metric([pool], allocated[pool] / total[pool] if total[pool] else 0.0)
        by_state = GaugeMetricFamily("bolt_nodes", "Nodes by state.", labels=["state"])
        for state, count in sorted(states.items()):
            by_state.add_metric([state], count)
        return [gpus, ratio, by_state, _fragmentation(fleet, nodes, held)]

    def _queue(self, s: Session) -> Metric:
        depth = GaugeMetricFamily(
            "bolt_queue_depth",
            "Jobs waiting (pending or requeued).",
            labels=["priority_class", "team"],
        )
        q = (
            select(JobRow.priority, JobRow.team, func.count())
            .where(JobRow.state.in_(WAITING))
            .group_by(JobRow.priority, JobRow.team)
        )
        for priority, team, count in sorted(s.execute(q).all()):
            depth.add_metric([PRIORITY_NAMES.get(priority, str(priority)), team], count)
        return depth

    def _jobs(self, s: Session) -> Metric:
        counts: Counter[str] = Counter(dict.fromkeys(ALLOWED, 0))
        for state, count in s.execute(select(JobRow.state, func.count()).group_by(JobRow.state)):
            counts[state] += count
        jobs = GaugeMetricFamily("bolt_jobs", "Jobs by state.", labels=["state"])
        for state, count in sorted(counts.items()):
            jobs.add_metric([state], count)
        return jobs

    def _spend(self, s: Session) -> list[Metric]:
        """Each team's spend this month, and the budgeted teams' limits."""
        now = self.rt.clock()
        spent = GaugeMetricFamily(
            "bolt_team_spend_dollars",
            "Dollars allocated to a team's jobs this calendar month (UTC).",
            labels=["team"],
        )
        for team, dollars in sorted(spend(s, now).items()):
            spent.add_metric([team], dollars)
        limits = GaugeMetricFamily(
            "bolt_team_budget_dollars", "A team's monthly budget limits.", labels=["team", "limit"]
        )
        for team, budget in sorted(self.rt.config.budgets.items()):
            limits.add_metric([team, "hard"], budget.monthly)
            limits.add_metric([team, "soft"], budget.soft_dollars)
        return [spent, limits]


def _fragmentation(
    fleet: Fleet | None, nodes: dict[str, NodeRow], held: dict[str, set[int]]
) -> Metric:
    """The core's fragmentation index per pool, on the fleet as the store holds it now:
    ``held`` GPUs taken, dead and cordoned nodes fenced off (as a scheduling pass sees it)."""
    family = GaugeMetricFamily(
        "bolt_fragmentation_index",
        "Share of a pool's free GPUs on partly used or cordoned hosts.",
        labels=["pool"],
    )
    if fleet is None:
        return family
    state = FleetState(fleet.tree)
    for name, n in nodes.items():
        idx = fleet.index[name]
        state.cordoned[idx] = n.state not in USABLE_NODES or n.cordoned
        if held.get(name):
            grant = Grant("held", 0, idx, tuple(sorted(held[name])))
            with contextlib.suppress(Conflict):
                state.allocate(Allocation(f"held:{name}", (grant,)))
    tree = fleet.tree
    for i, pool in enumerate(tree.pools):
        family.add_metric([pool.name], index_over(state, tree.host_pool == i))
    return family


class ShedCollector(Collector):
    """Requests the app's overload middleware refused, by reason (every reason listed, zeros
    included; none counted when the app has no such middleware). Counts from the server's
    start."""

    def __init__(self, app: FastAPI) -> None:
        self.app = app

    def collect(self) -> Iterator[Metric]:
        limiter: Limiter | None = getattr(self.app.state, "overload", None)
        shed = dict(limiter.shed) if limiter is not None else {}
        family = CounterMetricFamily(
            "bolt_api_shed", "Requests refused for overload (429 or 503).", labels=["reason"]
        )
        for reason in REASONS:
            family.add_metric([reason], shed.get(reason, 0))
        yield family


class StoreCollector(Collector):
    """Whether the store is available, how long it has been away and how many times it
    went away, from the server's ``StoreStatus`` (no store access)."""

    def __init__(self, status: StoreStatus) -> None:
        self.status = status

    def collect(self) -> Iterator[Metric]:
        status = self.status
        yield GaugeMetricFamily(
            "bolt_store_available",
            "1 while the store takes writes, 0 while it is away.",
            value=1 if status.available else 0,
        )
        yield GaugeMetricFamily(
            "bolt_store_unavailable_seconds",
            "Seconds the store has been away (0 while it is available).",
            value=status.away_s(),
        )
        yield CounterMetricFamily(
            "bolt_store_outages", "Times the store went away since the start.", value=status.outages
        )


def install(app: FastAPI, rt: Runtime) -> CollectorRegistry:
    """Serve ``rt``'s metrics at ``GET /metrics`` from a registry of the app's own."""
    registry = CollectorRegistry()
    registry.register(FleetCollector(rt))
    registry.register(ShedCollector(app))
    registry.register(StoreCollector(rt.db.status))

    @app.get("/metrics", include_in_schema=False)
    def metrics() -> Response:
        """Prometheus text exposition; unauthenticated, aggregates only."""
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_PLAIN_0_0_4)

    return registry

"""Discrete-event replay of a trace through the scheduling core, on a simulated clock.

The engine owns the simulated world (the fleet state, who runs where, what each job has left to
do) and asks ``core.cycle`` what to do, exactly as the control plane does: an arrival gets the
incremental pass (``schedule_arrival``); anything that frees capacity (a completion, a failure,
a repaired host) and the optional interval tick get a full pass (``run_cycle``). Events that
fall on the same instant are applied together before the scheduler runs once. Evictions are
applied before binds, and growths of elastic jobs after them. An elastic job shrunk instead of
evicted, or grown into free capacity, is resized in place: it checkpoints, keeps its progress
and runs on at its new size after the restart overhead, without going back to the queue (see
``boltforge.sim.execution``); capacity freed while such a job runs below its maximum gets a
full pass even when nothing waits, so it can grow. An optional ``Controller`` acts on the
replay at a fixed period up to a horizon, submitting jobs that are not in the trace and
withdrawing them (the serving study, ``boltforge.sim.serving``). Nothing reads the wall clock
or a global random state: the same trace, fleet, configuration and seed give the same result.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from enum import IntEnum
from typing import Protocol

import numpy as np

from boltforge.core.billing.meter import grant_dollars
from boltforge.core.cycle import Snapshot, gpus_by_pool, run_cycle, schedule_arrival
from boltforge.core.decisions import CycleResult, Evict, Reserve, Resize
from boltforge.core.model.state import Allocation, FleetState, Grant
from boltforge.core.model.topology import TopologyTree
from boltforge.core.model.workload import Job, Running, Usage
from boltforge.core.placement.answers import Placement
from boltforge.core.placement.fragmentation import index_over
from boltforge.core.placement.modes import fits_empty
from boltforge.core.placement.place import place_gang
from boltforge.core.placement.routing import RoutingFacts
from boltforge.core.policy import Ordering, Policy
from boltforge.core.queueing.columns import QueueColumns
from boltforge.core.queueing.quota import QueueSpec, QuotaTree
from boltforge.core.queueing.runtimes import Finished, RuntimeHistory
from boltforge.core.queueing.usage import Holding, carry
from boltforge.sim.execution import (
    Segment,
    evacuated,
    finished,
    interrupted,
    regranted_slowdown,
    slowdown,
    warmup_gpu_s,
)
from boltforge.sim.jobs import to_job
from boltforge.sim.limits import chosen_limits
from boltforge.sim.pending import PendingJobs
from boltforge.sim.records import JobRecord, Sample, SimResult, TraceJob
from boltforge.sim.spot import Reclaim, ReclaimClock

Progress = Callable[[int, int], None]  # (jobs done or dropped, jobs in the trace)


@dataclass(frozen=True, slots=True)
class SimConfig:
    """How the simulated fleet behaves.

    ``failures_per_1000_gpu_day``: host failures per 1,000 GPUs per day (1-4 is typical at
    scale); a failed host is repaired after ``repair_s``. ``interval_s``: also run a full pass
    on this period (None: on events only). ``usage_refresh_s``: how often fair-share usage is
    brought forward. ``team_queues``: give the scheduler one queue per team (``team_tree``), so
    fair share ranks teams by decayed usage; without them every team shares the root's factor
    and only the dominant-share tie-break tells teams apart. ``reclaims``: the reclaim process
    of each spot pool, by pool name (see ``boltforge.sim.spot``); ``checkpoint_write_s``: how
    long a job takes to write a checkpoint when a reclaim warns it. ``cost_routing``: hand the
    cycle the facts cost-aware routing needs (``boltforge.core.placement.routing``): each
    pool's interruptions per host-hour (its reclaim rate plus the failure rate) and each
    job's spot reclaims so far; off, the cycle places jobs without regard to price.
    ``time_limits``: give each job the time limit a user would ask for (``sim.jobs.time_limit``);
    off, jobs carry none. ``learned_runtimes``: a job without a time limit expects what its
    team's finished jobs of its size took (``core.queueing.runtimes``, learned as jobs finish,
    as a live server learns), and under a size-ranked policy every job is ranked by what
    finished jobs making the same claim typically took (``RuntimeHistory.typical``); off, the
    scheduler knows nothing of its runtime but its limit.
    ``limit_model``: how a job without a limit of its own (the trace's ``time_limit_s``) gets
    one, ``"derived"`` (``sim.jobs.time_limit``) or ``"user"`` (users' estimates, seeded by
    ``seed``; ``boltforge.sim.limits``); ``time_limits`` off wins over it.
    """

    policy: Policy
    seed: int = 0
    checkpoint_interval_s: float = 1800.0
    restart_overhead_s: float = 120.0
    failures_per_1000_gpu_day: float = 2.0
    repair_s: float = 6 * 3600.0
    interval_s: float | None = None
    usage_refresh_s: float = 600.0
    team_queues: bool = True
    reclaims: Mapping[str, Reclaim] = field(default_factory=dict)
    checkpoint_write_s: float = 60.0
    cost_routing: bool = False
    time_limits: bool = True
    learned_runtimes: bool = True
    limit_model: str = "derived"


class Kind(IntEnum):
    """Event kinds, in the order they are applied when they share an instant."""

    FINISH = 0
    REPAIR = 1
    RETURN = 2
    HOST_GONE = 3
    RECLAIM = 4
    FAILURE = 5
    ARRIVAL = 6
    TICK = 7
    CONTROL = 8


class Cause(IntEnum):
    """Why a run stopped before it finished."""

    PREEMPTED = 0
    FAILED = 1
    RECLAIMED = 2


class Controller(Protocol):
    """Acts on a replay at a fixed period, from time 0 to ``horizon_s``, through
    ``Simulation.submit`` and ``Simulation.withdraw`` (the serving study's autoscalers use one).

    With a controller the replay runs to ``horizon_s`` whether or not the trace is done, and
    stops at the first event after it. ``control(sim)`` is called every ``period_s`` after the
    instant's other events and before the scheduler runs (``sim.now`` is the instant); it
    returns whether the scheduler should make a full pass now even if nothing was freed (say,
    its jobs are waiting). A running job it withdraws always gets one.
    """

    @property
    def period_s(self) -> float: ...

    @property
    def horizon_s(self) -> float: ...

    def control(self, sim: Simulation) -> bool: ...


@dataclass(slots=True)
class _Live:
    run: Running
    segment: Segment
    token: int


class Simulation:
    """One policy over one trace on one fleet; ``run`` returns the ``SimResult``."""

    def __init__(
        self,
        tree: TopologyTree,
        trace: list[TraceJob],
        config: SimConfig,
        progress: Progress | None = None,
        controller: Controller | None = None,
    ) -> None:
        self.tree, self.config, self.progress = tree, config, progress
        self.controller = controller
        self.policy = config.policy
        self.state = FleetState(tree)
        self.rng = np.random.default_rng(config.seed)
        self.spot = ReclaimClock(tree, config.reclaims, config.seed)
        self.trace = trace
        self.records = {
            t.id: JobRecord(t.id, t.team, t.gpus, t.submit_s, t.duration_s, deadline_s=t.deadline_s)
            for t in trace
        }
        self.remaining = {t.id: t.duration_s for t in trace}
        self.pending = PendingJobs()
        self.live: dict[str, _Live] = {}
        self.last_preempted: dict[str, float] = {}
        self.reservations: tuple[Reserve, ...] = ()
        self.recent: list[tuple[float, int]] = []
        self.usage = Usage()
        self.quota = team_tree(trace) if config.team_queues else None
        self.ended: list[Holding] = []  # segments ended since usage.as_of (fair order only)
        self.held: dict[str, dict[str, int]] = {}  # the running jobs' ``holdings_of`` (``_hold``)
        self.held_runs: dict[str, int] = {}  # running jobs per queue in ``held``
        self.runtimes = RuntimeHistory()  # what finished jobs took, for jobs with no limit
        # learn from finished jobs: estimates for jobs with no limit, and, where the policy
        # ranks by size, what jobs like each one typically took
        self.estimating = not config.time_limits and config.learned_runtimes
        self.learning = self.estimating or (
            config.learned_runtimes and config.policy.order.size is not None
        )
        self.ideal: dict[object, Placement | None] = {}
        self.events: list[tuple[float, int, int, str]] = []
        self.seq = 0
        self.arrivals_left = 0
        self.repairs_left = 0
        self.every_host = np.ones(len(tree.host_gpus), dtype=np.bool_)
        self.now = 0.0
        self.done = 0
        self.productive_rate = 0.0
        self.result = SimResult(config.policy.name, tree.name, tree.total_gpus, seed=config.seed)

    # -- events --------------------------------------------------------------------------

    def _push(self, t: float, kind: Kind, key: str = "") -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, int(kind), self.seq, key))

    def run(self) -> SimResult:
        """Replay every job; stop when no event is left."""
        host_gpus = int(self.tree.host_gpus.max(initial=0))
        cfg = self.config
        jobs = {
            t.id: to_job(t, host_gpus, cfg.checkpoint_interval_s, cfg.restart_overhead_s)
            for t in self.trace
        }
        if not cfg.time_limits:
            jobs = {key: replace(job, time_limit=None) for key, job in jobs.items()}
        else:
            chosen = chosen_limits(self.trace, cfg.limit_model, cfg.seed)
            jobs |= {key: replace(jobs[key], time_limit=s) for key, s in chosen.items()}
        self.jobs = jobs
        for t in self.trace:
            self._push(t.submit_s, Kind.ARRIVAL, t.id)
        first = self.trace[0].submit_s if self.trace else 0.0
        self._schedule_failure(first)
        for pool in self.spot.processes:
            self._push(self.spot.next_after(pool, first), Kind.RECLAIM, pool)
        if self.config.interval_s:
            self._push(self.config.interval_s, Kind.TICK)
        if self.controller is not None:
            self._push(0.0, Kind.CONTROL)
        self.arrivals_left = len(self.trace)
        while self.events and self._can_progress():
            self._step()
        self.result.jobs = list(self.records.values())
        return self.result

    def _can_progress(self) -> bool:
        """Whether any job may still finish: something runs, arrives, or a host comes back.
        With a controller: whether the next event falls within its horizon."""
        if self.controller is not None:
            return self.events[0][0] <= self.controller.horizon_s
        if self.done >= len(self.trace):
            return False
        return bool(self.live) or self.arrivals_left > 0 or self.repairs_left > 0

    def _step(self) -> None:
        t = self.events[0][0]
        self.now = t
        freed, arrived, tick = False, [], False
        while self.events and self.events[0][0] == t:
            _, kind, seq, key = heapq.heappop(self.events)
            self.result.events += 1
            if kind == Kind.ARRIVAL:
                self.arrivals_left -= 1
                arrived.append(key)
            elif kind == Kind.FINISH:
                freed |= self._finish(key, seq)
            elif kind == Kind.FAILURE:
                freed |= self._fail()
            elif kind in (Kind.REPAIR, Kind.RETURN):
                self.repairs_left -= 1
                self.state.cordoned[int(key)] = False
                freed = True
            elif kind == Kind.RECLAIM:
                freed |= self._reclaim(key)
            elif kind == Kind.HOST_GONE:
                freed |= self._host_gone(int(key))
            elif kind == Kind.TICK:
                tick = True
                if self.config.interval_s and self.done < len(self.trace):
                    self._push(t + self.config.interval_s, Kind.TICK)
            else:
                wants, released = self._control()
                tick |= wants
                freed |= released
        self._admit(arrived)
        if (freed or tick) and (self.pending or self._may_grow()):
            self._full_pass()
        elif arrived:
            self._arrivals([a for a in arrived if a in self.pending])
        self._sample()

    # -- a controller's jobs ---------------------------------------------------------------

    def _control(self) -> tuple[bool, bool]:
        """A CONTROL event: call the controller, schedule its next call within the horizon;
        returns (it asks for a full pass, it stopped a running job)."""
        controller = self.controller
        assert controller is not None  # CONTROL events are pushed only with one
        running = len(self.live)
        wants = controller.control(self)
        after = self.now + controller.period_s
        if after <= controller.horizon_s:
            self._push(after, Kind.CONTROL)
        return wants, len(self.live) < running

    def submit(self, job: Job, work_s: float = math.inf) -> None:
        """Queue ``job``, which is not in the trace, now: it arrives in this instant, after the
        trace's arrivals, and is scheduled as they are. ``work_s``: seconds of work at its size
        (infinite: it runs until withdrawn). Its record counts its runs but never finishes the
        trace (it is not in ``len(trace)``). Raises ``ValueError`` when its id is already
        known or it cannot fit even the empty fleet."""
        if job.id in self.records:
            raise ValueError(f"job {job.id!r} is already known to this simulation")
        if not fits_empty(self.tree, job.gang):
            raise ValueError(f"job {job.id!r} ({job.gpus} GPUs) cannot fit even the empty fleet")
        self.jobs[job.id] = job
        self.records[job.id] = JobRecord(job.id, job.queue, job.gpus, self.now, work_s)
        self.remaining[job.id] = work_s
        self.arrivals_left += 1
        self._push(self.now, Kind.ARRIVAL, job.id)

    def withdraw(self, key: str) -> None:
        """Take ``key`` away for good now. A pending job leaves the queue; a running one stops
        (charged for what its run held, its progress kept as after a checkpoint) and its GPUs
        go back to the scheduler in this instant. Its record keeps ``finish_s`` None. Raises
        ``KeyError`` when ``key`` is neither pending nor running (say, submitted in this very
        instant and not yet arrived)."""
        if key in self.pending:
            self.pending.pop(key)
            self.reservations = tuple(r for r in self.reservations if r.job != key)
            return
        if key not in self.live:
            raise KeyError(f"job {key!r} is neither pending nor running")
        live = self._stop(key)
        out = evacuated(live.segment, self.now)
        self._charge(key, live, out.allocated_gpu_s, out.productive_gpu_s, out.lost_gpu_s)
        self.remaining[key] = max(self.remaining[key] - out.work_s, 0.0)

    # -- arrivals and passes -------------------------------------------------------------

    def _admit(self, arrived: list[str]) -> None:
        """Queue the arrivals; a job that cannot fit even the empty fleet is dropped."""
        for key in arrived:
            job = self._expecting(self.jobs[key])
            if fits_empty(self.tree, job.gang):
                self.pending.put(job)
            else:
                self._drop()

    def _arrivals(self, arrived: list[str]) -> None:
        """Incremental passes for new jobs. Under strict order nothing can start while older
        jobs wait (nothing was freed), and simultaneous arrivals get one full pass in order."""
        if self.policy.order.strict:
            if len(self.pending) == len(arrived):
                self._full_pass()
            return
        for key in arrived:
            job = self.pending[key]
            others = tuple(self.pending.values())
            if others and others[-1] is job:  # the usual case: it is the latest to queue
                others = others[:-1]
            else:
                others = tuple(j for j in others if j is not job)
            self._apply(
                schedule_arrival(
                    self._snapshot(others), job, self.policy, self.reservations, explain=False
                )
            )

    def _full_pass(self) -> None:
        self._refresh_usage()
        if self.learning:
            self.pending.update(self._expecting)
        promised = frozenset(r.job for r in self.reservations)
        snap = self._snapshot(self.pending.in_arrival_order(), promised, self.pending.columns())
        result = run_cycle(snap, self.policy, explain=False)
        self.reservations = result.reservations
        self._apply(result)

    def _expecting(self, job: Job) -> Job:
        """``job`` expecting what its team's finished jobs of its size took, when it has no
        time limit and the replay learns estimates (``estimating``), and ranked by what jobs
        like it typically took (``RuntimeHistory.typical``) when the replay learns at all."""
        if not self.learning:
            return job
        team = self.records[job.id].team
        typical = self.runtimes.typical(team, "", job.gpus, job.time_limit)
        learned = job.estimate
        if self.estimating and job.time_limit is None:
            learned = self.runtimes.estimate(team, "", job.gpus)
        if learned == job.estimate and typical == job.typical:
            return job
        return replace(job, estimate=learned, typical=typical)

    def _snapshot(
        self,
        pending: tuple[Job, ...],
        promised: frozenset[str] = frozenset(),
        columns: QueueColumns | None = None,
    ) -> Snapshot:
        """What a pass sees now; ``columns``: those of ``pending``, which is then in arrival
        order."""
        window = self.policy.churn_window_s
        self.recent = [(t, g) for t, g in self.recent if self.now - t < window]
        running = tuple(live.run for live in self.live.values())
        return Snapshot(
            self.state,
            pending,
            running,
            self.now,
            quota=self.quota,
            usage=self.usage,
            recent_preemptions=tuple(self.recent),
            routing=self._routing() if self.config.cost_routing else None,
            promised=promised,
            known_held=self.held,
            in_arrival_order=columns is not None,
            columns=columns,
        )

    def _routing(self) -> RoutingFacts:
        """Interruptions per host-hour by pool (configured, not observed) and spot reclaims
        by waiting job."""
        failure = self.config.failures_per_1000_gpu_day / 1000.0 / 24.0
        rates = {}
        for pool in self.tree.pools:
            reclaim = self.config.reclaims.get(pool.name)
            spot = reclaim.rate_per_host_day / 24.0 if reclaim is not None else 0.0
            rates[pool.name] = spot + failure * pool.gpus_per_host
        bumped = {k: self.records[k].reclaims for k in self.pending if self.records[k].reclaims}
        return RoutingFacts(rates, bumped)

    def _may_grow(self) -> bool:
        """Whether a full pass could grow a running job: the policy resizes and an elastic job
        runs below its maximum. Capacity freed with nobody waiting gets a full pass then."""
        if self.policy.elastic is None:
            return False
        return any(_below_maximum(live.run) for live in self.live.values())

    def _apply(self, result: CycleResult) -> None:
        """Act on a pass's decisions in the order the core made them: evictions and shrinks
        (which free what the binds use), then binds, then growths (placed on what is left)."""
        self.result.cycles += 1
        for ev in result.evictions:
            if ev.job in self.live:
                self._evict(ev)
        for bind in result.binds:
            self._start(bind.job, bind.placement)
        for resize in result.resizes:
            if resize.job in self.live:
                self._grow(resize)

    # -- job lifecycle -------------------------------------------------------------------

    def _start(self, key: str, placement: Placement) -> None:
        """Start pending ``key`` on ``placement``: at its requested size, or smaller when the
        cycle started an elastic job on fewer replicas (it then runs that much slower)."""
        job = self.pending.pop(key)
        record = self.records[key]
        warmup = self.config.restart_overhead_s if record.start_s is not None else 0.0
        if record.start_s is None:
            record.start_s = self.now
        grants = placement.grants
        if len(grants) < job.gang.roles[0].replicas:
            record.elastic_starts += 1
        factor = slowdown(placement, self._ideal(job, len(grants)))
        self._run(key, job, grants, factor, warmup, None)

    def _run(
        self,
        key: str,
        job: Job,
        grants: tuple[Grant, ...],
        factor: float,
        warmup: float,
        resized: float | None,
    ) -> None:
        """Open a run segment of ``job`` on ``grants`` now: allocate them, count its productive
        rate and schedule its finish (a new token, so FINISH events of earlier segments are
        stale). Its expected end in the state is its time limit stretched to the size it runs
        at. ``resized``: when it was last resized in place (the core's resize window)."""
        gpus = sum(len(g.gpus) for g in grants)
        size = gpus / job.gpus
        limit = job.expected_runtime()
        end = self.now + limit / size if limit is not None else None
        self.state.allocate(Allocation(key, grants, end, job.priority))
        allocation = self.state.allocations[key]
        last_preempted = self.last_preempted.get(key)
        run = Running(job, allocation, self.now, None, last_preempted, last_resized=resized)
        segment = Segment(self.now, gpus, factor, warmup, size)
        self.records[key].slowdown = factor
        self.seq += 1
        self.live[key] = _Live(run, segment, self.seq)
        self._hold(run, 1)
        self.productive_rate += gpus / factor
        heapq.heappush(
            self.events,
            (segment.finish_time(self.remaining[key]), int(Kind.FINISH), self.seq, key),
        )

    def _ideal(self, job: Job, replicas: int) -> Placement | None:
        """The empty fleet's placement of ``job`` at ``replicas`` replicas of its first role
        (what its speed is measured against), computed once per shape."""
        gang = job.gang.resized(replicas)
        shape = gang.shape
        if shape not in self.ideal:
            self.ideal[shape] = place_gang(FleetState(self.tree), gang)[0]
        return self.ideal[shape]

    def _finish(self, key: str, token: int) -> bool:
        """A FINISH event; stale ones (the job was interrupted or resized since) are ignored."""
        live = self.live.get(key)
        if live is None or token != live.token:
            return False
        self._stop(key)
        out = finished(live.segment, self.now, self.remaining[key])
        self._charge(key, live, out.allocated_gpu_s, out.productive_gpu_s, out.lost_gpu_s)
        self.remaining[key] = 0.0
        record = self.records[key]
        record.finish_s = self.now
        if self.learning and record.gpus:
            held = record.allocated_gpu_s / record.gpus  # GPU-seconds per GPU, as a server learns
            limit = self.jobs[key].time_limit
            self.runtimes.learn(Finished(record.team, "", record.gpus, held, limit))
        self.done += 1
        self._report()
        return True

    def _interrupt(self, key: str, cause: Cause, saved: bool = False) -> None:
        """Stop ``key``'s run now and requeue it; ``saved``: it checkpointed just before, so it
        keeps all its progress (else only up to its last periodic checkpoint)."""
        live = self._stop(key)
        seg = live.segment
        if saved:
            out = evacuated(seg, self.now)
        else:
            out = interrupted(seg, self.now, self.config.checkpoint_interval_s)
        self._charge(key, live, out.allocated_gpu_s, out.productive_gpu_s, out.lost_gpu_s)
        self.remaining[key] = max(self.remaining[key] - out.work_s, 0.0)
        record = self.records[key]
        job = live.run.job
        if cause == Cause.PREEMPTED:
            record.preemptions += 1
            self.last_preempted[key] = self.now
            self.recent.append((self.now, seg.gpus))
        elif cause == Cause.FAILED:
            record.failures += 1
        else:
            record.reclaims += 1
            record.reclaim_lost_gpu_s += out.lost_gpu_s - warmup_gpu_s(seg, self.now)
        attained = job.attained_gpu_seconds + out.allocated_gpu_s
        self.pending.put(replace(job, attained_gpu_seconds=attained))

    def _evict(self, ev: Evict) -> None:
        """An eviction: a shrink (``ev.keep``) resizes the job in place onto the grants it
        keeps and counts against the churn budget the GPUs it gave up; anything else stops
        the job and requeues it."""
        if ev.shrink_to is None or not ev.keep:
            self._interrupt(ev.job, Cause.PREEMPTED)
            return
        given_up = self.live[ev.job].segment.gpus - sum(len(g.gpus) for g in ev.keep)
        self._resize(ev.job, ev.keep)
        self.records[ev.job].shrinks += 1
        self.recent.append((self.now, given_up))

    def _grow(self, resize: Resize) -> None:
        """A growth: the job resizes in place onto the grants it holds plus the added ones."""
        held = self.live[resize.job].run.allocation.grants
        self._resize(resize.job, (*held, *resize.added.grants))
        self.records[resize.job].grows += 1

    def _resize(self, key: str, grants: tuple[Grant, ...]) -> None:
        """Resize running ``key`` in place onto ``grants``, without requeueing it.

        It checkpoints first, so the segment that ends keeps all its progress (only restart
        time still inside its warm-up is lost) and is charged as any segment; the new segment
        on ``grants`` starts at once with the restart overhead as warm-up, at the speed of its
        new size and placement. Its GPUs go back to the state and are taken again at once, so
        nothing else can take them in between; a grant that is not free raises ``Conflict``.
        """
        live = self._stop(key)
        out = evacuated(live.segment, self.now)
        self._charge(key, live, out.allocated_gpu_s, out.productive_gpu_s, out.lost_gpu_s)
        self.remaining[key] = max(self.remaining[key] - out.work_s, 0.0)
        job = live.run.job
        job = replace(job, attained_gpu_seconds=job.attained_gpu_seconds + out.allocated_gpu_s)
        factor = regranted_slowdown(self.tree, grants, self._ideal(job, len(grants)))
        self._run(key, job, grants, factor, self.config.restart_overhead_s, self.now)

    def _stop(self, key: str) -> _Live:
        live = self.live.pop(key)
        self.state.release(key)
        self._hold(live.run, -1)
        self.productive_rate -= live.segment.gpus / live.segment.slowdown
        return live

    def _hold(self, run: Running, sign: int) -> None:
        """Count ``run``'s GPUs per pool into (``sign`` 1) or out of (-1) its queue's in
        ``held``, which stays equal to ``holdings_of`` the running jobs: a queue has an
        entry while it runs a job, a pool while the queue holds GPUs there."""
        queue = run.job.queue
        pools = self.held.setdefault(queue, {})
        for pool, gpus in gpus_by_pool(self.tree, run.allocation.grants).items():
            left = pools.get(pool, 0) + sign * gpus
            if left:
                pools[pool] = left
            else:
                del pools[pool]
        runs = self.held_runs.get(queue, 0) + sign
        if runs:
            self.held_runs[queue] = runs
        else:
            del self.held_runs[queue], self.held[queue]

    def _charge(self, key: str, live: _Live, held: float, useful: float, lost: float) -> None:
        record = self.records[key]
        record.allocated_gpu_s += held
        record.productive_gpu_s += useful
        record.lost_gpu_s += lost
        grants, start = live.run.allocation.grants, live.segment.start
        by_pool = self.result.dollars_by_pool
        for name, dollars in grant_dollars(self.tree, grants, start, self.now).items():
            record.dollars += dollars
            by_pool[name] = by_pool.get(name, 0.0) + dollars
        if self.policy.order.by == Ordering.FAIR:
            self.ended.append(self._holding(live, self.now))

    def _drop(self) -> None:
        self.done += 1
        self._report()

    def _report(self) -> None:
        if self.progress is not None and (self.done % 250 == 0 or self.done == len(self.trace)):
            self.progress(self.done, len(self.trace))

    # -- failures ------------------------------------------------------------------------

    def _schedule_failure(self, after: float) -> None:
        rate = self.config.failures_per_1000_gpu_day * self.tree.total_gpus / 1000.0 / 86400.0
        if rate > 0:
            self._push(after + float(self.rng.exponential(1.0 / rate)), Kind.FAILURE)

    def _fail(self) -> bool:
        """A random healthy GPU host fails: its jobs lose work since their last checkpoint and
        requeue; the host is out until repaired."""
        self._schedule_failure(self.now)
        healthy = np.flatnonzero((self.tree.host_gpus > 0) & ~self.state.cordoned)
        if healthy.size == 0:
            return False
        host = int(healthy[int(self.rng.integers(healthy.size))])
        hit = self._on_host(host)
        for key in hit:
            self._interrupt(key, Cause.FAILED)
        self.state.cordoned[host] = True
        self.repairs_left += 1
        self._push(self.now + self.config.repair_s, Kind.REPAIR, str(host))
        return bool(hit)

    def _on_host(self, host: int) -> list[str]:
        """The running jobs with a replica on ``host``."""
        return [
            k
            for k, live in self.live.items()
            if any(g.host == host for g in live.run.allocation.grants)
        ]

    # -- spot reclaims -------------------------------------------------------------------

    def _reclaim(self, pool: str) -> bool:
        """``pool``'s provider warns one of its hosts (a host already away is skipped): the
        host takes no new work, jobs that can checkpoint within the notice stop at once with
        their progress saved, the rest run on until the host goes."""
        self._push(self.spot.next_after(pool, self.now), Kind.RECLAIM, pool)
        host = self.spot.pick(pool)
        if self.state.cordoned[host]:
            return False
        self.result.reclaims += 1
        self.state.cordoned[host] = True
        self.repairs_left += 1
        process = self.spot.processes[pool]
        self._push(self.now + process.notice_s, Kind.HOST_GONE, str(host))
        if process.notice_s < self.config.checkpoint_write_s:
            return False
        hit = self._on_host(host)
        for key in hit:
            self._interrupt(key, Cause.RECLAIMED, saved=True)
        return bool(hit)

    def _host_gone(self, host: int) -> bool:
        """The notice ran out: jobs still on ``host`` lose work since their last checkpoint
        and requeue; the host comes back after its pool's ``back_after_s``."""
        hit = self._on_host(host)
        for key in hit:
            self._interrupt(key, Cause.RECLAIMED)
        pool = self.tree.pools[int(self.tree.host_pool[host])].name
        self._push(self.now + self.spot.processes[pool].back_after_s, Kind.RETURN, str(host))
        return bool(hit)

    # -- fair share and samples ----------------------------------------------------------

    def _refresh_usage(self) -> None:
        """Under fair order, at most every ``usage_refresh_s``: carry usage forward to now
        exactly (``core.usage.carry``, the computation the server shares) with the segments
        that ended since the last refresh and the open ones, which count up to now."""
        if self.policy.order.by != Ordering.FAIR:
            return
        if self.now - self.usage.as_of < self.config.usage_refresh_s:
            return
        held = self.ended + [self._holding(live, None) for live in self.live.values()]
        self.usage = carry(self.usage, self.now, self.policy.order.half_life_s, held)
        self.ended = []

    @staticmethod
    def _holding(live: _Live, end: float | None) -> Holding:
        """``live``'s segment as fair-share usage sees it, ended at ``end`` (None: open)."""
        return Holding(live.run.job.queue, live.segment.gpus, live.segment.start, end)

    def _sample(self) -> None:
        allocated = self.tree.total_gpus - int(self.state.host_free.sum())
        self.result.samples.append(
            Sample(
                self.now,
                allocated,
                self.productive_rate,
                len(self.pending),
                index_over(self.state, self.every_host),  # ``measure(...).index``
            )
        )


def _below_maximum(run: Running) -> bool:
    """Whether ``run`` is of an elastic job holding fewer replicas than its maximum."""
    elastic = run.job.elastic
    return elastic is not None and len(run.allocation.grants) < elastic[1]


def team_tree(trace: list[TraceJob]) -> QuotaTree:
    """One queue per team of ``trace`` (a team named ``a/b`` nests under ``a``), equal weights and
    no GPU quotas: fair share ranks each team by its decayed usage against an equal share, and
    nothing is admitted or refused by quota."""
    return QuotaTree.build(QueueSpec(team) for team in sorted({t.team for t in trace}))


def simulate(
    tree: TopologyTree,
    trace: list[TraceJob],
    config: SimConfig,
    progress: Progress | None = None,
    controller: Controller | None = None,
) -> SimResult:
    """Replay ``trace`` on ``tree`` under ``config`` (see ``Simulation``), with
    ``controller`` acting on it if given (see ``Controller``)."""
    return Simulation(tree, trace, config, progress, controller).run()

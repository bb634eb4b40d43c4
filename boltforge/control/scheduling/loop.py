"""The scheduling loop: event-driven passes of the core cycle over the in-memory world.

The loop reads the mirror of the store (``control/store/mirror.py``), never the whole store: it is
loaded once at start and follows every commit. Wake-ups say what happened: an arrival (a
new job: one incremental pass), a change that can alter the plan (an exit, a node lost or
changed, a cancellation, a reclaim: a full pass), or a timer (leases, and a full pass every
``full_every_s``). Wake-ups that come together are served by one pass, and full passes are
never run back to back: after one, the next waits at least as long as it took (and
``MIN_FULL_GAP_S``), while arrivals and dispatch go on meanwhile. Each pass, under the lock:

    # 1. upkeep    (its own transaction, only when the mirror shows something due)
    #    leases    nodes that went silent become suspect, then dead (their work requeues)
    #    holds     recovery holds past --recovery-hold end (control/jobs/restarts.py): the GPUs
    #              a job that lost a host kept for its restart are free for others again
    #    reclaims  nodes past their spot reclaim time are gone; jobs a reclaim notice moved
    #              that requeued get their lost work on their timeline (control/nodes/spot.py)
    #    health    every few seconds: stragglers recorded (their hosts cordoned, by policy),
    #              jobs making no progress past their timeout reclaimed (control/nodes/health.py;
    #              with ``overlap`` every running job is judged on a thread of its own, holding
    #              no lock, and a pass acts only on what that found)
    # 2. world     the fleet, the holders of every GPU and the waiting jobs, from the mirror:
    #              one world is kept current by the mirror's changes (``refresh_world``) and
    #              read whole only when that cannot be done; a full pass plans on a copy of
    #              it with the whole queue added
    # 3. decide    the core cycle: one incremental pass per new arrival, or a full pass
    # 4. persist   evictions, binds and every changed reason, in one transaction, committed
    #              before anything is sent to a node (a planned full pass's reasons, past the
    #              first ``WAITS_PER_PASS``, a share per pass after that pass's dispatch)
    # 5. wake      after commit: the nodes and jobs the decisions changed, at once (a
    #              victim's node hears of its eviction before dispatch begins)
    # 6. dispatch  gangs whose GPUs are free go to their nodes (its own transaction); those
    #              nodes are woken after it commits

While the store is away (``control/store/outage.py``) the loop runs no pass: it probes the
store twice a second, and is woken as soon as a call's write commits; once the store takes
writes again, it reads the world afresh, renews every live node's lease and resumes with a
full pass.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace

from sqlalchemy.orm import Session

from boltforge.control.jobs.restarts import end_holds
from boltforge.control.nodes import spot
from boltforge.control.nodes.agents import LeaseTerms, expire, extend_leases
from boltforge.control.nodes.backend import Backend, NativeBackend
from boltforge.control.nodes.health import HealthCheck
from boltforge.control.notify import Notifier
from boltforge.control.scheduling.actuate import (
    Settings,
    Touched,
    apply,
    read_jobs,
    record_waits,
)
from boltforge.control.scheduling.dispatch import dispatch
from boltforge.control.scheduling.lifecycle import WAITING
from boltforge.control.scheduling.planning import Plan, still_valid
from boltforge.control.scheduling.quotas import TeamQuotas, quota_tree
from boltforge.control.scheduling.world import (
    USABLE_NODES,
    Caches,
    World,
    add_waiting,
    fleet_of,
    load_world,
    refresh_routing,
    refresh_world,
    routing_stale,
    usage,
    with_queue,
)
from boltforge.control.store import failpoints
from boltforge.control.store.db import Database
from boltforge.control.store.mirror import Mirror
from boltforge.control.store.models import JobRow
from boltforge.control.store.outage import fault_of
from boltforge.core.cycle import Snapshot, run_cycle, schedule_arrival
from boltforge.core.decisions import CycleResult, Reserve, Waiting, WaitReason
from boltforge.core.health import HealthRules
from boltforge.core.model.state import Allocation
from boltforge.core.model.workload import Job, Running, Usage
from boltforge.core.policy import Policy

log = logging.getLogger("boltforge.loop")
MAX_INCREMENTAL = 512
USAGE_REFRESH_S = 5.0
VERDICT_S = 1.0
GATHER_S = 0.02
MIN_FULL_GAP_S = 0.5
PROBE_S = 0.5  # how often a paused loop asks whether the store is back
WAITS_PER_PASS = 250  # a planned full pass's waiting reasons written per pass (overlap)
SLOW_FULL_MS = 1000.0  # a full pass slower than this is logged, with where its time went


@dataclass
class LoopStats:
    """What the loop has done, for ``/v1/fleet`` and the metrics."""

    cycles: int = 0
    full_cycles: int = 0
    last_cycle_ms: float | None = None
    last_full_at: float = float("-inf")
    binds: int = 0
    evictions: int = 0
    cycle_ms: list[float] = field(default_factory=list)
    full_ms: list[float] = field(default_factory=list)
    world_reads: int = 0  # worlds read whole from the mirror (``refresh_world`` could not)
    world_ms: list[float] = field(default_factory=list)  # those reads' times
    refresh_ms: list[float] = field(default_factory=list)  # worlds brought up to date by the
    # mirror's changes instead (``refresh_world``)
    last_full_ms: float = 0.0
    last_full_end: float = float("-inf")  # time.monotonic() when the last full pass ended


class Scheduler:
    """Runs passes when woken. ``lock`` serializes every change to jobs, replicas and nodes
    (passes, agent reports, cancellations); submissions only insert and need no lock.
    ``mirror`` is the live world the passes read; the caller loads it before the first
    pass and keeps it following the store."""

    def __init__(
        self,
        db: Database,
        policy: Policy,
        notifier: Notifier,
        settings: Settings,
        terms: LeaseTerms,
        clock: Callable[[], float] = time.time,
        tick_s: float = 1.0,
        full_every_s: float = 10.0,
        health: HealthRules | None = None,
        recovery_hold_s: float = 60.0,
        quotas: TeamQuotas | None = None,
        mirror: Mirror | None = None,
        backend: Backend | None = None,
        overlap: bool = False,
    ) -> None:
        self.db, self.policy, self.notifier = db, policy, notifier
        self.settings, self.terms, self.clock = settings, terms, clock
        self.tick_s, self.full_every_s = tick_s, full_every_s
        self.recovery_hold_s = recovery_hold_s
        self.quotas = quotas
        self.mirror = mirror if mirror is not None else Mirror()
        self.backend = backend if backend is not None else NativeBackend(notifier)
        self.settings = replace(settings, launcher=self.backend.launcher)
        self.overlap = overlap
        self._plan: Plan | None = None
        self._planning: Future[Plan] | None = None
        self._planner = ThreadPoolExecutor(1, thread_name_prefix="planner") if overlap else None
        self._surveyor = ThreadPoolExecutor(1, thread_name_prefix="health") if overlap else None
        self.lock = threading.RLock()
        self.health = HealthCheck(health or HealthRules())
        self.stats = LoopStats()
        self.caches = Caches()
        self.reservations: tuple[Reserve, ...] = ()
        self.recent: list[tuple[float, int]] = []
        self._verdicts: dict[tuple[object, ...], tuple[float, Waiting]] = {}
        self._usage_cache = Usage()
        self._usage_at = float("-inf")
        self._pending_lock = threading.Lock()
        self._arrivals: list[str] = []
        self._other = True
        self._in_flight = 0  # passes begun and not yet returned (``passing``)
        self._world: World | None = None
        self._world_version = -1
        self._waits: tuple[World, list[Waiting]] | None = None  # reasons left to write
        self._committed = Touched()
        self._wakeup: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping = False

    # -- waking ------------------------------------------------------------------------

    def wake(self, *arrivals: str) -> None:
        """Ask for a pass soon (from any thread): ``arrivals`` name newly submitted jobs
        (incremental passes); without them, something changed that can alter the plan (a
        full pass)."""
        with self._pending_lock:
            if arrivals:
                self._arrivals.extend(arrivals)
            else:
                self._other = True
        self.poke()

    def wanted(self) -> tuple[int, bool]:
        """What the next pass has to do: how many arrivals wait for it, and whether a full
        pass was asked for."""
        with self._pending_lock:
            return len(self._arrivals), self._other

    def passing(self) -> bool:
        """Whether a pass is under way (counted from the moment it took what was asked of
        it, so ``wanted`` and ``passing`` together tell whether anything is left to do)."""
        with self._pending_lock:
            return self._in_flight > 0

    def poke(self) -> None:
        """Ask for a pass soon that only dispatches and serves arrivals (replicas exited,
        so GPUs a bound gang waits for may be free)."""
        if self._loop is not None and self._wakeup is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._wakeup.set)

    async def run(self) -> None:
        """Pass whenever woken or every ``tick_s``, until ``stop``. Under a stream of
        wake-ups, passes start at most every ``GATHER_S`` so each covers many events (the
        first wake-up after a quiet spell is served at once); a full pass waits until
        ``full_gap`` has passed since the last one ended."""
        self._loop = asyncio.get_running_loop()
        self._wakeup = asyncio.Event()
        last = float("-inf")
        status = self.db.status
        status.watch(self.poke)
        seen = status.outages
        while not self._stopping:
            wait = self.idle_wait()
            with contextlib.suppress(TimeoutError):  # not wait_for: it can swallow a cancel
                async with asyncio.timeout(wait):
                    await self._wakeup.wait()
            gap = time.monotonic() - last
            if gap < GATHER_S:
                await asyncio.sleep(GATHER_S - gap)
            self._wakeup.clear()
            if self._stopping:
                break
            if not status.available or status.outages != seen:
                await self.ride_out()
                seen = status.outages
                continue
            last = time.monotonic()
            allow_full = self.full_due_in() <= 0
            try:
                await asyncio.to_thread(self.pass_once, allow_full)
            except Exception as e:  # a pass must never take the loop down with it
                if self._stopping:  # stopped mid-pass (the planner is shut): just end
                    self.announce(self._committed)
                    break
                self.announce(self._committed)  # what it committed before it failed
                if fault_of(e) is not None:  # the store went away: pause (above)
                    continue
                log.exception("scheduling pass failed")
                await asyncio.sleep(self.tick_s)

    async def ride_out(self) -> None:
        """While the store is away: no passes. The store is probed every ``PROBE_S`` (or
        tick, if sooner), and the loop is woken at once when a call's write commits (the
        status tells its watchers); once the store takes writes again the loop ``recover``s
        and goes on. Other wake-ups meanwhile probe no sooner than due, and a recovery that
        failed is tried again no sooner than a probe would be."""
        assert self._wakeup is not None
        status, told = self.db.status, False
        every = min(self.tick_s, PROBE_S)
        probe_at = retry_at = 0.0  # monotonic: when the next probe, or recovery, may run
        while not self._stopping:
            self._wakeup.clear()
            try:
                if not status.available and time.monotonic() >= probe_at:
                    probe_at = time.monotonic() + every
                    await asyncio.to_thread(self.db.probe)
                if status.available and time.monotonic() >= retry_at:
                    await asyncio.to_thread(self.recover)
                    return
            except Exception as e:
                retry_at = time.monotonic() + every
                if fault_of(e) is None and not told:  # unexpected: its traceback, once
                    log.exception("recovering from a store outage failed")
                    told = True
            until = retry_at if status.available else probe_at
            wait = max(until - time.monotonic(), GATHER_S)
            with contextlib.suppress(TimeoutError):  # woken early when the store is back
                async with asyncio.timeout(wait):
                    await self._wakeup.wait()

    def recover(self) -> None:
        """After the store was away: read the world afresh from it (a write whose commit
        went unanswered may or may not have landed, and a promoted standby may lack the
        last ones), give every live node a full lease from now (their heartbeats could not
        be stored; no pass ran meanwhile to take their work away), and ask for a full
        pass."""
        with self.lock:
            self._plan, self._world = None, None
            with self.db.session() as s:
                self.mirror.load(s)
            with self.db.session() as s:
                extend_leases(s, self.terms, self.clock())
        self.wake()

    def idle_wait(self) -> float:
        """Seconds the loop sleeps unless woken: until the next tick, or sooner when a full
        pass is wanted (asked for, or due every ``full_every_s``) and may run then (never
        sooner than ``GATHER_S``). A loop with nothing to do passes once a tick, not
        every ``GATHER_S``."""
        with self._pending_lock:
            asked = self._other
        due_in = 0.0 if asked else self.stats.last_full_at + self.full_every_s - self.clock()
        return min(self.tick_s, max(self.full_due_in(), due_in, GATHER_S))

    def full_due_in(self) -> float:
        """Seconds until a full pass may run (0 or less: now; infinite while one is being
        planned: the planner wakes the loop when it is done)."""
        if self._planning is not None:
            return float("inf")
        stats = self.stats
        gap = max(MIN_FULL_GAP_S, stats.last_full_ms / 1000.0)
        return stats.last_full_end + gap - time.monotonic()

    def stop(self) -> None:
        self._stopping = True
        for pool in (self._planner, self._surveyor):
            if pool is not None:
                pool.shutdown(wait=False, cancel_futures=True)
        self.poke()

    def announce(self, touched: Touched) -> None:
        """After ``touched``'s changes committed: the backend converges the touched nodes
        on their intent, and long-polls on the touched jobs wake."""
        if touched.nodes:
            self.backend.converge(touched.nodes)
        if touched.jobs:
            self.notifier.notify([*(f"job:{j}" for j in touched.jobs), "jobs"])

    # -- one pass ----------------------------------------------------------------------

    def pass_once(self, allow_full: bool = True) -> Touched:
        """One pass (see the module docstring). It announces what it committed as it goes
        (the decisions before dispatch starts, so a victim's node hears of its eviction
        without waiting for the dispatch transaction) and returns all of it. Without
        ``allow_full``, a full pass that is wanted waits for a later pass. With ``overlap``,
        a full pass is planned beside later passes and applied by the first pass after it is
        done; without, it is planned and applied here."""
        with self._pending_lock:
            arrivals, other = self._arrivals, self._other
            self._arrivals = []
            if allow_full and self._planning is None:
                self._other = False
            else:
                allow_full = False
            self._in_flight += 1
        try:
            return self._pass(arrivals, other, allow_full)
        finally:
            with self._pending_lock:
                self._in_flight -= 1

    def _pass(self, arrivals: list[str], other: bool, allow_full: bool) -> Touched:
        touched = self._committed = Touched()  # grows as each step commits
        with self.lock:
            now = self.clock()
            upkept, plan_changed = self._upkeep(now)  # 1. upkeep
            touched |= upkept
            touched |= self._finish_plan(now)
            full = allow_full and (
                other
                or plan_changed
                or len(arrivals) > MAX_INCREMENTAL
                or now - self.stats.last_full_at >= self.full_every_s
            )
            if full:
                touched |= self._full(now)
            if arrivals and (self.overlap or not full):
                touched |= self._incremental(now, arrivals)
            if plan_changed and not full:
                self.wake()
            if touched.jobs:
                failpoints.hit("decided")
            self.announce(touched)  # 5. wake
            with self.db.session() as s:
                dispatched = dispatch(s, self.mirror, now)  # 6. dispatch
            if dispatched.nodes:
                failpoints.hit("dispatched")
            self.announce(dispatched)
            self._more_waits()
        touched |= dispatched
        return touched

    def _upkeep(self, now: float) -> tuple[Touched, bool]:
        """Leases, recovery holds, reclaims and health, in one transaction when the mirror
        shows any of them due. Returns what changed and whether it can change the plan."""
        nodes, holds = upkeep_due(self.mirror, self.terms, now, self.recovery_hold_s)
        if self._surveyor is not None:  # judged off the lock; only findings are acted on
            self.health.survey(self._surveyor, self.db.reading, now, self.poke)
            check = self.health.ready()
        else:
            check = self.health.due(now)
        if not nodes and not holds and not check:
            return Touched(), False
        with self.db.session() as s:
            expired = expire(s, self.terms, now, nodes) if nodes else Touched()
            ended = end_holds(s, now, self.recovery_hold_s) if holds else set()
            expired.jobs |= ended
            spot.settle(s, expired.jobs)
            if nodes:
                expired |= spot.expire(s, now)
            if self._surveyor is not None:
                healed = self.health.act(s, now) if check else Touched()
            else:
                healed = self.health.run(s, now)
        touched = Touched()
        touched |= expired
        touched |= healed
        return touched, bool(expired.nodes or ended or healed.nodes)

    def _full(self, now: float) -> Touched:
        """Read the world and plan a full pass over it: in the planner thread (``overlap``;
        applied by a later pass), or here, applied at once."""
        started = time.perf_counter()
        self._fresh_routing(now)
        with self.db.session() as s:  # the store only for quotas and fair-share usage
            world = with_queue(self._world_for(s, now, []), self.mirror, self.caches)  # 2.
            world.quota = quota_tree(self.quotas, s, world, full=True)
            self._usage_at = float("-inf")
            promised = frozenset(r.job for r in self.reservations)
            snap = world.snapshot(self._usage(s, now), self._recent(now), promised)
        plan = Plan(world, self.mirror.version, self.mirror.fleet_version)
        plan.read_ms = _ms_since(started)
        if self._planner is None:
            self._plan = self._decide(plan, snap)
            return self._finish_plan(now)
        self._planning = self._planner.submit(self._decide, plan, snap)
        self._planning.add_done_callback(lambda _: self.poke())
        return Touched()

    def _decide(self, plan: Plan, snap: Snapshot) -> Plan:
        """The core's full cycle over ``snap`` (3. decide); touches nothing shared."""
        started, cpu = time.perf_counter(), time.thread_time()
        plan.result = run_cycle(snap, self.policy)
        plan.compute_ms = _ms_since(started)
        plan.compute_cpu_ms = (time.thread_time() - cpu) * 1000.0
        return plan

    def _finish_plan(self, now: float) -> Touched:
        """Apply the plan that is done, if any: the decisions that still hold (4. persist)."""
        if self._planning is not None and self._planning.done():
            planning, self._planning = self._planning, None
            self._plan = planning.result()
        plan, self._plan = self._plan, None
        if plan is None or plan.result is None:
            return Touched()
        started = time.perf_counter()
        result = self._current(plan, now)
        world = plan.world
        world.now = now
        self.reservations = result.reservations
        self._waits = None  # a plan's reasons supersede the last one's
        waits = result.waiting
        if self._planner is not None and len(waits) > WAITS_PER_PASS:
            self._waits = (world, list(waits[WAITS_PER_PASS:]))
            result = replace(result, waiting=waits[:WAITS_PER_PASS])
            self.poke()
        with self.db.session() as s:
            touched = self._persist(s, world, result)
        apply_ms = _ms_since(started)
        self._count_full(plan, now, apply_ms, result)
        return touched

    def _more_waits(self) -> None:
        """Write the next ``WAITS_PER_PASS`` of the last planned full pass's waiting reasons
        (head of the queue first). Reasons are advice, so a plan's binds and evictions are
        written at once and its thousands of reasons a share per pass, after the pass's
        arrivals and dispatch: an arrival waits for one share at most, never for all."""
        if self._waits is None:
            return
        world, left = self._waits
        self._waits = (world, left[WAITS_PER_PASS:]) if len(left) > WAITS_PER_PASS else None
        with self.mirror.reading():  # still waiting now, not only when planned
            share = [w for w in left[:WAITS_PER_PASS] if self._still_waits(w.job)]
        with self.db.session() as s:
            record_waits(s, world, share)
        if self._waits is not None:
            self.poke()

    def _still_waits(self, job: str) -> bool:
        row = self.mirror.jobs.get(job)
        return row is not None and row.state in WAITING

    def _current(self, plan: Plan, now: float) -> CycleResult:
        """The plan's result as it stands now: whole when nothing changed the holdings since
        it read the world, else the decisions that still hold (``planning.still_valid``); no
        binds or evictions when the fleet itself changed (a full pass is asked for again)."""
        result = plan.result
        assert result is not None
        if self.mirror.version == plan.version:
            return result
        if self.mirror.fleet_version != plan.fleet_version:
            self.wake()
            return replace(result, binds=(), evictions=(), reservations=())
        bound = [b.job for b in result.binds]
        with self.db.session() as s:
            current = self._world_for(s, now, bound).copy()
        plan.world.ports = current.ports
        kept = still_valid(result, plan.world, current)
        if len(kept.binds) < len(result.binds):
            self.wake()  # what was dropped gets another chance soon
        return kept

    def _count_full(self, plan: Plan, now: float, apply_ms: float, result: CycleResult) -> None:
        stats = self.stats
        stats.full_cycles += 1
        stats.last_full_at = now
        stats.last_full_end = time.monotonic()
        stats.last_full_ms = plan.read_ms + plan.compute_ms + apply_ms
        stats.full_ms = _kept(stats.full_ms, stats.last_full_ms)
        self._count(stats.last_full_ms, result)
        if stats.last_full_ms > SLOW_FULL_MS:
            log.warning(
                "slow full pass: %.0f ms (read %.0f, decide %.0f of which %.0f on the CPU, "
                "apply %.0f); %d waiting, %d running; %d binds, %d evictions",
                stats.last_full_ms,
                plan.read_ms,
                plan.compute_ms,
                plan.compute_cpu_ms,
                apply_ms,
                len(plan.world.pending),
                len(plan.world.running),
                len(result.binds),
                len(result.evictions),
            )

    def _incremental(self, now: float, job_ids: list[str]) -> Touched:
        """Incremental passes for new jobs, in submit order, on the world the last pass left
        (read again from the mirror only when something besides these passes' own binds
        changed the holdings). A job exactly like one that just had to wait, on the same
        holdings, waits for the same reason without asking the core again (``_verdicts``;
        kept for ``VERDICT_S``, since time alone can change the answer). An arrival that
        evicts ends the pass: the arrivals after it wait for the next one, which sees the
        victims leaving. An arrival that must wait while no start is reserved asks for a
        full pass at once, so it gets the reservation before smaller arrivals backfill into
        the GPUs it waits for."""
        touched = Touched()
        blocked = False
        current = True  # whether every change since the world was read is in it
        reserved = {r.job for r in self.reservations}
        todo = [j for j in job_ids if j not in reserved]  # a full pass gave them a start
        waits: list[Waiting] = []  # written together, in one statement, at the end
        with self.db.session() as s:
            world = self._world_for(s, now, todo)
            kept: list[JobRow] = []  # rows of the arrivals, read at the first bind
            for job in list(world.pending):
                started = time.perf_counter()
                world.pending = [j for j in world.pending if j.id != job.id]
                result = self._arrival(s, world, job, now)
                if result.binds or result.evictions:
                    if not kept:  # this arrival's row and those of the ones after it
                        kept = read_jobs(s, [job.id, *(j.id for j in world.pending)])
                    touched |= self._persist(s, world, result)
                else:
                    waits += result.waiting
                self._timed(started, result)
                blocked = blocked or (bool(result.waiting) and not result.binds)
                if result.evictions:
                    current = False  # its changes reach the world through the mirror
                    later = [j.id for j in world.pending]
                    with self._pending_lock:
                        self._arrivals[:0] = later
                    if later:
                        self.poke()
                    break
                self._bound(world, job, result, now)
            touched |= self._persist(s, world, CycleResult(waiting=tuple(waits)))
        if current:
            self._world_version = self.mirror.version  # its own binds are in it already
        if blocked and not self.reservations and self.policy.backfill.depth > 0:
            self.wake()  # a full pass reserves a start for it before later arrivals backfill
        return touched

    def _world_for(self, s: Session, now: float, job_ids: list[str]) -> World:
        """The world for incremental passes over ``job_ids``: the last one, brought to
        ``now`` by the mirror's changes since it was read (``refresh_world``), with these
        arrivals; read whole when that cannot be done. Its quota tree is built again
        whenever its holdings moved, and for every arrival while a guarantee is lent (an
        arrival may restore it)."""
        world, started, stats = self._world, time.perf_counter(), self.stats
        moved = world is None or self._world_version != self.mirror.version
        if world is not None:
            world.now = now
            if moved or now >= world.stale_at:
                hold = self.recovery_hold_s
                version = refresh_world(world, self.mirror, self.caches, self._world_version, hold)
                if version is None:
                    world = None
                else:
                    self._world_version = version
                    stats.refresh_ms = _kept(stats.refresh_ms, _ms_since(started))
        if world is None:
            self._fresh_routing(now)
            hold = self.recovery_hold_s
            world = load_world(self.mirror, now, self.caches, waiting=job_ids, hold_s=hold)
            self._world, self._world_version = world, self.mirror.version
            stats.world_reads += 1
            stats.world_ms = _kept(stats.world_ms, _ms_since(started))
            moved = True
        else:
            add_waiting(world, self.mirror, job_ids, self.caches)
        if moved or (self.quotas is not None and self.quotas.lent):
            world.quota = quota_tree(self.quotas, s, world, full=False)
        return world

    def _fresh_routing(self, now: float) -> None:
        """Re-read the pools' interruption rates when they are due (once a minute), in a
        short transaction of its own."""
        if routing_stale(self.caches, now):
            fleet = fleet_of(self.mirror, self.caches)
            with self.db.session() as s:
                refresh_routing(s, fleet, now, self.caches)

    def _arrival(self, s: Session, world: World, job: Job, now: float) -> CycleResult:
        key = (_kind(job), self._world_version, world.changes)
        known = self._verdicts.get(key)
        if known is not None and now - known[0] < VERDICT_S:
            return CycleResult(waiting=(known[1]._replace(job=job.id),))
        snap = world.snapshot(self._usage(s, now), self._recent(now))
        result = schedule_arrival(snap, job, self.policy, self.reservations)
        waits = tuple(w._replace(position=-1) for w in result.waiting)
        result = replace(result, waiting=waits)
        if waits and not result.binds and not result.evictions:
            self._verdicts = {key: (now, waits[0])}
        return result

    @staticmethod
    def _bound(world: World, job: Job, result: CycleResult, now: float) -> None:
        """Count ``result``'s binds in ``world`` (for the next arrivals, quotas included)."""
        for b in result.binds:
            end = now + job.time_limit if job.time_limit else None
            world.state.allocate(Allocation(b.job, b.placement.grants, end, job.priority))
            held = world.state.allocations[b.job]
            world.add_running(Running(job, held, now, borrowed=b.borrowed_gpus > 0))

    def _persist(self, s: Session, world: World, result: CycleResult) -> Touched:
        for ev in result.evictions:
            run = next((r for r in world.running if r.job.id == ev.job), None)
            if run is not None:
                self.recent.append((world.now, run.gpus))
        touched = apply(s, world, result, self.settings)
        never = [
            Waiting(job, -1, WaitReason.NEVER, (why,)) for job, why in world.unresolved.items()
        ]
        if never:
            apply(s, world, CycleResult(waiting=tuple(never)), self.settings)
            world.unresolved.clear()
        return touched

    def _usage(self, s: Session, now: float) -> Usage:
        """Fair-share usage, read afresh for full passes and at most every few seconds for
        incremental ones (it changes slowly)."""
        if now - self._usage_at >= USAGE_REFRESH_S:
            self._usage_cache = usage(s, now, self.policy.order.half_life_s)
            self._usage_at = now
        return self._usage_cache

    def _recent(self, now: float) -> tuple[tuple[float, int], ...]:
        window = self.policy.churn_window_s
        self.recent = [(t, g) for t, g in self.recent if now - t < window]
        return tuple(self.recent)

    def _timed(self, started: float, result: CycleResult) -> None:
        self._count(_ms_since(started), result)

    def _count(self, ms: float, result: CycleResult) -> None:
        """Count one pass of ``ms`` milliseconds that decided ``result``."""
        stats = self.stats
        stats.cycles += 1
        stats.last_cycle_ms = ms
        stats.binds += len(result.binds)
        stats.evictions += len(result.evictions)
        stats.cycle_ms = _kept(stats.cycle_ms, ms)


def _ms_since(started: float) -> float:
    """Milliseconds since ``started`` (a ``time.perf_counter()`` reading)."""
    return (time.perf_counter() - started) * 1000.0


def _kept(samples: list[float], ms: float) -> list[float]:
    """``samples`` (the last 1,000 kept) and ``ms`` after them."""
    return [*samples[-999:], ms]


def upkeep_due(
    mirror: Mirror, terms: LeaseTerms, now: float, hold_s: float
) -> tuple[set[str], bool]:
    """What upkeep the mirror shows due: the live nodes whose lease ran out, that went quiet
    (not yet suspect) or whose spot reclaim time passed; and whether a recovery hold is to
    end."""
    nodes = set()
    with mirror.reading():
        for n in mirror.nodes.values():
            if n.state not in USABLE_NODES:
                continue
            quiet = n.last_heartbeat is not None and now > n.last_heartbeat + terms.suspect_s
            if (
                (n.lease_expires_at is not None and now > n.lease_expires_at)
                or (quiet and n.state != "suspect")
                or (n.reclaim_at is not None and n.reclaim_at <= now)
            ):
                nodes.add(n.name)
        holds = any(
            j.recovery_hold is not None
            and (j.state not in WAITING or float(j.recovery_hold.get("at", 0.0)) + hold_s <= now)
            for j in mirror.jobs.values()
        )
    return nodes, holds


def _kind(job: Job) -> tuple[object, ...]:
    """What an arrival's fate depends on besides the fleet: its shape, class, queue, limits."""
    return (
        job.gang.shape,
        job.priority,
        job.queue,
        job.time_limit,
        job.estimate,
        job.deadline,
        job.elastic,
        job.preemptible,
    )

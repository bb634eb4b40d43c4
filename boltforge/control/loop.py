"""The scheduling loop: event-driven passes of the core cycle over the store.

Submissions, exits, cancellations and node changes wake the loop; a timer also wakes it (for
leases, and a full pass every ``full_every_s``). Each pass, under the store lock:

    # 1. leases    nodes that went silent become suspect, then dead (their work requeues)
    #    holds     recovery holds past --recovery-hold end (control/restarts.py): the GPUs
    #              a job that lost a host kept for its restart are free for others again
    #    reclaims  nodes past their spot reclaim time are gone; jobs a reclaim notice moved
    #              that requeued get their lost work on their timeline (control/spot.py)
    #    health    every few seconds: stragglers recorded (their hosts cordoned, by policy),
    #              jobs making no progress past their timeout reclaimed (control/health.py)
    # 2. world     read the fleet, the holders of every GPU and the waiting jobs
    # 3. decide    the core cycle: one incremental pass per new arrival when nothing else
    #              happened since the last full pass, else a full pass
    # 4. persist   evictions, binds and every waiting job's reason, in one transaction
    # 5. dispatch  gangs whose GPUs are free go to their nodes
    # 6. wake      after commit: the nodes and jobs whose state changed
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from sqlalchemy.orm import Session

from boltforge.control import spot
from boltforge.control.actuate import Settings, Touched, apply
from boltforge.control.agents import LeaseTerms, expire
from boltforge.control.db import Database
from boltforge.control.dispatch import dispatch
from boltforge.control.health import HealthCheck
from boltforge.control.notify import Notifier
from boltforge.control.quotas import TeamQuotas, quota_tree
from boltforge.control.restarts import end_holds
from boltforge.control.world import Caches, World, load_world, usage
from boltforge.core.cycle import reservation_depth, run_cycle, schedule_arrival
from boltforge.core.decisions import CycleResult, Reserve, Waiting, WaitReason
from boltforge.core.health import HealthRules
from boltforge.core.modes import shape_of
from boltforge.core.policy import Policy
from boltforge.core.state import Allocation
from boltforge.core.workload import Job, Running, Usage

log = logging.getLogger("boltforge.loop")
MAX_INCREMENTAL = 512
USAGE_REFRESH_S = 5.0
VERDICT_S = 1.0
GATHER_S = 0.02


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


class Scheduler:
    """Runs passes when woken. ``lock`` serializes every change to jobs, replicas and nodes
    (passes, agent reports, cancellations); submissions only insert and need no lock."""

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
    ) -> None:
        self.db, self.policy, self.notifier = db, policy, notifier
        self.settings, self.terms, self.clock = settings, terms, clock
        self.tick_s, self.full_every_s = tick_s, full_every_s
        self.recovery_hold_s = recovery_hold_s
        self.quotas = quotas
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
        self._wakeup: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping = False

    # -- waking ------------------------------------------------------------------------

    def wake(self, arrival: str | None = None) -> None:
        """Ask for a pass soon (from any thread); ``arrival`` names a newly submitted job."""
        with self._pending_lock:
            if arrival is None:
                self._other = True
            else:
                self._arrivals.append(arrival)
        if self._loop is not None and self._wakeup is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._wakeup.set)

    async def run(self) -> None:
        """Pass whenever woken or every ``tick_s``, until ``stop``. Under a stream of
        wake-ups, passes start at most every ``GATHER_S`` so each covers many events (the
        first wake-up after a quiet spell is served at once)."""
        self._loop = asyncio.get_running_loop()
        self._wakeup = asyncio.Event()
        last = float("-inf")
        while not self._stopping:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wakeup.wait(), self.tick_s)
            gap = time.monotonic() - last
            if gap < GATHER_S:
                await asyncio.sleep(GATHER_S - gap)
            self._wakeup.clear()
            if self._stopping:
                break
            last = time.monotonic()
            try:
                touched = await asyncio.to_thread(self.pass_once)
            except Exception:  # a pass must never take the loop down with it
                log.exception("scheduling pass failed")
                await asyncio.sleep(self.tick_s)
                continue
            self.announce(touched)

    def stop(self) -> None:
        self._stopping = True
        if self._loop is not None and self._wakeup is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._wakeup.set)

    def announce(self, touched: Touched) -> None:
        """Wake long-polls on the touched nodes and jobs (after their changes committed)."""
        keys = [f"node:{n}" for n in touched.nodes] + [f"job:{j}" for j in touched.jobs]
        if touched.jobs:
            keys.append("jobs")
        self.notifier.notify(keys)

    # -- one pass ----------------------------------------------------------------------

    def pass_once(self) -> Touched:
        """One pass (see the module docstring); returns what to wake once it committed."""
        with self._pending_lock:
            arrivals, other = self._arrivals, self._other
            self._arrivals, self._other = [], False
        touched = Touched()
        with self.lock, self.db.session() as s:
            now = self.clock()
            expired = expire(s, self.terms, now)  # 1. leases
            ended = end_holds(s, now, self.recovery_hold_s)
            expired.jobs |= ended
            spot.settle(s, expired.jobs)
            expired |= spot.expire(s, now)
            healed = self.health.run(s, now)
            touched |= expired
            touched |= healed
            full = (
                other
                or bool(expired.nodes)
                or bool(ended)
                or bool(healed.nodes)
                or len(arrivals) > MAX_INCREMENTAL
                or now - self.stats.last_full_at >= self.full_every_s
            )
            if full:
                touched |= self._full(s, now)
            else:
                touched |= self._incremental(s, now, arrivals)
            touched |= dispatch(s, now)  # 5. dispatch
        return touched

    def _full(self, s: Session, now: float) -> Touched:
        started = time.perf_counter()
        world = load_world(s, now, self.caches, hold_s=self.recovery_hold_s)  # 2. world
        world.quota = quota_tree(self.quotas, s, world, full=True)
        self._usage_at = float("-inf")
        snap = world.snapshot(self._usage(s, now), self._recent(now))
        result = run_cycle(snap, self.policy)  # 3. decide
        self.reservations = result.reservations
        touched = self._persist(s, world, result)  # 4. persist
        self.stats.full_cycles += 1
        self.stats.last_full_at = now
        self._timed(started, result)
        return touched

    def _incremental(self, s: Session, now: float, job_ids: list[str]) -> Touched:
        """Incremental passes for new jobs, in submit order, on one read of the store (read
        again only after a pass evicted someone). A job exactly like one that just had to
        wait, on the same holdings, waits for the same reason without asking the core again
        (``_verdicts``; kept for ``VERDICT_S``, since time alone can change the answer).
        An arrival that must wait while no start is reserved asks for a full pass at once, so
        it gets the reservation before smaller arrivals backfill into the GPUs it waits for."""
        touched = Touched()
        world: World | None = None
        blocked = False
        reserved = {r.job for r in self.reservations}
        for job_id in job_ids:
            if job_id in reserved:
                continue  # a full pass since it arrived gave it a start: keep that answer
            started = time.perf_counter()
            world = world or load_world(
                s, now, self.caches, waiting=job_ids, hold_s=self.recovery_hold_s
            )
            world.quota = world.quota or quota_tree(self.quotas, s, world, full=False)
            job = next((j for j in world.pending if j.id == job_id), None)
            if job is None:
                continue
            world.pending = [j for j in world.pending if j.id != job_id]
            key = (_kind(job), _holdings(world))
            known = self._verdicts.get(key)
            if known is not None and now - known[0] < VERDICT_S:
                result = CycleResult(waiting=(replace(known[1], job=job_id),))
            else:
                snap = world.snapshot(self._usage(s, now), self._recent(now))
                result = schedule_arrival(snap, job, self.policy, self.reservations)
                waits = tuple(replace(w, position=-1) for w in result.waiting)
                result = replace(result, waiting=waits)
                if waits and not result.binds and not result.evictions:
                    self._verdicts = {key: (now, waits[0])}
            touched |= self._persist(s, world, result)
            if result.evictions:
                world = None  # the victims still hold their GPUs: read the store again
            else:
                for b in result.binds:
                    world.state.allocate(Allocation(b.job, b.placement.grants, None, job.priority))
                    held = world.state.allocations[b.job]  # counts for the next arrivals' quota
                    world.running.append(Running(job, held, now, borrowed=b.borrowed_gpus > 0))
            self._timed(started, result)
            blocked = blocked or (bool(result.waiting) and not result.binds)
        if blocked and not self.reservations and reservation_depth(self.policy) > 0:
            self.wake()  # a full pass reserves a start for it before later arrivals backfill
        return touched

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
        return touched

    def _usage(self, s: Session, now: float) -> Usage:
        """Fair-share usage, read afresh for full passes and at most every few seconds for
        incremental ones (it changes slowly)."""
        if now - self._usage_at >= USAGE_REFRESH_S:
            self._usage_cache = usage(s, now, self.policy.half_life_s)
            self._usage_at = now
        return self._usage_cache

    def _recent(self, now: float) -> tuple[tuple[float, int], ...]:
        window = self.policy.preempt_rules.churn_window_s
        self.recent = [(t, g) for t, g in self.recent if now - t < window]
        return tuple(self.recent)

    def _timed(self, started: float, result: CycleResult) -> None:
        ms = (time.perf_counter() - started) * 1000.0
        stats = self.stats
        stats.cycles += 1
        stats.last_cycle_ms = ms
        stats.binds += len(result.binds)
        stats.evictions += len(result.evictions)
        stats.cycle_ms = [*stats.cycle_ms[-999:], ms]


def _kind(job: Job) -> tuple[object, ...]:
    """What an arrival's fate depends on besides the fleet: its shape, class, queue, limits."""
    return (
        shape_of(job.gang),
        job.priority,
        job.queue,
        job.time_limit,
        job.estimate,
        job.deadline,
        job.elastic,
        job.preemptible,
    )


def _holdings(world: World) -> tuple[object, ...]:
    """Who holds what, and which hosts are fenced off: equal for equal fleets' states."""
    state = world.state
    held = tuple(sorted((a.job, a.grants) for a in state.allocations.values()))
    return (held, state.cordoned.tobytes(), state.degraded.tobytes())

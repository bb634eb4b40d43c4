"""Health checks over running jobs, run from the scheduling loop: stragglers are recorded (and,
by policy, their host cordoned and the job moved off), zombies are reclaimed.

Each check (in a pass's transaction, or judged in the background and acted on by a pass:
``HealthCheck``):

    # 1. running   the jobs in state ``running``, with their ranks' progress this allocation
    # 2. zombies   a job past its progress timeout is failed and its replicas stopped;
    #              where NVML samples its GPUs, only if they also held memory and computed
    #              nothing past the timeout (``activity``)
    # 3. stragglers a rank found straggling is recorded once per allocation (a ``straggler``
    #              event with the evidence); with the ``cordon`` action its host is cordoned
    #              (audited as done by ``system``) and the job moves off at its checkpoint

A zombie is failed, not requeued: a hung job restarted from the same checkpoint usually hangs
again, and failing it says so to its owner. Its GPUs are free once its replicas exited (the
checkpoint signal, the job's grace period, then a kill). Everything here changes the store
only; the loop commits, then wakes what ``Touched`` names.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Callable, Collection
from concurrent.futures import Executor, Future
from contextlib import AbstractContextManager

from sqlalchemy import ColumnElement, func, select
from sqlalchemy.orm import Session

from boltforge.control.audit import audit
from boltforge.control.auth import Caller
from boltforge.control.nodes.activity import idle_since
from boltforge.control.nodes.quarantine import cordon, move_off
from boltforge.control.scheduling.actuate import Touched, close_run, halt
from boltforge.control.scheduling.lifecycle import record, transition
from boltforge.control.store.models import (
    HELD,
    EventRow,
    JobRow,
    NodeRow,
    RankProgressRow,
    ReplicaRow,
)
from boltforge.core.health import (
    HealthRules,
    RankTimes,
    Stall,
    Straggler,
    StragglerAction,
    confirm,
    gpus_idle_for,
    may_cordon,
    progress_timeout,
    stalled,
    stragglers,
)

log = logging.getLogger("boltforge.health")
CHECK_EVERY_S = 2.0
SPACING = 20.0  # a check waits at least this many times as long as the last one took
SYSTEM = Caller("system", "system", None, "health check")
STRAGGLER = "straggler"
DEGRADED_S = 6 * 3600.0  # a straggler's host takes no multi-replica work for this long


class HealthCheck:
    """The loop's health step: a check at most every ``every_s`` of server time, nothing in
    between. On a large fleet, where a check over thousands of running jobs takes a while,
    checks are spaced at least ``SPACING`` times as long as the last one took, so they never
    take more than a small share of the server.

    Two ways to run it. ``run``, inside a pass under the scheduler's lock, judges and acts in
    the pass's transaction. In the background (``survey`` then ``act``), the judging of every
    running job, the slow part, reads a session of its own on a thread of its own, holding no
    lock, so arrivals never wait for it; the pass after it is done acts under the lock,
    judging again only the jobs the survey found something on (the store may have moved)."""

    def __init__(self, rules: HealthRules, every_s: float = CHECK_EVERY_S) -> None:
        self.rules, self.every_s = rules, every_s
        self._last = float("-inf")
        self._spacing = every_s
        self._survey: Future[list[str]] | None = None

    def due(self, now: float) -> bool:
        """Whether a check should begin now."""
        return self._survey is None and now - self._last >= self._spacing

    def ready(self) -> bool:
        """Whether a background survey is done and ``act`` has its findings to act on."""
        return self._survey is not None and self._survey.done()

    def run(self, s: Session, now: float) -> Touched:
        """Judge every running job and act on what is found, in ``s``, when due."""
        if not self.due(now):
            return Touched()
        self._last = now
        started = time.perf_counter()
        touched = check(s, self.rules, now)
        self._spacing = max(self.every_s, SPACING * (time.perf_counter() - started))
        return touched

    def survey(
        self,
        pool: Executor,
        read: Callable[[], AbstractContextManager[Session]],
        now: float,
        done: Callable[[], None],
    ) -> None:
        """Begin judging every running job on ``pool``, in a session of ``read``'s (writing
        nothing); ``done`` is called when it is over, so that a pass can ``act``."""
        if not self.due(now):
            return
        self._last = now
        self._survey = pool.submit(self._judge_all, read, now)
        self._survey.add_done_callback(lambda _: done())

    def _judge_all(
        self, read: Callable[[], AbstractContextManager[Session]], now: float
    ) -> list[str]:
        started = time.perf_counter()
        try:
            with read() as s:
                return [job.id for job, _, _ in judge(s, self.rules, now)]
        finally:
            self._spacing = max(self.every_s, SPACING * (time.perf_counter() - started))

    def act(self, s: Session, now: float) -> Touched:
        """Act, in ``s``, on what the finished survey found: its jobs judged again as they
        are now. A survey that failed (the store went away) finds nothing; the next one is
        due as usual."""
        if not self.ready():
            return Touched()
        survey, self._survey = self._survey, None
        assert survey is not None
        try:
            found = survey.result()
        except Exception as e:  # the next survey tries again; a pass goes on meanwhile
            log.warning("health survey failed: %s", e)
            return Touched()
        return check(s, self.rules, now, only=found) if found else Touched()


Finding = tuple[JobRow, Stall | None, list[Straggler]]


def judge(
    s: Session, rules: HealthRules, now: float, only: Collection[str] | None = None
) -> list[Finding]:
    """The running jobs (only those named in ``only`` when given) with something to act on:
    a confirmed stall, or stragglers not yet recorded for this allocation. Reads only."""
    running = JobRow.state == "running"
    if only is not None:
        running = running & JobRow.id.in_(sorted(only))
    jobs = list(s.scalars(select(JobRow).where(running).order_by(JobRow.id)))
    if not jobs:
        return []
    ranks, started, flagged = _ranks(s, running), _started(s, running), _flagged(s, running)
    out: list[Finding] = []
    for job in jobs:
        rows = ranks.get(job.id, [])
        stall = _stall(job, rows, started.get(job.id), rules, now)
        if stall is not None:
            stall = confirm(stall, *_gpus_idle(s, job, now))
        if stall is not None:
            out.append((job, stall, []))
            continue
        found = [f for f in stragglers(_times(rows), rules) if (job.id, f.rank) not in flagged]
        if found:
            out.append((job, None, found))
    return out


def check(
    s: Session, rules: HealthRules, now: float, only: Collection[str] | None = None
) -> Touched:
    """Judge every running job (or those in ``only``) once and act on what is found (see the
    module docstring). Idempotent: a straggler already recorded for this allocation and
    rank is not recorded or acted on again."""
    touched = Touched()
    for job, stall, found in judge(s, rules, now, only):
        if stall is not None:
            touched |= reclaim(s, job, stall, now)
        else:
            touched |= _report(s, job, found, rules, now)
    return touched


def _ranks(s: Session, jobs: ColumnElement[bool]) -> dict[str, list[RankProgressRow]]:
    """The rank progress rows of the current allocation of the jobs ``jobs`` selects."""
    q = (
        select(RankProgressRow)
        .join(JobRow, JobRow.id == RankProgressRow.job_id)
        .where(jobs, RankProgressRow.epoch == JobRow.epoch)
    )
    out: dict[str, list[RankProgressRow]] = defaultdict(list)
    for row in s.scalars(q):
        out[row.job_id].append(row)
    return out


def _started(s: Session, jobs: ColumnElement[bool]) -> dict[str, float]:
    """When the current allocations of the jobs ``jobs`` selects started running (their last
    replica started)."""
    q = (
        select(ReplicaRow.job_id, func.max(ReplicaRow.started_at))
        .join(JobRow, JobRow.id == ReplicaRow.job_id)
        .where(jobs, ReplicaRow.epoch == JobRow.epoch)
        .group_by(ReplicaRow.job_id)
    )
    return {job: at for job, at in s.execute(q) if at is not None}


def _flagged(s: Session, jobs: ColumnElement[bool]) -> set[tuple[str, int]]:
    """(job, rank) of the stragglers already recorded in the current allocations of the jobs
    ``jobs`` selects."""
    q = (
        select(EventRow.job_id, EventRow.data, JobRow.epoch)
        .join(JobRow, JobRow.id == EventRow.job_id)
        .where(jobs, EventRow.kind == STRAGGLER)
    )
    return {(job, int(data["rank"])) for job, data, epoch in s.execute(q) if data["epoch"] == epoch}


def _times(rows: list[RankProgressRow]) -> list[RankTimes]:
    return [RankTimes(r.rank, r.node, tuple(r.step_times)) for r in rows]


def _stall(
    job: JobRow,
    rows: list[RankProgressRow],
    started: float | None,
    rules: HealthRules,
    now: float,
) -> Stall | None:
    own = (job.spec.get("health") or {}).get("progress_timeout")
    timeout = progress_timeout(None if own is None else float(own), bool(rows), rules)
    last = max((r.at for r in rows), default=None)
    return stalled(last, started, now, timeout)


def _gpus_idle(s: Session, job: JobRow, now: float) -> tuple[bool, float | None]:
    """Whether NVML samples every GPU of ``job``'s current allocation, and how long all of
    them have held memory while computing nothing (None: one of them computes)."""
    q = select(ReplicaRow).where(
        ReplicaRow.job_id == job.id, ReplicaRow.epoch == job.epoch, ReplicaRow.state.in_(HELD)
    )
    since: list[float | None] = []
    for rep in s.scalars(q):
        node_since = idle_since(s.get(NodeRow, rep.node), rep.gpus)
        if node_since is None:
            return False, None
        since += node_since
    return bool(since), gpus_idle_for(since, now)


def reclaim(s: Session, job: JobRow, stall: Stall, now: float) -> Touched:
    """Fail running ``job`` for making no progress, with the evidence on its timeline, and
    tell the nodes to stop its replicas (its GPUs are free once they exited)."""
    q = select(ReplicaRow).where(
        ReplicaRow.job_id == job.id, ReplicaRow.epoch == job.epoch, ReplicaRow.state.in_(HELD)
    )
    touched = halt(s, s.scalars(q), now)
    close_run(s, job, now)
    data = {
        "reason": "no-progress",
        "idle_s": round(stall.idle_s, 3),
        "timeout_s": stall.timeout_s,
        "since": stall.since,
        "last_step": job.last_step,
        "epoch": job.epoch,
    }
    if stall.gpu_idle_s is not None:
        data["gpu_idle_s"] = round(stall.gpu_idle_s, 3)
    transition(s, job, "failed", now, f"failed: {stall.describe()}", "failed", data)
    touched.jobs.add(job.id)
    return touched


def _report(
    s: Session, job: JobRow, found: list[Straggler], rules: HealthRules, now: float
) -> Touched:
    """Record each finding; with the cordon action, cordon the hosts (within the fleet's
    cordon allowance) and move the job off the ones now cordoned (unless it is not
    preemptible: then it stays)."""
    touched = Touched(jobs={job.id})
    cordoned: list[str] = []
    if rules.straggler_action is StragglerAction.CORDON:
        for node in sorted({f.node for f in found}):
            if _cordon(s, job, node, found, rules, now):
                cordoned.append(node)
    movable = bool(job.spec.get("preemptible", True))
    for f in found:
        host = s.get(NodeRow, f.node)
        if host is not None:  # no multi-replica work there for a while (``world.degraded``)
            host.degraded_until = max(host.degraded_until or now, now + DEGRADED_S)
        note = _outcome(f.node in cordoned, movable, rules)
        data = {**f.evidence(), "epoch": job.epoch, "action": note}
        record(s, job.id, now, STRAGGLER, f"straggler: {f.describe()}; {note}", data)
    if cordoned and movable:
        why = f"moving off straggling host(s) {', '.join(cordoned)}"
        touched |= move_off(s, job, now, why, "moved", {"nodes": cordoned})
    return touched


def _cordon(
    s: Session, job: JobRow, node: str, found: list[Straggler], rules: HealthRules, now: float
) -> bool:
    """Cordon ``node`` for straggling ranks of ``job`` (audited as done by the system);
    whether it is cordoned now. Refused past the fleet's cordon allowance."""
    row = s.get(NodeRow, node)
    if row is None:
        return False
    if row.cordoned:
        return True
    nodes = s.scalar(select(func.count()).select_from(NodeRow)) or 0
    already = s.scalar(select(func.count()).where(NodeRow.cordoned.is_(True))) or 0
    if not may_cordon(already, nodes, rules):
        return False
    cordon(s, node)
    worst = max((f for f in found if f.node == node), key=lambda f: f.ratio)
    audit(s, SYSTEM, "cordon", node, now, reason=STRAGGLER, job=job.id, **worst.evidence())
    return True


def _outcome(cordoned: bool, movable: bool, rules: HealthRules) -> str:
    """What was done about a finding, in words."""
    if cordoned:
        if movable:
            return "host cordoned; the job moves off at its checkpoint"
        return "host cordoned; the job stays (it is not preemptible)"
    if rules.straggler_action is StragglerAction.REPORT:
        return "reported only"
    return f"host not cordoned: {rules.max_cordoned:.0%} of the fleet is cordoned already"

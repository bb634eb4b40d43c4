"""What agents report about replicas, applied to the store: starts, exits, logs, progress.

A report for a replica the server does not know, for an epoch it has moved past, or for a
replica it wrote off as lost with its node, is refused: a node that was cut off cannot change
a job that has since been placed elsewhere. The exit of a replica of an older epoch (one
still leaving after its job was requeued) only frees its GPUs. A replica the node stopped on
its own (``by_node``: its lease ran out, or its agent shut down) did not finish its job: the
job requeues and resumes from its last checkpoint, within its restart budget. A replica its
node's preflight refused (``preflight``) was never started: the node is drained and the job
placed elsewhere, free of its restart budget (``control.preflight``). What a node cleaned up after a
replica (leftover processes, shared memory files) lands on the job's timeline.
"""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import select
from sqlalchemy.orm import Session

from boltforge.control.jobs.restarts import restart_or_fail
from boltforge.control.nodes import preflight
from boltforge.control.scheduling.actuate import Touched, close_run, halt
from boltforge.control.scheduling.lifecycle import HOLDING, record, transition
from boltforge.control.store.models import JobRow, LogRow, NodeRow, RankProgressRow, ReplicaRow
from boltforge.wire.agent import LogChunk, Progress, ReplicaEvent

STEP_WINDOW = 50
CHECKPOINT_EVENT_GAP_S = 60.0
AHEAD = "bolt.reports.ahead"  # Session.info key: the rows ``read_ahead`` keeps


def read_ahead(s: Session, replica_ids: set[str]) -> None:
    """Read the replicas a group of reports names, their jobs, and each job's current
    epoch, in three statements, and keep them for the transaction: ``s.get`` then finds
    them in the session's identity map and ``_epoch`` here. Reports create no replicas, so
    an epoch read here stays whole for the transaction (a job that moves to a new epoch is
    read again)."""
    reps = list(s.scalars(select(ReplicaRow).where(ReplicaRow.id.in_(replica_ids))))
    jobs = list(s.scalars(select(JobRow).where(JobRow.id.in_({r.job_id for r in reps}))))
    current = {j.id: j.epoch for j in jobs}
    epochs: dict[str, tuple[int, list[ReplicaRow]]] = {j.id: (j.epoch, []) for j in jobs}
    for r in s.scalars(select(ReplicaRow).where(ReplicaRow.job_id.in_(current))):
        if current[r.job_id] == r.epoch:
            epochs[r.job_id][1].append(r)
    s.info[AHEAD] = (reps, jobs, epochs)


def apply_events(
    s: Session, node: str, events: Iterable[ReplicaEvent]
) -> tuple[list[str], Touched]:
    """Apply replica events from node ``node`` (whose session the caller checked); returns
    the refused replica ids and what changed."""
    refused: list[str] = []
    touched = Touched()
    for ev in events:
        with s.no_autoflush:  # reads of rows that exist: the writes before them can wait
            rep = s.get(ReplicaRow, ev.replica)
            if _stale(rep, node, ev.epoch) or rep is None or rep.job_id != ev.job:
                refused.append(ev.replica)
                continue
            job = s.get(JobRow, rep.job_id)
            assert job is not None
            touched.jobs.add(job.id)
            if ev.kind == "started":
                _started(s, job, rep, ev)
                continue
        if rep.state != "exited":
            touched |= _ended(s, job, rep, ev)
            touched |= _node_findings(s, rep, ev)
    return refused, touched


def _stale(rep: ReplicaRow | None, node: str, epoch: int) -> bool:
    """Whether a report item about ``rep`` at ``epoch`` from ``node`` is to be refused."""
    return rep is None or rep.node != node or rep.epoch != epoch or rep.state == "lost"


def _started(s: Session, job: JobRow, rep: ReplicaRow, ev: ReplicaEvent) -> None:
    if rep.state not in ("starting", "running"):
        return
    rep.state, rep.pid, rep.started_at = "running", ev.pid, ev.at
    maybe_running(s, job, ev.at)


def maybe_running(s: Session, job: JobRow, at: float) -> None:
    """A scheduled job runs once every replica of its epoch has started (some may already
    have finished)."""
    if job.state != "scheduled":
        return
    reps = _epoch(s, job)
    if any(r.started_at is None for r in reps):
        return
    first = job.started_at is None
    job.started_at = job.started_at or at
    verb = "running" if first else "resumed"
    nodes = len({r.node for r in reps})
    message = f"{verb}: {len(reps)} replica(s) started on {nodes} node(s)"
    transition(s, job, "running", at, message, verb)


def _ended(s: Session, job: JobRow, rep: ReplicaRow, ev: ReplicaEvent) -> Touched:
    stopping = rep.state == "stopping"
    rep.state, rep.exited_at = "exited", ev.at
    rep.exit_code, rep.signal, rep.checkpoint_s = ev.exit_code, ev.signal, ev.checkpoint_s
    ran = ev.exit_code is not None or ev.signal is not None
    if ev.kind == "exited" and ran and rep.started_at is None:
        rep.started_at = rep.dispatched_at or ev.at  # it ran, though its start was not heard
    touched = Touched()
    if rep.epoch != job.epoch:
        return touched  # a replica of an allocation the job has left: its GPUs are free now
    maybe_running(s, job, ev.at)
    reps = _epoch(s, job)
    alive = [r for r in reps if r.state not in ("exited", "lost")]
    if job.state == "preempting":
        if not alive:
            took = max((r.checkpoint_s or 0.0) for r in reps)
            close_run(s, job, ev.at)
            message = f"checkpointed in {took:.1f} s and stopped; requeued"
            transition(s, job, "requeued", ev.at, message, "checkpointed", {"checkpoint_s": took})
        return touched
    if job.state not in HOLDING or stopping:
        if not alive:
            close_run(s, job, ev.at)
        return touched
    if ev.by_node:
        return _requeue(s, job, rep, alive, ev.at)
    if ev.preflight and ev.kind == "failed":
        return preflight.requeue(s, job, rep, ev)
    failed = ev.kind == "failed" or (ev.exit_code or 0) != 0 or ev.signal is not None
    if failed:
        touched |= halt(s, alive, ev.at)
        close_run(s, job, ev.at)
        job.exit_code = ev.exit_code if ev.exit_code is not None else -(ev.signal or 1)
        why = ev.detail or _exit_words(ev)
        transition(s, job, "failed", ev.at, f"failed: replica {rep.rank} {why}")
    elif not alive:
        close_run(s, job, ev.at)
        job.exit_code = 0
        transition(s, job, "succeeded", ev.at, "succeeded: every replica exited 0")
    return touched


def _node_findings(s: Session, rep: ReplicaRow, ev: ReplicaEvent) -> Touched:
    """Drain the node of a replica its preflight refused (after its job was requeued, so the
    drain moves only the node's other jobs); record what a node cleaned up after a replica on
    the job's timeline."""
    if ev.preflight and ev.kind == "failed":
        return preflight.drain_unfit(s, rep, ev)
    if ev.cleanup:
        data = {"node": rep.node, "replica": rep.id, "epoch": rep.epoch, "cleanup": ev.cleanup}
        record(s, rep.job_id, ev.at, "cleanup", f"node {rep.node}: {ev.cleanup}", data)
    return Touched()


def _requeue(
    s: Session, job: JobRow, rep: ReplicaRow, alive: list[ReplicaRow], at: float
) -> Touched:
    """Node ``rep.node`` stopped ``rep`` on its own: stop the rest of the gang and requeue
    the job to resume from its last checkpoint (or fail it once its restart budget is
    spent). The node is suspect (no new work) until its next heartbeat: it may be going
    away."""
    node = s.get(NodeRow, rep.node)
    if node is not None and node.state == "ready":
        node.state = "suspect"
    touched = halt(s, alive, at)
    why = f"node {rep.node} stopped replica {rep.rank} on its own (lease lost or shutting down)"
    restart_or_fail(s, job, at, why, [rep.node])
    return touched


def _exit_words(ev: ReplicaEvent) -> str:
    if ev.signal is not None:
        return f"was killed by signal {ev.signal}"
    return f"exited with code {ev.exit_code}"


def _epoch(s: Session, job: JobRow) -> list[ReplicaRow]:
    """The replicas of ``job``'s current epoch (as ``read_ahead`` kept them, when it did)."""
    ahead = s.info.get(AHEAD)
    known = ahead[2].get(job.id) if ahead is not None else None
    if known is not None and known[0] == job.epoch:
        return list(known[1])
    q = select(ReplicaRow).where(ReplicaRow.job_id == job.id, ReplicaRow.epoch == job.epoch)
    return list(s.scalars(q))


def apply_logs(s: Session, node: str, chunks: Iterable[LogChunk], at: float) -> list[str]:
    """Store log chunks in order; a chunk already stored (a retried report) is skipped."""
    refused = []
    for c in chunks:
        rep = s.get(ReplicaRow, c.replica)
        if _stale(rep, node, c.epoch) or rep is None:
            refused.append(c.replica)
            continue
        if c.seq <= rep.log_seq:
            continue
        rep.log_seq = c.seq
        s.add(LogRow(job_id=rep.job_id, replica=rep.id, seq=c.seq, at=at, data=c.data))
    return refused


def apply_progress(s: Session, node: str, reports: Iterable[Progress]) -> list[str]:
    """Record each rank's latest step and recent step times; a checkpoint moves the job's
    last checkpoint (what preemption prices lost work from). Progress of an epoch the job
    has left is refused."""
    refused = []
    for p in reports:
        rep = s.get(ReplicaRow, p.replica)
        job = s.get(JobRow, rep.job_id) if rep is not None else None
        if _stale(rep, node, p.epoch) or job is None or job.epoch != p.epoch:
            refused.append(p.replica)
            continue
        _rank(s, job, node, p)
        job.last_step = max(job.last_step or 0, p.step)
        if p.checkpoint:
            quiet = (job.last_checkpoint_at or 0.0) > p.at - CHECKPOINT_EVENT_GAP_S
            job.last_checkpoint_at = p.at
            if p.rank == 0 and (not quiet or job.state == "preempting"):
                record(s, job.id, p.at, "checkpoint", f"checkpoint written at step {p.step}")
    return refused


def _rank(s: Session, job: JobRow, node: str, p: Progress) -> None:
    row = s.get(RankProgressRow, (job.id, p.rank))
    if row is None:
        row = RankProgressRow(
            job_id=job.id,
            rank=p.rank,
            epoch=p.epoch,
            node=node,
            step=p.step,
            at=p.at,
            step_times=[],
            metrics={},
        )
        s.add(row)
    times = list(row.step_times) if row.epoch == p.epoch else []
    if p.step_time_s is not None:
        times = [*times, p.step_time_s][-STEP_WINDOW:]
    row.epoch, row.node, row.step, row.at = p.epoch, node, p.step, p.at
    row.step_times, row.metrics = times, dict(p.metrics)

"""Cancelling jobs in every state (``jobs/cancel.py``) on a real SQLite store, as a table of
scenarios: what becomes of the job, each of its replicas, its open run and its nodes.

Waiting jobs end at once. A holding job's replicas that never reached a node end at once;
those a node runs get the checkpoint signal (the node is told), and the job's run stays
open until they exit. Finished jobs are left exactly as they ended."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session
from store_builders import (
    T0,
    a_job,
    a_replica,
    a_run,
    events_of,
    rolled_back,
    store_with_nodes,
)

from boltforge.control.jobs.cancel import cancel_jobs
from boltforge.control.scheduling.lifecycle import LIVE
from boltforge.control.store.db import Database
from boltforge.control.store.models import JobRow, NodeRow, ReplicaRow, RunRow

AT = T0 + 600.0  # when the cancel comes: ten minutes into the job's run
NODES = ("host-0", "host-1")


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Database]:
    with store_with_nodes(tmp_path_factory.mktemp("cancel") / "store.db", NODES) as store:
        yield store


@pytest.fixture
def s(db: Database) -> Iterator[Session]:
    """A session rolled back at the end: every scenario starts from the same two nodes."""
    yield from rolled_back(db)


@dataclass(frozen=True)
class Scenario:
    """A job in ``state`` with replicas in ``replicas`` (one per node, in order) and an
    open run when ``run``; after the cancel, the replicas are in ``after`` and ``told`` are
    the nodes told to stop something."""

    state: str
    replicas: tuple[str, ...] = ()
    run: bool = False
    after: tuple[str, ...] = ()
    told: frozenset[str] = field(default_factory=frozenset)
    run_closed: bool = False


SCENARIOS = {
    "pending": Scenario("pending"),
    "requeued": Scenario("requeued"),
    "scheduled, nothing dispatched yet": Scenario(
        "scheduled", ("waiting", "waiting"), True, ("exited", "exited"), frozenset(), True
    ),
    "scheduled, dispatched": Scenario(
        "scheduled", ("starting", "starting"), True, ("stopping", "stopping"), frozenset(NODES)
    ),
    "running": Scenario(
        "running", ("running", "running"), True, ("stopping", "stopping"), frozenset(NODES)
    ),
    "running, one replica already gone": Scenario(
        "running", ("exited", "running"), True, ("exited", "stopping"), frozenset({"host-1"})
    ),
    "running, one replica still waiting for its GPUs": Scenario(
        "running", ("waiting", "running"), True, ("exited", "stopping"), frozenset({"host-1"})
    ),
    "preempting, already stopping": Scenario(
        "preempting", ("stopping", "stopping"), True, ("stopping", "stopping"), frozenset()
    ),
    "preempting, its last replica lost": Scenario(
        "preempting", ("lost",), True, ("lost",), frozenset(), True
    ),
}


def set_up(s: Session, case: Scenario) -> JobRow:
    job = a_job(s, case.state, epoch=2, gpus=8, position=4, estimated_start=T0 + 60)
    for rank, state in enumerate(case.replicas):
        extra = {"stop_requested_at": T0 + 1} if state == "stopping" else {}
        a_replica(s, job, rank, NODES[rank], state, **extra)
    if case.run:
        a_run(s, job, started_at=T0, gpus=8)
    return job


def versions(s: Session) -> dict[str, int]:
    s.flush()
    return {n.name: n.desired_version for n in s.scalars(select(NodeRow))}


@pytest.mark.parametrize("case", SCENARIOS.values(), ids=list(SCENARIOS))
def test_a_live_job_is_cancelled_as_its_state_requires(s: Session, case: Scenario) -> None:
    job = set_up(s, case)
    before = versions(s)

    touched = cancel_jobs(s, [job], "alice", AT)
    s.flush()

    assert (job.state, job.finished_at, job.position, job.estimated_start) == (
        "cancelled",
        AT,
        None,
        None,
    )
    [event] = [e for e in events_of(s, job.id) if e.kind == "cancelled"]
    assert (event.at, event.message) == (AT, "cancelled by alice")
    reps = list(
        s.scalars(select(ReplicaRow).where(ReplicaRow.job_id == job.id).order_by(ReplicaRow.rank))
    )
    assert tuple(r.state for r in reps) == case.after
    assert touched.jobs == {job.id}
    assert touched.nodes == case.told
    after = versions(s)
    assert {n for n in NODES if after[n] != before[n]} == case.told
    assert all(after[n] - before[n] in (0, 1) for n in NODES)  # told once, however many replicas


@pytest.mark.parametrize("case", SCENARIOS.values(), ids=list(SCENARIOS))
def test_the_run_closes_at_the_cancel_only_once_nothing_is_left_to_checkpoint(
    s: Session, case: Scenario
) -> None:
    job = set_up(s, case)
    cancel_jobs(s, [job], "alice", AT)
    s.flush()
    runs = list(s.scalars(select(RunRow).where(RunRow.job_id == job.id)))
    if not case.run:
        assert runs == []
        return
    [run] = runs
    if case.run_closed:
        assert run.ended_at == AT
        assert job.attained_gpu_s == pytest.approx(8 * 600.0)  # its GPU-seconds are counted
    else:
        assert run.ended_at is None  # closed when its stopping replicas exit
        assert job.attained_gpu_s == 0.0


def test_replicas_a_node_runs_get_the_signal_at_the_cancel_and_waiting_ones_end_then(
    s: Session,
) -> None:
    job = set_up(s, SCENARIOS["running, one replica still waiting for its GPUs"])
    cancel_jobs(s, [job], "alice", AT)
    s.flush()
    waiting, running = s.scalars(
        select(ReplicaRow).where(ReplicaRow.job_id == job.id).order_by(ReplicaRow.rank)
    )
    assert (waiting.exited_at, waiting.stop_requested_at) == (AT, None)
    assert (running.stop_requested_at, running.exited_at) == (AT, None)


def test_a_replica_already_stopping_keeps_its_first_signal_time(s: Session) -> None:
    job = set_up(s, SCENARIOS["preempting, already stopping"])
    cancel_jobs(s, [job], "bob", AT)
    s.flush()
    stops = set(s.scalars(select(ReplicaRow.stop_requested_at).where(ReplicaRow.job_id == job.id)))
    assert stops == {T0 + 1}  # its grace counts from the preemption's signal


@pytest.mark.parametrize("state", ["succeeded", "failed", "cancelled"])
def test_a_finished_job_is_left_exactly_as_it_ended(s: Session, state: str) -> None:
    job = a_job(s, state, finished_at=T0 + 5, exit_code=3 if state == "failed" else None)
    a_run(s, job, started_at=T0, ended_at=T0 + 5)
    before = len(events_of(s, job.id))
    touched = cancel_jobs(s, [job], "alice", AT)
    s.flush()
    assert (job.state, job.finished_at) == (state, T0 + 5)
    assert len(events_of(s, job.id)) == before
    assert touched.jobs == set() and touched.nodes == set()
    assert s.scalar(select(RunRow.ended_at).where(RunRow.job_id == job.id)) == T0 + 5


def test_only_the_live_jobs_of_a_list_are_cancelled_and_told(s: Session) -> None:
    """An array job's tasks, some of which finished: the live ones are cancelled together."""
    tasks = [
        a_job(s, state, array_id="A", array_index=i)
        for i, state in enumerate(["succeeded", "running", "pending", "failed", "requeued"])
    ]
    a_replica(s, tasks[1], 0, "host-0", "running")
    touched = cancel_jobs(s, tasks, "carol", AT)
    s.flush()
    assert [t.state for t in tasks] == [
        "succeeded",
        "cancelled",
        "cancelled",
        "failed",
        "cancelled",
    ]
    assert touched.jobs == {tasks[1].id, tasks[2].id, tasks[4].id}
    assert touched.nodes == {"host-0"}


def test_cancelling_twice_leaves_one_cancellation(s: Session) -> None:
    job = set_up(s, SCENARIOS["running"])
    cancel_jobs(s, [job], "alice", AT)
    again = cancel_jobs(s, [job], "bob", AT + 10)
    s.flush()
    assert [e.message for e in events_of(s, job.id) if e.kind == "cancelled"] == [
        "cancelled by alice"
    ]
    assert job.finished_at == AT
    assert again.jobs == set() and again.nodes == set()


def test_replicas_of_an_earlier_allocation_that_still_hold_gpus_are_stopped_too(
    s: Session,
) -> None:
    """A job requeued while its old replicas are still checkpointing, then cancelled:
    every replica that holds GPUs belongs to the cancel, whatever its epoch."""
    job = a_job(s, "requeued", epoch=3)
    old = a_replica(s, job, 0, "host-0", "starting", id=f"{job.id}.2.0", epoch=2)
    touched = cancel_jobs(s, [job], "alice", AT)
    s.flush()
    assert old.state == "stopping" and touched.nodes == {"host-0"}


def test_every_live_state_is_one_the_table_covers() -> None:
    assert {c.state for c in SCENARIOS.values()} == set(LIVE)

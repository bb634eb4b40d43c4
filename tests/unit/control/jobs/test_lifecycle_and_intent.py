"""The job state machine (``scheduling/lifecycle.py``) and replica intent
(``scheduling/intent.py``) on a real SQLite store: allowed transitions leave one timeline
entry each, forbidden ones raise and change nothing, and start/stop move only the replicas
they should while marking each node changed once."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from boltforge.control.scheduling import intent
from boltforge.control.scheduling.lifecycle import (
    ALLOWED,
    HOLDING,
    LIVE,
    WAITING,
    IllegalTransition,
    record,
    transition,
)
from boltforge.control.store.db import Database
from boltforge.control.store.models import EventRow, JobRow, NodeRow, ReplicaRow

STATES = tuple(ALLOWED)
FINAL = ("succeeded", "failed", "cancelled")
T0 = 1_800_000_000.0
_ids = itertools.count(1)


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Database]:
    path: Path = tmp_path_factory.mktemp("store") / "lifecycle.db"
    store = Database(f"sqlite:///{path}")
    store.migrate()
    yield store
    store.close()


@pytest.fixture
def s(db: Database) -> Iterator[Session]:
    """A session whose writes are rolled back at the end, so tests share one store."""
    session = db.sessions()
    try:
        yield session
    finally:
        session.rollback()
        session.close()


def a_job(s: Session, state: str = "pending", **extra: object) -> JobRow:
    n = next(_ids)
    values: dict[str, object] = {
        "id": f"j{n}",
        "num": n,
        "name": f"train-{n}",
        "team": "research",
        "queue": "research",
        "priority": 2,
        "state": state,
        "spec": {},
        "gpus": 8,
        "replicas": 1,
        "submitted_at": T0,
        "position": 3,
        "estimated_start": T0 + 60.0,
    }
    values.update(extra)
    job = JobRow(**values)
    s.add(job)
    s.flush()
    return job


def a_node(s: Session, name: str, version: int = 0) -> NodeRow:
    node = NodeRow(
        name=name,
        inventory={"gpu": "h100"},
        pool="default",
        pod="p1",
        rack="r1",
        gpus=8,
        state="ready",
        registered_at=T0,
        desired_version=version,
    )
    s.add(node)
    s.flush()
    return node


def a_replica(s: Session, job: JobRow, rank: int, node: str, state: str) -> ReplicaRow:
    rep = ReplicaRow(
        id=f"{job.id}-0-{rank}",
        job_id=job.id,
        epoch=1,
        role="worker",
        rank=rank,
        node=node,
        gpus=[rank],
        state=state,
        spec={},
    )
    s.add(rep)
    s.flush()
    return rep


def events_of(s: Session, job: JobRow) -> list[EventRow]:
    s.flush()
    return list(s.scalars(select(EventRow).where(EventRow.job_id == job.id).order_by(EventRow.id)))


def versions(s: Session, names: list[str]) -> dict[str, int]:
    s.flush()
    rows = s.scalars(select(NodeRow).where(NodeRow.name.in_(names)))
    return {n.name: n.desired_version for n in rows}


# -- the transition table ------------------------------------------------------------------


def test_the_table_covers_every_state_and_names_only_known_ones() -> None:
    assert set(LIVE) | set(FINAL) == set(ALLOWED)
    for targets in ALLOWED.values():
        assert targets <= set(ALLOWED)
    assert set(WAITING) <= set(LIVE) and set(HOLDING) <= set(LIVE)


@pytest.mark.parametrize("state", FINAL)
def test_final_states_lead_nowhere(state: str) -> None:
    assert ALLOWED[state] == frozenset()


@pytest.mark.parametrize("state", LIVE)
def test_every_live_state_can_be_cancelled_or_fail(state: str) -> None:
    assert {"cancelled", "failed"} <= ALLOWED[state]


def test_only_a_held_or_stopping_job_can_succeed() -> None:
    assert {s for s, targets in ALLOWED.items() if "succeeded" in targets} == {
        "running",
        "preempting",
    }


def test_no_state_moves_to_itself_or_back_to_pending() -> None:
    for state, targets in ALLOWED.items():
        assert state not in targets
        assert "pending" not in targets


# -- transitions on the store ---------------------------------------------------------------

ALLOWED_PAIRS = sorted((a, b) for a, targets in ALLOWED.items() for b in targets)
FORBIDDEN_PAIRS = sorted((a, b) for a in STATES for b in STATES if b not in ALLOWED[a])


@pytest.mark.parametrize(("before", "after"), ALLOWED_PAIRS)
def test_an_allowed_transition_moves_the_job_and_leaves_one_event(
    s: Session, before: str, after: str
) -> None:
    job = a_job(s, before)
    transition(s, job, after, T0 + 5, f"now {after}")
    assert job.state == after
    [event] = events_of(s, job)
    assert (event.kind, event.message, event.at, event.data) == (
        after,
        f"now {after}",
        T0 + 5,
        {},
    )


@pytest.mark.parametrize(("before", "after"), FORBIDDEN_PAIRS)
def test_a_forbidden_transition_raises_and_changes_nothing(
    s: Session, before: str, after: str
) -> None:
    job = a_job(s, before)
    with pytest.raises(IllegalTransition, match=f"{job.id}: {before} -> {after}"):
        transition(s, job, after, T0 + 5, "never")
    assert job.state == before
    assert job.finished_at is None
    assert (job.position, job.estimated_start) == (3, T0 + 60.0)
    assert events_of(s, job) == []


@pytest.mark.parametrize("end", FINAL)
def test_a_final_transition_stamps_the_finish_and_leaves_the_queue(s: Session, end: str) -> None:
    job = a_job(s, "running")
    transition(s, job, end, T0 + 99, "done")
    assert job.finished_at == T0 + 99
    assert job.position is None and job.estimated_start is None


def test_a_live_transition_keeps_the_queue_position_and_no_finish(s: Session) -> None:
    job = a_job(s, "pending")
    transition(s, job, "scheduled", T0 + 1, "bound")
    assert job.finished_at is None
    assert (job.position, job.estimated_start) == (3, T0 + 60.0)


def test_an_event_can_carry_its_own_kind_and_data(s: Session) -> None:
    job = a_job(s, "running")
    transition(s, job, "scheduled", T0, "resized to 16 GPUs", kind="resized", data={"gpus": 16})
    [event] = events_of(s, job)
    assert (event.kind, event.data) == ("resized", {"gpus": 16})
    assert job.state == "scheduled"


def test_record_adds_to_the_timeline_without_moving_the_job(s: Session) -> None:
    job = a_job(s, "running")
    record(s, job.id, T0, "checkpoint", "step 100", {"step": 100})
    record(s, job.id, T0 + 1, "checkpoint", "step 200")
    assert job.state == "running"
    assert [(e.kind, e.message, e.data) for e in events_of(s, job)] == [
        ("checkpoint", "step 100", {"step": 100}),
        ("checkpoint", "step 200", {}),
    ]


def test_a_job_through_a_preemption_and_back_tells_its_whole_story(s: Session) -> None:
    job = a_job(s)
    story = ["scheduled", "running", "preempting", "requeued", "scheduled", "running", "succeeded"]
    for i, state in enumerate(story):
        transition(s, job, state, T0 + i, state)
    assert [e.kind for e in events_of(s, job)] == story
    assert job.finished_at == T0 + len(story) - 1


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(steps=st.lists(st.sampled_from(STATES), max_size=12))
def test_any_sequence_of_requests_follows_the_table(s: Session, steps: list[str]) -> None:
    """Whatever is asked, the job's state walks the table: each allowed request adds one
    event and moves the job, each forbidden one raises and leaves it as it was."""
    job = a_job(s)
    state, taken = "pending", []
    for i, wanted in enumerate(steps):
        if wanted in ALLOWED[state]:
            transition(s, job, wanted, T0 + i, wanted)
            state = wanted
            taken.append(wanted)
        else:
            with pytest.raises(IllegalTransition):
                transition(s, job, wanted, T0 + i, wanted)
        assert job.state == state
    assert [e.kind for e in events_of(s, job)] == taken
    assert (job.finished_at is not None) == (state in FINAL)


# -- intent: start and stop -----------------------------------------------------------------

REPLICA_STATES = ("waiting", "starting", "running", "stopping", "exited")

STOP_MOVES = {
    "waiting": "exited",
    "starting": "stopping",
    "running": "stopping",
    "stopping": "stopping",
    "exited": "exited",
}


@pytest.mark.parametrize("state", REPLICA_STATES)
def test_start_moves_only_a_waiting_replica(s: Session, state: str) -> None:
    job = a_job(s, "scheduled")
    node = a_node(s, f"n-{job.id}", version=4)
    rep = a_replica(s, job, 0, node.name, state)
    told = intent.start(s, [rep], T0)
    if state == "waiting":
        assert (rep.state, rep.dispatched_at) == ("starting", T0)
        assert told == {node.name}
        assert versions(s, [node.name]) == {node.name: 5}
    else:
        assert (rep.state, rep.dispatched_at) == (state, None)
        assert told == set()
        assert versions(s, [node.name]) == {node.name: 4}


@pytest.mark.parametrize("state", REPLICA_STATES)
def test_stop_moves_each_replica_state_where_it_should(s: Session, state: str) -> None:
    job = a_job(s, "running")
    node = a_node(s, f"n-{job.id}", version=1)
    rep = a_replica(s, job, 0, node.name, state)
    told = intent.stop(s, [rep], T0 + 7)
    assert rep.state == STOP_MOVES[state]
    signalled = state in ("starting", "running")
    assert told == ({node.name} if signalled else set())
    assert rep.stop_requested_at == (T0 + 7 if signalled else None)
    assert rep.exited_at == (T0 + 7 if state == "waiting" else None)
    assert versions(s, [node.name]) == {node.name: 2 if signalled else 1}


def test_a_gang_start_marks_each_node_changed_once(s: Session) -> None:
    job = a_job(s, "scheduled")
    a, b = a_node(s, f"a-{job.id}"), a_node(s, f"b-{job.id}", version=10)
    reps = [a_replica(s, job, r, (a if r < 3 else b).name, "waiting") for r in range(5)]
    told = intent.start(s, reps, T0)
    assert told == {a.name, b.name}
    assert all(r.state == "starting" for r in reps)
    assert versions(s, [a.name, b.name]) == {a.name: 1, b.name: 11}


def test_a_stop_ends_unstarted_replicas_and_signals_started_ones_once_per_node(
    s: Session,
) -> None:
    job = a_job(s, "running")
    busy, idle = a_node(s, f"busy-{job.id}"), a_node(s, f"idle-{job.id}")
    running = [a_replica(s, job, r, busy.name, "running") for r in range(2)]
    starting = a_replica(s, job, 2, busy.name, "starting")
    never = a_replica(s, job, 3, idle.name, "waiting")
    told = intent.stop(s, [*running, starting, never], T0)
    assert told == {busy.name}
    assert never.state == "exited" and never.exited_at == T0
    assert all(r.state == "stopping" for r in [*running, starting])
    assert versions(s, [busy.name, idle.name]) == {busy.name: 1, idle.name: 0}


def test_stopping_twice_changes_nothing_the_second_time(s: Session) -> None:
    job = a_job(s, "running")
    node = a_node(s, f"n-{job.id}")
    rep = a_replica(s, job, 0, node.name, "running")
    assert intent.stop(s, [rep], T0) == {node.name}
    assert intent.stop(s, [rep], T0 + 30) == set()
    assert rep.stop_requested_at == T0
    assert versions(s, [node.name]) == {node.name: 1}


def test_nothing_to_do_touches_no_node(s: Session) -> None:
    job = a_job(s, "running")
    node = a_node(s, f"n-{job.id}", version=3)
    assert intent.start(s, [], T0) == set()
    assert intent.stop(s, [], T0) == set()
    assert versions(s, [node.name]) == {node.name: 3}


def test_changed_reads_nodes_the_session_does_not_hold(db: Database) -> None:
    name = f"stored-{next(_ids)}"
    with db.session() as s1:
        a_node(s1, name, version=7)
    with db.session() as s2:
        intent.changed(s2, {name, "no-such-node"})
    with db.session() as s3:
        assert s3.scalar(select(NodeRow.desired_version).where(NodeRow.name == name)) == 8
        s3.delete(s3.get(NodeRow, name))


def test_renewed_counts_from_zero_for_a_node_not_yet_stored() -> None:
    node = NodeRow(name="fresh")
    intent.renewed(node)
    intent.renewed(node)
    assert node.desired_version == 2


def test_the_event_count_grows_only_with_the_job_s_own_events(s: Session) -> None:
    mine, other = a_job(s), a_job(s)
    transition(s, mine, "scheduled", T0, "bound")
    s.flush()
    count = s.scalar(select(func.count()).select_from(EventRow).where(EventRow.job_id == other.id))
    assert count == 0
    assert len(events_of(s, mine)) == 1

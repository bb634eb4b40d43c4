"""The restart budget and recovery holds (``jobs/restarts.py``) on a real SQLite store, as a
table of scenarios: which failures requeue a job and at what cost, when it fails instead,
what its timeline says, which GPUs are held for its restart, and when a hold ends."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

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

from boltforge.control.jobs.restarts import budget, end_holds, hold, restart_or_fail
from boltforge.control.store.db import Database
from boltforge.control.store.models import JobRow, RunRow
from boltforge.spec.job import DEFAULT_MAX_RESTARTS

AT = T0 + 100.0
WHY = "node host-1 stopped answering"
NODES = ("host-0", "host-1", "host-2", "host-3")


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Database]:
    with store_with_nodes(tmp_path_factory.mktemp("restarts") / "store.db", NODES) as store:
        yield store


@pytest.fixture
def s(db: Database) -> Iterator[Session]:
    yield from rolled_back(db)


# -- the budget ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "allowed"),
    [({}, DEFAULT_MAX_RESTARTS), ({"max_restarts": 0}, 0), ({"max_restarts": 7}, 7)],
)
def test_a_jobs_budget_is_its_specs_or_the_default(
    s: Session, spec: dict[str, Any], allowed: int
) -> None:
    assert budget(a_job(s, "running", spec=spec)) == allowed


@dataclass(frozen=True)
class Failure:
    """A job in ``state`` that has spent ``spent`` of ``allowed`` restarts fails; it
    ``requeues`` (or fails), with ``restarts`` counted after, and a last event of
    ``kind`` saying ``says``."""

    state: str
    spent: int
    allowed: int
    requeues: bool
    restarts: int
    kind: str
    says: str


RESUME = f"requeued: {WHY}; resumes from its last checkpoint"
FAILURES = {
    "a first failure": Failure("running", 0, 3, True, 1, "lost", RESUME),
    "the last restart left": Failure("running", 2, 3, True, 3, "lost", RESUME),
    "the budget spent": Failure(
        "running", 3, 3, False, 3, "failed", f"failed: restart budget of 3 exhausted; last: {WHY}"
    ),
    "no restarts allowed": Failure(
        "scheduled", 0, 0, False, 0, "failed", f"failed: restart budget of 0 exhausted; last: {WHY}"
    ),
    "placed but not yet running": Failure("scheduled", 1, 3, True, 2, "lost", RESUME),
    "leaving by the scheduler's choice": Failure("preempting", 0, 3, True, 0, "lost", RESUME),
    "leaving, with the budget spent": Failure("preempting", 3, 3, True, 3, "lost", RESUME),
}


@pytest.mark.parametrize("case", FAILURES.values(), ids=list(FAILURES))
def test_a_failure_requeues_the_job_or_fails_it_as_its_budget_says(
    s: Session, case: Failure
) -> None:
    job = a_job(s, case.state, restarts=case.spent, spec={"max_restarts": case.allowed})
    a_run(s, job, started_at=T0, gpus=8)

    requeued = restart_or_fail(s, job, AT, WHY)
    s.flush()

    assert requeued is case.requeues
    assert job.state == ("requeued" if case.requeues else "failed")
    assert job.restarts == case.restarts
    assert job.finished_at == (None if case.requeues else AT)
    last = events_of(s, job.id)[-1]
    assert (last.kind, last.message, last.at) == (case.kind, case.says, AT)
    if case.state != "preempting":
        assert last.data == {"restarts": case.restarts, "max_restarts": case.allowed}
    else:
        assert last.data == {}  # nothing was charged
    run = s.scalar(select(RunRow).where(RunRow.job_id == job.id))
    assert run is not None and run.ended_at == AT  # the run ends at the failure either way
    assert job.attained_gpu_s == pytest.approx(8 * 100.0)


def test_a_job_keeps_restarting_until_its_budget_is_spent(s: Session) -> None:
    job = a_job(s, "running", spec={"max_restarts": 2})
    outcomes = []
    for n in range(4):
        if job.state == "requeued":
            job.state = "running"  # placed and started again (as the scheduler would)
        if job.state == "failed":
            break
        outcomes.append(restart_or_fail(s, job, AT + n, WHY))
    assert outcomes == [True, True, False]
    assert (job.state, job.restarts) == ("failed", 2)


# -- recovery holds --------------------------------------------------------------------------


def gang(s: Session, states: tuple[str, ...], **job: Any) -> JobRow:
    """A running job with one replica per node of ``NODES`` in ``states``."""
    row = a_job(s, "running", epoch=2, **job)
    for rank, state in enumerate(states):
        a_replica(
            s, row, rank, NODES[rank], state, gpus=[rank, rank + 4], spec={"storage_gb": 10 * rank}
        )
    return row


def test_a_requeue_after_a_host_failure_holds_what_the_job_kept_on_healthy_hosts(
    s: Session,
) -> None:
    job = gang(s, ("stopping", "lost", "running", "starting"))
    assert restart_or_fail(s, job, AT, WHY, lost=["host-1", "host-1"])
    assert job.recovery_hold == {
        "at": AT,
        "lost": ["host-1"],
        "grants": [
            {
                "role": "worker",
                "replica": r,
                "node": f"host-{r}",
                "gpus": [r, r + 4],
                "cpus": 8.0,
                "memory_gb": 64.0,
                "storage_gb": float(10 * r),
            }
            for r in (0, 2, 3)
        ],
    }


def test_a_hold_keeps_only_replicas_of_the_current_allocation_that_reached_their_node(
    s: Session,
) -> None:
    job = gang(s, ("waiting", "exited", "running", "lost"))
    a_replica(s, job, 9, "host-0", "running", id=f"{job.id}.1.9", epoch=1)  # the last epoch's
    found = hold(s, job, ["host-3"], AT)
    assert found is not None
    assert [g["node"] for g in found["grants"]] == ["host-2"]


def test_a_hold_numbers_each_roles_replicas_from_its_first_rank(s: Session) -> None:
    job = a_job(s, "running", epoch=1)
    for rank, (role, node) in enumerate(
        [("learner", "host-0"), ("learner", "host-1"), ("actor", "host-2"), ("actor", "host-3")]
    ):
        a_replica(s, job, rank, node, "running", role=role)
    found = hold(s, job, ["host-0"], AT)
    assert found is not None
    assert [(g["role"], g["replica"], g["node"]) for g in found["grants"]] == [
        ("learner", 1, "host-1"),
        ("actor", 0, "host-2"),
        ("actor", 1, "host-3"),
    ]


@pytest.mark.parametrize(
    ("states", "lost", "spent"),
    [
        (("lost", "lost", "exited", "exited"), ["host-0", "host-1"], 0),  # nothing survived
        (("stopping", "lost", "running", "running"), [], 0),  # no host named as lost
        (("stopping", "lost", "running", "running"), ["host-1"], 3),  # failed: nothing to hold
    ],
    ids=["nothing survived", "no host lost", "the job failed"],
)
def test_no_hold_when_there_is_nothing_to_keep_or_nobody_to_keep_it_for(
    s: Session, states: tuple[str, ...], lost: list[str], spent: int
) -> None:
    job = gang(s, states, restarts=spent)
    restart_or_fail(s, job, AT, WHY, lost=lost)
    assert job.recovery_hold is None


HOLD_S = 120.0


@pytest.mark.parametrize(
    ("state", "age", "kept", "told"),
    [
        ("requeued", HOLD_S - 1, True, False),
        ("requeued", HOLD_S, False, True),  # a hold lasts exactly hold_s
        ("pending", HOLD_S + 50, False, True),
        ("running", 1.0, False, False),  # placed meanwhile: cleared quietly
        ("cancelled", 1.0, False, False),
    ],
    ids=["fresh", "just ran out", "long gone", "placed since", "cancelled since"],
)
def test_a_hold_ends_when_it_runs_out_or_its_job_stops_waiting(
    s: Session, state: str, age: float, kept: bool, told: bool
) -> None:
    grants = [{"node": "host-2", "gpus": [0]}, {"node": "host-3", "gpus": [1]}]
    job = a_job(s, state, recovery_hold={"at": AT, "lost": ["host-1"], "grants": grants})
    before = len(events_of(s, job.id))

    timeline_grew = end_holds(s, AT + age, HOLD_S)
    s.flush()

    assert (job.recovery_hold is not None) is kept
    assert (job.id in timeline_grew) is told
    notes = events_of(s, job.id)[before:]
    if told:
        [note] = notes
        assert (note.kind, note.at) == ("note", AT + age)
        assert (
            note.message == "recovery hold on host-[2-3] ended; those GPUs are free for other jobs"
        )
    else:
        assert notes == []


def test_jobs_without_a_hold_are_left_alone(s: Session) -> None:
    job = a_job(s, "requeued")
    assert end_holds(s, AT + 1e6, HOLD_S) == set()
    assert job.recovery_hold is None and events_of(s, job.id) == []

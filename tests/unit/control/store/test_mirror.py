"""The in-memory world follows the store's commits exactly: what commits lands, what rolls
back leaves no trace, and its versions move only for changes a pass would see."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from boltforge.control.store.db import Database
from boltforge.control.store.mirror import Mirror, stage
from boltforge.control.store.models import JobRow, NodeRow, ReplicaRow


@pytest.fixture
def store(tmp_path: Path) -> Iterator[tuple[Database, Mirror]]:
    db = Database(f"sqlite:///{tmp_path / 'm.db'}")
    db.migrate()
    mirror = Mirror()
    mirror.watch(db.sessions)
    with db.session() as s:
        mirror.load(s)
    yield db, mirror
    db.close()


def node(name: str = "host-0", **extra: Any) -> NodeRow:
    values: dict[str, Any] = {
        "name": name,
        "inventory": {"name": name, "gpus": 8},
        "pool": "h100",
        "pod": "p0",
        "rack": "r0",
        "gpus": 8,
        "state": "ready",
        "registered_at": 0.0,
        "cordoned": False,
        "desired_version": 0,
        "health": {},
    }
    return NodeRow(**{**values, **extra})


def job(job_id: str = "1", state: str = "pending", **extra: Any) -> JobRow:
    values: dict[str, Any] = {
        "id": job_id,
        "num": int(job_id),
        "name": "train",
        "team": "research",
        "queue": "research",
        "priority": 2,
        "state": state,
        "spec": {"gpus": 8},
        "gpus": 8,
        "replicas": 1,
        "submitted_at": 0.0,
        "epoch": 0,
        "waiting": [],
        "explanation": [],
    }
    return JobRow(**{**values, **extra})


def replica(rid: str = "1.1.0", state: str = "waiting", **extra: Any) -> ReplicaRow:
    values: dict[str, Any] = {
        "id": rid,
        "job_id": "1",
        "epoch": 1,
        "role": "worker",
        "rank": 0,
        "node": "host-0",
        "gpus": [0, 1],
        "state": state,
        "spec": {"grace_s": 45.0, "env": {"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}},
    }
    return ReplicaRow(**{**values, **extra})


def fresh(db: Database) -> Mirror:
    again = Mirror()
    with db.session() as s:
        again.load(s)
    return again


def test_committed_rows_land_with_their_derived_fields(store: tuple[Database, Mirror]) -> None:
    db, mirror = store
    with db.session() as s:
        s.add_all([node(), job(state="scheduled")])
        s.flush()
        s.add(replica())
    rep = mirror.replicas["1.1.0"]
    assert (rep.grace_s, rep.rendezvous, rep.gpus) == (45.0, ("10.0.0.1", 29500), [0, 1])
    assert mirror.held_on("host-0") == [rep]
    assert mirror.jobs["1"].state == "scheduled"
    assert fresh(db).replicas == mirror.replicas


def test_a_rolled_back_transaction_leaves_no_trace(store: tuple[Database, Mirror]) -> None:
    db, mirror = store
    with db.session() as s:
        s.add(node())
    before = mirror.version
    with pytest.raises(RuntimeError), db.session() as s:
        row = s.get(NodeRow, "host-0")
        assert row is not None
        row.cordoned = True
        s.flush()
        raise RuntimeError("the request failed after writing")
    assert mirror.nodes["host-0"].cordoned is False
    assert mirror.version == before


def test_reasons_and_heartbeats_leave_the_holdings_version_alone(
    store: tuple[Database, Mirror],
) -> None:
    db, mirror = store
    with db.session() as s:
        s.add_all([node(), job()])
    before = mirror.version
    with db.session() as s:
        row, host = s.get(JobRow, "1"), s.get(NodeRow, "host-0")
        assert row is not None and host is not None
        row.reason, row.position = "capacity", 3
        host.last_heartbeat, host.lease_expires_at = 10.0, 25.0
        host.health = {"gpus": {"0": {"util": 5}}}
    assert mirror.version == before
    assert (mirror.jobs["1"].reason, mirror.nodes["host-0"].lease_expires_at) == ("capacity", 25.0)
    with db.session() as s:
        host = s.get(NodeRow, "host-0")
        assert host is not None
        host.cordoned = True
    assert mirror.version == before + 1


def test_jobs_and_replicas_leave_when_they_stop_being_live(
    store: tuple[Database, Mirror],
) -> None:
    db, mirror = store
    with db.session() as s:
        s.add_all([node(), job(state="running")])
        s.flush()
        s.add(replica(state="running"))
    with db.session() as s:
        rep, row = s.get(ReplicaRow, "1.1.0"), s.get(JobRow, "1")
        assert rep is not None and row is not None
        rep.state, row.state = "exited", "succeeded"
    assert "1" not in mirror.jobs and "1.1.0" not in mirror.replicas
    assert mirror.held_on("host-0") == []


def test_bulk_writes_are_handed_over_and_land_at_commit(store: tuple[Database, Mirror]) -> None:
    db, mirror = store
    mirror.add_jobs([{"id": "7", "num": 7, "state": "pending", "team": "nlp", "spec": {}}])
    assert mirror.jobs["7"].team == "nlp"
    with db.session() as s:
        stage(s, JobRow, "7", {"reason": "quota"})
        assert mirror.jobs["7"].reason == ""  # not committed yet
    assert mirror.jobs["7"].reason == "quota"
    stale = len(mirror.jobs)
    with db.session() as s:
        stage(s, JobRow, "8", {"reason": "quota"})  # no such live job: nothing invented
    assert len(mirror.jobs) == stale


def test_a_partial_change_of_an_unknown_row_invents_nothing(
    store: tuple[Database, Mirror],
) -> None:
    _, mirror = store
    mirror.apply(
        [(ReplicaRow, "9.1.0", {"pid": 4}, False), (NodeRow, "x", {"state": "dead"}, False)]
    )
    assert mirror.replicas == {} and mirror.nodes == {}


def test_jobs_that_succeed_teach_runtimes_that_outlive_a_restart(
    store: tuple[Database, Mirror],
) -> None:
    db, mirror = store
    with db.session() as s:
        s.add_all([job(str(i), state="running") for i in range(1, 5)])
    with db.session() as s:
        for i, hours in ((1, 1.0), (2, 2.0), (3, 3.0)):
            row = s.get(JobRow, str(i))
            assert row is not None
            row.state, row.finished_at = "succeeded", float(i)
            row.attained_gpu_s = 8 * hours * 3600.0  # eight GPUs for that many hours
        row = s.get(JobRow, "4")
        assert row is not None
        row.state, row.attained_gpu_s = "failed", 8 * 100 * 3600.0  # failures teach nothing
    assert mirror.estimate("research", "train", 8) == 3 * 3600.0
    assert fresh(db).estimate("research", "train", 8) == 3 * 3600.0
    assert mirror.estimate("research", "train", 16) == 3 * 3600.0  # the team's, any size
    assert mirror.estimate("vision", "train", 8) is None

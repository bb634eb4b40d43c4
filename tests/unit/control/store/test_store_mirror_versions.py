"""The mirror's two versions as a table: which committed changes a scheduling pass must see
(``version``: the fleet's holdings; ``fleet_version``: the nodes' inventories) and which it
may ignore, plus the mirror's indexes (replicas by node, by job) and the rows it copies.
Changes are handed over as the store's commits hand them (``Mirror.apply``), and a few
through a real SQLite session, the way the server makes them."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import delete
from store_builders import a_job, a_node, a_replica, migrated

from boltforge.control.store.db import Database
from boltforge.control.store.mirror import LiveReplica, Mirror
from boltforge.control.store.models import JobRow, NodeRow, ReplicaRow

INVENTORY = {"name": "host-0", "gpus": 8, "gpu": "H100"}


def node_values(**extra: Any) -> dict[str, Any]:
    return {
        "name": "host-0",
        "inventory": INVENTORY,
        "state": "ready",
        "cordoned": False,
        "health": {},
        **extra,
    }


def job_values(job_id: str, state: str, **extra: Any) -> dict[str, Any]:
    return {"id": job_id, "num": int(job_id), "team": "t", "state": state, "priority": 2, **extra}


def replica_values(rid: str, state: str, node: str = "host-0", **extra: Any) -> dict[str, Any]:
    job, epoch, rank = rid.split(".")
    return {
        "id": rid,
        "job_id": job,
        "epoch": int(epoch),
        "rank": int(rank),
        "node": node,
        "gpus": [0, 1],
        "state": state,
        **extra,
    }


@pytest.fixture
def mirror() -> Mirror:
    """A node, a pending job ("1"), a running one ("2") with a running replica on the node."""
    m = Mirror()
    m.apply(
        [
            (NodeRow, "host-0", node_values(), False),
            (JobRow, "1", job_values("1", "pending"), False),
            (JobRow, "2", job_values("2", "running"), False),
            (ReplicaRow, "2.1.0", replica_values("2.1.0", "running"), False),
        ]
    )
    return m


@dataclass(frozen=True)
class Change:
    table: type
    key: str
    values: dict[str, Any]
    deleted: bool = False
    version: int = 0  # how much each version moves
    fleet: int = 0


CHANGES = {
    # nodes
    "a heartbeat": Change(NodeRow, "host-0", {"last_heartbeat": 5.0, "lease_expires_at": 20.0}),
    "a cordon": Change(NodeRow, "host-0", {"cordoned": True}, version=1),
    "a node going suspect": Change(NodeRow, "host-0", {"state": "suspect"}, version=1),
    "new inventory": Change(
        NodeRow, "host-0", {"inventory": {**INVENTORY, "gpus": 4}}, False, 1, 1
    ),
    "the same inventory again": Change(NodeRow, "host-0", {"inventory": dict(INVENTORY)}),
    "GPU samples in the health": Change(NodeRow, "host-0", {"health": {"gpus": {"0": 91}}}),
    "the node found degraded": Change(NodeRow, "host-0", {"health": {"degraded": True}}, version=1),
    "a straggler mark": Change(NodeRow, "host-0", {"degraded_until": 99.0}, version=1),
    "a spot reclaim notice": Change(NodeRow, "host-0", {"reclaim_at": 50.0}),
    "a new node": Change(NodeRow, "host-1", node_values(name="host-1"), False, 1, 1),
    "a node removed": Change(NodeRow, "host-0", {}, True, 1, 1),
    "an unknown node removed": Change(NodeRow, "host-9", {}, True),
    "a change of a node never seen whole": Change(NodeRow, "host-9", {"state": "lost"}),
    # jobs
    "a new pending job": Change(JobRow, "3", job_values("3", "pending")),
    "a new running job": Change(JobRow, "3", job_values("3", "running"), version=1),
    "a pending job requeued": Change(JobRow, "1", {"state": "requeued"}),
    "a pending job placed": Change(JobRow, "1", {"state": "scheduled"}, version=1),
    "a running job rescheduled": Change(JobRow, "2", {"state": "scheduled"}),
    "a running job preempted": Change(JobRow, "2", {"state": "preempting"}, version=1),
    "a pending job cancelled": Change(JobRow, "1", {"state": "cancelled"}),
    "a running job finished": Change(JobRow, "2", {"state": "succeeded"}, version=1),
    "a job's priority": Change(JobRow, "1", {"priority": 0}, version=1),
    "a job's reason and place": Change(JobRow, "1", {"reason": "quota", "position": 4}),
    "a job borrowing": Change(JobRow, "2", {"borrowed": True}, version=1),
    "a finished job never live": Change(JobRow, "9", {"exit_code": 0}),
    # replicas
    "a new bound replica": Change(
        ReplicaRow, "1.1.0", replica_values("1.1.0", "waiting"), version=1
    ),
    "a replica started": Change(ReplicaRow, "2.1.0", {"state": "running", "pid": 4242}),
    "a replica told to stop": Change(
        ReplicaRow, "2.1.0", {"state": "stopping", "stop_requested_at": 9.0}, version=1
    ),
    "a replica exited": Change(ReplicaRow, "2.1.0", {"state": "exited"}, version=1),
    "a replica's log offset": Change(ReplicaRow, "2.1.0", {"log_seq": 40}),
    "a replica on other GPUs": Change(ReplicaRow, "2.1.0", {"gpus": [2, 3]}, version=1),
    "an exited replica never held": Change(ReplicaRow, "9.1.0", replica_values("9.1.0", "exited")),
}


@pytest.mark.parametrize("case", CHANGES.values(), ids=list(CHANGES))
def test_versions_move_only_for_what_a_pass_would_see(mirror: Mirror, case: Change) -> None:
    version, fleet = mirror.version, mirror.fleet_version
    mirror.apply([(case.table, case.key, case.values, case.deleted)])
    assert (mirror.version - version, mirror.fleet_version - fleet) == (case.version, case.fleet)


def test_a_removed_node_is_gone_and_a_change_of_it_afterwards_invents_nothing(
    mirror: Mirror,
) -> None:
    mirror.apply([(NodeRow, "host-0", {}, True)])
    assert mirror.nodes == {}
    mirror.apply([(NodeRow, "host-0", {"last_heartbeat": 1.0}, False)])
    assert mirror.nodes == {}


def test_jobs_that_are_not_live_are_not_kept(mirror: Mirror) -> None:
    mirror.apply([(JobRow, "2", {"state": "failed"}, False)])
    mirror.add_jobs([job_values("5", "succeeded"), job_values("6", "pending")])
    assert sorted(mirror.jobs) == ["1", "6"]


@pytest.mark.parametrize("case", CHANGES.values(), ids=list(CHANGES))
def test_each_step_of_the_version_names_what_changed(mirror: Mirror, case: Change) -> None:
    version = mirror.version
    mirror.apply([(case.table, case.key, case.values, case.deleted)])
    jobs, nodes = mirror.changed_since(version) or (set(), set())
    named = len(nodes) if case.table is NodeRow else len(jobs)
    assert named == case.version and len(jobs) + len(nodes) == case.version


def test_the_change_log_forgets_its_oldest_steps(
    mirror: Mirror, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("boltforge.control.store.mirror.LOG_KEEP", 4)
    start = mirror.version
    for i in range(6):
        mirror.apply([(JobRow, "2", {"priority": 10 + i}, False)])
    assert mirror.changed_since(start) is None  # no longer known: a whole read will do
    assert mirror.changed_since(mirror.version - 1) == ({"2"}, set())
    assert mirror.changed_since(mirror.version) == (set(), set())
    mirror.apply([(ReplicaRow, "2.1.0", {}, True)])
    assert mirror.changed_since(mirror.version - 1) == ({"2"}, set())
    assert mirror.replicas_of("2") == [] and "2" not in mirror.of_job


# -- indexes ---------------------------------------------------------------------------------


def test_a_replica_that_moves_is_held_on_its_new_node_only(mirror: Mirror) -> None:
    mirror.apply([(ReplicaRow, "2.1.0", {"node": "host-1"}, False)])
    assert mirror.held_on("host-0") == []
    assert [r.id for r in mirror.held_on("host-1")] == ["2.1.0"]


def test_replicas_on_a_node_come_by_id_and_by_job_in_epoch_then_rank_order(
    mirror: Mirror,
) -> None:
    mirror.apply(
        [
            (ReplicaRow, rid, replica_values(rid, "running"), False)
            for rid in ("2.2.1", "2.1.1", "2.2.0", "1.1.0")
        ]
    )
    assert [r.id for r in mirror.held_on("host-0")] == ["1.1.0", "2.1.0", "2.1.1", "2.2.0", "2.2.1"]
    by_job = mirror.held_by_job()
    assert [(r.epoch, r.rank) for r in by_job["2"]] == [(1, 0), (1, 1), (2, 0), (2, 1)]
    assert [r.id for r in by_job["1"]] == ["1.1.0"]
    assert mirror.held_on("host-7") == []


@pytest.mark.parametrize(
    ("spec", "grace", "rendezvous"),
    [
        ({}, 30.0, None),
        ({"grace_s": 120}, 120.0, None),
        ({"env": {"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29501"}}, 30.0, ("10.0.0.1", 29501)),
        ({"env": None}, 30.0, None),
    ],
    ids=["defaults", "its own grace", "a rendezvous port", "no environment"],
)
def test_a_replicas_grace_and_rendezvous_come_from_its_spec(
    spec: dict[str, Any], grace: float, rendezvous: tuple[str, int] | None
) -> None:
    rep = LiveReplica(id="1.1.0", spec=spec)
    assert (rep.grace_s, rep.rendezvous) == (grace, rendezvous)


# -- through the store -----------------------------------------------------------------------


@pytest.fixture
def watched(tmp_path: Path) -> Iterator[tuple[Database, Mirror]]:
    with migrated(tmp_path / "mirror.db") as db:
        m = Mirror()
        m.watch(db.sessions)
        with db.session() as s:
            m.load(s)
        yield db, m


def test_a_node_deleted_in_the_store_leaves_the_mirror(watched: tuple[Database, Mirror]) -> None:
    db, mirror = watched
    with db.session() as s:
        a_node(s, "host-0")
    assert "host-0" in mirror.nodes
    version, fleet = mirror.version, mirror.fleet_version
    with db.session() as s:
        s.delete(s.get_one(NodeRow, "host-0"))
    assert "host-0" not in mirror.nodes
    assert (mirror.version, mirror.fleet_version) == (version + 1, fleet + 1)


def test_a_bulk_delete_is_not_seen_until_the_mirror_is_loaded_again(
    watched: tuple[Database, Mirror],
) -> None:
    """Writes past the unit of work reach the mirror only when handed over; a reload
    rebuilds it from the store."""
    db, mirror = watched
    with db.session() as s:
        a_node(s, "host-0")
    with db.session() as s:
        s.execute(delete(NodeRow))
    assert "host-0" in mirror.nodes
    with db.session() as s:
        mirror.load(s)
    assert mirror.nodes == {}


def test_the_mirror_keeps_copies_a_later_change_to_the_row_cannot_reach(
    watched: tuple[Database, Mirror],
) -> None:
    db, mirror = watched
    with db.session() as s:
        a_node(s, "host-0")
        job = a_job(s, "running", waiting=["capacity"])
        rep = a_replica(s, job, 0, "host-0", "running", gpus=[0, 1])
        rep.gpus.append(7)  # in place, after the flush: not a change the store records
        job.waiting.append("quota")
    assert mirror.replicas[rep.id].gpus == [0, 1]
    assert mirror.jobs[job.id].waiting == ["capacity"]


def test_loading_rebuilds_the_nodes_index_and_moves_both_versions(
    watched: tuple[Database, Mirror],
) -> None:
    db, mirror = watched
    with db.session() as s:
        a_node(s, "host-0")
        job = a_job(s, "running")
        a_replica(s, job, 0, "host-0", "running")
        a_replica(s, job, 1, "host-0", "exited")
    again = Mirror()
    with db.session() as s:
        again.load(s)
    assert [r.id for r in again.held_on("host-0")] == [f"{job.id}.1.0"]
    assert again.replicas == mirror.replicas and again.jobs == mirror.jobs
    assert (again.version, again.fleet_version) == (1, 1)

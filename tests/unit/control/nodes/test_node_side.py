"""The node side of the control plane through the real API in-process (the test plays the
agents): registration reconciling what a node still runs, sessions, leases on a fake clock,
which reports are refused, logs and progress landing on the job, and quarantine of a gang."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from control_kit import ADMIN, Fleet, Node, make_spec
from sqlalchemy import select

from boltforge.control.store.models import ReplicaRow
from boltforge.wire.agent import ReplicaSpec


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    with Fleet(tmp_path) as f:
        yield f


def placed(fleet: Fleet, job: str) -> tuple[Node, ReplicaSpec]:
    """The node running the single replica of ``job``, and that replica."""
    [(node, rep)] = [(n, r) for n in fleet.nodes.values() for r in n.to_run() if r.job == job]
    return node, rep


def replica_row(fleet: Fleet, replica: str) -> ReplicaRow:
    with fleet.rt.db.session() as s:
        row = s.scalar(select(ReplicaRow).where(ReplicaRow.id == replica))
        assert row is not None
        s.expunge(row)
        return row


def node_states(fleet: Fleet) -> dict[str, Any]:
    nodes = fleet.http.get("/v1/nodes", headers=ADMIN).json()["nodes"]
    return {n["name"]: n for n in nodes}


def status(rep: ReplicaSpec, **change: Any) -> dict[str, Any]:
    """What a node says it runs of ``rep`` when it registers (``change`` alters it)."""
    return {
        "replica": rep.replica,
        "job": rep.job,
        "epoch": rep.epoch,
        "state": "running",
        **change,
    }


def keep_others_alive(fleet: Fleet, silent: str, seconds: float) -> None:
    """Time passes; every node but ``silent`` heartbeats at its end."""
    fleet.clock.advance(seconds)
    for name, node in fleet.nodes.items():
        if name != silent:
            assert node.heartbeat() == 200
    fleet.settle()


# -- registration reconciles what the node still runs ----------------------------------------


@dataclass(frozen=True)
class Rejoin:
    """A node registering again while it holds the replica ``rep`` of an 8-GPU job."""

    name: str
    started: bool  # whether the replica's start was reported before
    running: Callable[[ReplicaSpec], list[dict[str, Any]]]  # what the node says it runs
    stop: Callable[[ReplicaSpec], list[str]]  # what the lease tells it to stop
    replica_state: str  # the replica's row afterwards
    job_state: str  # the job's state after a settle
    still_told_to_run: bool


REJOINS = [
    Rejoin(
        "adopts-a-started-replica-it-still-runs",
        started=True,
        running=lambda r: [status(r, pid=77)],
        stop=lambda r: [],
        replica_state="running",
        job_state="running",
        still_told_to_run=True,
    ),
    Rejoin(
        "stops-a-replica-it-never-placed-and-keeps-the-one-it-did",
        started=True,
        running=lambda r: [status(r), status(r, replica="ghost.1.0", job="ghost", epoch=1)],
        stop=lambda r: ["ghost.1.0"],
        replica_state="running",
        job_state="running",
        still_told_to_run=True,
    ),
    Rejoin(
        "loses-the-replica-the-node-no-longer-has",
        started=True,
        running=lambda r: [],
        stop=lambda r: [],
        replica_state="lost",
        job_state="scheduled",  # requeued, then placed again at once
        still_told_to_run=False,
    ),
]


@pytest.mark.parametrize("case", REJOINS, ids=[c.name for c in REJOINS])
def test_a_registration_reconciles_what_the_node_still_runs(fleet: Fleet, case: Rejoin) -> None:
    job = fleet.submit(make_spec("train", 8))
    node, rep = placed(fleet, job)
    if case.started:
        node.start(rep)
        fleet.settle()
    lease = node.register(case.running(rep))
    assert sorted(lease["stop"]) == sorted(case.stop(rep))
    fleet.settle()
    assert replica_row(fleet, rep.replica).state == case.replica_state
    assert fleet.job(job).state == case.job_state
    assert any(r.replica == rep.replica for r in node.to_run()) is case.still_told_to_run
    fleet.no_gpu_held_twice()


def test_a_replica_adopted_at_registration_keeps_the_pid_the_node_reported(fleet: Fleet) -> None:
    job = fleet.submit(make_spec("train", 8))
    node, rep = placed(fleet, job)
    node.register([status(rep, pid=4321)])
    row = replica_row(fleet, rep.replica)
    assert (row.state, row.pid) == ("running", 4321)
    assert row.started_at == fleet.clock()


def test_a_job_whose_every_replica_is_adopted_at_registration_is_running(fleet: Fleet) -> None:
    job = fleet.submit(make_spec("train", 8))
    node, rep = placed(fleet, job)
    node.register([status(rep, pid=77)])  # the start report was never heard
    fleet.settle()
    assert replica_row(fleet, rep.replica).started_at is not None
    assert fleet.job(job).state == "running"


def test_a_node_that_lost_its_replica_at_registration_charges_its_job_one_restart(
    fleet: Fleet,
) -> None:
    job = fleet.submit(make_spec("train", 8))
    node, rep = placed(fleet, job)
    node.start(rep)
    node.register([])
    fleet.settle()
    detail = fleet.job(job)
    assert detail.restarts == 1 and detail.epoch == 2
    lost = next(e for e in detail.events if e.kind == "lost")
    assert f"node {node.name} restarted without them" in lost.message


# -- sessions --------------------------------------------------------------------------------


def test_a_new_session_refuses_the_old_sessions_heartbeats_and_reports(fleet: Fleet) -> None:
    job = fleet.submit(make_spec("train", 8))
    node, rep = placed(fleet, job)
    node.start(rep)
    fleet.settle()
    old = node.session
    lease = node.register([status(rep)])
    assert lease["session"] != old

    stale = fleet.http.post(
        f"/v1/agents/{node.name}/heartbeat", json={"session": old}, headers=ADMIN
    )
    assert stale.status_code == 409
    assert "To fix: register again" in stale.json()["error"]
    exit_event = {
        "replica": rep.replica,
        "job": job,
        "epoch": rep.epoch,
        "kind": "exited",
        "at": fleet.clock(),
        "exit_code": 1,
    }
    r = fleet.http.post(
        f"/v1/agents/{node.name}/report",
        json={"session": old, "events": [exit_event]},
        headers=ADMIN,
    )
    assert r.status_code == 409
    fleet.settle()
    assert fleet.job(job).state == "running"  # the old session changed nothing

    assert node.heartbeat() == 200
    assert node.report(events=[{**exit_event, "exit_code": 0}]) == {"refused": []}
    fleet.settle()
    assert fleet.job(job).state == "succeeded"


def test_an_unknown_node_is_refused_its_heartbeat_and_its_desired_state(fleet: Fleet) -> None:
    hb = fleet.http.post("/v1/agents/nobody/heartbeat", json={"session": "x"}, headers=ADMIN)
    assert hb.status_code == 409
    desired = fleet.http.get("/v1/agents/nobody/desired", headers=ADMIN)
    assert desired.status_code == 404
    assert "To fix: register it first" in desired.json()["error"]


def test_batched_heartbeats_renew_each_node_as_its_own_heartbeat_would(fleet: Fleet) -> None:
    job = fleet.submit(make_spec("train", 8))
    home, rep = placed(fleet, job)
    stale = next(n for n in fleet.nodes.values() if n is not home)
    old = stale.session
    stale.register()
    fleet.clock.advance(1.0)
    runs = [status(rep), status(rep, replica="x.0.0")]
    beats = {
        home.name: {"session": home.session, "running": runs},
        stale.name: {"session": old},
        "nobody": {"session": "s"},
    }
    reply = fleet.post("/v1/agents/heartbeats", {"beats": beats}, ADMIN).json()

    assert sorted(reply["lost"]) == sorted([stale.name, "nobody"])
    assert list(reply["leases"]) == [home.name]
    assert reply["leases"][home.name]["stop"] == ["x.0.0"]  # runs what the store does not know
    row = replica_row(fleet, rep.replica)
    assert (row.state, row.started_at) == ("running", fleet.clock())  # adopted as running
    nodes = node_states(fleet)
    assert nodes[home.name]["last_heartbeat"] == fleet.clock()


def test_batched_reports_apply_each_current_nodes_events_and_list_the_rest_as_lost(
    fleet: Fleet,
) -> None:
    jobs = [fleet.submit(make_spec(f"train-{i}", 8)) for i in range(2)]
    (home, first), (other, second) = (placed(fleet, j) for j in jobs)
    assert home is not other
    old = other.session
    other.register([status(second)])

    def events(rep: ReplicaSpec, *kinds: str) -> list[dict[str, Any]]:
        at = fleet.clock()
        return [
            {"replica": rep.replica, "job": rep.job, "epoch": rep.epoch, "kind": k, "at": at}
            | ({"exit_code": 0} if k == "exited" else {})
            for k in kinds
        ]

    batch = {
        home.name: {"session": home.session, "events": events(first, "started", "exited")},
        other.name: {"session": old, "events": events(second, "started", "exited")},
        "nobody": {"session": "s", "events": []},
    }
    reply = fleet.post("/v1/agents/reports", {"reports": batch}, ADMIN).json()
    fleet.settle()

    assert sorted(reply["lost"]) == sorted([other.name, "nobody"])
    assert reply["refused"] == {}
    assert fleet.job(jobs[0]).state == "succeeded"
    assert fleet.job(jobs[1]).state == "running"  # the stale session changed nothing


def test_a_batched_report_of_a_past_epoch_is_refused_by_replica(fleet: Fleet) -> None:
    job = fleet.submit(make_spec("train", 8))
    node, rep = placed(fleet, job)
    stale = {"replica": rep.replica, "job": job, "epoch": rep.epoch - 1, "kind": "started"}
    batch = {node.name: {"session": node.session, "events": [{**stale, "at": fleet.clock()}]}}
    reply = fleet.post("/v1/agents/reports", {"reports": batch}, ADMIN).json()
    assert reply == {"refused": {node.name: [rep.replica]}, "lost": []}


# -- leases on a fake clock ------------------------------------------------------------------


def test_a_suspect_node_gets_no_new_work_until_it_heartbeats_again(tmp_path: Path) -> None:
    with Fleet(tmp_path, hosts=2) as fleet:
        keep_others_alive(fleet, "host-0", 7.0)  # past suspect_s (6 s), within the lease
        assert node_states(fleet)["host-0"]["state"] == "suspect"
        job = fleet.submit(make_spec("wide", 16))
        assert fleet.job(job).state == "pending"  # host-0's GPUs may not be used
        assert fleet.nodes["host-0"].heartbeat() == 200
        fleet.settle()
        assert node_states(fleet)["host-0"]["state"] == "ready"
        fleet.rt.scheduler.wake()
        fleet.settle()
        assert fleet.job(job).state == "scheduled"
        assert sorted(p.node for p in fleet.job(job).placement) == ["host-0", "host-1"]
        fleet.no_gpu_held_twice()


@pytest.mark.parametrize(
    ("silence", "state", "job_state"),
    [(5.0, "ready", "running"), (7.0, "suspect", "running"), (16.0, "dead", "requeued")],
    ids=["within-heartbeat", "past-suspect", "past-lease"],
)
def test_silence_turns_a_node_suspect_then_dead_and_its_work_moves(
    tmp_path: Path, silence: float, state: str, job_state: str
) -> None:
    with Fleet(tmp_path, hosts=1) as fleet:
        job = fleet.submit(make_spec("train", 8))
        fleet.start_everything()
        fleet.clock.advance(silence)
        fleet.settle()
        assert node_states(fleet)["host-0"]["state"] == state
        detail = fleet.job(job)
        assert detail.state == job_state  # with no other node it cannot be placed again
        if state == "dead":
            assert fleet.nodes["host-0"].heartbeat() == 409
            assert "stopped answering" in detail.events[-1].message
        fleet.no_gpu_held_twice()


def test_a_dead_node_that_registers_again_is_ready_and_runs_the_requeued_job(
    tmp_path: Path,
) -> None:
    with Fleet(tmp_path, hosts=1) as fleet:
        job = fleet.submit(make_spec("train", 8))
        fleet.start_everything()
        fleet.clock.advance(16.0)
        fleet.settle()
        node = fleet.nodes["host-0"]
        node.register([])
        node.started.clear()
        fleet.settle()
        assert node_states(fleet)["host-0"]["state"] == "ready"
        fleet.start_everything()
        back = fleet.job(job)
        assert (back.state, back.epoch, back.restarts) == ("running", 2, 1)
        fleet.no_gpu_held_twice()


def test_a_leaving_node_keeps_its_jobs_but_gets_no_new_ones(tmp_path: Path) -> None:
    with Fleet(tmp_path, hosts=1) as fleet:
        job = fleet.submit(make_spec("train", 4))
        fleet.start_everything()
        node = fleet.nodes["host-0"]
        r = fleet.http.post(
            "/v1/agents/host-0/heartbeat",
            json={"session": node.session, "leaving": True},
            headers=ADMIN,
        )
        assert r.status_code == 200
        fleet.settle()
        assert node_states(fleet)["host-0"]["state"] == "suspect"
        other = fleet.submit(make_spec("small", 4))
        assert fleet.job(other).state == "pending"
        assert fleet.job(job).state == "running"


# -- which reports are refused ---------------------------------------------------------------


def event_item(rep: ReplicaSpec, at: float) -> dict[str, Any]:
    return {"replica": rep.replica, "job": rep.job, "epoch": rep.epoch, "kind": "exited",
            "at": at, "exit_code": 0}  # fmt: skip


def log_item(rep: ReplicaSpec, at: float) -> dict[str, Any]:
    return {"replica": rep.replica, "job": rep.job, "epoch": rep.epoch, "seq": 1,
            "data": "loss=1.0\n"}  # fmt: skip


def progress_item(rep: ReplicaSpec, at: float) -> dict[str, Any]:
    return {"replica": rep.replica, "job": rep.job, "epoch": rep.epoch, "rank": 0,
            "step": 10, "at": at, "checkpoint": True}  # fmt: skip


ITEMS: dict[str, Callable[[ReplicaSpec, float], dict[str, Any]]] = {
    "events": event_item,
    "logs": log_item,
    "progress": progress_item,
}
WRONGS = ["from-another-node", "stale-epoch", "unknown-replica"]


@pytest.mark.parametrize("wrong", WRONGS)
@pytest.mark.parametrize("kind", sorted(ITEMS))
def test_a_report_item_that_cannot_be_about_the_current_replica_is_refused(
    fleet: Fleet, kind: str, wrong: str
) -> None:
    job = fleet.submit(make_spec("train", 8))
    fleet.start_everything()
    home, rep = placed(fleet, job)
    sender = home
    item = ITEMS[kind](rep, fleet.clock())
    if wrong == "from-another-node":
        sender = next(n for n in fleet.nodes.values() if n is not home)
    elif wrong == "stale-epoch":
        item["epoch"] = rep.epoch - 1
    else:
        item["replica"] = "nope.1.0"
    reply = sender.report(**{kind: [item]})
    assert reply["refused"] == [item["replica"]]
    fleet.settle()
    detail = fleet.job(job)
    assert detail.state == "running"
    assert detail.last_step is None and detail.last_checkpoint_at is None
    logs = fleet.http.get(f"/v1/jobs/{job}/logs", headers=ADMIN).json()
    assert logs["lines"] == []


def test_a_lost_replicas_late_exit_is_refused_and_does_not_end_the_requeued_job(
    tmp_path: Path,
) -> None:
    with Fleet(tmp_path, hosts=2) as fleet:
        job = fleet.submit(make_spec("train", 8))
        fleet.start_everything()
        home, rep = placed(fleet, job)
        keep_others_alive(fleet, home.name, 10.0)
        keep_others_alive(fleet, home.name, 10.0)  # home's lease ran out
        moved = fleet.job(job)
        assert moved.epoch == 2 and moved.state == "scheduled"
        r = fleet.http.post(
            f"/v1/agents/{home.name}/report",
            json={"session": home.session, "events": [event_item(rep, fleet.clock())]},
            headers=ADMIN,
        )
        assert r.status_code == 409  # a dead node's session is over
        assert replica_row(fleet, rep.replica).state == "lost"
        assert fleet.job(job).state == "scheduled"
        fleet.no_gpu_held_twice()


# -- logs and progress land on the job -------------------------------------------------------


def test_log_chunks_land_in_order_once_and_page_from_where_the_reader_stopped(
    fleet: Fleet,
) -> None:
    job = fleet.submit(make_spec("train", 8))
    fleet.start_everything()
    node, rep = placed(fleet, job)

    def chunk(seq: int, data: str) -> dict[str, Any]:
        return {"replica": rep.replica, "job": job, "epoch": rep.epoch, "seq": seq, "data": data}

    assert node.report(logs=[chunk(1, "step 1\n"), chunk(2, "step 2\n")]) == {"refused": []}
    first = fleet.http.get(f"/v1/jobs/{job}/logs", headers=ADMIN).json()
    assert first["lines"] == ["step 1", "step 2"] and first["state"] == "running"

    node.report(logs=[chunk(2, "step 2\n"), chunk(1, "step 1\n")])  # a retried report
    node.report(logs=[chunk(3, "step 3\n")])
    page = fleet.http.get(
        f"/v1/jobs/{job}/logs", params={"after": first["next"]}, headers=ADMIN
    ).json()
    assert page["lines"] == ["step 3"]
    every = fleet.http.get(f"/v1/jobs/{job}/logs", headers=ADMIN).json()
    assert every["lines"] == ["step 1", "step 2", "step 3"]


def test_progress_moves_the_last_step_and_checkpoint_and_notes_checkpoints_sparingly(
    fleet: Fleet,
) -> None:
    job = fleet.submit(make_spec("train", 8))
    fleet.start_everything()
    node, rep = placed(fleet, job)
    t0 = fleet.clock()

    def step(n: int, at: float, checkpoint: bool = False) -> dict[str, Any]:
        return {"replica": rep.replica, "job": job, "epoch": rep.epoch, "rank": 0, "step": n,
                "at": at, "step_time_s": 0.5, "checkpoint": checkpoint}  # fmt: skip

    node.report(progress=[step(10, t0)])
    detail = fleet.job(job)
    assert detail.last_step == 10 and detail.last_checkpoint_at is None

    node.report(progress=[step(20, t0 + 10, checkpoint=True)])
    node.report(progress=[step(30, t0 + 40, checkpoint=True)])  # within 60 s: no new note
    node.report(progress=[step(25, t0 + 50)])  # an older step never moves it back
    node.report(progress=[step(40, t0 + 130, checkpoint=True)])
    detail = fleet.job(job)
    assert detail.last_step == 40
    assert detail.last_checkpoint_at == t0 + 130
    notes = [e.message for e in detail.events if e.kind == "checkpoint"]
    assert notes == ["checkpoint written at step 20", "checkpoint written at step 40"]


# -- quarantine and spot notices of a gang ---------------------------------------------------


def test_draining_one_node_of_a_gang_stops_every_replica_and_uncordon_restores_it(
    fleet: Fleet,
) -> None:
    job = fleet.submit(make_spec("wide", 16))
    fleet.start_everything()
    nodes = sorted(p.node for p in fleet.job(job).placement)
    r = fleet.post(f"/v1/nodes/{nodes[0]}/drain", {})
    assert r.status_code == 200 and r.json()["state"] == "draining"  # busy and cordoned
    fleet.settle()
    stops = sorted(rep.replica for n in fleet.nodes.values() for rep in n.to_stop())
    assert len(stops) == 2 and all(s.startswith(f"{job}.1.") for s in stops)
    assert fleet.stop_everything() != []
    fleet.start_everything()
    moved = fleet.job(job)
    assert moved.state == "running" and moved.restarts == 0
    assert nodes[0] not in {p.node for p in moved.placement}

    r = fleet.post(f"/v1/nodes/{nodes[0]}/uncordon", {})
    assert r.status_code == 200 and r.json()["state"] == "ready"
    fleet.settle()
    rest = fleet.submit(make_spec("rest", 16))
    assert fleet.job(rest).state == "scheduled"
    assert nodes[0] in {p.node for p in fleet.job(rest).placement}
    fleet.no_gpu_held_twice()


def test_draining_an_idle_node_cordons_it_and_moves_nothing(fleet: Fleet) -> None:
    job = fleet.submit(make_spec("train", 8))
    fleet.start_everything()
    home, _ = placed(fleet, job)
    idle = next(n for n in fleet.nodes if n != home.name)
    r = fleet.post(f"/v1/nodes/{idle}/drain", {})
    assert r.status_code == 200 and r.json()["state"] == "cordoned"  # idle and cordoned
    fleet.settle()
    assert fleet.job(job).state == "running"
    assert [rep for n in fleet.nodes.values() for rep in n.to_stop()] == []


def test_a_reclaim_notice_for_an_idle_node_names_no_jobs_and_it_goes_at_its_time(
    fleet: Fleet,
) -> None:
    r = fleet.post("/v1/nodes/host-3/reclaim", {"in_s": 30})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["jobs"] == [] and body["reclaim_at"] == fleet.clock() + 30
    assert body["node"]["state"] == "cordoned"
    for _ in range(8):  # everyone heartbeats inside its lease; the reclaim time decides
        fleet.clock.advance(5.0)
        for node in fleet.nodes.values():
            node.heartbeat()
    fleet.settle()
    assert node_states(fleet)["host-3"]["state"] == "dead"
    assert node_states(fleet)["host-2"]["state"] == "ready"

"""What the server believes when nodes act on their own or come back from the dead, through
the real API in-process (the test plays the agents): a replica the node stopped itself does
not finish its job, a written-off replica cannot change the job that moved on, and a server
that restarts does not count its own downtime against the nodes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from control_kit import ADMIN, Fleet, make_spec
from fastapi.testclient import TestClient

from boltforge.control.app import create_app
from boltforge.wire.agent import ReplicaSpec


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    with Fleet(tmp_path, hosts=2) as f:
        yield f


def exited(fleet: Fleet, rep: ReplicaSpec, **fields: Any) -> dict[str, Any]:
    node = fleet.nodes[rep.env["BOLT_NODE"]]
    event = {"replica": rep.replica, "job": rep.job, "epoch": rep.epoch, "kind": "exited"}
    reply = node.report(events=[{**event, "at": fleet.clock(), **fields}])
    fleet.settle()
    return reply


def node_state(fleet: Fleet, name: str) -> str:
    nodes = fleet.http.get("/v1/nodes", headers=ADMIN).json()["nodes"]
    state: str = next(n["state"] for n in nodes if n["name"] == name)
    return state


def running(fleet: Fleet, job: str) -> ReplicaSpec:
    [rep] = [r for n in fleet.nodes.values() for r in n.to_run() if r.job == job]
    return rep


def test_a_replica_its_node_stopped_on_its_own_requeues_the_job_instead_of_finishing_it(
    fleet: Fleet,
) -> None:
    job = fleet.submit(make_spec("train", 8))
    fleet.start_everything()
    rep = running(fleet, job)
    exited(fleet, rep, exit_code=0, checkpoint_s=1.0, by_node=True)
    requeued = fleet.job(job)
    assert requeued.state in ("requeued", "scheduled") and requeued.restarts == 1
    assert "on its own" in next(e for e in requeued.events if e.kind == "lost").message
    home = rep.env["BOLT_NODE"]
    assert node_state(fleet, home) == "suspect"  # no new work until it says it is well
    assert [p.node for p in fleet.job(job).placement] != [home]


def test_a_leaving_node_gets_no_new_work(fleet: Fleet) -> None:
    leaving = fleet.nodes["host-0"]
    r = fleet.http.post(
        "/v1/agents/host-0/heartbeat",
        json={"session": leaving.session, "leaving": True},
        headers={"Authorization": "Bearer agt"},
    )
    assert r.status_code == 200 and node_state(fleet, "host-0") == "suspect"
    job = fleet.submit(make_spec("train", 8))
    assert [p.node for p in fleet.job(job).placement] == ["host-1"]


def test_the_exit_of_a_replica_written_off_with_its_node_is_refused(fleet: Fleet) -> None:
    job = fleet.submit(make_spec("train", 8))
    fleet.start_everything()
    stale = running(fleet, job)
    quiet = stale.env["BOLT_NODE"]
    fleet.clock.advance(20.0)  # past the lease: the node is dead, the job moves
    for name, node in fleet.nodes.items():
        if name != quiet:
            node.heartbeat()
    fleet.settle()
    fleet.start_everything()
    assert fleet.job(job).state == "running" and fleet.job(job).epoch == 2
    fleet.nodes[quiet].register(running=[])  # it comes back, and its old replica dies
    reply = exited(fleet, stale, signal=9, by_node=True)
    assert reply["refused"] == [stale.replica]
    after = fleet.job(job)
    assert (after.state, after.epoch, after.restarts) == ("running", 2, 1)


def test_a_restarted_server_gives_every_node_a_full_lease(fleet: Fleet) -> None:
    fleet.clock.advance(14.0)  # the server was down for most of the nodes' 15 s lease
    again = create_app(fleet.config, fleet.clock)
    with TestClient(again) as http:
        fleet.clock.advance(5.0)  # past the old lease; well inside the one given at start
        again.state.runtime.scheduler.pass_once()
        nodes = http.get("/v1/nodes", headers=ADMIN).json()["nodes"]
    assert {n["state"] for n in nodes} <= {"ready", "suspect"}

"""A job's restart budget, through the real API in-process (the test plays the agents): each
failure not of the job's making (its node dies, or stops a replica on its own) spends one
restart; once ``max_restarts`` are spent the next such failure fails the job and says why.
Preemptions are the scheduler's choice and cost nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from control_kit import ADMIN, Fleet, make_spec

from boltforge.core.preempt.victims import PreemptRules
from boltforge.spec.errors import SpecError
from boltforge.spec.job import DEFAULT_MAX_RESTARTS, parse_job
from boltforge.wire.agent import ReplicaSpec


def home_of(fleet: Fleet, job: str) -> list[str]:
    """The nodes the job's current replicas run on."""
    return sorted(p.node for p in fleet.job(job).placement if p.state != "exited")


def die(fleet: Fleet, name: str) -> None:
    """Node ``name`` goes silent past its 15 s lease while every other node keeps
    heartbeating (in two steps, so the others never lapse whenever the loop looks)."""
    for _ in range(2):
        fleet.clock.advance(10.0)
        for other, node in fleet.nodes.items():
            if other != name:
                assert node.heartbeat() == 200
    fleet.settle()


def come_back(fleet: Fleet, name: str) -> None:
    """A dead node registers again, running nothing."""
    fleet.nodes[name].register(running=[])
    fleet.nodes[name].started.clear()
    fleet.settle()


def stopped_by_node(fleet: Fleet, rep: ReplicaSpec) -> None:
    node = fleet.nodes[rep.env["BOLT_NODE"]]
    event = {"replica": rep.replica, "job": rep.job, "epoch": rep.epoch, "kind": "exited"}
    node.report(events=[{**event, "at": fleet.clock(), "exit_code": 0, "by_node": True}])
    fleet.settle()


def replica_of(fleet: Fleet, job: str) -> ReplicaSpec:
    [rep] = [r for n in fleet.nodes.values() for r in n.to_run() if r.job == job]
    return rep


def last_event(fleet: Fleet, job: str) -> Any:
    return fleet.job(job).events[-1]


def test_a_job_restarts_after_node_deaths_until_its_budget_is_spent_then_fails(
    tmp_path: Path,
) -> None:
    with Fleet(tmp_path, hosts=2) as fleet:
        job = fleet.submit(make_spec("train", 8, max_restarts=1))
        fleet.start_everything()
        [first] = home_of(fleet, job)

        die(fleet, first)
        fleet.start_everything()
        moved = fleet.job(job)
        assert (moved.state, moved.restarts, moved.epoch) == ("running", 1, 2)
        [second] = home_of(fleet, job)
        assert second != first
        come_back(fleet, first)

        die(fleet, second)
        failed = fleet.job(job)
        assert (failed.state, failed.restarts) == ("failed", 1)
        assert failed.events[-1].message == (
            f"failed: restart budget of 1 exhausted; last: node {second} stopped answering"
        )


def test_a_gang_that_spent_its_budget_fails_and_stops_its_surviving_replicas(
    tmp_path: Path,
) -> None:
    with Fleet(tmp_path, hosts=2) as fleet:
        job = fleet.submit(make_spec("train", 16, max_restarts=0))
        fleet.start_everything()

        die(fleet, "host-0")

        assert fleet.job(job).state == "failed"
        assert "restart budget of 0 exhausted" in last_event(fleet, job).message
        assert [r.job for r in fleet.nodes["host-1"].to_stop()] == [job]


def test_a_replica_its_node_stopped_on_its_own_spends_the_budget_too(tmp_path: Path) -> None:
    with Fleet(tmp_path, hosts=2) as fleet:
        job = fleet.submit(make_spec("train", 8, max_restarts=0))
        fleet.start_everything()
        rep = replica_of(fleet, job)

        stopped_by_node(fleet, rep)

        failed = fleet.job(job)
        assert (failed.state, failed.restarts) == ("failed", 0)
        node = rep.env["BOLT_NODE"]
        assert failed.events[-1].message.startswith(
            f"failed: restart budget of 0 exhausted; last: node {node} stopped replica 0"
        )


def test_a_job_without_a_budget_gets_the_default_number_of_restarts(tmp_path: Path) -> None:
    with Fleet(tmp_path, hosts=2) as fleet:
        job = fleet.submit(make_spec("train", 8))
        for spent in range(1, DEFAULT_MAX_RESTARTS + 1):
            fleet.start_everything()
            stopped_by_node(fleet, replica_of(fleet, job))
            assert fleet.job(job).restarts == spent
            for node in fleet.nodes.values():
                node.heartbeat()  # the suspect node is well again
            fleet.settle()
        fleet.start_everything()
        stopped_by_node(fleet, replica_of(fleet, job))
        assert fleet.job(job).state == "failed"


def test_preemptions_do_not_count_against_the_budget(tmp_path: Path) -> None:
    rules = PreemptRules(min_runtime_s=0.0, cooldown_s=0.0, churn_fraction=1.0, churn_window_s=1)
    with Fleet(tmp_path, hosts=1, preempt=rules) as fleet:
        low = fleet.submit(make_spec("low", 8, priority="low", max_restarts=0))
        fleet.start_everything()
        for i in range(2):
            fleet.clock.advance(2.0)  # past the churn window
            high = fleet.submit(make_spec(f"high-{i}", 8, team="nlp", priority="high"))
            fleet.stop_everything()
            fleet.start_everything()
            fleet.finish(high)
            fleet.start_everything()
        kept = fleet.job(low)
        assert (kept.state, kept.preemptions, kept.restarts) == ("running", 2, 0)
        fleet.finish(low)
        assert fleet.job(low).state == "succeeded"


def test_a_node_that_dies_under_a_job_being_preempted_costs_it_no_restart(
    tmp_path: Path,
) -> None:
    with Fleet(tmp_path, hosts=2) as fleet:
        low = fleet.submit(make_spec("low", 16, priority="low", max_restarts=0))
        fleet.start_everything()
        fleet.submit(make_spec("high", 8, team="nlp", priority="high"))
        assert fleet.job(low).state == "preempting"

        die(fleet, "host-0")

        requeued = fleet.job(low)
        assert requeued.state in ("requeued", "scheduled") and requeued.restarts == 0


@pytest.mark.parametrize(
    ("value", "hint"),
    [(-1, "greater than or equal to 0"), ("lots", "whole number"), (5000, "less than")],
    ids=["a negative budget", "a budget that is not a number", "a budget past 1000"],
)
def test_a_bad_budget_names_the_field(value: object, hint: str) -> None:
    with pytest.raises(SpecError) as caught:
        parse_job(make_spec("train", 8, max_restarts=value), "job.yaml")
    [problem] = caught.value.problems
    assert problem.field == "job.max_restarts" and hint in problem.message


def test_the_api_refuses_a_bad_budget_with_the_field_and_keeps_nothing(tmp_path: Path) -> None:
    with Fleet(tmp_path, hosts=1) as fleet:
        r = fleet.post("/v1/jobs", {"spec": make_spec("train", 8, max_restarts=-2)})
        assert r.status_code == 422, r.text
        assert [p["field"] for p in r.json()["problems"]] == ["job.max_restarts"]
        assert fleet.http.get("/v1/jobs", headers=ADMIN).json()["jobs"] == []

"""The control plane end to end in-process: the real API, store and scheduling loop, with the
test playing the agents. Scenarios follow a job from submit to its last state."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from control_kit import ADMIN, Fleet, make_spec, postgres_server, store_url, wait_for

__all__ = ["postgres_server", "store_url"]  # fixtures used by name


@pytest.fixture
def fleet(tmp_path: Path, store_url: str) -> Iterator[Fleet]:
    with Fleet(tmp_path, db_url=store_url) as f:
        yield f


def test_a_job_is_placed_on_the_tightest_hosts_and_runs_once_every_replica_started(
    fleet: Fleet,
) -> None:
    job = fleet.submit(make_spec("train", 16))
    placed = fleet.job(job)
    assert placed.state == "scheduled"
    assert sorted(r.node for r in placed.placement) == ["host-0", "host-1"]  # one rack
    assert "inside rack r0" in placed.explanation[0]
    fleet.start_everything()
    running = fleet.job(job)
    assert running.state == "running"
    assert [e.kind for e in running.events] == ["queued", "placed", "running"]


def test_every_replica_gets_the_rank_variables_a_distributed_job_expects(fleet: Fleet) -> None:
    job = fleet.submit(make_spec("train", 16, env={"SEED": "7"}))
    specs = [r for n in fleet.nodes.values() for r in n.to_run() if r.job == job]
    ranks = sorted(int(r.env["RANK"]) for r in specs)
    assert ranks == [0, 1]
    for r in specs:
        assert r.env["WORLD_SIZE"] == "2"
        assert r.env["LOCAL_RANK"] == "0"
        assert r.env["MASTER_ADDR"] == "127.0.0.1"
        assert r.env["MASTER_PORT"] == specs[0].env["MASTER_PORT"]
        assert r.env["SEED"] == "7"
        assert r.gpus == list(range(8))
        assert r.checkpoint_dir is not None and r.checkpoint_dir.endswith(f"/{job}")


def test_a_high_priority_job_preempts_a_low_one_which_checkpoints_requeues_and_resumes(
    fleet: Fleet,
) -> None:
    low = fleet.submit(make_spec("low", 32, priority="low"))
    fleet.start_everything()
    high = fleet.submit(make_spec("high", 16, team="nlp", priority="high"))

    victim = fleet.job(low)
    assert victim.state == "preempting"
    stops = [r for n in fleet.nodes.values() for r in n.to_stop()]
    assert len(stops) == 4 and all(r.job == low and r.grace_s == 120 for r in stops)
    waiting = fleet.job(high)
    assert waiting.state == "scheduled"
    assert not [r for n in fleet.nodes.values() for r in n.to_run() if r.job == high]

    fleet.stop_everything(checkpoint_s=3.5)
    requeued = fleet.job(low)
    assert requeued.state == "requeued"
    assert "checkpointed in 3.5 s" in requeued.events[-1].message
    fleet.start_everything()
    assert fleet.job(high).state == "running"

    fleet.finish(high)
    assert fleet.job(high).state == "succeeded"
    fleet.start_everything()
    resumed = fleet.job(low)
    assert resumed.state == "running" and resumed.epoch == 2
    assert [e.kind for e in resumed.events][-2:] == ["placed", "resumed"]
    fleet.no_gpu_held_twice()


def test_the_placed_event_names_the_jobs_preempted_for_it(fleet: Fleet) -> None:
    low = fleet.submit(make_spec("low", 32, priority="low"))
    fleet.start_everything()
    high = fleet.submit(make_spec("high", 16, team="nlp", priority="high"))
    placed = next(e for e in fleet.job(high).events if e.kind == "placed")
    assert placed.data["preempted"] == [low]


def test_a_report_for_an_epoch_the_server_moved_past_is_refused(fleet: Fleet) -> None:
    low = fleet.submit(make_spec("low", 8, priority="low"))
    fleet.start_everything()
    node = fleet.nodes["host-0"]
    [old] = [r for r in node.to_run() if r.job == low]
    event = {
        "replica": old.replica,
        "job": low,
        "epoch": old.epoch + 1,
        "kind": "exited",
        "at": fleet.clock(),
        "exit_code": 0,
    }
    assert node.report(events=[event])["refused"] == [old.replica]
    assert fleet.job(low).state == "running"


def test_a_replica_that_fails_fails_the_job_and_stops_its_peers(fleet: Fleet) -> None:
    job = fleet.submit(make_spec("train", 16))
    fleet.start_everything()
    node = fleet.nodes["host-0"]
    [rep] = node.to_run()
    node.exit(rep, code=3)
    fleet.settle()
    failed = fleet.job(job)
    assert failed.state == "failed" and failed.exit_code == 3
    assert "exited with code 3" in failed.events[-1].message
    assert [r.job for r in fleet.nodes["host-1"].to_stop()] == [job]


def test_cancelling_a_running_job_signals_it_and_frees_its_gpus_when_it_exits(fleet: Fleet) -> None:
    job = fleet.submit(make_spec("train", 32))
    fleet.start_everything()
    r = fleet.post(f"/v1/jobs/{job}/cancel", {})
    assert r.status_code == 200
    assert fleet.job(job).state == "cancelled"
    assert len(fleet.stop_everything()) == 4
    other = fleet.submit(make_spec("next", 32))
    assert fleet.job(other).state == "scheduled"
    fleet.no_gpu_held_twice()


def test_a_pending_job_is_cancelled_at_once(fleet: Fleet) -> None:
    fleet.submit(make_spec("big", 32))
    queued = fleet.submit(make_spec("waits", 8))
    assert fleet.job(queued).state == "pending"
    fleet.post(f"/v1/jobs/{queued}/cancel", {})
    assert fleet.job(queued).state == "cancelled"


def test_a_waiting_job_says_why_where_it_stands_and_when_it_should_start(fleet: Fleet) -> None:
    fleet.submit(make_spec("big", 32, time_limit="1h"))
    fleet.start_everything()
    job = fleet.submit(make_spec("waits", 16))
    fleet.rt.scheduler.wake()  # a full pass places every waiting job in line
    fleet.settle()
    queued = fleet.job(job)
    assert queued.state == "pending"
    assert queued.reason in ("capacity", "reserved")
    assert queued.position == 0
    assert queued.estimated_start == pytest.approx(fleet.clock() + 3600, abs=1)
    assert queued.waiting


def test_a_big_arrival_that_must_wait_is_not_delayed_by_smaller_arrivals(fleet: Fleet) -> None:
    leaving = fleet.submit(make_spec("leaving", 8))
    fleet.start_everything()
    fleet.post(f"/v1/jobs/{leaving}/cancel", {})  # its process still holds 8 GPUs
    big = fleet.submit(make_spec("big", 32))
    # Its arrival pass asks for a full pass, which the test or the server's loop may run.
    wait_for(lambda: fleet.job(big).reason == "reserved")
    small = fleet.submit(make_spec("small", 8))  # no time limit: it would delay the big one
    assert fleet.job(big).state == "pending"
    assert (fleet.job(small).state, fleet.job(small).reason) == ("pending", "reservation-ahead")
    fleet.stop_everything()
    assert fleet.job(big).state == "scheduled"
    fleet.no_gpu_held_twice()


def test_a_retried_submit_with_the_same_key_makes_one_job(fleet: Fleet) -> None:
    spec = make_spec("once", 8)
    first = fleet.post("/v1/jobs", {"spec": spec, "idempotency_key": "k-1"})
    again = fleet.http.post(
        "/v1/jobs", json={"spec": spec}, headers={**ADMIN, "Idempotency-Key": "k-1"}
    )
    assert first.status_code == 201 and again.status_code == 200
    assert first.json()["job"]["id"] == again.json()["job"]["id"]
    assert again.json()["created"] is False
    assert len(fleet.http.get("/v1/jobs", headers=ADMIN).json()["jobs"]) == 1


def test_an_array_job_is_one_submission_whose_tasks_see_their_index(fleet: Fleet) -> None:
    r = fleet.post("/v1/jobs", {"spec": make_spec("sweep", 1), "array": "0-5:2"})
    assert r.status_code == 201
    tasks = r.json()["tasks"]
    assert [t.split("_")[1] for t in tasks] == ["0", "2", "4"]
    fleet.settle()
    specs = [r for n in fleet.nodes.values() for r in n.to_run()]
    assert sorted(r.env["BOLT_ARRAY_INDEX"] for r in specs) == ["0", "2", "4"]


def test_every_mutating_call_lands_in_the_audit_log(fleet: Fleet) -> None:
    job = fleet.submit(make_spec("train", 8))
    fleet.post(f"/v1/jobs/{job}/cancel", {})
    log = fleet.http.get("/v1/audit", headers=ADMIN).json()
    actions = [(e["action"], e["target"], e["who"]) for e in log]
    assert ("submit", job, "admin") in actions
    assert ("cancel", job, "admin") in actions
    assert ("register", "host-0", "agents") in actions


def test_a_gang_whose_replicas_finish_before_all_reported_starting_still_succeeds(
    fleet: Fleet,
) -> None:
    job = fleet.submit(make_spec("quick", 16))
    first, second = fleet.nodes["host-0"], fleet.nodes["host-1"]
    [a] = first.to_run()
    [b] = second.to_run()
    second.start(b)
    second.exit(b, 0)
    first.start(a)
    first.exit(a, 0)
    fleet.settle()
    done = fleet.job(job)
    assert done.state == "succeeded"
    assert [e.kind for e in done.events][-2:] == ["running", "succeeded"]

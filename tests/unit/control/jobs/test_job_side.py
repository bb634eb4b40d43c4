"""The job side of the control plane through the real API in-process (the test plays the
agents): cancelling jobs in every live state, the restart budget against drains, idempotent
submits of array jobs, and bad input refused with nothing stored."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from control_kit import ADMIN, Fleet, make_spec
from sqlalchemy import func, select

from boltforge.control.store.models import JobRow


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    with Fleet(tmp_path) as f:
        yield f


def stored_jobs(fleet: Fleet) -> int:
    with fleet.rt.db.session() as s:
        return int(s.scalar(select(func.count()).select_from(JobRow)) or 0)


def stops_of(fleet: Fleet, job: str) -> list[str]:
    return sorted(r.replica for n in fleet.nodes.values() for r in n.to_stop() if r.job == job)


def cancel(fleet: Fleet, job: str) -> list[dict[str, Any]]:
    r = fleet.post(f"/v1/jobs/{job}/cancel", {})
    assert r.status_code == 200, r.text
    fleet.settle()
    jobs: list[dict[str, Any]] = r.json()["jobs"]
    return jobs


# -- cancellation ----------------------------------------------------------------------------


def pending(fleet: Fleet) -> str:
    fleet.submit(make_spec("blocker", 32))
    fleet.start_everything()
    return fleet.submit(make_spec("victim", 16))


def scheduled(fleet: Fleet) -> str:
    return fleet.submit(make_spec("victim", 16))  # placed, its replicas not started


def running(fleet: Fleet) -> str:
    job = fleet.submit(make_spec("victim", 16))
    fleet.start_everything()
    return job


def requeued(fleet: Fleet) -> str:
    job = fleet.submit(make_spec("victim", 16, priority="low"))
    fleet.start_everything()
    fleet.submit(make_spec("urgent", 32, team="nlp", priority="high"))
    fleet.stop_everything()  # the victim checkpoints and waits for room
    return job


@dataclass(frozen=True)
class Cancel:
    name: str
    setup: Callable[[Fleet], str]
    before: str  # the job's state when cancelled
    stops: int  # replicas told to stop by the cancel


CANCELS = [
    Cancel("pending", pending, "pending", 0),
    Cancel("scheduled", scheduled, "scheduled", 2),
    Cancel("running", running, "running", 2),
    Cancel("requeued", requeued, "requeued", 0),
]


@pytest.mark.parametrize("case", CANCELS, ids=[c.name for c in CANCELS])
def test_a_live_job_is_cancelled_its_replicas_stop_and_its_gpus_come_back(
    fleet: Fleet, case: Cancel
) -> None:
    job = case.setup(fleet)
    assert fleet.job(job).state == case.before
    [out] = cancel(fleet, job)
    assert out["state"] == "cancelled"
    detail = fleet.job(job)
    assert detail.state == "cancelled"
    assert detail.events[-1].kind == "cancelled"
    assert detail.events[-1].message.startswith("cancelled by ")
    assert len(stops_of(fleet, job)) == case.stops
    fleet.stop_everything()
    assert stops_of(fleet, job) == []
    assert not [r for n in fleet.nodes.values() for r in n.to_run() if r.job == job]
    for other in fleet.http.get("/v1/jobs", headers=ADMIN).json()["jobs"]:
        if other["id"] != job and other["state"] in ("scheduled", "running"):
            fleet.finish(other["id"])
    after = fleet.submit(make_spec("after", 32))
    assert fleet.job(after).state == "scheduled"  # every GPU is free again
    assert fleet.job(job).state == "cancelled"  # a cancelled job is never placed again
    fleet.no_gpu_held_twice()


@pytest.mark.parametrize("code", [0, 5], ids=["succeeded", "failed"])
def test_cancelling_a_finished_job_leaves_it_as_it_ended(fleet: Fleet, code: int) -> None:
    job = fleet.submit(make_spec("done", 8))
    fleet.start_everything()
    fleet.finish(job, code)
    ended = fleet.job(job)
    [out] = cancel(fleet, job)
    assert out["state"] == ended.state == ("succeeded" if code == 0 else "failed")
    assert [e.kind for e in fleet.job(job).events] == [e.kind for e in ended.events]


def test_cancelling_twice_records_one_cancellation(fleet: Fleet) -> None:
    job = running(fleet)
    cancel(fleet, job)
    cancel(fleet, job)
    kinds = [e.kind for e in fleet.job(job).events]
    assert kinds.count("cancelled") == 1
    assert len(fleet.stop_everything()) == 2
    fleet.no_gpu_held_twice()


def test_cancelling_an_array_cancels_every_live_task_and_leaves_finished_ones(
    fleet: Fleet,
) -> None:
    r = fleet.post("/v1/jobs", {"spec": make_spec("sweep", 8), "array": "0-5"})
    assert r.status_code == 201, r.text
    tasks = r.json()["tasks"]
    array = tasks[0].split("_")[0]  # tasks are <array>_<index>
    assert len(tasks) == 6
    fleet.settle()
    fleet.start_everything()
    states = {t: fleet.job(t).state for t in tasks}
    assert sorted(states.values()) == ["pending"] * 2 + ["running"] * 4
    done = next(t for t in tasks if states[t] == "running")
    fleet.finish(done)
    out = cancel(fleet, array)
    assert len(out) == 6
    after = {t: fleet.job(t).state for t in tasks}
    assert after[done] == "succeeded"
    assert sorted(s for t, s in after.items() if t != done) == ["cancelled"] * 5
    fleet.stop_everything()
    assert [r for n in fleet.nodes.values() for r in n.to_run()] == []
    fleet.no_gpu_held_twice()


def test_cancelling_an_unknown_job_names_it_and_the_fix(fleet: Fleet) -> None:
    r = fleet.post("/v1/jobs/j-404/cancel", {})
    assert r.status_code == 404
    assert "no job j-404" in r.json()["error"] and "To fix" in r.json()["error"]


# -- the restart budget ----------------------------------------------------------------------


def test_drains_never_spend_the_restart_budget_but_a_node_death_does(tmp_path: Path) -> None:
    with Fleet(tmp_path, hosts=3) as fleet:
        job = fleet.submit(make_spec("train", 8, max_restarts=1))
        fleet.start_everything()
        for _ in range(2):  # drained twice: still no restart charged
            [home] = [p.node for p in fleet.job(job).placement if p.state != "exited"]
            assert fleet.post(f"/v1/nodes/{home}/drain", {}).status_code == 200
            fleet.settle()
            fleet.stop_everything()
            fleet.start_everything()
            assert fleet.job(job).restarts == 0
            assert fleet.post(f"/v1/nodes/{home}/uncordon", {}).status_code == 200
        moved = fleet.job(job)
        assert moved.state == "running" and moved.epoch == 3

        def lose_home() -> str:
            [home] = [p.node for p in fleet.job(job).placement if p.state != "exited"]
            for _ in range(2):
                fleet.clock.advance(10.0)
                for name, node in fleet.nodes.items():
                    if name != home:
                        node.heartbeat()
            fleet.settle()
            return home

        first = lose_home()
        assert fleet.job(job).restarts == 1
        fleet.nodes[first].register([])
        fleet.nodes[first].started.clear()
        fleet.start_everything()
        lose_home()
        failed = fleet.job(job)
        assert failed.state == "failed"
        assert "restart budget of 1 exhausted" in failed.events[-1].message
        fleet.no_gpu_held_twice()


def test_a_replica_that_exits_non_zero_fails_the_job_without_spending_a_restart(
    fleet: Fleet,
) -> None:
    job = fleet.submit(make_spec("train", 8, max_restarts=3))
    fleet.start_everything()
    fleet.finish(job, 2)
    failed = fleet.job(job)
    assert (failed.state, failed.restarts, failed.exit_code) == ("failed", 0, 2)


# -- idempotent submits ----------------------------------------------------------------------


def test_a_retried_array_submit_returns_the_same_tasks_and_stores_nothing_new(
    fleet: Fleet,
) -> None:
    body = {"spec": make_spec("sweep", 1), "array": "0-3"}
    headers = {**ADMIN, "Idempotency-Key": "sweep-1"}
    first = fleet.http.post("/v1/jobs", json=body, headers=headers)
    assert first.status_code == 201, first.text
    count = stored_jobs(fleet)
    again = fleet.http.post("/v1/jobs", json=body, headers=headers)
    assert again.status_code == 200
    assert again.json()["created"] is False
    assert again.json()["tasks"] == first.json()["tasks"]
    assert again.json()["job"]["id"] == first.json()["job"]["id"]
    assert stored_jobs(fleet) == count == 4


def test_a_key_returns_the_first_job_even_with_another_spec_or_after_it_ended(
    fleet: Fleet,
) -> None:
    headers = {**ADMIN, "Idempotency-Key": "k-9"}
    first = fleet.http.post("/v1/jobs", json={"spec": make_spec("a", 8)}, headers=headers)
    job = first.json()["job"]["id"]
    fleet.settle()
    fleet.start_everything()
    fleet.finish(job)
    again = fleet.http.post("/v1/jobs", json={"spec": make_spec("b", 16)}, headers=headers)
    assert again.status_code == 200
    assert (again.json()["job"]["id"], again.json()["job"]["state"]) == (job, "succeeded")
    assert stored_jobs(fleet) == 1


def test_another_teams_key_is_refused_and_makes_no_job(fleet: Fleet) -> None:
    fleet.http.post(
        "/v1/jobs",
        json={"spec": make_spec("a", 8, team="nlp")},
        headers={**ADMIN, "Idempotency-Key": "shared"},
    )
    r = fleet.post("/v1/tokens", {"name": "vis", "role": "member", "team": "vision"})
    assert r.status_code == 201, r.text
    vision = {"Authorization": f"Bearer {r.json()['token']}", "Idempotency-Key": "shared"}
    again = fleet.http.post("/v1/jobs", json={"spec": make_spec("b", 8, team="vision")},
                            headers=vision)  # fmt: skip
    assert again.status_code == 409
    assert "another team's job" in again.json()["error"]
    assert stored_jobs(fleet) == 1


# -- bad input -------------------------------------------------------------------------------


BAD: list[tuple[str, dict[str, Any], str]] = [
    ("negative-gpus", {"spec": make_spec("a", -1)}, "gpus"),
    ("unknown-field", {"spec": {**make_spec("a", 1), "gpuz": 2}}, "gpuz"),
    ("bad-priority", {"spec": make_spec("a", 1, priority="urgent")}, "priority"),
    ("bad-restarts", {"spec": make_spec("a", 1, max_restarts=-2)}, "max_restarts"),
    ("never-fits", {"spec": make_spec("a", 4096)}, "job"),
    ("bad-array", {"spec": make_spec("a", 1), "array": "0-99999999"}, "array"),
    ("no-command", {"spec": {"name": "a", "team": "t", "gpus": 1}}, "command"),
    ("bad-override", {"spec": make_spec("a", 1), "gpus": "lots"}, "gpus"),
]


@pytest.mark.parametrize(("body", "field"), [(b, f) for _, b, f in BAD], ids=[n for n, *_ in BAD])
def test_bad_input_is_refused_naming_the_field_and_the_fix_and_nothing_is_stored(
    fleet: Fleet, body: dict[str, Any], field: str
) -> None:
    r = fleet.post("/v1/jobs", body)
    assert r.status_code == 422, r.text
    problems = r.json()["problems"]
    assert problems, r.text
    assert any(p["field"].split(".")[-1] == field for p in problems), problems
    assert any("To fix" in p["message"] for p in problems), problems
    assert stored_jobs(fleet) == 0
    fleet.settle()
    assert [r for n in fleet.nodes.values() for r in n.to_run()] == []


def test_a_wrongly_typed_gpu_need_is_refused_with_the_fix(fleet: Fleet) -> None:
    r = fleet.post("/v1/jobs", {"spec": {**make_spec("a", 1), "gpu": 2}})
    assert r.status_code == 422, r.text
    [problem] = r.json()["problems"]
    assert problem["field"] == "job.gpu"
    assert "To fix" in problem["message"]

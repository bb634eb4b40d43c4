"""The health step of the scheduling loop, through the real API in-process with stand-in
nodes and a fake clock: stragglers are recorded once (and, by policy, cordoned and moved
off); jobs that stop making progress are failed and give their GPUs back; jobs that never
report are left alone unless they opted in."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from control_kit import ADMIN, Fleet, later, make_spec, report_steps, wait_for

from boltforge.cli.jobs import explanation
from boltforge.control.store.invariants import double_allocations
from boltforge.core.health import HealthRules, StragglerAction

CORDON = HealthRules(straggler_action=StragglerAction.CORDON, progress_timeout_s=60.0)


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    with Fleet(tmp_path, hosts=3, health=CORDON) as f:
        yield f


def events(fleet: Fleet, job: str, kind: str) -> list[Any]:
    return [e for e in fleet.job(job).events if e.kind == kind]


def test_a_straggler_is_cordoned_audited_and_its_job_moves_off(fleet: Fleet) -> None:
    job = fleet.submit(make_spec("train", 16))
    fleet.start_everything()
    placed = {r.rank: r.node for r in fleet.job(job).placement}
    report_steps(fleet, job, {0: 0.05, 1: 0.15})
    later(fleet, 3.0)

    [found] = events(fleet, job, "straggler")
    assert found.data["rank"] == 1 and found.data["node"] == placed[1]
    assert found.data["ratio"] == pytest.approx(3.0)
    assert found.data["samples"] == 12 and found.data["epoch"] == 1
    assert "host cordoned" in found.message
    moving = fleet.job(job)
    assert moving.state == "preempting" and moving.events[-1].kind == "moved"
    audit = fleet.http.get("/v1/audit", headers=ADMIN).json()
    assert any(
        (e["who"], e["action"], e["target"]) == ("system", "cordon", placed[1]) for e in audit
    )

    fleet.stop_everything()
    fleet.start_everything()
    moved = fleet.job(job)
    assert moved.state == "running" and moved.epoch == 2
    assert placed[1] not in {r.node for r in moved.placement}
    with fleet.rt.db.session() as s:
        assert double_allocations(s) == []


def test_a_straggler_is_reported_once_per_allocation(tmp_path: Path) -> None:
    with Fleet(tmp_path, hosts=2) as fleet:
        job = fleet.submit(make_spec("train", 16))
        fleet.start_everything()
        for _ in range(3):
            report_steps(fleet, job, {0: 0.15, 1: 0.05})
            later(fleet, 3.0)
        [found] = events(fleet, job, "straggler")
        assert found.data["rank"] == 0 and "reported only" in found.message
        assert fleet.job(job).state == "running"
        assert found.message in explanation(fleet.job(job))  # what `bolt explain` prints
        nodes = fleet.http.get("/v1/nodes", headers=ADMIN).json()["nodes"]
        assert all(n["state"] != "draining" for n in nodes)


def test_the_cordon_allowance_leaves_a_second_straggler_host_in_service(fleet: Fleet) -> None:
    fleet.post("/v1/nodes/host-2/cordon", {})
    job = fleet.submit(make_spec("train", 16))
    fleet.start_everything()
    report_steps(fleet, job, {0: 0.05, 1: 0.15})
    later(fleet, 3.0)
    [found] = events(fleet, job, "straggler")
    assert "not cordoned" in found.message
    assert fleet.job(job).state == "running"


def test_a_job_that_stops_reporting_is_failed_and_its_gpus_go_to_the_next(fleet: Fleet) -> None:
    hung = fleet.submit(make_spec("hung", 24))
    fleet.start_everything()
    report_steps(fleet, hung, dict.fromkeys(range(3), 0.05), steps=3)
    later(fleet, 30.0)
    assert fleet.job(hung).state == "running"
    later(fleet, 33.0)

    failed = fleet.job(hung)
    assert failed.state == "failed"
    last = failed.events[-1]
    assert last.kind == "failed" and last.data["reason"] == "no-progress"
    assert last.data["last_step"] == 3 and last.data["timeout_s"] == 60.0
    assert "no progress for 63 s" in last.message
    assert sorted(name for name, node in fleet.nodes.items() if node.to_stop()) == [
        "host-0",
        "host-1",
        "host-2",
    ]
    after = fleet.submit(make_spec("after", 8))
    assert fleet.job(after).state == "pending"  # the hung replicas still hold the GPUs
    fleet.stop_everything()
    assert fleet.job(after).state == "scheduled"
    with fleet.rt.db.session() as s:
        assert double_allocations(s) == []


def test_a_job_that_never_reports_is_judged_only_when_it_opted_in(fleet: Fleet) -> None:
    plain = fleet.submit(make_spec("plain", 8))
    opted = fleet.submit(make_spec("opted", 8, health={"progress_timeout": "2m"}))
    fleet.start_everything()
    later(fleet, 100.0)
    assert fleet.job(plain).state == fleet.job(opted).state == "running"
    later(fleet, 30.0)
    assert fleet.job(plain).state == "running"
    reclaimed = fleet.job(opted)
    assert reclaimed.state == "failed"
    assert "since its replicas started (no report)" in reclaimed.events[-1].message


def sampled_later(fleet: Fleet, seconds: float, util_pct: float, memory_mib: float) -> None:
    """``later``, every node's heartbeat carrying NVML samples: each GPU at ``util_pct``
    with ``memory_mib`` in use."""
    while seconds > 0:
        step = min(seconds, 5.0)
        fleet.clock.advance(step)
        seconds -= step
        for node in fleet.nodes.values():
            sample = {"util_pct": util_pct, "memory_used_mib": memory_mib}
            node.heartbeat(gpus=[{"index": i, **sample} for i in range(node.gpus)])
        fleet.settle()


def test_with_nvml_a_silent_job_is_a_zombie_only_once_its_gpus_sit_idle(fleet: Fleet) -> None:
    job = fleet.submit(make_spec("eval", 8))
    fleet.start_everything()
    report_steps(fleet, job, {0: 0.05}, steps=3)
    sampled_later(fleet, 90.0, util_pct=97.0, memory_mib=30_000.0)
    assert fleet.job(job).state == "running"  # silent past its timeout, but computing
    sampled_later(fleet, 60.0, util_pct=0.0, memory_mib=30_000.0)
    assert fleet.job(job).state == "running"  # idle since the first idle sample: 55 s
    sampled_later(fleet, 10.0, util_pct=0.0, memory_mib=30_000.0)

    failed = fleet.job(job)
    assert failed.state == "failed"
    last = failed.events[-1]
    assert last.data["reason"] == "no-progress" and last.data["gpu_idle_s"] == 65.0
    assert "its GPUs held memory and computed nothing for 65 s" in last.message


def test_with_nvml_gpus_that_free_their_memory_are_not_a_hung_job(fleet: Fleet) -> None:
    job = fleet.submit(make_spec("io-bound", 8))
    fleet.start_everything()
    report_steps(fleet, job, {0: 0.05}, steps=3)
    sampled_later(fleet, 200.0, util_pct=0.0, memory_mib=0.0)
    assert fleet.job(job).state == "running"


def test_judged_in_the_background_a_hung_job_is_still_failed(tmp_path: Path) -> None:
    """With full passes planned beside the loop (``overlap``), every running job is judged on
    a thread of its own, holding no lock; the pass after that survey fails the hung job."""
    with Fleet(tmp_path, hosts=3, health=CORDON, overlap=True) as fleet:
        hung = fleet.submit(make_spec("hung", 16))
        healthy = fleet.submit(make_spec("healthy", 8))
        fleet.start_everything()
        report_steps(fleet, hung, dict.fromkeys(range(2), 0.05), steps=3)
        later(fleet, 60.0)
        report_steps(fleet, healthy, {0: 0.05}, steps=3)
        later(fleet, 5.0)

        def failed() -> bool:
            fleet.settle()
            return fleet.job(hung).state == "failed"

        wait_for(failed)
        assert fleet.job(hung).events[-1].data["reason"] == "no-progress"
        assert fleet.job(healthy).state == "running"

"""Elastic jobs on the server: a job grows into GPUs that free up and shrinks for a more
important job, each time restarting in place from its checkpoint at the new size, never
requeued. The test plays the agents (``control_kit``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from control_kit import Fleet, make_spec

from boltforge.wire.jobs import JobDetail


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    with Fleet(tmp_path) as f:
        yield f


def elastic(name: str, replicas: int, low: int, high: int, **extra: Any) -> dict[str, Any]:
    """An 8-GPU-per-replica training job that may run with ``low`` to ``high`` replicas."""
    return make_spec(
        name, 8 * replicas, elastic={"min": low, "max": high}, time_limit=36_000, **extra
    )


def gpus_of(fleet: Fleet, job: str) -> int:
    return sum(len(r.gpus) for n in fleet.nodes.values() for r in n.to_run() if r.job == job)


def kinds(detail: JobDetail) -> list[str]:
    return [e.kind for e in detail.events]


def later(fleet: Fleet, seconds: float) -> None:
    """Time passes; every node keeps its lease by heartbeating every 5 s."""
    for _ in range(int(seconds // 5)):
        fleet.clock.advance(5)
        for node in fleet.nodes.values():
            assert node.heartbeat() == 200


def grown_scenario(fleet: Fleet) -> str:
    """A 2-replica elastic job (1-4) runs beside a 16-GPU job; that job ends, and the next
    full pass grows the elastic one into the freed hosts. Returns the elastic job's id."""
    other = fleet.submit(make_spec("other", 16, time_limit=600))
    job = fleet.submit(elastic("pretrain", 2, 1, 4))
    fleet.start_everything()
    assert gpus_of(fleet, job) == 16
    fleet.finish(other)
    later(fleet, 60)
    fleet.rt.scheduler.wake()
    fleet.settle()
    return job


def test_an_elastic_job_grows_into_freed_gpus_and_restarts_from_its_checkpoint(
    fleet: Fleet,
) -> None:
    job = grown_scenario(fleet)
    growing = fleet.job(job)
    assert growing.state == "scheduled" and growing.epoch == 2
    assert kinds(growing)[-1] == "grown"
    assert "grown to 4 replica(s)" in growing.events[-1].message
    stops = [r for n in fleet.nodes.values() for r in n.to_stop()]
    assert len(stops) == 2 and {r.epoch for r in stops} == {1}  # the old size checkpoints
    assert gpus_of(fleet, job) == 0  # the new size waits for the old one's GPUs
    fleet.stop_everything(checkpoint_s=1.5)
    fleet.start_everything()
    grown = fleet.job(job)
    assert grown.state == "running" and grown.epoch == 2
    assert gpus_of(fleet, job) == 32
    runs = [rep for n in fleet.nodes.values() for rep in n.to_run() if rep.job == job]
    assert sorted(int(r.env["RANK"]) for r in runs) == [0, 1, 2, 3]
    assert {r.env["WORLD_SIZE"] for r in runs} == {"4"}
    assert "requeued" not in kinds(grown)
    fleet.no_gpu_held_twice()


def test_a_grown_job_shrinks_for_a_high_priority_job_and_keeps_running(fleet: Fleet) -> None:
    job = grown_scenario(fleet)
    fleet.stop_everything()
    fleet.start_everything()
    later(fleet, 3600)  # past the resize window
    high = fleet.submit(make_spec("urgent", 16, team="nlp", priority="high"))
    shrunk = fleet.job(job)
    assert shrunk.state == "scheduled" and shrunk.epoch == 3
    assert kinds(shrunk)[-1] == "shrunk"
    assert f"by job {high}" in shrunk.events[-1].message
    assert fleet.job(high).state == "scheduled"
    fleet.stop_everything()
    fleet.start_everything()
    assert fleet.job(high).state == "running"
    kept = fleet.job(job)
    assert kept.state == "running" and kept.epoch == 3 and gpus_of(fleet, job) == 16
    assert "requeued" not in kinds(kept) and kept.preemptions == 0
    fleet.no_gpu_held_twice()


def test_an_elastic_job_is_not_resized_again_inside_the_resize_window(fleet: Fleet) -> None:
    job = grown_scenario(fleet)
    fleet.stop_everything()
    fleet.start_everything()
    later(fleet, 60)
    high = fleet.submit(make_spec("urgent", 16, team="nlp", priority="high"))
    assert fleet.job(job).epoch == 2  # just grown: not shrunk at once
    assert fleet.job(high).state in ("scheduled", "pending")


def test_a_job_that_is_not_elastic_never_grows(fleet: Fleet) -> None:
    other = fleet.submit(make_spec("other", 16, time_limit=600))
    job = fleet.submit(make_spec("fixed", 16, time_limit=36_000))
    fleet.start_everything()
    fleet.finish(other)
    later(fleet, 60)
    fleet.rt.scheduler.wake()
    fleet.settle()
    fixed = fleet.job(job)
    assert fixed.epoch == 1 and fixed.state == "running" and gpus_of(fleet, job) == 16

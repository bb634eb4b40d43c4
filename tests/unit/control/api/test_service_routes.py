"""``/v1/services`` and the autoscaler on the real app: bad specs are refused naming the
field and fix with nothing stored; a service's replicas are jobs of serving priority that the
autoscaler submits and cancels as their reported load moves; a service scaled to zero wakes
on a gateway's report; a job of GPU shares reaches its agent with its share and is metered
for its part of the GPU."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from api_builders import problem_of
from control_kit import ADMIN, Fleet, make_spec
from sqlalchemy import select

from boltforge.control.services.scaler import Scaler
from boltforge.control.store.models import ServiceRow

SERVICE: dict[str, Any] = {
    "kind": "service",
    "name": "chat",
    "team": "nlp",
    "gpus": 4,
    "command": ["python", "serve.py"],
    "replicas": {"min": 0, "max": 3},
    "autoscale": {
        "rps_per_replica": 10,
        "target_utilization": 1.0,
        "scale_down_window": "30s",
        "idle_to_zero": "60s",
        "predictive": False,
    },
}


@pytest.fixture
def fleet(tmp_path: Any) -> Iterator[Fleet]:
    with Fleet(tmp_path, hosts=2, scale_every_s=3600.0) as f:
        yield f


def scale(fleet: Fleet) -> dict[str, Any]:
    """One autoscaling round, then the passes it asks for; the service as the API shows it.
    The nodes heartbeat first, as they would have while the clock moved."""
    for node in fleet.nodes.values():
        node.heartbeat()
    asyncio.run(Scaler(fleet.rt, fresh_s=30.0).step())
    fleet.settle()
    fleet.start_everything()
    body: dict[str, Any] = fleet.http.get("/v1/services/chat", headers=ADMIN).json()
    return body


def report(fleet: Fleet, rate: float) -> None:
    """Every running replica of the service reports ``rate`` requests per second."""
    for node in fleet.nodes.values():
        progress = [
            {
                "replica": rep.replica,
                "job": rep.job,
                "epoch": rep.epoch,
                "rank": 0,
                "step": 1,
                "at": fleet.clock(),
                "metrics": {"requests_per_s": rate, "queued": 0.0, "p99_ms": 80.0},
            }
            for rep in node.to_run()
        ]
        if progress:
            node.report(progress=progress)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"replicas": {"min": 4, "max": 2}}, "service.replicas"),
        ({"autoscale": {"target_utilization": 3}}, "service.autoscale.target_utilization"),
        ({"kind": "job"}, "service.kind"),
        ({"gpus": 16, "per_node": 8}, "service.gpus"),
        ({"gpu": "A100"}, "job.gpu"),
    ],
)
def test_a_bad_service_names_the_field_and_its_fix_and_stores_nothing(
    fleet: Fleet, change: dict[str, Any], field: str
) -> None:
    r = fleet.post("/v1/services", {"spec": {**SERVICE, **change}})
    assert problem_of(r)["field"] == field
    with fleet.rt.db.session() as s:
        assert s.scalars(select(ServiceRow)).all() == []


def test_replicas_follow_the_reported_load_up_down_to_zero_and_back(fleet: Fleet) -> None:
    r = fleet.post("/v1/services", {"spec": SERVICE})
    assert r.status_code == 201 and r.json()["desired"] == 1
    first = scale(fleet)
    assert (first["live"], first["running"]) == (1, 1)
    [job] = first["replica_jobs"]
    assert fleet.job(job).priority_name == "serving"

    report(fleet, 25.0)  # 25 requests/s on one replica of 10: three are needed
    fleet.clock.advance(5)
    up = scale(fleet)
    assert (up["desired"], up["live"], up["ready"]) == (3, 3, 1)
    assert up["reason"] == "request rate" and up["load"]["requests_per_s"] == 25.0

    report(fleet, 0.0)
    fleet.clock.advance(10)
    assert scale(fleet)["desired"] == 3  # inside the 30 s window: held
    fleet.clock.advance(40)
    report(fleet, 0.0)
    down = scale(fleet)
    assert (down["desired"], down["live"]) == (1, 1)
    assert fleet.job(job).state == "running"  # the newest replicas went first

    fleet.clock.advance(70)
    report(fleet, 0.0)
    zero = scale(fleet)
    assert (zero["desired"], zero["live"]) == (0, 0) and "scale to zero" in zero["reason"]

    r = fleet.post("/v1/services/chat/load", {"queued": 2})
    assert r.status_code == 200
    woke = scale(fleet)
    assert woke["desired"] == 1 and "cold start" in woke["reason"]
    listed = fleet.http.get("/v1/services", headers=ADMIN).json()["services"]
    assert [s["name"] for s in listed] == ["chat"]

    gone = fleet.http.delete("/v1/services/chat", headers=ADMIN).json()
    assert gone["state"] == "deleted"
    assert all(fleet.job(j).state == "cancelled" for j in woke["replica_jobs"])
    assert fleet.http.get("/v1/services/chat", headers=ADMIN).status_code == 404


def test_a_job_of_gpu_shares_reaches_its_agent_with_its_share(fleet: Fleet) -> None:
    spec = make_spec("notebook", 0, gpu={"fraction": 0.25, "memory_gb": 20})
    del spec["gpus"]
    job = fleet.submit(spec)
    runs = [rep for node in fleet.nodes.values() for rep in node.to_run() if rep.job == job]
    [rep] = runs
    assert rep.gpus == [] and rep.share is not None
    assert (rep.share.fraction, rep.share.memory_gb) == (0.25, 20.0)
    second = fleet.submit({**spec, "name": "notebook-2"})
    [other] = [r for n in fleet.nodes.values() for r in n.to_run() if r.job == second]
    assert other.share is not None and other.share.gpu == rep.share.gpu  # packed on one GPU
    fleet.start_everything()
    fleet.clock.advance(3600)
    for node in fleet.nodes.values():
        node.heartbeat()
    metered = fleet.job(job)
    assert metered.state == "running"
    assert metered.gpu_hours == pytest.approx(0.25)  # a quarter of a GPU for an hour

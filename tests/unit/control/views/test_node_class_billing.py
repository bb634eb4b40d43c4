"""Node classes through the real server app in-process: agents declare gpu, cpu and storage
nodes; CPU batch and data pipelines are routed to their class with the reason on the job, a
pipeline's replicas carry the local storage they hold, and the bill meters vCPU-hours at each
pool's price beside GPU-hours."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from control_kit import ADMIN, Fleet, Node

from boltforge.control.nodes.agents import LeaseTerms
from boltforge.wire.cost import CostReply

T0 = 1_900_000_000.0
HOUR = 3600.0


@dataclass
class ClassNode(Node):
    """A stand-in node whose inventory the test gives."""

    extra: dict[str, Any] = field(default_factory=dict)

    def inventory(self) -> dict[str, Any]:
        return {**super().inventory(), **self.extra}


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    f = Fleet(tmp_path, hosts=0, terms=LeaseTerms(2.0, 1e8, 1e9))
    f.clock.now = T0
    gpu = {"pool": "h100", "price_per_gpu_hour": 4.0, "price_per_vcpu_hour": 0.0}
    cpu = {"pool": "batch", "node_class": "cpu", "gpus": 0, "gpu": "none", "cpus": 64}
    cpu |= {"price_per_vcpu_hour": 0.0625}
    store = {"pool": "data", "node_class": "storage", "gpus": 0, "gpu": "none", "cpus": 32}
    store |= {"storage_gb": 2000, "storage_gbps": 5, "price_per_vcpu_hour": 0.125}
    f.nodes = {
        "g-0": ClassNode(f, "g-0", "r0", extra=gpu),
        "c-0": ClassNode(f, "c-0", "r1", gpus=0, extra=cpu),
        "s-0": ClassNode(f, "s-0", "r2", gpus=0, extra=store),
    }
    with f:
        yield f


def job(name: str, **fields: Any) -> dict[str, Any]:
    return {"name": name, "team": "research", "command": ["run"], **fields}


def node_of(fleet: Fleet, job_id: str) -> str:
    [node] = [n.name for n in fleet.nodes.values() for r in n.to_run() if r.job == job_id]
    return node


def test_batch_and_pipelines_go_to_their_class_with_the_reason(fleet: Fleet) -> None:
    batch = fleet.submit(job("etl", cpus=16))
    pipe = fleet.submit(job("shuffle", cpus=8, storage_gb=1500))
    train = fleet.submit(job("train", gpus=8))
    assert (node_of(fleet, batch), node_of(fleet, pipe), node_of(fleet, train)) == (
        "c-0",
        "s-0",
        "g-0",
    )
    said = "\n".join(fleet.job(pipe).explanation)
    assert "node class storage (pool data): it asks for 1500 GB of local storage" in said
    [rep] = [r for r in fleet.nodes["s-0"].to_run() if r.job == pipe]
    assert rep.cpus == 8
    second = fleet.submit(job("shuffle-2", cpus=8, storage_gb=1500))
    assert fleet.job(second).state == "pending"  # 500 GB left on the only storage node


def test_the_bill_meters_vcpu_hours_at_each_pools_price(fleet: Fleet) -> None:
    batch = fleet.submit(job("etl", cpus=16))
    pipe = fleet.submit(job("shuffle", cpus=8, storage_gb=100))
    fleet.start_everything()
    fleet.clock.advance(HOUR)
    fleet.finish(batch)
    fleet.finish(pipe)
    r = fleet.http.get("/v1/cost", params={"by": "job", "since": "30d"}, headers=ADMIN)
    reply = CostReply.model_validate(r.json())
    rows = {row.key: row for row in reply.rows}
    assert rows[batch].vcpu_hours == pytest.approx(16.0, rel=1e-6)
    assert rows[batch].dollars == pytest.approx(16 * 0.0625, rel=1e-6)
    assert rows[pipe].vcpu_hours == pytest.approx(8.0, rel=1e-6)
    assert rows[pipe].dollars == pytest.approx(8 * 0.125, rel=1e-6)
    assert rows[batch].gpu_hours == 0.0
    assert reply.total.vcpu_hours == pytest.approx(24.0, rel=1e-6)

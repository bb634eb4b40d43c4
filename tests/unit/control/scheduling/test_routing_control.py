"""Cost-aware routing through the real server on SQLite: a job goes to the cheaper spot
pool, and a reclaim notice shows up as the spot pool's observed interruption rate and as
the job's spot interruption count (control/scheduling/interruptions.py)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from control_kit import ADMIN, Fleet, Node, make_spec

from boltforge.control.scheduling.interruptions import routing_facts
from boltforge.control.scheduling.world import Caches, load_fleet


@dataclass
class PricedNode(Node):
    """A stand-in node of a named pool with a tier and price."""

    pool: str = "h100-od"
    tier: str = "on-demand"
    price: float = 4.0

    def inventory(self) -> dict[str, Any]:
        base = super().inventory()
        return {**base, "pool": self.pool, "tier": self.tier, "price_per_gpu_hour": self.price}


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    f = Fleet(tmp_path, hosts=0)
    f.nodes = {
        "od-0": PricedNode(f, "od-0", "r0"),
        "spot-0": PricedNode(f, "spot-0", "r1", pool="h100-spot", tier="spot", price=1.0),
    }
    with f:
        yield f


def test_a_job_goes_to_the_cheaper_spot_pool_and_a_reclaim_counts_against_it(
    fleet: Fleet,
) -> None:
    spec = make_spec("train", 8, time_limit="10h", checkpoint={"interval": "30m"})
    job = fleet.submit(spec)
    fleet.start_everything()
    [where] = [r.node for r in fleet.job(job).placement]
    assert where == "spot-0"
    said = [line for line in fleet.job(job).explanation if line.startswith("spot h100-spot")]
    assert said == ["spot h100-spot: effective $80.00 vs on-demand h100-od $320.00"]
    r = fleet.http.post("/v1/nodes/spot-0/reclaim", json={"in_s": 30}, headers=ADMIN)
    assert r.status_code == 200, r.text
    fleet.settle()
    with fleet.rt.db.session() as s:
        tree, nodes = load_fleet(s, Caches())
        facts = routing_facts(s, tree.tree, nodes, fleet.clock())
    assert facts.interruptions == {"h100-spot": 1.0}  # one reclaim over (at least) 1 host-hour
    assert facts.spot_interruptions == {job: 1}

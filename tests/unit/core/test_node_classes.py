"""Node classes: a job goes to GPU, CPU or storage nodes by what it asks for, storage is held
like memory, and the explanation says which class and why."""

from __future__ import annotations

from typing import Any

import pytest

from boltforge.core.model.state import Allocation, FleetState
from boltforge.core.model.topology import TopologyTree
from boltforge.core.placement.answers import Outcome
from boltforge.core.placement.explain import describe
from boltforge.core.placement.modes import could_ever_fit
from boltforge.core.placement.place import place_gang
from boltforge.spec.errors import SpecError
from boltforge.spec.fleet import parse_fleet
from boltforge.spec.job import parse_job
from boltforge.spec.resolve import to_gang

GPU = {"name": "h100", "gpu": "H100-80GB", "gpu_memory_gb": 80, "cpus": 64}
CPU = {"name": "batch", "class": "cpu", "gpus_per_host": 0, "cpus": 96}
STORE = {"name": "data", "class": "storage", "gpus_per_host": 0, "cpus": 32, "storage_gb": 1000}


def fleet(*pools: dict[str, Any], hosts: int = 2) -> TopologyTree:
    spec = {"name": "mixed", "pools": [{**p, "layout": {"hosts": hosts}} for p in pools]}
    return parse_fleet(spec).to_tree()


def job(tree: TopologyTree, **fields: Any) -> Any:
    spec = parse_job({"name": "j", "team": "t", "command": "run", **fields})
    return to_gang(spec, tree)


def pools_of(tree: TopologyTree, state: FleetState, gang: Any) -> list[str]:
    placement, _ = place_gang(state, gang)
    assert placement is not None
    return [tree.pools[tree.hosts[g.host].pool].name for g in placement.grants]


def test_each_job_goes_to_the_class_its_request_names() -> None:
    tree = fleet(GPU, CPU, STORE)
    state = FleetState(tree)
    assert pools_of(tree, state, job(tree, gpus=8)) == ["h100"]
    assert pools_of(tree, state, job(tree, cpus=16)) == ["batch"]
    assert pools_of(tree, state, job(tree, cpus=8, storage_gb=300)) == ["data"]


def test_the_explanation_names_the_class_and_why() -> None:
    tree = fleet(GPU, CPU, STORE)
    for fields, said in (
        ({"gpus": 8}, "node class gpu (pool h100): it asks for GPUs"),
        ({"cpus": 4}, "node class cpu (pool batch): it asks for no GPUs and no local storage"),
        (
            {"storage_gb": 300},
            "node class storage (pool data): it asks for 300 GB of local storage",
        ),
    ):
        placement, _ = place_gang(FleetState(tree), job(tree, **fields))
        assert placement is not None
        assert f"  {said}" in describe(tree, placement)


def test_storage_is_held_like_memory_and_comes_back() -> None:
    tree = fleet(STORE)  # two hosts of 1000 GB
    state = FleetState(tree)
    taken = []
    for n in range(4):  # 400 GB each: two per host
        placement, _ = place_gang(state, job(tree, storage_gb=400))
        assert placement is not None, f"pipeline {n} should fit"
        state.allocate(Allocation(f"p{n}", placement.grants))
        taken.append(placement.grants[0].host)
    assert sorted(taken) == [0, 0, 1, 1]
    assert state.free_storage.tolist() == [200.0, 200.0]
    assert place_gang(state, job(tree, storage_gb=400))[0] is None
    state.release("p0")
    assert place_gang(state, job(tree, storage_gb=400))[0] is not None


def test_cpu_work_never_lands_on_storage_nodes_but_may_use_gpu_hosts_spare_cpus() -> None:
    tree = fleet(GPU, STORE, hosts=1)
    placement, _ = place_gang(FleetState(tree), job(tree, cpus=8))
    assert placement is not None
    assert [tree.hosts[g.host].name for g in placement.grants] == [tree.hosts[0].name]
    words = describe(tree, placement)
    assert any("no CPU node could take it, so it uses spare CPUs here" in w for w in words)


def test_a_storage_request_on_a_fleet_without_storage_nodes_can_never_run() -> None:
    tree = fleet(GPU, CPU)
    decision = could_ever_fit(tree, job(tree, storage_gb=100))
    assert decision.outcome == Outcome.NEVER
    assert any("add a pool with `class: storage`" in f for f in decision.fixes)


@pytest.mark.parametrize(
    ("pool", "said"),
    [
        ({**STORE, "storage_gb": 0}, "class storage with no local storage"),
        ({**CPU, "gpus_per_host": 8, "gpu": "H100", "gpu_memory_gb": 80}, "class cpu but has 8"),
        ({"name": "x", "class": "gpu", "gpus_per_host": 0}, "class gpu with no GPUs"),
    ],
)
def test_a_class_that_contradicts_the_hardware_is_refused(pool: dict[str, Any], said: str) -> None:
    with pytest.raises(SpecError, match=said):
        fleet(pool)

"""The fleet as the scheduler sees it (``scheduling/fleet.py``): a tree built from the nodes'
inventories, hosts numbered so every rack and pod is contiguous, one pool per pool name,
and the hardware a node's inventory leaves unsaid filled in."""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sched_builders import inventory

from boltforge.control.scheduling.fleet import build_fleet, check_inventory, to_pool
from boltforge.core.model.topology import Tier
from boltforge.spec.errors import SpecError


def test_hosts_are_numbered_by_pod_rack_and_name_whatever_the_order_they_came_in() -> None:
    fleet = build_fleet(
        "f",
        [
            inventory("b", rack="r1", pod="p1"),
            inventory("z", rack="r0", pod="p0"),
            inventory("a", rack="r1", pod="p1"),
            inventory("c", rack="r0", pod="p1"),
        ],
    )
    assert fleet.names == ("z", "c", "a", "b")
    assert fleet.index == {"z": 0, "c": 1, "a": 2, "b": 3}
    assert [h.name for h in fleet.tree.hosts] == list(fleet.names)


def test_nodes_of_one_pool_share_one_pool_and_each_pool_is_listed_once() -> None:
    fleet = build_fleet(
        "f",
        [
            inventory("h0"),
            inventory("h1"),
            inventory("l0", pool="l4", gpu="L4", gpus=4, nvlink_island=None, rack="r9"),
        ],
    )
    assert [p.name for p in fleet.tree.pools] == ["h100", "l4"]
    assert [fleet.tree.pool_of(fleet.index[n]).name for n in ("h0", "h1", "l0")] == [
        "h100",
        "h100",
        "l4",
    ]


def test_a_pool_takes_its_hardware_and_prices_from_the_inventory() -> None:
    pool = to_pool(
        inventory(
            "s0",
            pool="spot",
            tier="spot",
            price_per_gpu_hour=1.25,
            price_per_vcpu_hour=0.02,
            nvlink_island=4,
            rails=2,
        )
    )
    assert (pool.name, pool.gpu_type, pool.gpus_per_host, pool.island_size) == (
        "spot",
        "H100-80GB",
        8,
        4,
    )
    assert (pool.rails, pool.tier, pool.price_per_gpu_hour, pool.price_per_vcpu_hour) == (
        2,
        Tier.SPOT,
        1.25,
        0.02,
    )
    assert (pool.cpus, pool.memory_gb, pool.gpu_memory_gb) == (64, 512.0, 80.0)


def test_what_an_inventory_leaves_unsaid_is_filled_in_from_its_gpus() -> None:
    pool = to_pool(inventory("g", nvlink_island=None, rails=None))
    assert (pool.island_size, pool.rails, pool.node_class) == (8, 8, "")


def test_a_cpu_node_is_a_cpu_pool_of_one_rail() -> None:
    pool = to_pool(inventory("c", pool="cpu", gpu="none", gpus=0, node_class="cpu"))
    assert (pool.gpu_type, pool.gpus_per_host, pool.island_size, pool.rails) == ("cpu", 0, 1, 1)
    assert pool.node_class == "cpu"


def test_a_node_is_never_checked_against_itself() -> None:
    changed = inventory("h0", gpus=4, nvlink_island=4)
    check_inventory(changed, inventory("h0"))  # its own old record: no complaint
    with pytest.raises(SpecError):
        check_inventory(changed, inventory("h9"))


def test_every_contradiction_is_named_at_once_with_its_value() -> None:
    peer = inventory("h0")
    with pytest.raises(SpecError) as refused:
        check_inventory(inventory("h1", gpus=4, nvlink_island=3, cpus=32), peer)
    problems = {p.field: p for p in refused.value.problems}
    assert set(problems) == {"inventory.nvlink_island", "inventory.gpus", "inventory.cpus"}
    assert problems["inventory.cpus"].value == 32
    assert problems["inventory.cpus"].message == (
        "differs from node h0 of pool h100 (64). To fix: put different hardware in its own pool"
    )
    assert refused.value.render().startswith("node h1: 4 problem(s)")


@settings(max_examples=60, deadline=None)
@given(
    layout=st.lists(
        st.tuples(st.sampled_from(["p0", "p1", "p2"]), st.sampled_from(["r0", "r1", "r2"])),
        min_size=1,
        max_size=12,
    )
)
def test_every_rack_and_pod_is_numbered_contiguously(layout: list[tuple[str, str]]) -> None:
    invs = [inventory(f"h{i}", pod=pod, rack=rack) for i, (pod, rack) in enumerate(layout)]
    fleet = build_fleet("f", invs)
    where = {i.name: (i.pod, i.rack) for i in invs}
    order = [where[n] for n in fleet.names]
    assert contiguous([pod for pod, _ in order]), order
    assert contiguous(order), order
    assert sorted(fleet.names) == sorted(where)


def contiguous(keys: Sequence[Hashable]) -> bool:
    """Whether equal keys all stand together."""
    runs = [k for i, k in enumerate(keys) if i == 0 or keys[i - 1] != k]
    return len(runs) == len(set(runs))

"""A node's inventory follows the node: GPUs the device plugin reports after the node is
Ready, GPU feature discovery's labels and the admin's rack labels that arrive later register
the node again with what it now has; a node without GPUs says so, and pods asking for GPUs
while no node has any say why they wait."""

from __future__ import annotations

import pytest
from kube_sched_rig import Rig, rig
from kube_unit_kit import knode, kpod

from boltforge.agent.client import Refused
from boltforge.kube.gangs import GangKey


@pytest.fixture
def r(monkeypatch: pytest.MonkeyPatch) -> Rig:
    return rig(monkeypatch)


def inventories(r: Rig, node: str) -> list[tuple[int, str, str, str]]:
    """(gpus, gpu model, rack, pool) of each registration of ``node``, in order."""
    return [
        (reg.inventory.gpus, reg.inventory.gpu, reg.inventory.rack, reg.inventory.pool)
        for reg in r.agents.registered
        if reg.inventory.name == node
    ]


def test_gpus_and_labels_that_arrive_after_ready_register_the_node_again(r: Rig) -> None:
    r.nodes(knode("n1", bare=True))
    r.passes()
    r.nodes(knode("n1", rack="r7"))  # the device plugin, GFD and the admin have spoken
    r.passes(2)
    assert inventories(r, "n1") == [(0, "none", "rack0", "k8s-cpu"), (8, "h100", "r7", "k8s-h100")]


def test_a_node_registered_again_keeps_what_it_runs(r: Rig) -> None:
    r.nodes(knode("n1", rack="r1"))
    r.passes()
    r.nodes(knode("n1", rack="r2"))
    r.passes()
    assert [reg.running for reg in r.agents.registered] == [[], []]
    assert r.sched.state.leases["n1"].session == "s-n1-2"


def test_an_unchanged_node_is_not_registered_again(r: Rig) -> None:
    r.nodes(knode("n1"))
    r.passes()
    r.nodes(knode("n1"))  # a new object (its heartbeat moved), the same inventory
    r.passes(2)
    assert len(inventories(r, "n1")) == 1


def test_a_node_the_server_refuses_is_skipped_and_the_rest_register(r: Rig) -> None:
    r.nodes(knode("n1"), knode("n2"))
    r.agents.refuse_nodes["n1"] = Refused(
        422, "inventory contradicts its pool", ["inventory.gpus: differs"]
    )
    r.passes()
    assert set(r.sched.state.leases) == {"n2"}
    assert "contradicts its pool" in r.sched.state.refused_nodes["n1"]


def test_gpu_pods_on_a_fleet_without_gpus_say_the_device_plugin_has_not_reported(
    r: Rig,
) -> None:
    r.nodes(knode("n1", bare=True))
    r.put(kpod("solo", gpus=8))
    r.passes()
    why = r.sched.state.refused[GangKey("research", "pod", "solo")]
    assert "no Ready node reports nvidia.com/gpu allocatable" in why
    assert "NVIDIA device plugin" in why
    r.nodes(knode("n1"))
    r.passes()
    assert [spec["name"] for spec, _, _ in r.jobs.submitted] == ["research-solo"]

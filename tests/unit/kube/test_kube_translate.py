"""Kubernetes objects into Boltforge's words: nodes, priorities, gangs and their specs."""

from __future__ import annotations

import pytest

from boltforge.kube import model
from boltforge.kube.gangs import GangKey, gangs, preemptible
from boltforge.kube.model import quantity
from boltforge.kube.translate import (
    Labels,
    Unplaceable,
    cordoned,
    inventory,
    job_spec,
    priority,
    shape,
)
from boltforge.spec.job import JobSpec
from boltforge.testing.kube_builders import node_json, pdb_json, pod_json


@pytest.mark.parametrize(
    ("text", "value"),
    [("500m", 0.5), ("16Gi", 16 * 2**30), ("8", 8.0), ("1.5", 1.5), ("2k", 2000.0), ("x", 0.0)],
)
def test_quantities_read_as_kubernetes_writes_them(text: str, value: float) -> None:
    assert quantity(text) == value


def test_a_node_becomes_an_inventory_with_its_gpu_model_rack_and_pool() -> None:
    inv = inventory(model.node(node_json("gpu-1", gpus=8, rack="r7")), Labels())
    assert (inv.name, inv.gpus, inv.gpu, inv.rack, inv.pool) == (
        "gpu-1",
        8,
        "h100",
        "r7",
        "k8s-h100",
    )
    assert inv.gpu_memory_gb == pytest.approx(79.6, abs=0.1)
    assert inv.cpus == 96 and inv.memory_gb == 1000


def test_an_unschedulable_or_tainted_node_is_cordoned_but_the_gpu_taint_is_tolerated() -> None:
    gpu_taint = [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]
    maint = [{"key": "maintenance", "effect": "NoExecute"}]
    assert not cordoned(model.node(node_json("a", taints=gpu_taint)), Labels())
    assert cordoned(model.node(node_json("b", taints=maint)), Labels())
    assert cordoned(model.node(node_json("c", unschedulable=True)), Labels())


def test_priority_comes_from_the_class_name_its_label_or_its_value() -> None:
    classes = {
        "prod": model.priority_class({"metadata": {"name": "prod"}, "value": 2_000_000}),
        "scavenger": model.priority_class({"metadata": {"name": "scavenger"}, "value": -10}),
        "tier": model.priority_class(
            {"metadata": {"name": "tier", "labels": {"boltforge.io/class": "serving"}}, "value": 5}
        ),
    }
    of = {
        pc: priority(model.pod(pod_json("p", priority_class=pc)), classes)
        for pc in ["high", "prod", "scavenger", "tier", "", "unknown"]
    }
    assert of == {
        "high": "high",
        "prod": "high",
        "scavenger": "low",
        "tier": "serving",
        "": "normal",
        "unknown": "normal",
    }


def test_a_gang_spec_has_one_replica_per_pod_by_role_and_is_a_valid_job() -> None:
    pods = [model.pod(pod_json(f"w{i}", gpus=8, group="llm")) for i in range(8)]
    pods.append(model.pod(pod_json("launcher", gpus=0, group="llm")))
    spec = job_spec(
        "research-llm",
        shape(pods),
        priority_class="high",
        grace_s=30,
        preemptible=True,
        largest_node=8,
    )
    roles = [(r["name"], r["replicas"], r["gpus"]) for r in spec["roles"]]
    assert roles == [("gpu8", 8, 8), ("cpu", 1, 0)]
    assert spec["team"] == "research"
    JobSpec.model_validate(spec)


def test_a_pod_asking_more_gpus_than_any_node_is_refused_with_the_fix() -> None:
    pods = [model.pod(pod_json("big", gpus=16))]
    with pytest.raises(Unplaceable, match=r"asks for 16 GPUs.*largest node has 8"):
        job_spec(
            "x", shape(pods), priority_class="normal", grace_s=1, preemptible=True, largest_node=8
        )


def test_pods_of_one_role_must_be_the_same_size() -> None:
    pods = [
        model.pod(pod_json("a", gpus=8, labels={"boltforge.io/role": "w"})),
        model.pod(pod_json("b", gpus=4, labels={"boltforge.io/role": "w"})),
    ]
    with pytest.raises(Unplaceable, match="role w ask for different resources"):
        shape(pods)


def test_gangs_form_by_pod_group_annotation_or_alone_and_say_what_they_wait_for() -> None:
    group = model.pod_group(
        {
            "metadata": {"name": "llm", "namespace": "research", "uid": "u1"},
            "spec": {"minMember": 4},
        }
    )
    pods = [model.pod(pod_json(f"w{i}", group="llm")) for i in range(3)]
    pods += [model.pod(pod_json(f"a{i}", gang=("pair", 2))) for i in range(2)]
    pods += [model.pod(pod_json("solo")), model.pod(pod_json("lost", group="nope"))]
    found = gangs(pods, {"research/llm": group})
    llm = found[GangKey("research", "podgroup", "llm")]
    assert "3 of the 4 pods" in (llm.not_ready() or "")
    assert found[GangKey("research", "gang", "pair")].not_ready() is None
    assert found[GangKey("research", "pod", "solo")].not_ready() is None
    missing = found[GangKey("research", "podgroup", "nope")].not_ready() or ""
    assert "PodGroup nope does not exist" in missing
    assert llm.idempotency_key().endswith("/u1")


def test_a_disruption_budget_that_would_refuse_part_of_a_gang_protects_all_of_it() -> None:
    pods = [model.pod(pod_json(f"w{i}", group="g", labels={"app": "g"})) for i in range(4)]
    gang = gangs(
        pods,
        {
            "research/g": model.pod_group(
                {"metadata": {"name": "g", "namespace": "research"}, "spec": {"minMember": 4}}
            )
        },
    )
    g = next(iter(gang.values()))
    strict = model.budget(pdb_json("keep3", {"app": "g"}, min_available=3))
    loose = model.budget(pdb_json("any", {"app": "g"}, min_available=0))
    other = model.budget(pdb_json("other", {"app": "x"}, min_available=4))
    assert not preemptible(g, [strict], pods)
    assert preemptible(g, [loose, other], pods)
    assert preemptible(g, [model.budget(pdb_json("pct", {"app": "g"}, min_available="0%"))], pods)

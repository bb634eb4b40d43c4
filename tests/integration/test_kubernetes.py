"""Boltforge as a Kubernetes scheduler on a real control plane (kube-apiserver,
kube-controller-manager with its disruption controller, kwok's nodes), with the RBAC of
``deploy/kubernetes/rbac.yaml``, driven through the real ``kubernetes`` client and kubectl:
gangs bound whole or not at all, on one rack; preemption through the Eviction API that
honours a PodDisruptionBudget; watches cut by an API server restart, resumed or listed again
after etcd's history was compacted; two replicas, one Lease."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from boltforge.kube.actions import COMPONENT
from boltforge.testing.kube_builders import CLASSES, pdb_json, pod_group_json, pod_json
from boltforge.testing.kube_fleet import KubeFleet, kube_fleet
from boltforge.testing.processes import wait_until
from boltforge.testing.realkube import RealKube, kwok_node

RACKS = {f"n{r}{i}": f"r{r}" for r in (1, 2) for i in range(8)}  # 2 racks of 8 nodes


@pytest.fixture
def fleet(tmp_path: Path, real_kube_session: RealKube) -> Iterator[KubeFleet]:
    nodes = [kwok_node(name, rack=rack) for name, rack in RACKS.items()]
    with kube_fleet(tmp_path, real_kube_session, nodes) as f:
        for pc in CLASSES:
            f.ensure(pc)
        yield f


def gang(f: KubeFleet, name: str, pods: int, gpus: int = 8, **extra: Any) -> list[str]:
    """A PodGroup of ``pods`` pods of ``gpus`` GPUs; the pods' names."""
    f.create(pod_group_json(name, pods, f.namespace))
    names = [f"{name}-{i}" for i in range(pods)]
    for n in names:
        f.create(pod_json(n, gpus=gpus, group=name, namespace=f.namespace, **extra))
    return names


def bound(f: KubeFleet, names: list[str]) -> dict[str, str]:
    pods = f.pods()
    return {n: pods[n]["spec"].get("nodeName") or "" for n in names if n in pods}


def all_bound(f: KubeFleet, names: list[str]) -> dict[str, str] | None:
    where = bound(f, names)
    return where if len(where) == len(names) and all(where.values()) else None


def condition(f: KubeFleet, pod: str) -> dict[str, Any]:
    conds = f.pods()[pod].get("status", {}).get("conditions") or []
    return next((c for c in conds if c["type"] == "PodScheduled"), {})


def said(f: KubeFleet, pod: str, reason: str) -> list[str]:
    return [e["message"] for e in f.events(pod) if e["reason"] == reason]


def test_a_64_gpu_gang_lands_in_one_rack_and_says_where(fleet: KubeFleet) -> None:
    small = gang(fleet, "warmup", 2)
    wait_until(lambda: all_bound(fleet, small), 30, "the small gang to bind")
    big = gang(fleet, "llm", 8)
    where = wait_until(lambda: all_bound(fleet, big), 30, "the 64-GPU gang to bind")
    assert len({RACKS[n] for n in where.values()}) == 1, where
    assert len(set(where.values())) == 8
    assert condition(fleet, "llm-0")["status"] == "True"
    placed = wait_until(lambda: said(fleet, "llm-0", "Scheduled"), 15, "a Scheduled event")
    assert where["llm-0"] in placed[0] and "8 pods on 8 nodes in rack" in placed[0]
    pods = fleet.pods()
    assert all(pods[n]["metadata"]["annotations"]["boltforge.io/job"] for n in big)


def test_a_gang_that_cannot_fully_fit_binds_nothing_and_says_why(fleet: KubeFleet) -> None:
    names = gang(fleet, "huge", 17)  # 136 GPUs on a 128-GPU fleet
    text = wait_until(lambda: condition(fleet, "huge-0").get("message"), 30, "a condition")
    assert condition(fleet, "huge-0")["status"] == "False"
    assert text.startswith("boltforge: ")
    assert not any(bound(fleet, names).values())
    assert wait_until(lambda: said(fleet, "huge-3", "FailedScheduling"), 15, "an event")


def test_bad_gangs_get_a_clear_condition_and_nothing_is_half_bound(fleet: KubeFleet) -> None:
    ns = fleet.namespace
    fleet.create(pod_json("greedy", gpus=16, namespace=ns))
    fleet.create(pod_json("orphan", group="no-such-group", namespace=ns))
    fleet.create(pod_group_json("short", 4, ns))
    for i in range(2):
        fleet.create(pod_json(f"short-{i}", group="short", namespace=ns))

    def message(pod: str) -> str:
        return str(condition(fleet, pod).get("message") or "")

    wait_until(lambda: "largest node has 8" in message("greedy"), 30, "the greedy pod's reason")
    assert "16 GPUs" in message("greedy")
    wait_until(lambda: "PodGroup no-such-group does not exist" in message("orphan"), 30, "orphan")
    wait_until(lambda: "2 of the 4 pods" in message("short-0"), 30, "the short gang's reason")
    assert not any(bound(fleet, ["greedy", "orphan", "short-0", "short-1"]).values())
    assert said(fleet, "greedy", "FailedScheduling")


def test_a_high_priority_gang_evicts_a_whole_rack_and_spares_the_budgeted_gang(
    fleet: KubeFleet,
) -> None:
    evictions = fleet.requests()[("create", "pods/eviction")]
    fleet.create(pdb_json("keep-all", {"app": "kept"}, min_available=8, namespace=fleet.namespace))
    kept = gang(fleet, "kept", 8, labels={"app": "kept"}, priority_class="low")
    wait_until(lambda: all_bound(fleet, kept), 30, "the budgeted gang to bind")
    free = gang(fleet, "free", 8, priority_class="low")
    wait_until(lambda: all_bound(fleet, free), 30, "the second gang to bind")
    free_nodes = set(bound(fleet, free).values())
    urgent = gang(fleet, "urgent", 8, priority_class="high")
    where = wait_until(lambda: all_bound(fleet, urgent), 30, "the urgent gang to bind")
    assert set(where.values()) == free_nodes  # the victims' rack: topology-valid
    # evicted: kwok, as the kubelet would, removed them
    wait_until(lambda: not set(free) & set(fleet.pods()), 30, "the evicted pods to go")
    pods = fleet.pods()
    assert all(
        pods[n]["spec"]["nodeName"] and "deletionTimestamp" not in pods[n]["metadata"] for n in kept
    )
    assert fleet.requests()[("create", "pods/eviction")] - evictions == 8


def test_watches_that_drop_or_expire_resume_without_binding_twice(fleet: KubeFleet) -> None:
    def bindings() -> int:
        return fleet.requests()[("create", "bindings")]

    before = bindings()
    first = gang(fleet, "first", 2)
    wait_until(lambda: all_bound(fleet, first), 30, "the first gang to bind")
    fleet.kube.restart_apiserver()  # every watch is cut
    second = gang(fleet, "second", 2)
    wait_until(lambda: all_bound(fleet, second), 60, "a gang after the watches dropped")
    fleet.kube.compact()  # etcd forgets every version the watches could resume from
    fleet.kube.restart_apiserver()
    third = gang(fleet, "third", 4)
    wait_until(lambda: all_bound(fleet, third), 60, "a gang after the history was compacted")
    posted = bindings() - before
    assert posted == 8, f"{posted} bindings for 8 pods"
    assert "listing again" in fleet.log()


def ours(f: KubeFleet, pod: str) -> list[dict[str, Any]]:
    """``pod``'s events written by a Boltforge scheduler replica: the controller manager
    writes its own (NodeNotReady when a kwok lease renews late) with no reporting instance."""
    return [e for e in f.events(pod) if e.get("reportingComponent") == COMPONENT]


def test_two_scheduler_replicas_never_both_act(fleet: KubeFleet) -> None:
    fleet.start_scheduler("sched-b")
    one = gang(fleet, "one", 2)
    wait_until(lambda: all_bound(fleet, one), 30, "a gang bound by the leader")
    # the Scheduled events are written beside the pass, just after the binding
    wait_until(lambda: ours(fleet, "one-0"), 30, "the leader's Scheduled event")
    assert {e["reportingInstance"] for e in ours(fleet, "one-0")} == {"sched-a"}
    fleet.kill_scheduler("sched-a")
    two = gang(fleet, "two", 2)
    wait_until(lambda: all_bound(fleet, two), 30, "the standby to take over and bind")
    wait_until(lambda: ours(fleet, "two-0"), 30, "the new leader's Scheduled event")
    assert {e["reportingInstance"] for e in ours(fleet, "two-0")} == {"sched-b"}
    assert "sched-b leads" in fleet.log("sched-b")


def kubectl() -> str:
    found = os.environ.get("BOLT_KUBECTL") or shutil.which("kubectl")
    if found is None:
        if os.environ.get("BOLT_REQUIRE_KUBECTL") == "1":
            raise RuntimeError("kubectl is required. To fix: apt-get install kubernetes-client")
        pytest.skip("kubectl is not installed (apt-get install kubernetes-client)")
    return found


def test_kubectl_describe_pod_shows_why_a_pod_waits(fleet: KubeFleet) -> None:
    fleet.create(pod_json("greedy", gpus=16, namespace=fleet.namespace))
    wait_until(lambda: said(fleet, "greedy", "FailedScheduling"), 30, "an event")
    out = subprocess.run(
        [
            kubectl(),
            "--kubeconfig",
            str(fleet.admin_kubeconfig),
            "-n",
            fleet.namespace,
            "describe",
            "pod",
            "greedy",
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    assert "PodScheduled" in out and "FailedScheduling" in out
    assert "largest node has 8" in out

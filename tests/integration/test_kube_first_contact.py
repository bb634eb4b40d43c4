"""What a real cluster does to a scheduler that has only met its own tests, against the real
control plane (``boltforge.testing.realkube``: kube-apiserver, kube-controller-manager with
its Job and disruption controllers, kwok's nodes) and real ``bolt server`` and ``bolt
kube-scheduler`` processes: GPUs and labels that arrive after a node is Ready; a cluster
without the PodGroup CRD; pods that ask for particular nodes, or that their kubelet refuses;
a Job that makes its workers again; budgets the disruption controller keeps; SIGTERM and the
Lease; the manifests a stock cluster must accept."""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes.client as client
import pytest

from boltforge.testing.kube_builders import CLASSES, pdb_json, pod_group_json, pod_json
from boltforge.testing.kube_fleet import LEASE, KubeFleet, kube_fleet
from boltforge.testing.processes import wait_until
from boltforge.testing.realkube import MANIFESTS, SCHEDULER_SA, RealKube, kwok_node

WAIT_S = 60.0
A100 = "NVIDIA-A100-SXM4-80GB"


@pytest.fixture
def nodes() -> list[dict[str, Any]]:
    """Four H100 nodes in rack r1 (pool k8s-h100), four A100 nodes in rack r2 (k8s-a100)."""
    h100 = [kwok_node(f"h{i}", rack="r1") for i in range(4)]
    return h100 + [kwok_node(f"a{i}", rack="r2", product=A100) for i in range(4)]


@pytest.fixture
def fleet(
    tmp_path: Path, real_kube_session: RealKube, nodes: list[dict[str, Any]]
) -> Iterator[KubeFleet]:
    with kube_fleet(tmp_path, real_kube_session, nodes) as f:
        for pc in CLASSES:
            f.ensure(pc)
        yield f


# reading the cluster


def pod_of(f: KubeFleet, name: str) -> dict[str, Any]:
    return f.pods().get(name) or {}


def node_of(f: KubeFleet, pod: str) -> str:
    return str((pod_of(f, pod).get("spec") or {}).get("nodeName") or "")


def condition(f: KubeFleet, pod: str) -> dict[str, Any]:
    conds = (pod_of(f, pod).get("status") or {}).get("conditions") or []
    return next((c for c in conds if c["type"] == "PodScheduled"), {})


def waits_with(f: KubeFleet, pod: str, reason: str, words: str = "") -> dict[str, Any]:
    """Wait until ``pod``'s PodScheduled condition has ``reason`` (and ``words``)."""

    def told() -> dict[str, Any] | None:
        c = condition(f, pod)
        ok = c.get("reason") == reason and words in str(c.get("message") or "")
        return c if ok else None

    found: dict[str, Any] = wait_until(told, WAIT_S, f"{pod} to say {reason} {words}")
    return found


def registered(f: KubeFleet, node: str) -> Any:
    return next((n for n in f.api.nodes().nodes if n.name == node), None)


def make(f: KubeFleet, name: str, **kw: Any) -> None:
    f.create(pod_json(name, namespace=f.namespace, **kw))


# 1. inventory that arrives after Ready


@pytest.mark.parametrize("nodes", [[kwok_node("late", gpus=0, rack=None)]])
def test_gpus_and_labels_that_arrive_after_ready_reach_the_server(fleet: KubeFleet) -> None:
    make(fleet, "solo", gpus=8)
    waits_with(fleet, "solo", "SchedulerRefused", "no Ready node reports nvidia.com/gpu")
    assert registered(fleet, "late").gpus == 0
    labels = {
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
        "nvidia.com/gpu.memory": "81559",
        "topology.boltforge.io/rack": "r9",
    }
    fleet.core.patch_node("late", {"metadata": {"labels": labels}})
    gpus = {"nvidia.com/gpu": "8"}
    status = {"status": {"allocatable": gpus, "capacity": gpus}}
    fleet.core.patch_node_status("late", status)  # the device plugin has spoken
    wait_until(lambda: node_of(fleet, "solo") == "late", WAIT_S, "the pod to be placed")
    node = registered(fleet, "late")
    assert (node.gpus, node.rack) == (8, "r9")
    assert "node late changed" in fleet.log()


# 2. no PodGroup CRD


@pytest.fixture
def without_crd(fleet: KubeFleet) -> Iterator[KubeFleet]:
    """The fleet with the PodGroup CRD deleted, put back afterwards for the other tests."""
    ext = client.ApiextensionsV1Api(fleet.kube_api)
    ext.delete_custom_resource_definition("podgroups.scheduling.x-k8s.io")
    custom = client.CustomObjectsApi(fleet.kube_api)

    def gone() -> bool:
        try:
            custom.list_cluster_custom_object("scheduling.x-k8s.io", "v1alpha1", "podgroups")
        except client.ApiException as e:
            return bool(e.status == 404)
        return False

    def deleted() -> bool:
        try:
            ext.read_custom_resource_definition("podgroups.scheduling.x-k8s.io")
        except client.ApiException as e:
            return bool(e.status == 404)
        return False

    wait_until(gone, WAIT_S, "PodGroups to stop being served")
    try:
        yield fleet
    finally:
        wait_until(deleted, WAIT_S, "the CRD to be deleted")
        fleet.kube.install_crds()  # for the tests that follow


def test_without_the_crd_annotation_gangs_run_and_podgroup_pods_say_why(
    without_crd: KubeFleet,
) -> None:
    f = without_crd
    for i in range(2):
        make(f, f"pair-{i}", gang=("pair", 2))
    make(f, "grouped", group="llm")
    wait_until(lambda: node_of(f, "pair-0") and node_of(f, "pair-1"), WAIT_S, "the pair")
    found = waits_with(f, "grouped", "PodGroupCRDMissing")
    assert "kubectl apply -f deploy/kubernetes/podgroup-crd.yaml" in found["message"]
    assert f.log().count("the PodGroup CRD (podgroups.scheduling.x-k8s.io") == 1


# 3. where a pod may run; the kubelet's refusal


def test_a_node_selector_places_a_pod_only_in_the_pool_it_selects(fleet: KubeFleet) -> None:
    make(fleet, "a100", node_selector={"nvidia.com/gpu.product": A100})
    make(fleet, "nowhere", node_selector={"nvidia.com/gpu.product": "NVIDIA-B200"})
    affinity = [[{"key": "topology.boltforge.io/rack", "operator": "In", "values": ["r1"]}]]
    make(fleet, "rack1", affinity=affinity)
    wait_until(lambda: node_of(fleet, "a100"), WAIT_S, "the A100 pod to be placed")
    wait_until(lambda: node_of(fleet, "rack1"), WAIT_S, "the rack-1 pod to be placed")
    assert node_of(fleet, "a100").startswith("a") and node_of(fleet, "rack1").startswith("h")
    found = waits_with(fleet, "nowhere", "Unschedulable", "0 of 8 nodes fit")
    assert "nodeSelector nvidia.com/gpu.product=NVIDIA-B200 does not match" in found["message"]


DEDICATED = {"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}


@pytest.mark.parametrize(
    "nodes", [[kwok_node(f"d{i}", rack="r1", taints=[DEDICATED]) for i in range(2)]]
)
def test_a_dedicated_taint_keeps_off_only_the_pods_that_do_not_tolerate_it(
    fleet: KubeFleet,
) -> None:
    tolerates = [{"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}]
    make(fleet, "tolerant", tolerations=tolerates)
    make(fleet, "intolerant")
    wait_until(lambda: node_of(fleet, "tolerant"), WAIT_S, "the tolerant pod to be placed")
    waits_with(fleet, "intolerant", "Unschedulable", "taint dedicated=gpu:NoSchedule")
    assert {n.state for n in fleet.api.nodes().nodes} == {"ready"}


def test_a_pod_its_kubelet_refuses_is_requeued_not_failed(fleet: KubeFleet) -> None:
    make(fleet, "solo")
    wait_until(lambda: node_of(fleet, "solo"), WAIT_S, "the pod to be placed")
    job = pod_of(fleet, "solo")["metadata"]["annotations"]["boltforge.io/job"]
    refusal = {
        "status": {
            "phase": "Failed",
            "reason": "OutOfnvidia.com/gpu",
            "message": "Pod was rejected: Node didn't have enough resource: nvidia.com/gpu",
        }
    }
    fleet.core.patch_namespaced_pod_status("solo", fleet.namespace, refusal)
    wait_until(
        lambda: fleet.api.job(job).state in ("requeued", "pending", "scheduled"),
        WAIT_S,
        "the job to be requeued",
    )
    assert fleet.api.job(job).state != "failed"
    events = [e["reason"] for e in fleet.events("solo")]
    assert "KubeletRefused" in events


# 4. a Job's workers made again


def test_a_job_whose_worker_failed_is_placed_again_as_a_new_attempt(fleet: KubeFleet) -> None:
    ns = fleet.namespace
    fleet.create(pod_group_json("train", 2, ns))
    template = pod_json("x", group="train", namespace=ns)
    template["spec"]["restartPolicy"] = "Never"
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "train", "namespace": ns},
        "spec": {
            "parallelism": 2,
            "completions": 2,
            "backoffLimit": 4,
            "template": {
                "metadata": {"labels": template["metadata"]["labels"]},
                "spec": template["spec"],
            },
        },
    }
    client.BatchV1Api(fleet.kube_api).create_namespaced_job(ns, job)

    def workers() -> dict[str, dict[str, Any]]:
        return {n: p for n, p in fleet.pods().items() if n.startswith("train-")}

    def running() -> list[str]:
        ws = workers()
        names = [n for n, p in ws.items() if (p.get("status") or {}).get("phase") == "Running"]
        return names if len(names) == 2 else []

    first = wait_until(running, WAIT_S, "the Job's two workers to run")
    attempt = pod_of(fleet, first[0])["metadata"]["annotations"]["boltforge.io/job"]
    fleet.kube.end_pod(first[0], ns, exit_code=1)

    def new_workers() -> list[str]:
        now = running()
        return now if now and not set(now) & set(first) else []

    again = wait_until(new_workers, WAIT_S * 2, "the Job's new workers to run")
    jobs = {pod_of(fleet, n)["metadata"]["annotations"]["boltforge.io/job"] for n in again}
    (second,) = jobs
    assert second != attempt  # a new attempt: a new Boltforge job
    assert fleet.api.job(attempt).state == "failed"


# 5. budgets the disruption controller keeps


@pytest.mark.parametrize("nodes", [[kwok_node(f"h{i}", rack="r1") for i in range(4)]])
def test_a_gang_under_two_budgets_is_not_evicted_and_the_urgent_gang_waits(
    fleet: KubeFleet,
) -> None:
    ns = fleet.namespace
    before = fleet.requests()[("create", "pods/eviction")]
    for name in ("keep-a", "keep-b"):
        fleet.create(pdb_json(name, {"app": "kept"}, min_available=0, namespace=ns))
    fleet.create(pod_group_json("kept", 4, ns))
    for i in range(4):
        make(fleet, f"kept-{i}", group="kept", labels={"app": "kept"}, priority_class="low")
    wait_until(lambda: all(node_of(fleet, f"kept-{i}") for i in range(4)), WAIT_S, "kept")
    fleet.create(pod_group_json("urgent", 2, ns))
    for i in range(2):
        make(fleet, f"urgent-{i}", group="urgent", priority_class="high")
    waits_with(fleet, "urgent-0", "SchedulerQueued")
    assert "is under 2 PodDisruptionBudgets" in fleet.log()
    assert fleet.requests()[("create", "pods/eviction")] == before
    assert not node_of(fleet, "urgent-0")


@pytest.mark.parametrize("nodes", [[kwok_node("h0", rack="r1")]])
def test_a_budget_the_disruption_controller_says_allows_nothing_is_not_evicted_against(
    fleet: KubeFleet,
) -> None:
    ns = fleet.namespace
    make(fleet, "low-0", labels={"app": "low"}, priority_class="low")
    wait_until(lambda: node_of(fleet, "low-0"), WAIT_S, "the low pod to be placed")
    fleet.create(pdb_json("hold", {"app": "low"}, min_available=1, namespace=ns))  # too late
    policy = client.PolicyV1Api(fleet.kube_api)

    def status() -> dict[str, Any] | None:
        raw = policy.read_namespaced_pod_disruption_budget("hold", ns, _preload_content=False)
        got: dict[str, Any] = json.loads(raw.data).get("status") or {}
        return got if got.get("currentHealthy") == 1 else None

    written = wait_until(status, WAIT_S, "the disruption controller's status")
    assert written["disruptionsAllowed"] == 0
    before = fleet.requests()[("create", "pods/eviction")]
    make(fleet, "urgent-0", priority_class="high")
    blocked = wait_until(
        lambda: [e for e in fleet.events("low-0") if e["reason"] == "EvictionBlocked"],
        WAIT_S,
        "the victim to say its eviction is blocked",
    )
    assert "PodDisruptionBudget " + ns + "/hold allows 0 disruptions now" in blocked[0]["message"]
    waits_with(fleet, "urgent-0", "EvictionBlocked", f"PodDisruptionBudget {ns}/hold")
    assert fleet.requests()[("create", "pods/eviction")] == before  # never asked, so no 429s
    assert node_of(fleet, "low-0") == "h0" and not node_of(fleet, "urgent-0")


# 6 and 7. SIGTERM and the Lease


def test_sigterm_hands_the_lease_to_the_standby_which_adopts_the_bound_pods(
    fleet: KubeFleet,
) -> None:
    make(fleet, "solo")
    wait_until(lambda: node_of(fleet, "solo"), WAIT_S, "the pod to be placed")
    fleet.start_scheduler("sched-b")
    coord = client.CoordinationV1Api(fleet.kube_api)

    def holder() -> str:
        lease = coord.read_namespaced_lease(LEASE, SCHEDULER_SA[0])
        return str(lease.spec.holder_identity or "")

    assert holder() == "sched-a"
    fleet.schedulers["sched-a"].signal(signal.SIGTERM)
    assert fleet.schedulers["sched-a"].popen.wait(30) == 0
    wait_until(lambda: holder() == "sched-b", WAIT_S, "the standby to lead")
    assert "SIGTERM: stopping" in fleet.log("sched-a")
    wait_until(lambda: "adopted 1 bound pods" in fleet.log("sched-b"), WAIT_S, "the adoption")
    transitions = coord.read_namespaced_lease(LEASE, SCHEDULER_SA[0]).spec.lease_transitions
    assert transitions >= 1


# 8. the manifests on a stock cluster


def test_the_priority_class_and_the_crd_are_accepted_by_the_api_server(
    real_kube_session: RealKube,
) -> None:
    out = real_kube_session.apply(MANIFESTS / "priorityclass.yaml", MANIFESTS / "podgroup-crd.yaml")
    assert "priorityclass.scheduling.k8s.io/boltforge-critical" in out
    pc = client.SchedulingV1Api(real_kube_session.api).read_priority_class("boltforge-critical")
    assert pc.value == 1_000_000_000

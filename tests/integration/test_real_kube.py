"""The real Kubernetes control plane the Kubernetes tests run against
(``boltforge.testing.realkube``): the API server is the pinned release, kwok's nodes are Ready
with GPUs, pods bound to them run and end as a test says, and the scheduler's RBAC manifests
apply and grant what they say, and no more."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import kubernetes.client as client
import pytest

from boltforge.kube.connect import api_client
from boltforge.testing.processes import wait_until
from boltforge.testing.realkube import TESTENV, RealKube, kwok_node


def pinned() -> str:
    for line in (TESTENV / "versions.env").read_text().splitlines():
        if line.startswith("KUBE_VERSION="):
            return line.split("=", 1)[1].strip()
    raise AssertionError("versions.env pins no KUBE_VERSION")


@pytest.fixture(scope="module")
def kube(real_kube_session: RealKube) -> Iterator[RealKube]:
    nodes = [kwok_node(f"smoke-{i}", rack=f"r{i // 2}") for i in range(4)]
    real_kube_session.add_nodes(nodes)
    real_kube_session.namespace("smoke")
    yield real_kube_session
    real_kube_session.delete_namespace("smoke", wait=False)
    for n in nodes:
        real_kube_session.core.delete_node(n["metadata"]["name"])


def test_the_api_server_is_the_pinned_release(kube: RealKube) -> None:
    version = kube.version()
    assert version["gitVersion"] == pinned()
    assert version["gitTreeState"] == "clean"
    assert kube.alive() == list(kube.procs)  # every component still running


def test_kwok_nodes_are_ready_with_gpus_and_labels(kube: RealKube) -> None:
    nodes = {n.metadata.name: n for n in kube.core.list_node().items}
    for name in (f"smoke-{i}" for i in range(4)):
        node = nodes[name]
        ready = {c.type: c.status for c in node.status.conditions}
        assert ready["Ready"] == "True"
        assert node.status.allocatable["nvidia.com/gpu"] == "8"
        assert node.metadata.labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    assert nodes["smoke-3"].metadata.labels["topology.boltforge.io/rack"] == "r1"


def test_pods_the_default_scheduler_binds_run_and_end_as_told(kube: RealKube) -> None:
    for name in ("ok", "bad"):
        pod = {
            "metadata": {"name": name, "namespace": "smoke"},
            "spec": {
                "restartPolicy": "Never",
                "containers": [
                    {
                        "name": "main",
                        "image": "busybox",
                        "resources": {"limits": {"nvidia.com/gpu": "8"}},
                    }
                ],
            },
        }
        kube.core.create_namespaced_pod("smoke", pod)

    def phase(name: str) -> str:
        got: str = kube.core.read_namespaced_pod(name, "smoke").status.phase
        return got

    def running() -> bool:
        return phase("ok") == phase("bad") == "Running"

    wait_until(running, 60, "the pods to run")
    where = {kube.core.read_namespaced_pod(n, "smoke").spec.node_name for n in ("ok", "bad")}
    assert len(where) == 2 and all(n.startswith("smoke-") for n in where)  # 8 GPUs each
    kube.end_pod("ok", "smoke", exit_code=0)
    kube.end_pod("bad", "smoke", exit_code=3)
    wait_until(lambda: phase("ok") == "Succeeded", 60, "the pod to succeed")
    wait_until(lambda: phase("bad") == "Failed", 60, "the pod to fail")
    for name, code in (("ok", 0), ("bad", 3)):
        status = kube.core.read_namespaced_pod(name, "smoke").status
        assert status.container_statuses[0].state.terminated.exit_code == code


def test_the_scheduler_token_has_the_manifests_rights_and_no_more(
    kube: RealKube, tmp_path: Path
) -> None:
    conf = kube.scheduler_kubeconfig(tmp_path / "scheduler.kubeconfig")
    api = api_client(str(conf))
    core = client.CoreV1Api(api)
    names = {n.metadata.name for n in core.list_node().items}
    assert {f"smoke-{i}" for i in range(4)} <= names
    core.list_pod_for_all_namespaces(limit=1)
    client.PolicyV1Api(api).list_pod_disruption_budget_for_all_namespaces(limit=1)
    with pytest.raises(client.ApiException) as refused:
        core.delete_node("smoke-0")
    assert refused.value.status == 403
    with pytest.raises(client.ApiException) as refused:
        core.create_namespaced_pod("smoke", {"metadata": {"name": "x"}, "spec": {}})
    assert refused.value.status == 403
    with pytest.raises(client.ApiException) as refused:
        core.list_namespaced_secret("boltforge-system")
    assert refused.value.status == 403
    review = {  # the manifest grants evictions: the pods/eviction subresource
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SelfSubjectAccessReview",
        "spec": {
            "resourceAttributes": {"verb": "create", "resource": "pods", "subresource": "eviction"}
        },
    }
    answer = client.AuthorizationV1Api(api).create_self_subject_access_review(review)
    assert answer.status.allowed
    who = client.AuthenticationV1Api(api).create_self_subject_review({})
    assert who.status.user_info.username == (
        "system:serviceaccount:boltforge-system:boltforge-scheduler"
    )

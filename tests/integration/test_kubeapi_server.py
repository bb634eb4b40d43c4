"""The test suite's fake kube-apiserver (``boltforge.testing.kubeapi``), driven the way the
Kubernetes scheduler and the tests drive it: through the real ``kubernetes`` Python client
and through kubectl.

kubectl tests run every kubectl found: ``kubectl`` on PATH and ``BOLT_KUBECTL`` (another
binary, e.g. an older release); they skip where there is none, unless
``BOLT_REQUIRE_KUBECTL=1``, which makes a missing kubectl a failure. kubectl is given only
``--kubeconfig`` and ``--cache-dir`` (its discovery cache, kept in the test's directory):
no ``--validate=false`` is needed."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import kubernetes.client as client
import kubernetes.config as config
import kubernetes.watch as watch
import pytest
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import ProtocolError

from boltforge.testing.kubeapi import ApiServer

NS = "research"


def eventually(check: Callable[[], Any], timeout: float = 5.0) -> Any:
    """Poll ``check`` until it returns something truthy, which is returned."""
    deadline = time.monotonic() + timeout
    while not (got := check()):
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)
    return got


@pytest.fixture
def kube() -> Iterator[ApiServer]:
    with ApiServer(bookmark_interval_s=0.2) as server:
        yield server


@pytest.fixture
def kubeconfig(kube: ApiServer, tmp_path: Path) -> Path:
    return kube.kubeconfig(tmp_path / "kubeconfig")


@pytest.fixture
def api(kubeconfig: Path) -> client.ApiClient:
    conf = client.Configuration()
    config.load_kube_config(config_file=str(kubeconfig), client_configuration=conf)
    return client.ApiClient(conf)


@pytest.fixture
def core(api: client.ApiClient) -> client.CoreV1Api:
    return client.CoreV1Api(api)


def node(name: str, **labels: str) -> dict[str, Any]:
    ready = [{"type": "Ready", "status": "True"}]
    status = {"capacity": {"nvidia.com/gpu": "8"}, "conditions": ready}
    return {"metadata": {"name": name, "labels": labels}, "status": status}


def pod(name: str, node_name: str | None = None, **labels: str) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "schedulerName": "boltforge",
        "containers": [{"name": "main", "image": "train:1"}],
    }
    if node_name:
        spec["nodeName"] = node_name
    return {"metadata": {"name": name, "labels": labels}, "spec": spec}


def binding(pod_name: str, node_name: str) -> dict[str, Any]:
    target = {"apiVersion": "v1", "kind": "Node", "name": node_name}
    return {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": pod_name}, "target": target}


def bind(core: client.CoreV1Api, pod_name: str, node_name: str) -> None:
    """A binding as a scheduler posts it (the answer is a Status, which the client cannot
    read as a V1Binding: hence ``_preload_content=False``, as against kube-apiserver)."""
    core.create_namespaced_binding(NS, binding(pod_name, node_name), _preload_content=False)


def status_of(e: ApiException) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(e.body)
    assert (body["kind"], body["apiVersion"], body["status"]) == ("Status", "v1", "Failure")
    assert body["code"] == e.status
    return body


def raw(response: Any) -> dict[str, Any]:
    found: dict[str, Any] = json.loads(response.data)
    return found


def phase(core: client.CoreV1Api, name: str) -> str | None:
    try:
        return str(core.read_namespaced_pod(name, NS).status.phase)
    except ApiException as e:
        assert e.status == 404
        return None


def running_pods(core: client.CoreV1Api, names: list[str], node_name: str = "n1") -> None:
    core.create_node(node(node_name))
    for name in names:
        core.create_namespaced_pod(NS, pod(name, app="web"))
        bind(core, name, node_name)
    eventually(lambda: all(phase(core, n) == "Running" for n in names))


def test_objects_get_kube_apiserver_metadata_and_errors_are_status_objects(
    core: client.CoreV1Api,
) -> None:
    created = raw(core.create_namespaced_pod(NS, pod("a"), _preload_content=False))
    md = created["metadata"]
    assert (created["kind"], created["apiVersion"], md["namespace"]) == ("Pod", "v1", NS)
    assert md["uid"] and md["creationTimestamp"].endswith("Z")
    assert isinstance(md["resourceVersion"], str)
    assert created["status"] == {"phase": "Pending", "qosClass": "BestEffort"}
    generated = core.create_namespaced_pod(
        NS, {"metadata": {"generateName": "w-"}, "spec": pod("x")["spec"]}
    )
    assert generated.metadata.name.startswith("w-") and len(generated.metadata.name) == 7
    second = core.create_namespaced_pod(NS, pod("b"))
    assert int(second.metadata.resource_version) > int(md["resourceVersion"])
    listed = raw(core.list_namespaced_pod(NS, _preload_content=False))
    assert (listed["kind"], listed["apiVersion"]) == ("PodList", "v1")
    assert {i["kind"] for i in listed["items"]} == {"Pod"}
    assert int(listed["metadata"]["resourceVersion"]) >= int(second.metadata.resource_version)
    with pytest.raises(ApiException) as exists:
        core.create_namespaced_pod(NS, pod("a"))
    assert (exists.value.status, status_of(exists.value)["reason"]) == (409, "AlreadyExists")
    with pytest.raises(ApiException) as missing:
        core.read_namespaced_pod("nope", NS)
    assert status_of(missing.value)["message"] == 'pods "nope" not found'
    names = {n.metadata.name for n in core.list_namespace().items}
    assert {"default", NS} <= names


def test_nodes_are_cluster_scoped_and_selectors_filter_lists(core: client.CoreV1Api) -> None:
    for name, rack in (("n1", "r1"), ("n2", "r1"), ("n3", "r2")):
        core.create_node(node(name, rack=rack, **({"gpu": "h100"} if name != "n3" else {})))
    assert core.read_node("n1").metadata.namespace is None

    def nodes(**kw: str) -> list[str]:
        return sorted(n.metadata.name for n in core.list_node(**kw).items)

    assert nodes(label_selector="rack=r1") == ["n1", "n2"]
    assert nodes(label_selector="rack==r1,gpu") == ["n1", "n2"]
    assert nodes(label_selector="rack!=r1") == ["n3"]
    assert nodes(label_selector="rack in (r2, r9)") == ["n3"]
    assert nodes(label_selector="rack notin (r2)") == ["n1", "n2"]
    assert nodes(label_selector="!gpu") == ["n3"]
    assert nodes(field_selector="metadata.name!=n2") == ["n1", "n3"]
    w = watch.Watch()
    seen = []
    for event in w.stream(core.list_node, label_selector="rack=r1", timeout_seconds=5):
        seen.append((event["type"], event["object"].metadata.name))
        if len(seen) == 2:
            w.stop()
    assert seen == [("ADDED", "n1"), ("ADDED", "n2")]
    core.create_namespaced_pod(NS, pod("bound", node_name="n1"))
    core.create_namespaced_pod(NS, pod("unbound"))

    def pods(**kw: str) -> list[str]:
        return sorted(p.metadata.name for p in core.list_namespaced_pod(NS, **kw).items)

    assert pods(field_selector="spec.nodeName=") == ["unbound"]
    assert pods(field_selector="spec.nodeName=n1,spec.schedulerName=boltforge") == ["bound"]
    with pytest.raises(ApiException) as bad:
        core.list_namespaced_pod(NS, field_selector="spec.bogus=1")
    assert status_of(bad.value)["message"] == "field label not supported: spec.bogus"


def test_a_binding_places_the_pod_and_a_second_one_is_a_conflict(
    kube: ApiServer, core: client.CoreV1Api
) -> None:
    core.create_node(node("n1"))
    core.create_namespaced_pod(NS, pod("p"))
    bind(core, "p", "n1")
    placed = core.read_namespaced_pod("p", NS)
    assert placed.spec.node_name == "n1"
    scheduled = placed.status.conditions[0]
    assert (scheduled.type, scheduled.status) == ("PodScheduled", "True")
    with pytest.raises(ApiException) as again:
        url = f"{kube.url}/api/v1/namespaces/{NS}/pods/p/binding"
        reply = httpx.post(url, json=binding("p", "n2"))
        assert reply.status_code == 409
        core.create_namespaced_binding(NS, binding("p", "n2"), _preload_content=False)
    assert status_of(again.value)["message"] == (
        'Operation cannot be fulfilled on pods/binding "p": pod p is already assigned to node "n1"'
    )
    with pytest.raises(ApiException) as gone:
        bind(core, "ghost", "n1")
    assert gone.value.status == 404
    core.create_namespaced_pod(NS, pod("q"))
    with pytest.raises(ValueError, match="target"):  # the client cannot read the Status answer
        core.create_namespaced_binding(NS, binding("q", "n1"))
    assert core.read_namespaced_pod("q", NS).spec.node_name == "n1"
    assert kube.requests[("create", "bindings")] == 4
    assert kube.requests[("create", "pods/binding")] == 1


def test_the_kubelet_runs_bound_pods_and_removes_deleted_ones_after_their_grace(
    kube: ApiServer, core: client.CoreV1Api
) -> None:
    running_pods(core, ["p"])
    up = core.read_namespaced_pod("p", NS).status
    conditions = {c.type: c.status for c in up.conditions}
    assert conditions == {
        "PodScheduled": "True",
        "Initialized": "True",
        "Ready": "True",
        "ContainersReady": "True",
    }
    assert up.start_time and up.container_statuses[0].state.running
    rv = core.list_namespaced_pod(NS).metadata.resource_version
    core.delete_namespaced_pod("p", NS)
    assert core.read_namespaced_pod("p", NS).metadata.deletion_grace_period_seconds == 30
    eventually(lambda: phase(core, "p") is None, 2)
    seen = [(e["type"], e["object"].status.phase) for e in replay(core, rv)]
    assert seen == [("MODIFIED", "Running"), ("MODIFIED", "Failed"), ("DELETED", "Failed")]
    ended = list(replay(core, rv))[1]["raw_object"]["status"]["containerStatuses"][0]
    assert ended["state"]["terminated"]["exitCode"] == 143
    kube.kubelet = False
    core.create_namespaced_pod(NS, pod("q"))
    bind(core, "q", "n1")
    core.delete_namespaced_pod("q", NS, grace_period_seconds=5)
    time.sleep(0.3)
    stuck = core.read_namespaced_pod("q", NS)
    assert stuck.status.phase == "Pending" and stuck.metadata.deletion_timestamp
    core.delete_namespaced_pod("q", NS, grace_period_seconds=0)
    assert phase(core, "q") is None


def test_the_kubelet_leaves_a_phase_a_test_wrote_alone(core: client.CoreV1Api) -> None:
    running_pods(core, ["done"])
    terminated = {"terminated": {"exitCode": 0, "reason": "Completed"}}
    statuses = [
        {
            "name": "main",
            "ready": False,
            "restartCount": 0,
            "image": "train:1",
            "imageID": "",
            "state": terminated,
        }
    ]
    body = {"status": {"phase": "Succeeded", "containerStatuses": statuses}}
    core.patch_namespaced_pod_status("done", NS, body)
    time.sleep(0.2)
    finished = core.read_namespaced_pod("done", NS).status
    assert finished.phase == "Succeeded"
    assert finished.container_statuses[0].state.terminated.exit_code == 0
    core.delete_namespaced_pod("done", NS)  # a finished pod goes at once
    assert phase(core, "done") is None


def pdb(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {"selector": {"matchLabels": {"app": "web"}}, **spec},
    }


def evict(core: client.CoreV1Api, name: str) -> None:
    body = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name}}
    body["deleteOptions"] = {"gracePeriodSeconds": 1}
    core.create_namespaced_pod_eviction(name, NS, body, _preload_content=False)


def test_an_eviction_that_would_break_a_disruption_budget_is_refused_with_429(
    api: client.ApiClient, core: client.CoreV1Api
) -> None:
    running_pods(core, ["w1", "w2", "w3"])
    policy = client.PolicyV1Api(api)
    policy.create_namespaced_pod_disruption_budget(NS, pdb("strict", minAvailable=3))
    with pytest.raises(ApiException) as refused:
        evict(core, "w1")
    body = status_of(refused.value)
    assert (refused.value.status, body["reason"]) == (429, "TooManyRequests")
    assert body["message"] == "Cannot evict pod as it would violate the pod's disruption budget."
    assert body["details"]["causes"] == [
        {
            "reason": "DisruptionBudget",
            "message": "The disruption budget strict needs 3 healthy pods and has 3 currently",
        }
    ]
    policy.delete_namespaced_pod_disruption_budget("strict", NS)
    policy.create_namespaced_pod_disruption_budget(NS, pdb("loose", maxUnavailable="34%"))
    status = policy.read_namespaced_pod_disruption_budget("loose", NS).status
    assert (status.current_healthy, status.desired_healthy, status.expected_pods) == (3, 1, 3)
    assert status.disruptions_allowed == 2
    evict(core, "w1")
    assert core.read_namespaced_pod("w1", NS).metadata.deletion_timestamp
    evict(core, "w2")
    with pytest.raises(ApiException) as third:  # two of three are going: none more may
        evict(core, "w3")
    assert third.value.status == 429
    eventually(lambda: phase(core, "w1") is None and phase(core, "w2") is None)
    status = policy.read_namespaced_pod_disruption_budget("loose", NS).status
    assert (status.current_healthy, status.expected_pods, status.disruptions_allowed) == (1, 1, 1)
    with pytest.raises(ApiException) as gone:
        evict(core, "w1")
    assert gone.value.status == 404


def test_a_lease_replaced_from_a_stale_version_is_a_conflict(api: client.ApiClient) -> None:
    leases = client.CoordinationV1Api(api)
    spec = {"holderIdentity": "a", "leaseDurationSeconds": 3}
    lease = leases.create_namespaced_lease(
        "kube-system", {"metadata": {"name": "bolt"}, "spec": spec}
    )
    stale = lease.metadata.resource_version
    lease.spec.holder_identity = "b"
    renewed = leases.replace_namespaced_lease("bolt", "kube-system", lease)
    assert renewed.spec.holder_identity == "b" and renewed.metadata.resource_version != stale
    lease.spec.holder_identity = "c"
    with pytest.raises(ApiException) as lost:
        leases.replace_namespaced_lease("bolt", "kube-system", lease)
    assert (lost.value.status, status_of(lost.value)["reason"]) == (409, "Conflict")
    lease.metadata.resource_version = None
    taken = leases.replace_namespaced_lease("bolt", "kube-system", lease)
    assert taken.spec.holder_identity == "c"
    same = leases.replace_namespaced_lease("bolt", "kube-system", taken)
    assert same.metadata.resource_version == taken.metadata.resource_version  # nothing changed


def test_patches_merge_conditions_by_type_and_keep_status_and_spec_apart(
    core: client.CoreV1Api,
) -> None:
    core.create_namespaced_pod(NS, pod("p"))

    def condition(kind: str, value: str) -> dict[str, Any]:
        return {"type": kind, "status": value, "reason": "Test"}

    core.patch_namespaced_pod_status(
        "p", NS, {"status": {"conditions": [condition("PodScheduled", "False")]}}
    )
    core.patch_namespaced_pod_status(
        "p", NS, {"status": {"conditions": [condition("Custom", "True")]}}
    )
    got = core.read_namespaced_pod("p", NS)
    assert [(c.type, c.status) for c in got.status.conditions] == [
        ("PodScheduled", "False"),
        ("Custom", "True"),
    ]
    core.patch_namespaced_pod(
        "p", NS, {"metadata": {"labels": {"x": "1"}}, "status": {"phase": "Failed"}}
    )
    core.patch_namespaced_pod_status("p", NS, {"spec": {"nodeName": "sneaky"}})
    got = core.read_namespaced_pod("p", NS)
    assert (got.metadata.labels, got.status.phase, got.spec.node_name) == (
        {"x": "1"},
        "Pending",
        None,
    )
    core.patch_namespaced_pod("p", NS, [{"op": "add", "path": "/metadata/labels/y", "value": "2"}])
    assert core.read_namespaced_pod("p", NS).metadata.labels == {"x": "1", "y": "2"}
    with pytest.raises(ApiException) as failed:
        core.patch_namespaced_pod(
            "p", NS, [{"op": "test", "path": "/metadata/labels/y", "value": "3"}]
        )
    assert failed.value.status == 422


def test_podgroups_are_a_custom_resource_with_a_status_subresource(api: client.ApiClient) -> None:
    custom = client.CustomObjectsApi(api)
    where = ("scheduling.x-k8s.io", "v1alpha1", NS, "podgroups")
    spec = {"minMember": 4, "minResources": {"nvidia.com/gpu": "32"}, "scheduleTimeoutSeconds": 60}
    body = {
        "apiVersion": "scheduling.x-k8s.io/v1alpha1",
        "kind": "PodGroup",
        "metadata": {"name": "gang"},
    }
    created = custom.create_namespaced_custom_object(
        *where, {**body, "spec": spec, "status": {"phase": "x"}}
    )
    assert "status" not in created and created["metadata"]["generation"] == 1
    custom.patch_namespaced_custom_object_status(*where, "gang", {"status": {"phase": "Scheduled"}})
    custom.patch_namespaced_custom_object(*where, "gang", {"spec": {"minMember": 2}})
    got = custom.get_namespaced_custom_object(*where, "gang")
    assert (got["spec"]["minMember"], got["status"]["phase"], got["metadata"]["generation"]) == (
        2,
        "Scheduled",
        2,
    )
    assert [
        g["metadata"]["name"] for g in custom.list_namespaced_custom_object(*where)["items"]
    ] == ["gang"]
    custom.delete_namespaced_custom_object(*where, "gang")
    assert custom.list_namespaced_custom_object(*where)["items"] == []


def test_pods_get_their_priority_from_their_priority_class(
    api: client.ApiClient, core: client.CoreV1Api
) -> None:
    scheduling = client.SchedulingV1Api(api)
    scheduling.create_priority_class({"metadata": {"name": "high"}, "value": 1000})
    scheduling.create_priority_class(
        {"metadata": {"name": "normal"}, "value": 10, "globalDefault": True}
    )
    high = core.create_namespaced_pod(
        NS, {**pod("a"), "spec": {**pod("a")["spec"], "priorityClassName": "high"}}
    )
    plain = core.create_namespaced_pod(NS, pod("b"))
    assert (high.spec.priority, plain.spec.priority, plain.spec.priority_class_name) == (
        1000,
        10,
        "normal",
    )
    with pytest.raises(ApiException) as refused:
        core.create_namespaced_pod(
            NS, {**pod("c"), "spec": {**pod("c")["spec"], "priorityClassName": "nope"}}
        )
    assert refused.value.status == 403


def replay(core: client.CoreV1Api, rv: str, **kw: Any) -> Iterator[dict[str, Any]]:
    """The changes to pods after ``rv``, as the client's watch yields them."""
    w = watch.Watch()
    for event in w.stream(
        core.list_namespaced_pod, NS, resource_version=rv, timeout_seconds=1, **kw
    ):
        yield event
        if int(event["raw_object"]["metadata"]["resourceVersion"]) >= int(
            core.list_namespaced_pod(NS).metadata.resource_version
        ):
            w.stop()


def test_a_watch_replays_from_a_version_and_selectors_turn_changes_into_adds_and_deletes(
    kube: ApiServer, core: client.CoreV1Api
) -> None:
    kube.kubelet = False
    core.create_node(node("n1"))
    core.create_namespaced_pod(NS, pod("old"))
    rv = core.list_namespaced_pod(NS).metadata.resource_version
    core.create_namespaced_pod(NS, pod("p", team="a"))
    core.patch_namespaced_pod("p", NS, {"metadata": {"labels": {"team": "b"}}})
    bind(core, "p", "n1")
    core.delete_namespaced_pod("old", NS)
    everything = [(e["type"], e["object"].metadata.name) for e in replay(core, rv)]
    assert everything == [("ADDED", "p"), ("MODIFIED", "p"), ("MODIFIED", "p"), ("DELETED", "old")]
    unbound = [
        (e["type"], e["object"].metadata.name)
        for e in replay(core, rv, field_selector="spec.nodeName=")
    ]
    assert unbound == [("ADDED", "p"), ("MODIFIED", "p"), ("DELETED", "p"), ("DELETED", "old")]
    team_b = [e["type"] for e in replay(core, rv, label_selector="team=b")]
    assert team_b == ["ADDED", "MODIFIED"]
    initial = watch.Watch().stream(core.list_namespaced_pod, NS, timeout_seconds=1)
    assert [(e["type"], e["object"].metadata.name) for e in initial] == [("ADDED", "p")]


def test_a_watch_from_a_compacted_version_gets_410_expired(
    kube: ApiServer, core: client.CoreV1Api
) -> None:
    """The client (35.0.0) meets the ERROR event by watching once more from the same version,
    then raises ApiException 410; with ``timeout_seconds`` it raises at once."""
    core.create_namespaced_pod(NS, pod("p"))
    rv = core.list_namespaced_pod(NS).metadata.resource_version
    core.patch_namespaced_pod("p", NS, {"metadata": {"labels": {"a": "1"}}})
    newest = kube.compact()
    for extra in ({}, {"timeout_seconds": 5}):
        with pytest.raises(ApiException) as gone:
            list(watch.Watch().stream(core.list_namespaced_pod, NS, resource_version=rv, **extra))
        assert gone.value.status == 410
        assert gone.value.reason == f"Expired: too old resource version: {rv} ({newest})"
    stream = core.list_namespaced_pod(NS, watch=True, resource_version=rv, _preload_content=False)
    event = json.loads(stream.data)
    assert event["type"] == "ERROR" and event["object"]["code"] == 410
    assert list(replay(core, str(newest))) == []


def follow(core: client.CoreV1Api, into: list[tuple[str, str]], **kw: Any) -> watch.Watch:
    """Watch pods on a thread, noting events in ``into`` (and a broken stream as BROKEN)."""
    w = watch.Watch()

    def run() -> None:
        try:
            for e in w.stream(core.list_namespaced_pod, NS, **kw):
                into.append((e["type"], e["object"].metadata.name))
        except ProtocolError:
            into.append(("BROKEN", ""))

    threading.Thread(target=run, daemon=True).start()
    return w


def test_dropped_watches_break_or_end_and_resume_without_losing_events(
    kube: ApiServer, core: client.CoreV1Api
) -> None:
    assert kube.cluster is not None
    watching = kube.cluster.store.subscribers
    cut: list[tuple[str, str]] = []
    follow(core, cut)
    core.create_namespaced_pod(NS, pod("a"))
    eventually(lambda: cut == [("ADDED", "a")])
    assert kube.drop_watches() == 1  # abrupt: the client's stream breaks
    eventually(lambda: cut == [("ADDED", "a"), ("BROKEN", "")])
    resumed: list[tuple[str, str]] = []
    rv = core.list_namespaced_pod(NS).metadata.resource_version
    again = follow(core, resumed, resource_version=rv)
    eventually(lambda: len(watching()) == 1)
    assert kube.drop_watches(abrupt=False) == 1  # clean: the client watches again by itself
    core.create_namespaced_pod(NS, pod("b"))
    eventually(lambda: resumed == [("ADDED", "b")] and len(watching()) == 1)
    core.create_namespaced_pod(NS, pod("c"))
    eventually(lambda: resumed == [("ADDED", "b"), ("ADDED", "c")])
    assert kube.requests[("watch", "pods")] == 3
    again.stop()
    kube.drop_watches(abrupt=False)


def test_bookmarks_carry_the_newest_version_to_a_watch_that_asks(
    kube: ApiServer, core: client.CoreV1Api
) -> None:
    core.create_namespaced_pod(NS, pod("a"))
    url = (
        f"{kube.url}/api/v1/namespaces/{NS}/pods?watch=1&allowWatchBookmarks=true&timeoutSeconds=1"
    )
    with httpx.stream("GET", url, timeout=5) as reply:
        assert reply.headers["content-type"] == "application/json"
        events = [json.loads(line) for line in reply.iter_lines() if line]
    assert events[0]["type"] == "ADDED"
    marks = [e["object"] for e in events if e["type"] == "BOOKMARK"]
    assert marks and marks[-1] == {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {"resourceVersion": events[0]["object"]["metadata"]["resourceVersion"]},
    }


def test_injected_faults_answer_the_next_matching_requests(
    kube: ApiServer, core: client.CoreV1Api
) -> None:
    core.create_node(node("n1"))
    core.create_namespaced_pod(NS, pod("p"))
    kube.fail_next("create", "bindings", 500, times=2)
    kube.fail_next("*", "nodes", 429)
    for _ in range(2):
        with pytest.raises(ApiException) as failed:
            bind(core, "p", "n1")
        assert (failed.value.status, status_of(failed.value)["reason"]) == (500, "InternalError")
    bind(core, "p", "n1")
    with pytest.raises(ApiException) as busy:
        core.list_node()
    assert (busy.value.status, status_of(busy.value)["reason"]) == (429, "TooManyRequests")
    assert len(core.list_node().items) == 1
    kube.fail_next("get", "nodes", 429, retry_after_s=1)
    assert httpx.get(f"{kube.url}/api/v1/nodes/n1").headers["Retry-After"] == "1"
    assert kube.requests[("create", "bindings")] == 3 and kube.requests[("list", "nodes")] == 2


def test_the_server_runs_as_a_process_with_the_same_knobs(tmp_path: Path) -> None:
    with ApiServer(process=True, kubelet=False) as kube:
        conf = client.Configuration()
        config.load_kube_config(
            config_file=str(kube.kubeconfig(tmp_path / "kc")), client_configuration=conf
        )
        core = client.CoreV1Api(client.ApiClient(conf))
        core.create_node(node("n1"))
        core.create_namespaced_pod(NS, pod("p"))
        bind(core, "p", "n1")
        time.sleep(0.1)
        assert core.read_namespaced_pod("p", NS).status.phase == "Pending"
        kube.kubelet = True
        eventually(lambda: phase(core, "p") == "Running")
        kube.fail_next("get", "pods", 503)
        with pytest.raises(ApiException):
            core.read_namespaced_pod("p", NS)
        assert kube.requests[("create", "bindings")] == 1
        assert kube.compact() > 0 and kube.drop_watches() == 0


def kubectls() -> list[str]:
    """Every kubectl to test with: PATH's and BOLT_KUBECTL's (one each, by real path)."""
    found = [os.environ.get("BOLT_KUBECTL"), shutil.which("kubectl")]
    paths = {os.path.realpath(p): p for p in found if p and os.path.exists(p)}
    return list(paths.values())


KUBECTLS: list[str | None] = [*kubectls()] or [None]


@pytest.fixture(params=KUBECTLS, ids=lambda p: p or "none")
def kubectl(request: pytest.FixtureRequest, kubeconfig: Path, tmp_path: Path) -> Callable[..., str]:
    binary = request.param
    if binary is None:
        if os.environ.get("BOLT_REQUIRE_KUBECTL") == "1":
            raise RuntimeError("kubectl is required. To fix: apt-get install kubernetes-client")
        pytest.skip("no kubectl (apt-get install kubernetes-client)")
    env = {"HOME": str(tmp_path), "PATH": os.environ.get("PATH", "")}

    def run(*args: str) -> str:
        cmd = [
            binary,
            "--kubeconfig",
            str(kubeconfig),
            "--cache-dir",
            str(tmp_path / "cache"),
            *args,
        ]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env)
        assert done.returncode == 0, done.stderr
        return done.stdout

    return run


MANIFEST = """
apiVersion: v1
kind: Node
metadata: {name: gpu-1, labels: {node-role.kubernetes.io/gpu: ""}}
status: {conditions: [{type: Ready, status: "True"}]}
---
apiVersion: v1
kind: Pod
metadata: {name: trainer, namespace: research, labels: {app: web}}
spec: {containers: [{name: main, image: "train:1"}]}
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {name: web, namespace: research}
spec: {minAvailable: 1, selector: {matchLabels: {app: web}}}
---
apiVersion: scheduling.x-k8s.io/v1alpha1
kind: PodGroup
metadata: {name: gang, namespace: research}
spec: {minMember: 2}
"""


def test_kubectl_creates_applies_and_gets_objects(
    kubectl: Callable[..., str], core: client.CoreV1Api, tmp_path: Path
) -> None:
    manifest = tmp_path / "objects.yaml"
    manifest.write_text(MANIFEST)
    out = kubectl("create", "-f", str(manifest))
    assert "pod/trainer created" in out and "podgroup.scheduling.x-k8s.io/gang created" in out
    bind(core, "trainer", "gpu-1")
    eventually(lambda: phase(core, "trainer") == "Running")
    manifest.write_text(MANIFEST.replace("minMember: 2", "minMember: 3"))
    assert "podgroup.scheduling.x-k8s.io/gang configured" in kubectl("apply", "-f", str(manifest))
    assert kubectl("get", "pg", "gang", "-n", NS, "-o", "jsonpath={.spec.minMember}") == "3"
    pods = kubectl("get", "pods", "-n", NS, "-o", "wide").splitlines()
    assert pods[0].split()[:6] == ["NAME", "READY", "STATUS", "RESTARTS", "AGE", "IP"]
    assert pods[1].split()[:3] == ["trainer", "1/1", "Running"] and "gpu-1" in pods[1].split()
    assert kubectl("get", "nodes").splitlines()[1].split()[:3] == ["gpu-1", "Ready", "gpu"]
    assert "web" in kubectl("get", "pdb", "-n", NS)
    assert 'pod "trainer" deleted' in kubectl("delete", "pod", "trainer", "-n", NS)
    assert phase(core, "trainer") is None


def test_kubectl_describe_shows_a_pods_conditions_and_events(
    kubectl: Callable[..., str], core: client.CoreV1Api
) -> None:
    core.create_node(node("n1"))
    created = core.create_namespaced_pod(NS, pod("p"))
    core.patch_namespaced_pod_status(
        "p",
        NS,
        {
            "status": {
                "conditions": [
                    {
                        "type": "PodScheduled",
                        "status": "False",
                        "reason": "Unschedulable",
                        "message": "no room",
                    }
                ]
            }
        },
    )
    involved = {
        "apiVersion": "v1",
        "kind": "Pod",
        "name": "p",
        "namespace": NS,
        "uid": created.metadata.uid,
    }
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    event = {
        "metadata": {"name": "p.1"},
        "involvedObject": involved,
        "reason": "FailedScheduling",
        "message": "no rack has 16 free GPUs",
        "type": "Warning",
        "source": {"component": "boltforge-scheduler"},
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }
    core.create_namespaced_event(NS, event)
    core.create_namespaced_event(
        NS,
        {
            **event,
            "metadata": {"name": "other.1"},
            "involvedObject": {**involved, "name": "other", "uid": "x"},
        },
    )
    described = kubectl("describe", "pod", "p", "-n", NS)
    assert "PodScheduled" in described and "False" in described
    events = described[described.index("Events:") :]
    assert "FailedScheduling" in events and "boltforge-scheduler" in events
    assert "no rack has 16 free GPUs" in events and events.count("FailedScheduling") == 1

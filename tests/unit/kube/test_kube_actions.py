"""The scheduler's writes, through the real client against the test suite's API server:
bindings (and the answers a scheduler expects: already bound, a pod gone or replaced), the
Eviction API (grace, disruption budgets), ``PodScheduled=False`` and Events, each answering
what happened rather than raising."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from typing import Any

import kubernetes.client as client
import pytest
from kube_unit_kit import serve_kube
from kubernetes.client.exceptions import ApiException

from boltforge.kube import model
from boltforge.kube.actions import COMPONENT, KubeWrites
from boltforge.kube.model import JOB, REPLICA, KubePod
from boltforge.testing.kube_builders import pdb_json, pod_json
from boltforge.testing.kubeapi import ApiServer

_names = itertools.count()


@pytest.fixture(scope="module")
def kube(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ApiServer, client.ApiClient]]:
    yield from serve_kube(tmp_path_factory.mktemp("kube"))


@pytest.fixture
def core(kube: tuple[ApiServer, client.ApiClient]) -> client.CoreV1Api:
    return client.CoreV1Api(kube[1])


@pytest.fixture
def writes(kube: tuple[ApiServer, client.ApiClient]) -> KubeWrites:
    return KubeWrites(kube[1], "sched-a")


@pytest.fixture
def ns() -> str:
    """A namespace of the test's own (the server is shared by the module)."""
    return f"act-{next(_names)}"


def read(core: client.CoreV1Api, ns: str, name: str) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(
        core.read_namespaced_pod(name, ns, _preload_content=False).data
    )
    return body


def make(core: client.CoreV1Api, ns: str, name: str, **kw: Any) -> KubePod:
    """A pod created on the server, as the pod informer would parse it."""
    created = core.create_namespaced_pod(ns, pod_json(name, namespace=ns, **kw))
    return model.pod(read(core, ns, created.metadata.name))


def running_on(core: client.CoreV1Api, ns: str, name: str, node: str, **kw: Any) -> KubePod:
    """A pod bound to ``node`` and Running (there is no kubelet here to run it)."""
    make(core, ns, name, **kw)
    binding = {"metadata": {"name": name}, "target": {"kind": "Node", "name": node}}
    core.create_namespaced_binding(ns, binding, _preload_content=False)
    core.patch_namespaced_pod_status(name, ns, {"status": {"phase": "Running"}})
    return model.pod(read(core, ns, name))


def events(core: client.CoreV1Api, ns: str, pod: str) -> list[dict[str, Any]]:
    body = json.loads(core.list_namespaced_event(ns, _preload_content=False).data)
    return [e for e in body["items"] if e["involvedObject"]["name"] == pod]


def condition(core: client.CoreV1Api, ns: str, pod: str) -> dict[str, Any]:
    conditions = read(core, ns, pod).get("status", {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == "PodScheduled"), {})


NOTES = {REPLICA: "j-1.1.0", JOB: "j-1"}


# bindings


def test_a_binding_puts_the_pod_on_its_node_with_the_replicas_annotations(
    core: client.CoreV1Api, writes: KubeWrites, ns: str
) -> None:
    pod = make(core, ns, "w0")
    assert writes.bind(pod, "n1", dict(NOTES)) is None
    now = read(core, ns, "w0")
    assert now["spec"]["nodeName"] == "n1"
    assert {k: now["metadata"]["annotations"][k] for k in NOTES} == NOTES
    assert condition(core, ns, "w0")["status"] == "True"


def test_binding_a_pod_again_to_the_node_it_is_on_is_done(
    core: client.CoreV1Api, writes: KubeWrites, ns: str
) -> None:
    pod = make(core, ns, "w0")
    assert writes.bind(pod, "n1", dict(NOTES)) is None
    assert writes.bind(pod, "n1", dict(NOTES)) is None  # a retry after a lost answer


def test_binding_a_pod_another_scheduler_placed_elsewhere_says_where_it_is(
    core: client.CoreV1Api, writes: KubeWrites, ns: str
) -> None:
    pod = make(core, ns, "w0")
    assert writes.bind(pod, "n2", {}) is None
    why = writes.bind(pod, "n1", dict(NOTES)) or ""
    assert why.startswith("409: ") and 'already assigned to node "n2"' in why
    assert read(core, ns, "w0")["spec"]["nodeName"] == "n2"


def test_binding_a_pod_that_was_replaced_under_the_same_name_is_refused(
    core: client.CoreV1Api, writes: KubeWrites, ns: str
) -> None:
    old = make(core, ns, "w0")
    core.delete_namespaced_pod("w0", ns)
    make(core, ns, "w0")
    why = writes.bind(old, "n1", {}) or ""
    assert why.startswith("409: ") and "UID mismatch" in why
    assert not read(core, ns, "w0")["spec"].get("nodeName")


def test_binding_a_pod_that_is_gone_says_so(
    core: client.CoreV1Api, writes: KubeWrites, ns: str
) -> None:
    pod = make(core, ns, "w0")
    core.delete_namespaced_pod("w0", ns)
    assert (writes.bind(pod, "n1", {}) or "").startswith("404: ")


def test_a_binding_the_server_fails_returns_the_servers_words(
    kube: tuple[ApiServer, client.ApiClient], core: client.CoreV1Api, writes: KubeWrites, ns: str
) -> None:
    pod = make(core, ns, "w0")
    kube[0].fail_next("create", "bindings", 500)
    assert writes.bind(pod, "n1", {}) == "500: injected fault: create bindings answered 500"
    assert not read(core, ns, "w0")["spec"].get("nodeName")


def test_a_conflict_it_cannot_check_is_reported_as_the_conflict(
    kube: tuple[ApiServer, client.ApiClient], core: client.CoreV1Api, writes: KubeWrites, ns: str
) -> None:
    pod = make(core, ns, "w0")
    assert writes.bind(pod, "n1", {}) is None
    kube[0].fail_next("get", "pods", 500)
    assert (writes.bind(pod, "n1", {}) or "").startswith("409: ")


@pytest.mark.parametrize(
    ("body", "said"),
    [
        ("<html>bad gateway</html>", "502: Bad Gateway"),
        ("", "502: Bad Gateway"),
        (json.dumps({"message": "no"}), "502: no"),
        (
            json.dumps(
                {"message": "no", "details": {"causes": [{"message": "a"}, {}, {"message": "b"}]}}
            ),
            "502: no; a; b",
        ),
    ],
    ids=["html", "empty", "message", "causes"],
)
def test_a_refusal_says_the_servers_message_and_its_causes(
    writes: KubeWrites, body: str, said: str
) -> None:
    class Refusing:
        def create_namespaced_binding(self, *args: Any, **kw: Any) -> None:
            e = ApiException(status=502, reason="Bad Gateway")
            e.body = body
            raise e

    writes.core = Refusing()
    pod = model.pod(pod_json("w0"))
    assert writes.bind(pod, "n1", {}) == said


# evictions


def test_an_eviction_deletes_the_pod_with_the_grace_asked(
    core: client.CoreV1Api, writes: KubeWrites, ns: str
) -> None:
    pod = running_on(core, ns, "w0", "n1")
    assert writes.evict(pod, 7.4) is None
    meta = read(core, ns, "w0")["metadata"]
    assert meta["deletionTimestamp"] and meta["deletionGracePeriodSeconds"] == 7


def test_an_eviction_without_a_grace_gives_the_pods_own(
    core: client.CoreV1Api, writes: KubeWrites, ns: str
) -> None:
    pod = running_on(core, ns, "w0", "n1", grace_s=45)
    assert writes.evict(pod, None) is None
    assert read(core, ns, "w0")["metadata"]["deletionGracePeriodSeconds"] == 45


def test_an_eviction_with_a_negative_grace_removes_the_pod_at_once(
    core: client.CoreV1Api, writes: KubeWrites, ns: str
) -> None:
    pod = running_on(core, ns, "w0", "n1")
    assert writes.evict(pod, -3) is None
    with pytest.raises(ApiException) as gone:
        read(core, ns, "w0")
    assert gone.value.status == 404


def test_evicting_a_pod_that_is_gone_is_done(
    core: client.CoreV1Api, writes: KubeWrites, ns: str
) -> None:
    pod = make(core, ns, "w0")
    core.delete_namespaced_pod("w0", ns)
    assert writes.evict(pod, 5) is None


def test_an_eviction_a_disruption_budget_refuses_says_which_budget_and_why(
    core: client.CoreV1Api, writes: KubeWrites, ns: str
) -> None:
    pod = running_on(core, ns, "w0", "n1", labels={"app": "serve"})
    policy = client.PolicyV1Api(core.api_client)
    policy.create_namespaced_pod_disruption_budget(
        ns, pdb_json("keep", {"app": "serve"}, min_available=1, namespace=ns)
    )
    why = writes.evict(pod, 5) or ""
    assert why.startswith("429: Cannot evict pod as it would violate the pod's disruption budget.")
    assert "; The disruption budget keep needs 1 healthy pods and has 1 currently" in why
    assert not read(core, ns, "w0")["metadata"].get("deletionTimestamp")


# what the pods are told


def test_unschedulable_writes_pod_scheduled_false_with_the_reason(
    core: client.CoreV1Api, writes: KubeWrites, ns: str
) -> None:
    pod = make(core, ns, "w0")
    writes.unschedulable(pod, "GangIncomplete", "boltforge: waiting for its gang")
    c = condition(core, ns, "w0")
    assert (c["status"], c["reason"], c["message"]) == (
        "False",
        "GangIncomplete",
        "boltforge: waiting for its gang",
    )
    assert c["lastTransitionTime"].endswith("Z")


def test_unschedulable_on_a_pod_that_is_gone_is_quiet_but_other_errors_raise(
    kube: tuple[ApiServer, client.ApiClient], core: client.CoreV1Api, writes: KubeWrites, ns: str
) -> None:
    pod = make(core, ns, "w0")
    core.delete_namespaced_pod("w0", ns)
    writes.unschedulable(pod, "Unschedulable", "x")
    other = make(core, ns, "w1")
    kube[0].fail_next("patch", "pods/status", 500)
    with pytest.raises(ApiException) as failed:
        writes.unschedulable(other, "Unschedulable", "x")
    assert failed.value.status == 500


def test_an_event_names_the_pod_the_scheduler_and_its_instance(
    core: client.CoreV1Api, writes: KubeWrites, ns: str
) -> None:
    pod = make(core, ns, "w0")
    writes.event(pod, "FailedScheduling", "boltforge: waiting (#2 in line)", "Warning")
    (e,) = events(core, ns, "w0")
    assert (e["reason"], e["message"], e["type"], e["count"]) == (
        "FailedScheduling",
        "boltforge: waiting (#2 in line)",
        "Warning",
        1,
    )
    assert e["involvedObject"]["uid"] == pod.uid and e["involvedObject"]["kind"] == "Pod"
    assert e["source"] == {"component": COMPONENT}
    assert (e["reportingComponent"], e["reportingInstance"]) == (COMPONENT, "sched-a")
    assert e["metadata"]["name"].startswith("w0.")


def test_events_are_normal_by_default_never_collide_and_are_cut_at_1024_characters(
    core: client.CoreV1Api, writes: KubeWrites, ns: str
) -> None:
    pod = make(core, ns, "w0")
    writes.event(pod, "Scheduled", "x" * 5000)
    writes.event(pod, "Scheduled", "again")
    said = events(core, ns, "w0")
    assert len({e["metadata"]["name"] for e in said}) == 2
    assert {e["type"] for e in said} == {"Normal"}
    assert sorted(len(e["message"]) for e in said) == [5, 1024]


def connections(api: client.ApiClient) -> int:
    """How many connections the client's pools have opened to the API server so far."""
    pools = api.rest_client.pool_manager.pools  # iterable only through ``keys()``
    return sum(pools[key].num_connections for key in pools.keys())  # noqa: SIM118


def test_writes_reuse_their_connections(
    kube: tuple[ApiServer, client.ApiClient], core: client.CoreV1Api, ns: str
) -> None:
    """Each write reads its answer to the end, so the pool hands the connection to the next
    write instead of opening one per call (against a real cluster, a TLS handshake each)."""
    api = kube[1]
    writes = KubeWrites(api, "sched-a")
    pods = [make(core, ns, f"p{i}") for i in range(5)]
    opened = connections(api)
    for pod in pods:
        assert writes.bind(pod, "n1", {}) is None
        writes.event(pod, "Scheduled", "placed")
        writes.unschedulable(pod, "Unschedulable", "waiting")
        assert writes.evict(pod, 0) is None
    assert connections(api) - opened <= 1

"""Reading the Kubernetes API's JSON: quantities, Nodes, Pods, PodGroups, PriorityClasses,
PodDisruptionBudgets and label selectors, including the fields a manifest may leave out."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kube_unit_kit import kpod, raw_pod

from boltforge.kube import model
from boltforge.kube.model import Budget, quantity, selects
from boltforge.testing.kube_builders import node_json, pdb_json


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1e3", 1000.0),
        ("2.5E-1", 0.25),
        ("100Mi", 100 * 2**20),
        ("1.5Gi", 1.5 * 2**30),
        ("2Ti", 2 * 2**40),
        ("3M", 3e6),
        ("4T", 4e12),
        (" 4 ", 4.0),
        (8, 8.0),
        ("", 0.0),
        ("5Xi", 0.0),
        ("-1", 0.0),
        ("Gi", 0.0),
    ],
    ids=lambda v: repr(v),
)
def test_a_quantity_reads_every_suffix_and_anything_else_as_zero(
    text: object, value: float
) -> None:
    assert quantity(text) == pytest.approx(value)


SUFFIXES = {"": 1, "k": 1e3, "M": 1e6, "G": 1e9, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30}


@settings(max_examples=80, deadline=None)
@given(st.integers(min_value=0, max_value=10**6), st.sampled_from(sorted(SUFFIXES)))
def test_a_whole_quantity_is_its_number_times_its_suffix(n: int, suffix: str) -> None:
    assert quantity(f"{n}{suffix}") == pytest.approx(n * SUFFIXES[suffix])


# nodes


def test_a_node_without_allocatable_falls_back_to_its_capacity() -> None:
    obj = node_json("n1", gpus=4)
    del obj["status"]["allocatable"]
    obj["status"]["capacity"] = {"nvidia.com/gpu": "2", "cpu": "8", "memory": "64Gi"}
    n = model.node(obj)
    assert (n.gpus, n.cpus, n.memory_gb) == (2, 8, 64.0)


def test_a_bare_node_gets_one_cpu_a_gigabyte_and_its_name_as_address() -> None:
    n = model.node({"metadata": {"name": "bare"}})
    assert (n.name, n.gpus, n.cpus, n.memory_gb, n.address) == ("bare", 0, 1, 1.0, "bare")
    assert not n.ready and not n.unschedulable and n.taints == ()
    assert n.product == "" and n.gpu_memory_gb == 0


def test_a_node_with_millicpus_and_little_memory_keeps_the_floors() -> None:
    obj = node_json("small")
    obj["status"]["allocatable"] = {"cpu": "500m", "memory": "10Mi"}
    n = model.node(obj)
    assert (n.cpus, n.memory_gb) == (1, 0.1)


@pytest.mark.parametrize(
    ("addresses", "address"),
    [
        (
            [{"type": "Hostname", "address": "h1"}, {"type": "InternalIP", "address": "10.1"}],
            "10.1",
        ),
        ([{"type": "Hostname", "address": "h1"}], "h1"),
        ([{"type": "ExternalIP", "address": "1.2.3.4"}], "n1"),
    ],
    ids=["internal-ip-first", "hostname", "neither"],
)
def test_a_nodes_address_is_its_internal_ip_else_hostname_else_name(
    addresses: list[dict[str, str]], address: str
) -> None:
    obj = node_json("n1")
    obj["status"]["addresses"] = addresses
    assert model.node(obj).address == address


@pytest.mark.parametrize("status", ["False", "Unknown", None], ids=str)
def test_a_node_is_ready_only_when_its_ready_condition_is_true(status: str | None) -> None:
    obj = node_json("n1")
    obj["status"]["conditions"] = [] if status is None else [{"type": "Ready", "status": status}]
    assert not model.node(obj).ready
    obj["status"]["conditions"] = [
        {"type": "MemoryPressure", "status": "False"},
        {"type": "Ready", "status": "True"},
    ]
    assert model.node(obj).ready


def test_a_nodes_gpu_product_memory_and_taints_come_from_its_labels_and_spec() -> None:
    obj = node_json("n1", taints=[{"key": "maint", "effect": "NoExecute"}], unschedulable=True)
    n = model.node(obj)
    assert n.product == "NVIDIA-H100-80GB-HBM3"
    assert n.gpu_memory_gb == pytest.approx(79.6)
    assert n.taints == (model.Taint("maint", "NoExecute"),) and n.unschedulable


# pods


def test_a_pods_gpus_come_from_limits_and_its_cpus_and_memory_from_requests() -> None:
    obj = raw_pod("p", gpus=0)
    obj["spec"]["containers"] = [
        {
            "name": "a",
            "resources": {
                "limits": {"nvidia.com/gpu": "4", "cpu": "8", "memory": "32Gi"},
                "requests": {"nvidia.com/gpu": "1", "cpu": "2", "memory": "16Gi"},
            },
        },
        {"name": "b", "resources": {"requests": {"nvidia.com/gpu": "2", "cpu": "500m"}}},
        {"name": "c", "resources": {"limits": {"cpu": "1", "memory": "512Mi"}}},
        {"name": "d"},
    ]
    p = model.pod(obj)
    assert p.gpus == 6  # 4 by the limit, 2 by a request where no limit is given
    assert p.cpus == 3.5  # requests first, a limit where no request is given
    assert p.memory_gb == 16.5


def test_a_minimal_pod_is_pending_in_default_for_the_default_scheduler() -> None:
    p = model.pod({"metadata": {"name": "p"}})
    assert (p.namespace, p.scheduler, p.phase, p.node) == (
        "default",
        "default-scheduler",
        "Pending",
        "",
    )
    assert (p.gpus, p.cpus, p.memory_gb) == (0, 0, 0)
    assert p.grace_s is None and p.exit_code is None and p.pod_group is None
    assert not p.bound and not p.finished and not p.deleting
    assert p.priority_class == "" and p.key == ("default", "p")


@pytest.mark.parametrize(
    ("codes", "worst"),
    [((), None), ((0,), 0), ((0, 3), 3), ((1, 137), 137), ((2, -9), -9), ((0, -1, 1), -1)],
    ids=str,
)
def test_a_pods_exit_code_is_the_worst_of_its_ended_containers(
    codes: tuple[int, ...], worst: int | None
) -> None:
    assert kpod("p", exit_codes=codes).exit_code == worst


def test_a_container_still_running_has_no_exit_code() -> None:
    obj = raw_pod("p", exit_codes=(4,))
    obj["status"]["containerStatuses"].append({"name": "x", "state": {"running": {}}})
    obj["status"]["containerStatuses"].append({"name": "y", "state": {"terminated": {}}})
    assert model.pod(obj).exit_code == 4


@pytest.mark.parametrize(
    ("phase", "node", "bound", "finished"),
    [
        ("Pending", "", False, False),
        ("Pending", "n1", True, False),
        ("Running", "n1", True, False),
        ("Succeeded", "n1", True, True),
        ("Failed", "n1", True, True),
    ],
)
def test_bound_and_finished_follow_the_node_and_phase(
    phase: str, node: str, bound: bool, finished: bool
) -> None:
    p = kpod("p", phase=phase, node=node)
    assert (p.bound, p.finished) == (bound, finished)


def test_a_pods_group_comes_from_either_pod_group_label_the_newer_first() -> None:
    older = kpod("p", labels={"pod-group.scheduling.sigs.k8s.io": "old"})
    both = kpod(
        "q",
        labels={"pod-group.scheduling.sigs.k8s.io": "old", "scheduling.x-k8s.io/pod-group": "new"},
    )
    assert older.pod_group == "old" and both.pod_group == "new"


def test_a_pods_grace_priority_deletion_and_creation_are_read() -> None:
    p = kpod("p", grace_s=45, priority_class="high", deleting=True)
    assert p.grace_s == 45.0 and p.priority_class == "high" and p.deleting
    assert p.created == "2025-01-01T00:00:00Z"
    obj = raw_pod("q")
    obj["spec"]["terminationGracePeriodSeconds"] = 0
    assert model.pod(obj).grace_s == 0.0  # zero grace is a grace, not "none given"


# pod groups, priority classes, budgets


@pytest.mark.parametrize(
    ("spec", "min_member"),
    [({"minMember": 3}, 3), ({"minMember": 0}, 1), ({}, 1), (None, 1)],
    ids=["three", "zero", "absent", "no-spec"],
)
def test_a_pod_group_needs_at_least_one_member(
    spec: dict[str, Any] | None, min_member: int
) -> None:
    obj: dict[str, Any] = {"metadata": {"name": "g", "namespace": "ns", "uid": "u"}, "spec": spec}
    g = model.pod_group(obj)
    assert (g.namespace, g.name, g.uid, g.min_member) == ("ns", "g", "u", min_member)


def test_a_priority_class_without_a_value_is_zero() -> None:
    pc = model.priority_class({"metadata": {"name": "x", "labels": {"a": "b"}}})
    assert (pc.name, pc.value, dict(pc.labels)) == ("x", 0, {"a": "b"})


@pytest.mark.parametrize(
    ("min_available", "max_unavailable", "expected", "allowed"),
    [
        (None, "1", 4, 1),
        (None, "50%", 3, 2),  # a percentage of pods that may go rounds up
        (None, "0", 4, 0),
        ("3", None, 4, 1),
        ("50%", None, 3, 1),  # two of three must stay: one may go
        ("5", None, 3, 0),
        ("100%", None, 7, 0),
        ("0%", None, 7, 7),
        (None, None, 5, 5),
        ("4", "2", 4, 2),  # maxUnavailable wins when both are given
    ],
)
def test_a_budget_allows_what_its_min_available_or_max_unavailable_leaves(
    min_available: str | None, max_unavailable: str | None, expected: int, allowed: int
) -> None:
    b = Budget("ns", "b", {}, min_available, max_unavailable)
    assert b.allowed(expected) == allowed


@settings(max_examples=80, deadline=None)
@given(st.integers(min_value=0, max_value=200), st.integers(min_value=0, max_value=100))
def test_a_min_available_percentage_never_allows_more_than_there_are(pods: int, pct: int) -> None:
    allowed = Budget("ns", "b", {}, f"{pct}%", None).allowed(pods)
    assert 0 <= allowed <= pods
    assert allowed <= pods - pct * pods / 100 + 1e-9  # enough pods stay available


def test_a_budget_reads_counts_and_percentages_as_text() -> None:
    b = model.budget(pdb_json("b", {"app": "x"}, min_available=2))
    assert (b.min_available, b.max_unavailable, dict(b.selector)) == (
        "2",
        None,
        {"matchLabels": {"app": "x"}},
    )
    m = model.budget({"metadata": {"name": "m"}, "spec": {"maxUnavailable": "10%"}})
    assert (m.namespace, m.min_available, m.max_unavailable, dict(m.selector)) == (
        "default",
        None,
        "10%",
        {},
    )


LABELS = {"app": "llm", "tier": "train"}


@pytest.mark.parametrize(
    ("selector", "chosen"),
    [
        ({}, True),
        ({"matchLabels": {"app": "llm"}}, True),
        ({"matchLabels": {"app": "llm", "tier": "serve"}}, False),
        ({"matchExpressions": [{"key": "app", "operator": "In", "values": ["llm", "x"]}]}, True),
        ({"matchExpressions": [{"key": "app", "operator": "In", "values": ["x"]}]}, False),
        ({"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}, False),
        ({"matchExpressions": [{"key": "app", "operator": "NotIn", "values": ["llm"]}]}, False),
        ({"matchExpressions": [{"key": "zone", "operator": "NotIn", "values": ["a"]}]}, True),
        ({"matchExpressions": [{"key": "tier", "operator": "Exists"}]}, True),
        ({"matchExpressions": [{"key": "zone", "operator": "Exists"}]}, False),
        ({"matchExpressions": [{"key": "zone", "operator": "DoesNotExist"}]}, True),
        ({"matchExpressions": [{"key": "app", "operator": "DoesNotExist"}]}, False),
        (
            {
                "matchLabels": {"app": "llm"},
                "matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["train"]}],
            },
            False,
        ),
    ],
    ids=lambda v: str(v) if isinstance(v, bool) else None,
)
def test_a_label_selector_matches_as_kubernetes_does(
    selector: dict[str, Any], chosen: bool
) -> None:
    assert selects(selector, LABELS) is chosen

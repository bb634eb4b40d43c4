"""Builders of Kubernetes objects as the API server sends them (JSON dicts), so tests read
like the manifests users write."""

from __future__ import annotations

from typing import Any

GROUP_LABEL = "scheduling.x-k8s.io/pod-group"


def node_json(
    name: str,
    *,
    gpus: int = 8,
    rack: str = "r1",
    product: str = "NVIDIA-H100-80GB-HBM3",
    ready: bool = True,
    unschedulable: bool = False,
    taints: list[dict[str, str]] | None = None,
    labels: dict[str, str] | None = None,
    bare: bool = False,
) -> dict[str, Any]:
    """A GPU node with GPU feature discovery's labels, a Boltforge rack label and ``labels``;
    ``bare``: as it first joins, Ready before the device plugin, GPU feature discovery and
    the admin have spoken (no GPUs allocatable, none of those labels)."""
    obj: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "nvidia.com/gpu.product": product,
                "nvidia.com/gpu.memory": "81559",
                "nvidia.com/gpu.count": str(gpus),
                "topology.boltforge.io/rack": rack,
            },
        },
        "spec": {"unschedulable": unschedulable, "taints": taints or []},
        "status": {
            "allocatable": {"nvidia.com/gpu": str(gpus), "cpu": "96", "memory": "1000Gi"},
            "capacity": {"nvidia.com/gpu": str(gpus), "cpu": "96", "memory": "1000Gi"},
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
            "addresses": [{"type": "InternalIP", "address": "10.0.0.1"}],
        },
    }
    if bare:
        obj["metadata"]["labels"] = {}
        for key in ("allocatable", "capacity"):
            del obj["status"][key]["nvidia.com/gpu"]
    obj["metadata"]["labels"].update(labels or {})
    return obj


def pod_json(
    name: str,
    *,
    namespace: str = "research",
    gpus: int = 8,
    group: str | None = None,
    gang: tuple[str, int] | None = None,
    priority_class: str = "",
    labels: dict[str, str] | None = None,
    scheduler: str = "boltforge",
    grace_s: int = 30,
    node_selector: dict[str, str] | None = None,
    affinity: list[list[dict[str, Any]]] | None = None,
    tolerations: list[dict[str, str]] | None = None,
    gates: tuple[str, ...] = (),
) -> dict[str, Any]:
    """A pod of ``gpus`` GPUs for the Boltforge scheduler, in PodGroup ``group`` or the
    annotation gang ``gang`` (name, size), with a ``nodeSelector``, required node
    ``affinity`` (its ``nodeSelectorTerms``, each a list of ``matchExpressions``),
    ``tolerations`` and scheduling ``gates``."""
    all_labels = dict(labels or {})
    if group:
        all_labels[GROUP_LABEL] = group
    annotations = {}
    if gang:
        annotations = {"boltforge.io/gang": gang[0], "boltforge.io/gang-size": str(gang[1])}
    resources = {"limits": {"nvidia.com/gpu": str(gpus)}} if gpus else {}
    spec: dict[str, Any] = {
        "schedulerName": scheduler,
        "terminationGracePeriodSeconds": grace_s,
        "containers": [{"name": "train", "image": "pytorch:2", "resources": resources}],
    }
    if priority_class:
        spec["priorityClassName"] = priority_class
    if node_selector:
        spec["nodeSelector"] = node_selector
    if affinity:
        terms = [{"matchExpressions": exprs} for exprs in affinity]
        required = {"nodeSelectorTerms": terms}
        spec["affinity"] = {
            "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required}
        }
    if tolerations:
        spec["tolerations"] = tolerations
    if gates:
        spec["schedulingGates"] = [{"name": g} for g in gates]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": all_labels,
            "annotations": annotations,
        },
        "spec": spec,
    }


def pod_group_json(name: str, min_member: int, namespace: str = "research") -> dict[str, Any]:
    return {
        "apiVersion": "scheduling.x-k8s.io/v1alpha1",
        "kind": "PodGroup",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"minMember": min_member},
    }


def pdb_json(
    name: str,
    match: dict[str, str],
    *,
    min_available: int | str,
    namespace: str = "research",
    allowed: int | None = None,
    expected: int = 0,
    generation: int = 1,
    observed: int = 1,
) -> dict[str, Any]:
    """A budget keeping ``min_available`` of the pods ``match`` selects; with ``allowed``,
    the status the disruption controller writes (``disruptionsAllowed``, ``expectedPods``
    and ``desiredHealthy``, for spec generation ``observed``)."""
    obj: dict[str, Any] = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": name, "namespace": namespace, "generation": generation},
        "spec": {"minAvailable": min_available, "selector": {"matchLabels": match}},
    }
    if allowed is not None:
        desired = int(min_available) if not str(min_available).endswith("%") else 0
        obj["status"] = {
            "observedGeneration": observed,
            "disruptionsAllowed": allowed,
            "expectedPods": expected,
            "desiredHealthy": desired,
            "currentHealthy": desired + allowed,
        }
    return obj


def priority_class_json(name: str, value: int) -> dict[str, Any]:
    return {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {"name": name},
        "value": value,
    }


CLASSES = [priority_class_json("high", 1_000_000), priority_class_json("low", -10)]


def job_json(
    name: str,
    parallelism: int,
    *,
    completions: int | None = None,
    indexed: bool = True,
    gpus: int = 8,
    namespace: str = "research",
    uid: str = "",
    backoff_limit: int = 0,
) -> dict[str, Any]:
    """A ``batch/v1`` Job (``completionMode: Indexed`` unless not ``indexed``) of
    ``parallelism`` pods of ``gpus`` GPUs for the Boltforge scheduler, ``completions``
    defaulting to ``parallelism``, as a user writes it: no PodGroup, no gang annotation."""
    template = pod_json(name, gpus=gpus, namespace=namespace)
    template["spec"]["restartPolicy"] = "Never"
    spec: dict[str, Any] = {
        "parallelism": parallelism,
        "completions": parallelism if completions is None else completions,
        "backoffLimit": backoff_limit,
        "template": {"metadata": {"labels": {"app": name}}, "spec": template["spec"]},
    }
    if indexed:
        spec["completionMode"] = "Indexed"
    meta: dict[str, Any] = {"name": name, "namespace": namespace}
    if uid:
        meta["uid"] = uid
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": meta, "spec": spec}


def job_pod_json(job: str, job_uid: str, index: int, **kw: Any) -> dict[str, Any]:
    """``pod_json`` as an indexed Job's controller makes it: its completion index and the
    Job as its controller owner."""
    obj = pod_json(f"{job}-{index}", **kw)
    meta = obj["metadata"]
    meta["annotations"]["batch.kubernetes.io/job-completion-index"] = str(index)
    meta["labels"]["batch.kubernetes.io/job-name"] = job
    meta["ownerReferences"] = [
        {"apiVersion": "batch/v1", "kind": "Job", "name": job, "uid": job_uid, "controller": True}
    ]
    return obj

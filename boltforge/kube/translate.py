"""Kubernetes' words into Boltforge's: a Node into an inventory, a gang of pods into a job
spec, a PriorityClass into a priority class. Pure functions; a gang Boltforge cannot take as
asked is an ``Unplaceable`` whose message becomes its pods' condition and event."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from boltforge.kube.model import ROLE, TEAM, KubeNode, KubePod, PriorityClass
from boltforge.kube.taints import Toleration, blocking
from boltforge.kube.taints import parse as parse_toleration
from boltforge.spec.job import PRIORITY_CLASSES
from boltforge.wire.agent import Inventory

COMMAND = "kubernetes-pod"  # the command of a gang's replicas: the kubelet runs the pods
CLASS_LABEL = "boltforge.io/class"  # on a PriorityClass: the Boltforge class it stands for
HIGH_VALUE = 1_000_000  # PriorityClass values from here up are ``high``; below 0 ``low``
GPU_WORDS = "resources.limits nvidia.com/gpu"
_GPU_MODELS = ("gb200", "b200", "h200", "h100", "a100", "l40s", "l40", "a10g", "l4", "v100", "t4")


class Unplaceable(ValueError):
    """A gang Boltforge cannot take as asked; the message says the fix."""


class FitsNowhere(Unplaceable):
    """A gang no node could ever run as asked (a node of another shape might)."""


@dataclass(frozen=True)
class Labels:
    """Which node labels carry the topology (``bolt kube scheduler --rack-label`` ...): a
    node's rack is its ``rack`` label, its pod (the racks under one spine) its ``pod`` label,
    else its ``spine`` label; its pool its ``pool`` label, else its GPU model. ``tolerated``:
    taints every pod is taken to tolerate (``KEY[=VALUE][:EFFECT]``, ``--tolerate-taint``; by
    default GPU nodes' usual ``nvidia.com/gpu``, which the ExtendedResourceToleration
    admission plugin tolerates for pods that ask for GPUs)."""

    rack: str = "topology.boltforge.io/rack"
    pod: str = "topology.boltforge.io/pod"
    spine: str = "topology.boltforge.io/spine"
    pool: str = "boltforge.io/pool"
    tolerated: tuple[str, ...] = ("nvidia.com/gpu",)


def name_of(text: str, fallback: str) -> str:
    """``text`` as a Boltforge name (lower case, ``[a-z0-9_.-]``, at most 63 characters)."""
    out = re.sub(r"[^a-z0-9_.-]", "-", text.lower()).strip("-._")[:63].rstrip("-._")
    return out or fallback


def gpu_model(product: str) -> str:
    """``NVIDIA-H100-80GB-HBM3`` -> ``h100``; an unknown product keeps its own name."""
    low = product.lower()
    return next((m for m in _GPU_MODELS if m in low), name_of(product, "gpu"))


def inventory(node: KubeNode, labels: Labels) -> Inventory:
    """A Node as a Boltforge node (see ``Labels`` for where its topology comes from)."""
    gpu = gpu_model(node.product) if node.gpus else "none"
    pool = node.labels.get(labels.pool) or (f"k8s-{gpu}" if node.gpus else "k8s-cpu")
    return Inventory(
        name=node.name,
        pool=name_of(pool, "k8s"),
        gpu=gpu,
        gpus=min(node.gpus, 64),
        gpu_memory_gb=node.gpu_memory_gb,
        cpus=node.cpus,
        memory_gb=node.memory_gb,
        rack=name_of(node.labels.get(labels.rack, "rack0"), "rack0"),
        pod=name_of(node.labels.get(labels.pod) or node.labels.get(labels.spine, "pod0"), "pod0"),
        address=node.address,
    )


NO_GPUS = (
    "it reports no nvidia.com/gpu allocatable, so it counts as a node without GPUs; its GPUs "
    "count once the NVIDIA device plugin reports them (kubectl describe node: Allocatable)"
)


def changes(old: Inventory, new: Inventory) -> str:
    """What differs between two inventories of a node, as ``field old -> new`` words."""
    was, now = old.model_dump(), new.model_dump()
    return ", ".join(f"{k} {was[k]} -> {now[k]}" for k in now if was.get(k) != now[k])


def tolerations(labels: Labels) -> tuple[Toleration, ...]:
    """``labels.tolerated`` as tolerations."""
    return tuple(parse_toleration(t) for t in labels.tolerated)


def cordoned(node: KubeNode, labels: Labels, tolerated_by_pods: Iterable[Toleration] = ()) -> bool:
    """New pods may not land on ``node``: it is unschedulable, or has a NoSchedule or
    NoExecute taint that neither ``labels.tolerated`` nor any of ``tolerated_by_pods`` (the
    tolerations of the scheduler's live pods, waiting or running) tolerates. A taint some
    pods tolerate does not cordon the node: those pods may go there, and the others are
    kept off it by their gang's pools (``fit.py``)."""
    kept = blocking(node.taints, tolerations(labels))
    return node.unschedulable or bool(blocking(kept, tolerated_by_pods))


def priority(pod: KubePod, classes: Mapping[str, PriorityClass]) -> str:
    """A pod's Boltforge class: its PriorityClass's name when named like one (``high``), else
    the class that PriorityClass's ``boltforge.io/class`` label names, else by its value
    (``HIGH_VALUE`` and up: high; below 0: low; else normal). No PriorityClass: normal."""
    name = pod.priority_class
    if name in PRIORITY_CLASSES:
        return name
    pc = classes.get(name)
    if pc is None:
        return "normal"
    if pc.labels.get(CLASS_LABEL) in PRIORITY_CLASSES:
        return pc.labels[CLASS_LABEL]
    if pc.value >= HIGH_VALUE:
        return "high"
    return "low" if pc.value < 0 else "normal"


@dataclass
class GangShape:
    """What a gang asks, by role: each role's pods (in rank order) and their size."""

    roles: dict[str, list[KubePod]] = field(default_factory=dict)

    def role_of(self, pod: KubePod) -> str:
        return next(r for r, pods in self.roles.items() if pod in pods)


def shape(pods: Sequence[KubePod]) -> GangShape:
    """The gang's roles: pods with a ``boltforge.io/role`` label by it, others by their size
    (``gpu8``, ``cpu``); each role's pods in name order, roles by most GPUs first."""
    groups: dict[str, list[KubePod]] = {}
    for p in sorted(pods, key=lambda p: p.name):
        role = p.labels.get(ROLE) or (f"gpu{p.gpus}" if p.gpus else "cpu")
        groups.setdefault(name_of(role, "worker"), []).append(p)
    for role, members in groups.items():
        sizes = {(p.gpus, p.cpus, p.memory_gb) for p in members}
        if len(sizes) > 1:
            raise Unplaceable(
                f"the pods of role {role} ask for different resources ({len(sizes)} sizes); "
                f"give each size its own {ROLE} label"
            )
    order = sorted(groups, key=lambda r: (-groups[r][0].gpus, r))
    return GangShape({r: groups[r] for r in order})


def job_spec(
    name: str,
    gang: GangShape,
    *,
    priority_class: str,
    grace_s: float,
    preemptible: bool,
    largest_node: int,
    pools: Sequence[str] = (),
) -> dict[str, Any]:
    """The Boltforge job spec of a gang: one replica per pod, each role's GPUs, CPUs and
    memory per replica; team from the first pod's ``boltforge.io/team`` label, else its
    namespace; ``pools``: the only pools it may use (empty: any). Raises ``Unplaceable``
    for a pod that asks more GPUs than any node has."""
    first = next(iter(gang.roles.values()))[0]
    for pods in gang.roles.values():
        if pods[0].gpus and not largest_node:
            raise Unplaceable(
                f"pod {pods[0].name} asks for {pods[0].gpus} GPUs ({GPU_WORDS}) and no Ready "
                "node reports nvidia.com/gpu allocatable yet; it waits until the NVIDIA device "
                "plugin reports the nodes' GPUs (kubectl describe node: Allocatable)"
            )
        if pods[0].gpus > largest_node:
            raise FitsNowhere(
                f"pod {pods[0].name} asks for {pods[0].gpus} GPUs ({GPU_WORDS}) and the "
                f"largest node has {largest_node}; ask for at most {largest_node} per pod "
                "and spread the work over more pods"
            )
    spec: dict[str, Any] = {
        "name": name,
        "team": name_of(first.labels.get(TEAM) or first.namespace, "default"),
        "priority": priority_class,
        "command": [COMMAND],
        "preemptible": preemptible,
        "checkpoint": {"grace": f"{max(1, round(grace_s))}s"},
        "roles": [
            {
                "name": role,
                "replicas": len(pods),
                "gpus": pods[0].gpus,
                "cpus": pods[0].cpus,
                "memory_gb": pods[0].memory_gb,
            }
            for role, pods in gang.roles.items()
        ],
    }
    if pools:
        spec["pools"] = list(pools)
    return spec

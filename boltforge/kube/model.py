"""What the Kubernetes API says, parsed: Nodes, Pods, PodGroups and PriorityClasses from
their JSON (as the API server sends them; the client's model classes are not used, they
cost more to build than the whole pass). Pure functions; nothing here calls the API."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from boltforge.kube.owners import Owner, indexed_owner
from boltforge.kube.taints import Taint as Taint
from boltforge.kube.taints import Toleration, taint, toleration

GPU = "nvidia.com/gpu"
PRODUCT = "nvidia.com/gpu.product"
GPU_MEMORY = "nvidia.com/gpu.memory"  # MiB, from GPU feature discovery
GPU_COUNT = "nvidia.com/gpu.count"
POD_GROUP_LABELS = ("scheduling.x-k8s.io/pod-group", "pod-group.scheduling.sigs.k8s.io")
GANG = "boltforge.io/gang"
GANG_SIZE = "boltforge.io/gang-size"
ROLE = "boltforge.io/role"
TEAM = "boltforge.io/team"
REPLICA = "boltforge.io/replica"  # written on a pod by its binding: the replica it runs
JOB = "boltforge.io/job"
# The reasons a kubelet gives a pod it refused to admit (``status.reason`` of a Failed pod
# whose containers never ran), besides ``OutOf<resource>``; and ``Evicted``, a pod it ended
# under node pressure. Neither is the pod's own failure: its gang runs again.
KUBELET_REFUSALS = frozenset(
    {
        "NodeAffinity",
        "NodeName",
        "NodePorts",
        "NodeSelectorMismatching",
        "InvalidNodeInfo",
        "UnexpectedAdmissionError",
        "PodOSNotSupported",
        "PodOSSelectorNodeLabelDoesNotMatch",
        "TaintToleration",
        "Evicted",
    }
)
_SUFFIX = {
    "": 1.0,
    "m": 1e-3,
    "k": 1e3,
    "M": 1e6,
    "G": 1e9,
    "T": 1e12,
    "Ki": 2.0**10,
    "Mi": 2.0**20,
    "Gi": 2.0**30,
    "Ti": 2.0**40,
}
_QUANTITY = re.compile(r"^([0-9.]+(?:[eE][+-]?[0-9]+)?)([a-zA-Z]*)$")


def quantity(text: object) -> float:
    """A Kubernetes quantity (``500m``, ``16Gi``, ``8``) as a number; 0 when unreadable."""
    m = _QUANTITY.match(str(text).strip())
    if m is None or m.group(2) not in _SUFFIX:
        return 0.0
    return float(m.group(1)) * _SUFFIX[m.group(2)]


@dataclass(frozen=True)
class KubeNode:
    """A Node: its allocatable GPUs, CPUs and memory, labels, whether it is Ready and whether
    new pods may land on it (``unschedulable``, taints)."""

    name: str
    gpus: int
    cpus: int
    memory_gb: float
    labels: Mapping[str, str]
    ready: bool
    unschedulable: bool
    taints: tuple[Taint, ...]
    address: str

    @property
    def product(self) -> str:
        return self.labels.get(PRODUCT, "")

    @property
    def gpu_memory_gb(self) -> float:
        mib = quantity(self.labels.get(GPU_MEMORY, "0"))
        return round(mib / 1024, 1)


@dataclass(frozen=True)
class KubePod:
    """A Pod as the scheduler sees it: who schedules it, where it is bound, its phase, what
    it asks (GPUs, CPUs, memory), how it is grouped, and how it ended."""

    namespace: str
    name: str
    uid: str
    scheduler: str
    node: str
    phase: str
    gpus: int
    cpus: float
    memory_gb: float
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    priority_class: str
    deleting: bool
    exit_code: int | None
    grace_s: float | None
    created: str
    pod_group: str | None  # the PodGroup its label names
    node_selector: Mapping[str, str] = field(default_factory=dict)
    affinity: tuple[Term, ...] = ()  # required node affinity: any one term must hold
    tolerations: tuple[Toleration, ...] = ()
    gates: tuple[str, ...] = ()  # spec.schedulingGates: not to be scheduled while any
    reason: str = ""  # status.reason (a kubelet's refusal: OutOfnvidia.com/gpu, ...)
    message: str = ""  # status.message
    owner: Owner | None = None  # the Job that made it, when an indexed one did

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)

    @cached_property
    def path(self) -> str:
        """``namespace/name``, as the informer keys it."""
        return f"{self.namespace}/{self.name}"

    @property
    def bound(self) -> bool:
        return bool(self.node)

    @property
    def finished(self) -> bool:
        return self.phase in ("Succeeded", "Failed")

    @property
    def refused_by_kubelet(self) -> bool:
        """Failed because its node's kubelet refused it (or evicted it), not by its own
        exit: the reason is one ``KUBELET_REFUSALS`` names, or ``OutOf<resource>``."""
        why = self.reason
        return self.phase == "Failed" and (why in KUBELET_REFUSALS or why.startswith("OutOf"))


@dataclass(frozen=True)
class Requirement:
    """One ``matchExpressions`` (or ``matchFields``) entry of a node selector term."""

    key: str
    operator: str  # In, NotIn, Exists, DoesNotExist, Gt, Lt
    values: tuple[str, ...] = ()


@dataclass(frozen=True)
class Term:
    """A ``nodeSelectorTerm``: every expression (on labels) and field (``metadata.name``)
    must hold."""

    expressions: tuple[Requirement, ...] = ()
    fields: tuple[Requirement, ...] = ()


@dataclass(frozen=True)
class PodGroup:
    """A ``scheduling.x-k8s.io/v1alpha1`` PodGroup: its pods are one gang of ``min_member``."""

    namespace: str
    name: str
    uid: str
    min_member: int


@dataclass(frozen=True)
class PriorityClass:
    name: str
    value: int
    labels: Mapping[str, str]


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta: Mapping[str, Any] = obj.get("metadata") or {}
    return meta


def node(obj: Mapping[str, Any]) -> KubeNode:
    meta, spec, status = _meta(obj), obj.get("spec") or {}, obj.get("status") or {}
    alloc = status.get("allocatable") or status.get("capacity") or {}
    conditions = {c.get("type"): c.get("status") for c in status.get("conditions") or []}
    addresses = {a.get("type"): a.get("address") for a in status.get("addresses") or []}
    return KubeNode(
        name=meta.get("name", ""),
        gpus=int(quantity(alloc.get(GPU, 0))),
        cpus=max(1, int(quantity(alloc.get("cpu", 1)))),
        memory_gb=max(0.1, round(quantity(alloc.get("memory", 2**30)) / 2**30, 1)),
        labels=dict(meta.get("labels") or {}),
        ready=conditions.get("Ready") == "True",
        unschedulable=bool(spec.get("unschedulable")),
        taints=tuple(taint(t) for t in spec.get("taints") or []),
        address=addresses.get("InternalIP") or addresses.get("Hostname") or meta.get("name", ""),
    )


def _asks(container: Mapping[str, Any]) -> tuple[float, float, float]:
    """A container's (GPUs, CPUs, memory bytes): GPUs by the limit, else the request; CPUs
    and memory by the request, else the limit."""
    res = container.get("resources") or {}
    limits, requests = res.get("limits") or {}, res.get("requests") or {}
    return (
        quantity(limits.get(GPU, requests.get(GPU, 0))),
        quantity(requests.get("cpu", limits.get("cpu", 0))),
        quantity(requests.get("memory", limits.get("memory", 0))),
    )


def requests(spec: Mapping[str, Any]) -> tuple[float, float, float]:
    """What a pod asks of its node, as the kubelet admits it: per resource, the larger of
    its containers' sum and its largest init container (init containers run one at a time,
    before the others; a sidecar, an init container with ``restartPolicy: Always``, runs
    beside them and adds to the sum), plus the pod's ``overhead``."""
    main = [_asks(c) for c in spec.get("containers") or []]
    sidecars = [
        _asks(c) for c in spec.get("initContainers") or [] if c.get("restartPolicy") == "Always"
    ]
    inits = [
        _asks(c) for c in spec.get("initContainers") or [] if c.get("restartPolicy") != "Always"
    ]
    total = [sum(a[i] for a in main + sidecars) for i in range(3)]
    first = [max((a[i] for a in inits), default=0.0) for i in range(3)]
    over = spec.get("overhead") or {}
    extra = (
        quantity(over.get(GPU, 0)),
        quantity(over.get("cpu", 0)),
        quantity(over.get("memory", 0)),
    )
    gpus, cpus, memory = (max(total[i], first[i]) + extra[i] for i in range(3))
    return gpus, cpus, memory


def _requirements(items: Any) -> tuple[Requirement, ...]:
    return tuple(
        Requirement(e.get("key", ""), e.get("operator", ""), tuple(map(str, e.get("values") or ())))
        for e in items or []
    )


def _affinity(spec: Mapping[str, Any]) -> tuple[Term, ...]:
    node_affinity = (spec.get("affinity") or {}).get("nodeAffinity") or {}
    required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    return tuple(
        Term(_requirements(t.get("matchExpressions")), _requirements(t.get("matchFields")))
        for t in required.get("nodeSelectorTerms") or []
    )


def pod(obj: Mapping[str, Any]) -> KubePod:
    meta, spec, status = _meta(obj), obj.get("spec") or {}, obj.get("status") or {}
    gpus, cpus, memory = requests(spec)
    grace = spec.get("terminationGracePeriodSeconds")
    labels = dict(meta.get("labels") or {})
    return KubePod(
        namespace=meta.get("namespace", "default"),
        name=meta.get("name", ""),
        uid=meta.get("uid", ""),
        scheduler=spec.get("schedulerName", "default-scheduler"),
        node=spec.get("nodeName") or "",
        phase=status.get("phase", "Pending"),
        gpus=int(gpus),
        cpus=round(cpus, 3),
        memory_gb=round(memory / 2**30, 3),
        labels=labels,
        annotations=dict(meta.get("annotations") or {}),
        priority_class=spec.get("priorityClassName") or "",
        deleting=bool(meta.get("deletionTimestamp")),
        exit_code=_exit_code(status),
        grace_s=float(grace) if grace is not None else None,
        created=meta.get("creationTimestamp", ""),
        pod_group=next((labels[k] for k in POD_GROUP_LABELS if k in labels), None),
        node_selector=dict(spec.get("nodeSelector") or {}),
        affinity=_affinity(spec),
        tolerations=tuple(toleration(t) for t in spec.get("tolerations") or []),
        gates=tuple(g.get("name", "") for g in spec.get("schedulingGates") or []),
        reason=status.get("reason") or "",
        message=status.get("message") or "",
        owner=indexed_owner(meta),
    )


def _exit_code(status: Mapping[str, Any]) -> int | None:
    """The worst exit code of the pod's terminated containers (None while none ended)."""
    codes = [
        int(term["exitCode"])
        for cs in status.get("containerStatuses") or []
        if (term := (cs.get("state") or {}).get("terminated")) and "exitCode" in term
    ]
    return max(codes, key=abs) if codes else None


def pod_group(obj: Mapping[str, Any]) -> PodGroup:
    meta, spec = _meta(obj), obj.get("spec") or {}
    return PodGroup(
        namespace=meta.get("namespace", "default"),
        name=meta.get("name", ""),
        uid=meta.get("uid", ""),
        min_member=int(spec.get("minMember") or 1),
    )


def priority_class(obj: Mapping[str, Any]) -> PriorityClass:
    meta = _meta(obj)
    return PriorityClass(meta.get("name", ""), int(obj.get("value") or 0), meta.get("labels") or {})


@dataclass(frozen=True)
class Budget:
    """A ``policy/v1`` PodDisruptionBudget: its selector and how many of its pods must stay
    (``min_available``) or may go (``max_unavailable``), each a count or a percentage; and,
    once the disruption controller has written its status for the current spec, what that
    status says (``disruptions_allowed`` now, ``expected`` pods, ``desired_healthy``)."""

    namespace: str
    name: str
    selector: Mapping[str, Any]
    min_available: str | None
    max_unavailable: str | None
    disruptions_allowed: int | None = None
    expected: int | None = None
    desired_healthy: int | None = None

    @property
    def path(self) -> str:
        return f"{self.namespace}/{self.name}"

    def allowed(self, expected: int) -> int:
        """Disruptions it allows when all ``expected`` pods it selects are healthy: from its
        status when the disruption controller wrote one (its count of expected pods and of
        those that must stay, which it works out from the pods' controllers), else from its
        spec."""
        if self.expected is not None and self.desired_healthy is not None:
            return max(0, self.expected - self.desired_healthy)
        if self.max_unavailable is not None:
            return _count(self.max_unavailable, expected, up=True)
        if self.min_available is not None:
            return max(0, expected - _count(self.min_available, expected, up=True))
        return expected


def _count(value: str, total: int, *, up: bool) -> int:
    if value.endswith("%"):
        share = float(value[:-1]) * total / 100
        return int(-(-share // 1)) if up else int(share)
    return int(value)


def budget(obj: Mapping[str, Any]) -> Budget:
    meta, spec, status = _meta(obj), obj.get("spec") or {}, obj.get("status") or {}
    low, high = spec.get("minAvailable"), spec.get("maxUnavailable")
    # the status counts only once it was written for this spec (its observedGeneration)
    current = "disruptionsAllowed" in status and int(status.get("observedGeneration") or 0) >= int(
        meta.get("generation") or 0
    )
    return Budget(
        namespace=meta.get("namespace", "default"),
        name=meta.get("name", ""),
        selector=spec.get("selector") or {},
        min_available=None if low is None else str(low),
        max_unavailable=None if high is None else str(high),
        disruptions_allowed=_count_of(status, "disruptionsAllowed") if current else None,
        expected=_count_of(status, "expectedPods") if current else None,
        desired_healthy=_count_of(status, "desiredHealthy") if current else None,
    )


def _count_of(status: Mapping[str, Any], key: str) -> int | None:
    value = status.get(key)
    return None if value is None else int(value)


def selects(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """A LabelSelector (``matchLabels``, ``matchExpressions``) against ``labels``; an empty
    selector selects everything, as a PodDisruptionBudget's does in ``policy/v1``."""
    for k, v in (selector.get("matchLabels") or {}).items():
        if labels.get(k) != v:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr.get("key"), expr.get("operator"), expr.get("values") or []
        has = key in labels
        if op == "In" and (not has or labels[key] not in values):
            return False
        if op == "NotIn" and has and labels[key] in values:
            return False
        if (op == "Exists" and not has) or (op == "DoesNotExist" and has):
            return False
    return True

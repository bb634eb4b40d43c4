"""The resources this API server serves, as discovery names them: plural, kind, group,
version, scope, short names, subresources, and the field labels a ``fieldSelector`` may use
(``metadata.name`` and ``metadata.namespace`` always)."""

from __future__ import annotations

from dataclasses import dataclass

VERBS = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")
POD_FIELDS = (
    "spec.nodeName",
    "spec.schedulerName",
    "spec.restartPolicy",
    "spec.serviceAccountName",
    "status.phase",
    "status.podIP",
    "status.nominatedNodeName",
)
EVENT_FIELDS = (
    "involvedObject.kind",
    "involvedObject.namespace",
    "involvedObject.name",
    "involvedObject.uid",
    "involvedObject.apiVersion",
    "involvedObject.resourceVersion",
    "involvedObject.fieldPath",
    "reason",
    "reportingComponent",
    "source",
    "type",
)


@dataclass(frozen=True)
class Subresource:
    """A subresource for discovery: ``pods/binding`` has kind Binding, verb create."""

    name: str
    kind: str
    verbs: tuple[str, ...]
    group: str | None = None
    version: str | None = None


STATUS_VERBS = ("get", "patch", "update")


@dataclass(frozen=True)
class Resource:
    """One served resource. ``custom`` resources take no strategic merge patch, as custom
    resources of kube-apiserver do not; ``has_status`` ones keep ``status`` out of main
    writes and ``spec`` out of status writes."""

    plural: str
    kind: str
    group: str
    version: str
    namespaced: bool = True
    short_names: tuple[str, ...] = ()
    has_status: bool = False
    custom: bool = False
    categories: tuple[str, ...] = ()
    fields: tuple[str, ...] = ()
    subresources: tuple[Subresource, ...] = ()

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def qualified(self) -> str:
        """``pods``, ``poddisruptionbudgets.policy``: how error messages name it."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def list_kind(self) -> str:
        return f"{self.kind}List"


PODS = Resource(
    "pods",
    "Pod",
    "",
    "v1",
    short_names=("po",),
    has_status=True,
    categories=("all",),
    fields=POD_FIELDS,
    subresources=(
        Subresource("status", "Pod", STATUS_VERBS),
        Subresource("binding", "Binding", ("create",)),
        Subresource("eviction", "Eviction", ("create",), "policy", "v1"),
    ),
)
NODES = Resource(
    "nodes",
    "Node",
    "",
    "v1",
    namespaced=False,
    short_names=("no",),
    has_status=True,
    fields=("spec.unschedulable",),
    subresources=(Subresource("status", "Node", STATUS_VERBS),),
)
EVENTS = Resource("events", "Event", "", "v1", short_names=("ev",), fields=EVENT_FIELDS)
NAMESPACES = Resource(
    "namespaces",
    "Namespace",
    "",
    "v1",
    namespaced=False,
    short_names=("ns",),
    fields=("status.phase",),
)
PDBS = Resource(
    "poddisruptionbudgets",
    "PodDisruptionBudget",
    "policy",
    "v1",
    short_names=("pdb",),
    has_status=True,
    subresources=(Subresource("status", "PodDisruptionBudget", STATUS_VERBS),),
)
PRIORITY_CLASSES = Resource(
    "priorityclasses", "PriorityClass", "scheduling.k8s.io", "v1", False, ("pc",)
)
LEASES = Resource("leases", "Lease", "coordination.k8s.io", "v1")
POD_GROUPS = Resource(
    "podgroups",
    "PodGroup",
    "scheduling.x-k8s.io",
    "v1alpha1",
    short_names=("pg",),
    has_status=True,
    custom=True,
    subresources=(Subresource("status", "PodGroup", STATUS_VERBS),),
)
RESOURCES = (PODS, NODES, EVENTS, NAMESPACES, PDBS, PRIORITY_CLASSES, LEASES, POD_GROUPS)
BY_PATH = {(r.group, r.version, r.plural): r for r in RESOURCES}
GROUP_VERSIONS = tuple(dict.fromkeys((r.group, r.version) for r in RESOURCES))


def lookup(group: str, version: str, plural: str) -> Resource | None:
    """The resource served at ``/apis/{group}/{version}/{plural}`` (group "" is ``/api``)."""
    return BY_PATH.get((group, version, plural))

"""What kube-apiserver does to pods beyond generic objects: defaults and admission on
create (``schedulerName``, ``restartPolicy``, ``terminationGracePeriodSeconds``,
``dnsPolicy``; ``spec.priority`` from the PriorityClass named, or the global default, as the
Priority admission plugin does; ``status`` reset to Pending with its QoS class) and binding
(``pods/binding`` and ``bindings``: sets ``spec.nodeName`` and ``PodScheduled=True``, copies
the binding's annotations; 409 when the pod already has a node or is being deleted).

A binding answers 201 with a ``Status`` of success, as kube-apiserver does: the Python
client's ``create_namespaced_binding`` cannot read that into a ``V1Binding`` (it raises
``ValueError: Invalid value for `target`, must not be `None```), so callers pass
``_preload_content=False``, as they must against a real cluster."""

from __future__ import annotations

from boltforge.testing.kubeapi.errors import ApiError, bad_request, conflict, not_found
from boltforge.testing.kubeapi.objects import JSON, meta, section, set_condition
from boltforge.testing.kubeapi.resources import PODS, PRIORITY_CLASSES
from boltforge.testing.kubeapi.store import Store

SYSTEM_PRIORITY_CLASSES = {
    "system-cluster-critical": 2000000000,
    "system-node-critical": 2000001000,
}


def prepare_create(store: Store, pod: JSON) -> None:
    """Defaults, priority admission and the initial status of a new pod."""
    spec = section(pod, "spec")
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("dnsPolicy", "ClusterFirst")
    _admit_priority(store, pod)
    pod["status"] = {"phase": "Pending", "qosClass": qos_class(spec)}


def _admit_priority(store: Store, pod: JSON) -> None:
    spec = pod["spec"]
    name = spec.get("priorityClassName")
    if name:
        found = store.get(PRIORITY_CLASSES.plural, "", name)
        if found is None:
            why = f"no PriorityClass with name {name} was found"
            message = f'pods "{meta(pod).get("name")}" is forbidden: {why}'
            raise ApiError(403, message, "Forbidden")
        pc = found.obj
    else:
        classes = store.items(PRIORITY_CLASSES.plural)
        pc = next((c.obj for c in classes if c.obj.get("globalDefault")), {})
        if pc:
            spec["priorityClassName"] = pc["metadata"]["name"]
    spec["priority"] = int(pc.get("value", 0))
    spec.setdefault("preemptionPolicy", pc.get("preemptionPolicy", "PreemptLowerPriority"))


def qos_class(spec: JSON) -> str:
    """Guaranteed, Burstable or BestEffort, from the containers' requests and limits."""
    resources = [c.get("resources") or {} for c in spec.get("containers") or []]
    if not any(r.get("requests") or r.get("limits") for r in resources):
        return "BestEffort"
    for r in resources:
        limits, requests = r.get("limits") or {}, r.get("requests") or {}
        if not ("cpu" in limits and "memory" in limits):
            return "Burstable"
        if any(requests.get(k, v) != v for k, v in limits.items()):
            return "Burstable"
    return "Guaranteed"


def bind(store: Store, namespace: str, binding: JSON, name: str | None = None) -> None:
    """Bind the pod ``binding`` names (or ``name``, from a ``pods/{name}/binding`` URL) to
    the node it targets."""
    md = meta(binding)
    pod_name = name or md.get("name")
    node = (binding.get("target") or {}).get("name")
    if not pod_name or not node:
        raise bad_request("a binding needs metadata.name and target.name")
    with store.lock:
        found = store.get(PODS.plural, namespace, pod_name)
        if found is None:
            raise not_found(PODS, pod_name)
        if md.get("uid") and md["uid"] != found.obj["metadata"]["uid"]:
            raise conflict("pods/binding", pod_name, "Precondition failed: UID mismatch")
        pod = found.copy()
        _check_bindable(pod, pod_name)
        pod["spec"]["nodeName"] = node
        if md.get("annotations"):
            meta(pod).setdefault("annotations", {}).update(md["annotations"])
        set_condition(section(pod, "status"), "PodScheduled", "True")
        store.put(PODS.plural, pod)


def _check_bindable(pod: JSON, name: str) -> None:
    current = section(pod, "spec").get("nodeName")
    if current:
        why = f'pod {name} is already assigned to node "{current}"'
        raise conflict("pods/binding", name, why)
    if meta(pod).get("deletionTimestamp"):
        why = f"pod {name} is being deleted, cannot be assigned to a host"
        raise conflict("pods/binding", name, why)

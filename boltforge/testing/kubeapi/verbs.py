"""The generic verbs on stored objects, with kube-apiserver's semantics:

- create fills in ``metadata.uid``, ``creationTimestamp``, ``generation`` (1), the
  namespace, a name from ``generateName``, ``kind`` and ``apiVersion``; an existing name is
  409 AlreadyExists; no name is 422; a namespace other than the URL's is 400. A namespace
  used for the first time is created (namespaces are implicit). The status of a new pod,
  PodDisruptionBudget or custom resource is reset (nodes keep theirs).
- update (PUT) and patch: a ``metadata.resourceVersion`` other than the stored one is 409
  Conflict (optimistic concurrency); none is unconditional. Writes to the main resource keep
  ``status`` of resources with a status subresource, writes to ``/status`` keep the rest;
  ``generation`` moves when ``spec`` does; a write that changes nothing takes no new
  ``resourceVersion`` and sends no event. Leases may be created by PUT.
- delete: see ``deletion``; ``propagationPolicy`` is ignored (no garbage collector).

Not implemented: validation of object contents, admission beyond pod priority, dry run,
managed fields, and ``limit``/``continue`` paging (lists answer everything at once)."""

from __future__ import annotations

from typing import Any

from boltforge.testing.kubeapi import deletion, pods
from boltforge.testing.kubeapi import patch as patching
from boltforge.testing.kubeapi.errors import (
    already_exists,
    bad_request,
    conflict,
    invalid,
    not_found,
)
from boltforge.testing.kubeapi.objects import JSON, generated_name, meta, new_uid, timestamp
from boltforge.testing.kubeapi.resources import LEASES, NAMESPACES, PDBS, POD_GROUPS, PODS, Resource
from boltforge.testing.kubeapi.store import Store, Stored, without_version
from boltforge.testing.kubeapi.watch import Filter

SYSTEM_FIELDS = (
    "name",
    "namespace",
    "uid",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "generation",
)
RESET_STATUS = (PODS, PDBS, POD_GROUPS)


def get(store: Store, res: Resource, ns: str, name: str) -> Stored:
    found = store.get(res.plural, ns, name)
    if found is None:
        raise not_found(res, name)
    return found


def listing(store: Store, res: Resource, wanted: Filter) -> tuple[int, list[Stored]]:
    """The list's ``resourceVersion`` and the objects ``wanted``."""
    with store.lock:
        items = store.items(res.plural, wanted.namespace)
        return store.rv, [s for s in items if wanted.matches(s.obj)]


def create(store: Store, res: Resource, ns: str, body: JSON) -> Stored:
    md = meta(body)
    if res.namespaced and md.get("namespace") not in (None, "", ns):
        raise bad_request(
            "the namespace of the provided object does not match the namespace sent on the request"
        )
    with store.lock:
        name = md.get("name") or _fresh_name(store, res, ns, md.get("generateName"))
        if store.get(res.plural, ns, name) is not None:
            raise already_exists(res, name)
        obj = _new_object(res, body, ns, name)
        if res is PODS:
            pods.prepare_create(store, obj)
        elif res in RESET_STATUS:
            obj.pop("status", None)
        ensure_namespace(store, ns)
        return store.put(res.plural, obj)


def _fresh_name(store: Store, res: Resource, ns: str, prefix: str | None) -> str:
    if not prefix:
        raise invalid(res, "", "metadata.name: Required value: name or generateName is required")
    name = generated_name(prefix)
    while store.get(res.plural, ns, name) is not None:
        name = generated_name(prefix)
    return name


def _new_object(res: Resource, body: JSON, ns: str, name: str) -> JSON:
    md = {k: v for k, v in meta(body).items() if k not in ("resourceVersion", "managedFields")}
    for key in ("deletionTimestamp", "deletionGracePeriodSeconds", "selfLink", "generateName"):
        md.pop(key, None)
    if meta(body).get("generateName") and not meta(body).get("name"):
        md["generateName"] = meta(body)["generateName"]
    md.update(name=name, uid=new_uid(), creationTimestamp=timestamp(), generation=1)
    if res.namespaced:
        md["namespace"] = ns
    else:
        md.pop("namespace", None)
    rest = {k: v for k, v in body.items() if k not in ("kind", "apiVersion", "metadata")}
    return {"kind": res.kind, "apiVersion": res.api_version, "metadata": md, **rest}


def ensure_namespace(store: Store, ns: str) -> None:
    """Create namespace ``ns`` if this is its first use."""
    if ns and store.get(NAMESPACES.plural, "", ns) is None:
        body = {"metadata": {"name": ns, "labels": {"kubernetes.io/metadata.name": ns}}}
        obj = _new_object(NAMESPACES, body, "", ns)
        obj.update(spec={"finalizers": ["kubernetes"]}, status={"phase": "Active"})
        store.put(NAMESPACES.plural, obj)


def update(
    store: Store, res: Resource, ns: str, name: str, body: JSON, sub: str | None = None
) -> Stored:
    """PUT ``body`` over the stored object (or its status, for ``sub`` "status")."""
    with store.lock:
        found = store.get(res.plural, ns, name)
        if found is None and res is LEASES and sub is None:
            return create(store, res, ns, {**body, "metadata": {**meta(body), "name": name}})
        found = get(store, res, ns, name)
        _check_preconditions(res, name, found, meta(body))
        return _commit(store, res, found, _replaced(res, found, body, sub))


def patch(
    store: Store, res: Resource, ns: str, name: str, content_type: str, raw: bytes, sub: str | None
) -> Stored:
    with store.lock:
        found = get(store, res, ns, name)
        patched = patching.apply(res, found.copy(), content_type, raw)
        _check_preconditions(res, name, found, meta(patched))
        return _commit(store, res, found, _replaced(res, found, patched, sub))


def _check_preconditions(res: Resource, name: str, found: Stored, md: JSON) -> None:
    stored = found.obj["metadata"]
    if md.get("resourceVersion") and md["resourceVersion"] != stored["resourceVersion"]:
        raise conflict(res, name)
    if md.get("uid") and md["uid"] != stored["uid"]:
        why = f"Precondition failed: UID in precondition: {md['uid']}, "
        why += f"UID in object meta: {stored['uid']}"
        raise conflict(res, name, why)


def _replaced(res: Resource, found: Stored, body: JSON, sub: str | None) -> JSON:
    """The object a write of ``body`` leaves: the stored one with ``body`` in its place."""
    old = found.copy()
    if sub == "status":
        old["status"] = body.get("status") or {}
        return old
    md = {k: v for k, v in meta(body).items() if k not in SYSTEM_FIELDS}
    md.update({k: old["metadata"][k] for k in SYSTEM_FIELDS if k in old["metadata"]})
    rest = {k: v for k, v in body.items() if k not in ("kind", "apiVersion", "metadata")}
    new: JSON = {"kind": res.kind, "apiVersion": res.api_version, "metadata": md, **rest}
    if res.has_status:
        new.pop("status", None)
        if "status" in old:
            new["status"] = old["status"]
    if new.get("spec") != old.get("spec"):
        md["generation"] = int(md.get("generation", 1)) + 1
    return new


def _commit(store: Store, res: Resource, found: Stored, new: JSON) -> Stored:
    if without_version(new) == without_version(found.obj):
        return found
    stored = store.put(res.plural, new)
    if deletion.removable(res, new):
        return deletion.finalize(store, res, stored)[0]
    return stored


def delete(
    store: Store, res: Resource, ns: str, name: str, options: dict[str, Any]
) -> tuple[Stored, bool]:
    """Delete an object with DeleteOptions ``options`` (``gracePeriodSeconds``,
    ``preconditions``): its last state and whether it is gone."""
    with store.lock:
        found = get(store, res, ns, name)
        _check_preconditions(res, name, found, options.get("preconditions") or {})
        grace = options.get("gracePeriodSeconds")
        return deletion.delete(store, res, found, None if grace is None else int(grace))

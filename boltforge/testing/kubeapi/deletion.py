"""Deletion as kube-apiserver does it.

- An object with ``metadata.finalizers`` is not removed: it gets a ``deletionTimestamp`` and
  goes when an update empties its finalizers.
- A pod is deleted gracefully: an unbound pod (no ``spec.nodeName``), a pod in phase
  Succeeded or Failed, and a grace of 0 remove it at once; any other gets
  ``deletionTimestamp`` (now plus the grace) and ``deletionGracePeriodSeconds`` (the
  request's grace, else ``spec.terminationGracePeriodSeconds``, else 30) and stays until its
  kubelet removes it (here the kubelet emulation; with it off, until a delete with grace 0).
  A second delete may shorten the grace, never lengthen it."""

from __future__ import annotations

import time

from boltforge.testing.kubeapi.objects import JSON, meta, section, timestamp
from boltforge.testing.kubeapi.resources import PODS, Resource
from boltforge.testing.kubeapi.store import Store, Stored

TERMINAL = ("Succeeded", "Failed")


def delete(store: Store, res: Resource, stored: Stored, grace: int | None) -> tuple[Stored, bool]:
    """Delete ``stored``: its last state and whether it is gone (rather than terminating)."""
    if res is PODS:
        return delete_pod(store, stored, grace)
    return finalize(store, res, stored)


def finalize(store: Store, res: Resource, stored: Stored) -> tuple[Stored, bool]:
    """Remove ``stored`` now, or, while it has finalizers, mark it deleted and keep it."""
    md = stored.obj["metadata"]
    if not md.get("finalizers"):
        gone = store.remove(res.plural, md.get("namespace", ""), md["name"])
        return gone or stored, True
    if md.get("deletionTimestamp") and md.get("deletionGracePeriodSeconds") == 0:
        return stored, False
    obj = stored.copy()
    obj["metadata"].setdefault("deletionTimestamp", timestamp())
    obj["metadata"]["deletionGracePeriodSeconds"] = 0
    return store.put(res.plural, obj), False


def pod_grace(pod: JSON, requested: int | None) -> int:
    """The grace, in seconds, a delete of ``pod`` gets."""
    spec, status = section(pod, "spec"), section(pod, "status")
    if not spec.get("nodeName") or status.get("phase") in TERMINAL:
        return 0
    if requested is not None:
        return max(0, int(requested))
    return max(0, int(spec.get("terminationGracePeriodSeconds", 30)))


def delete_pod(store: Store, stored: Stored, requested: int | None) -> tuple[Stored, bool]:
    grace = pod_grace(stored.obj, requested)
    if grace == 0:
        return finalize(store, PODS, stored)
    md = stored.obj["metadata"]
    if md.get("deletionTimestamp") and md.get("deletionGracePeriodSeconds", grace) <= grace:
        return stored, False
    obj = stored.copy()
    obj["metadata"]["deletionTimestamp"] = timestamp(time.time() + grace)
    obj["metadata"]["deletionGracePeriodSeconds"] = grace
    return store.put(PODS.plural, obj), False


def removable(res: Resource, obj: JSON) -> bool:
    """Whether ``obj``, just updated, is deleted with nothing left to wait for: no finalizers
    and, for a bound pod, its grace over."""
    md = meta(obj)
    if not md.get("deletionTimestamp") or md.get("finalizers"):
        return False
    pending = res is PODS and md.get("deletionGracePeriodSeconds") != 0
    return not (pending and section(obj, "spec").get("nodeName"))

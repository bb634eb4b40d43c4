"""PodDisruptionBudgets and the Eviction API, as kube-apiserver and its disruption
controller apply them.

A budget selects the pods of its namespace (``spec.selector``; an empty selector selects
them all). Of those, the *expected* pods are the ones not being deleted and the *healthy*
ones those also in phase Running; ``minAvailable`` or ``maxUnavailable`` (an integer or a
percentage of the expected pods, rounded up) gives the healthy pods desired, and
``disruptionsAllowed`` is healthy minus desired (never below 0). A pod being evicted is
deleted gracefully at once, so an eviction in progress already counts against the budget.
``status`` is computed afresh on every read, and written back (an update that watches see)
by a controller shortly after pods or budgets of its namespace change.

An eviction of a pod whose budgets allow no disruption is 429 TooManyRequests with the
budget's cause; other evictions (and those of pods Pending, Succeeded, Failed or already
being deleted, which ignore budgets as kube-apiserver's do) delete the pod with the
eviction's ``deleteOptions.gracePeriodSeconds`` and answer 201 Success. Unlike
kube-apiserver, a pod under several budgets is checked against each (rather than refused
with 500), and ``unhealthyPodEvictionPolicy`` is not read."""

from __future__ import annotations

import math
from typing import Any

from boltforge.testing.kubeapi import deletion
from boltforge.testing.kubeapi.errors import ApiError, not_found
from boltforge.testing.kubeapi.objects import JSON, deleting, meta, section, set_condition
from boltforge.testing.kubeapi.resources import PDBS, PODS
from boltforge.testing.kubeapi.selectors import from_spec
from boltforge.testing.kubeapi.store import Change, Store, Stored

IGNORES_BUDGET = ("Pending", "Succeeded", "Failed")
REFUSED = "Cannot evict pod as it would violate the pod's disruption budget."


def selects(pdb: JSON, pod: JSON) -> bool:
    selector = from_spec(section(pdb, "spec").get("selector"))
    return selector is not None and selector.matches_object(pod)


def status(store: Store, pdb: JSON) -> JSON:
    """``pdb``'s status as it is now."""
    ns = meta(pdb).get("namespace", "")
    pods = [p.obj for p in store.items(PODS.plural, ns) if selects(pdb, p.obj)]
    live = [p for p in pods if not deleting(p)]
    healthy = sum(1 for p in live if section(p, "status").get("phase") == "Running")
    desired = desired_healthy(section(pdb, "spec"), len(live))
    allowed = max(0, healthy - desired)
    current: JSON = {**(pdb.get("status") or {})}
    current.update(
        currentHealthy=healthy,
        desiredHealthy=desired,
        disruptionsAllowed=allowed,
        expectedPods=len(live),
        observedGeneration=meta(pdb).get("generation", 1),
    )
    current.setdefault("disruptedPods", {})
    current["conditions"] = [dict(c) for c in current.get("conditions") or []]
    reason = "SufficientPods" if allowed else "InsufficientPods"
    set_condition(current, "DisruptionAllowed", "True" if allowed else "False", reason, "")
    return current


def desired_healthy(spec: JSON, expected: int) -> int:
    if spec.get("minAvailable") is not None:
        return _scaled(spec["minAvailable"], expected)
    if spec.get("maxUnavailable") is not None:
        return max(0, expected - _scaled(spec["maxUnavailable"], expected))
    return 0


def _scaled(value: Any, total: int) -> int:
    """An IntOrString against ``total``: ``"50%"`` rounds up."""
    if isinstance(value, str) and value.endswith("%"):
        return math.ceil(int(value[:-1]) * total / 100)
    return int(value)


def with_status(store: Store, stored: Stored) -> JSON:
    """The budget as a read answers it: with its status computed now."""
    pdb = stored.copy()
    pdb["status"] = status(store, pdb)
    return pdb


def evict(store: Store, namespace: str, name: str, eviction: JSON) -> None:
    """Evict pod ``name`` or raise (404, or 429 naming the budget that refuses)."""
    grace = (eviction.get("deleteOptions") or {}).get("gracePeriodSeconds")
    with store.lock:
        found = store.get(PODS.plural, namespace, name)
        if found is None:
            raise not_found(PODS, name)
        pod = found.obj
        if section(pod, "status").get("phase") not in IGNORES_BUDGET and not deleting(pod):
            for pdb in store.items(PDBS.plural, namespace):
                if selects(pdb.obj, pod):
                    _check(store, pdb.obj)
        deletion.delete_pod(store, found, grace)


def _check(store: Store, pdb: JSON) -> None:
    now = status(store, pdb)
    if now["disruptionsAllowed"] > 0:
        return
    cause = (
        f"The disruption budget {meta(pdb)['name']} needs {now['desiredHealthy']} healthy "
        f"pods and has {now['currentHealthy']} currently"
    )
    details = {"causes": [{"reason": "DisruptionBudget", "message": cause}]}
    raise ApiError(429, REFUSED, "TooManyRequests", details)


class DisruptionController:
    """Writes budgets' status back when pods or budgets of their namespace change:
    ``observe`` (a store listener) notes the namespace, ``sync`` (called every
    ``interval_s`` on the server's loop) writes the statuses that changed."""

    interval_s = 0.1

    def __init__(self, store: Store) -> None:
        self._store = store
        self._dirty: set[str] = set()

    def observe(self, change: Change) -> None:
        wanted = change.resource in (PODS.plural, PDBS.plural)
        if wanted and self._store.count(PDBS.plural, change.namespace):
            self._dirty.add(change.namespace)

    def sync(self) -> None:
        with self._store.lock:
            spaces, self._dirty = self._dirty, set()
            for ns in spaces:
                for pdb in self._store.items(PDBS.plural, ns):
                    self._write(pdb)

    def _write(self, stored: Stored) -> None:
        now = status(self._store, stored.obj)
        old = dict(stored.obj.get("status") or {})
        if _comparable(now) != _comparable(old):
            obj = stored.copy()
            obj["status"] = now
            self._store.put(PDBS.plural, obj)


def _comparable(st: JSON) -> JSON:
    conditions = [
        {k: v for k, v in c.items() if k != "lastTransitionTime"}
        for c in st.get("conditions") or []
    ]
    return {**st, "conditions": conditions}

"""The PodDisruptionBudgets of a cluster, indexed so that a budget's status costs the pods
it selects rather than every pod: pods by label (namespace, key, value) and budgets by one
equality (or ``In``) requirement of their selector; a budget with none is checked against
every pod of its namespace. ``observe`` (a store listener) keeps the indexes and notes the
budgets a change may affect; ``sync`` (the disruption controller, run every ``interval_s``)
writes back the statuses that changed, as updates watches see. Reads compute status afresh.

Also the Eviction API: an eviction of a pod whose budgets allow no disruption is 429
TooManyRequests with the budget's cause; any other (and any of a pod Pending, Succeeded,
Failed or already being deleted, which ignore budgets as kube-apiserver's do) deletes the
pod with the eviction's ``deleteOptions.gracePeriodSeconds`` (see ``deletion``). Unlike
kube-apiserver, a pod under several budgets is checked against each (rather than refused
with 500), and ``unhealthyPodEvictionPolicy`` is not read."""

from __future__ import annotations

from boltforge.testing.kubeapi import deletion, disruption
from boltforge.testing.kubeapi.errors import not_found
from boltforge.testing.kubeapi.objects import JSON, deleting, meta, section
from boltforge.testing.kubeapi.resources import PDBS, PODS
from boltforge.testing.kubeapi.selectors import LabelSelector, from_spec
from boltforge.testing.kubeapi.store import DELETED, Change, Store, Stored

Anchor = tuple[str, str, str]  # namespace, label key, label value
IGNORES_BUDGET = ("Pending", "Succeeded", "Failed")


def _pairs(selector: LabelSelector) -> list[tuple[str, str]] | None:
    """The label pairs one of which every selected pod has; None when there is none."""
    for req in selector.requirements:
        if req.op in ("=", "in"):
            return [(req.key, v) for v in sorted(req.values)]
    return None


def _labels(stored: Stored | None) -> set[tuple[str, str]]:
    return set(((stored.obj["metadata"].get("labels") or {}) if stored else {}).items())


class Budgets:
    """Indexes, status and the disruption controller over ``store``."""

    interval_s = 0.1

    def __init__(self, store: Store) -> None:
        self._store = store
        self._pods: dict[Anchor, set[str]] = {}
        self._budgets: dict[Anchor, set[str]] = {}
        self._open: dict[str, set[str]] = {}
        self._dirty: set[tuple[str, str]] = set()

    def observe(self, change: Change) -> None:
        if change.resource == PODS.plural:
            self._pod_changed(change)
        elif change.resource == PDBS.plural:
            self._budget_changed(change)

    def _pod_changed(self, change: Change) -> None:
        ns, name = change.namespace, change.new.obj["metadata"]["name"]
        old = _labels(change.old)
        new = set() if change.type == DELETED else _labels(change.new)
        for pair in old - new:
            self._pods.get((ns, *pair), set()).discard(name)
        for pair in new - old:
            self._pods.setdefault((ns, *pair), set()).add(name)
        affected = set(self._open.get(ns, ()))
        for pair in old | new:
            affected |= self._budgets.get((ns, *pair), set())
        self._dirty.update((ns, b) for b in affected)

    def _budget_changed(self, change: Change) -> None:
        ns, name = change.namespace, change.new.obj["metadata"]["name"]
        if change.old is not None:
            self._index(ns, name, change.old.obj, add=False)
        if change.type == DELETED:
            return
        self._index(ns, name, change.new.obj, add=True)
        if change.old is None or change.old.obj.get("spec") != change.new.obj.get("spec"):
            self._dirty.add((ns, name))

    def _index(self, ns: str, name: str, pdb: JSON, add: bool) -> None:
        selector = from_spec(section(pdb, "spec").get("selector"))
        pairs = _pairs(selector) if selector is not None else []
        buckets = [self._open.setdefault(ns, set())] if pairs is None else []
        buckets += [self._budgets.setdefault((ns, *pair), set()) for pair in pairs or []]
        for bucket in buckets:
            (bucket.add if add else bucket.discard)(name)

    def pods_of(self, pdb: JSON) -> list[JSON]:
        """The pods ``pdb`` selects."""
        selector = from_spec(section(pdb, "spec").get("selector"))
        if selector is None:
            return []
        ns, pairs = meta(pdb).get("namespace", ""), _pairs(selector)
        with self._store.lock:
            if pairs is None:
                candidates = self._store.items(PODS.plural, ns)
            else:
                names = set().union(*(self._pods.get((ns, *p), set()) for p in pairs))
                found = (self._store.get(PODS.plural, ns, n) for n in sorted(names))
                candidates = [s for s in found if s is not None]
        return [s.obj for s in candidates if selector.matches_object(s.obj)]

    def budgets_of(self, pod: JSON) -> list[JSON]:
        """The budgets that select ``pod``."""
        ns = meta(pod).get("namespace", "")
        with self._store.lock:
            names = set(self._open.get(ns, ()))
            for pair in (meta(pod).get("labels") or {}).items():
                names |= self._budgets.get((ns, *pair), set())
            found = (self._store.get(PDBS.plural, ns, n) for n in sorted(names))
            return [s.obj for s in found if s is not None and disruption.selects(s.obj, pod)]

    def status(self, pdb: JSON) -> JSON:
        return disruption.status(pdb, self.pods_of(pdb))

    def with_status(self, stored: Stored) -> JSON:
        """The budget as a read answers it: with its status computed now."""
        pdb = stored.copy()
        pdb["status"] = self.status(pdb)
        return pdb

    def sync(self) -> None:
        """Write back the statuses of the budgets noted since the last sync that changed."""
        with self._store.lock:
            dirty, self._dirty = self._dirty, set()
            for ns, name in sorted(dirty):
                stored = self._store.get(PDBS.plural, ns, name)
                if stored is not None:
                    self._write(stored)

    def _write(self, stored: Stored) -> None:
        now = self.status(stored.obj)
        old = disruption.comparable(dict(stored.obj.get("status") or {}))
        if disruption.comparable(now) != old:
            obj = stored.copy()
            obj["status"] = now
            self._store.put(PDBS.plural, obj)

    def evict(self, namespace: str, name: str, eviction: JSON) -> None:
        """Evict pod ``name`` or raise (404, or 429 naming the budget that refuses)."""
        grace = (eviction.get("deleteOptions") or {}).get("gracePeriodSeconds")
        with self._store.lock:
            found = self._store.get(PODS.plural, namespace, name)
            if found is None:
                raise not_found(PODS, name)
            pod = found.obj
            if section(pod, "status").get("phase") not in IGNORES_BUDGET and not deleting(pod):
                for pdb in self.budgets_of(pod):
                    disruption.check(pdb, self.status(pdb))
            deletion.delete_pod(self._store, found, grace)

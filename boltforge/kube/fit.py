"""Which nodes a pod may run on, as the kubelet admits it and the default scheduler filters:
its ``nodeSelector``, its required node affinity (``nodeSelectorTerms``: any one term, each
term's ``matchExpressions`` on labels and ``matchFields`` on ``metadata.name`` all holding)
and its tolerations against the node's ``NoSchedule``/``NoExecute`` taints.

The core places a gang by pool, so a gang with such needs is given the pools whose every
usable node it may run on (``Fitter.pools``); one whose nodes are part of a pool is refused
with the fix (give those nodes a pool of their own). Pure functions over parsed objects."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from boltforge.kube.model import KubeNode, KubePod, Requirement, Term
from boltforge.kube.taints import Toleration, blocking
from boltforge.kube.translate import FitsNowhere, Unplaceable


def holds(req: Requirement, value: str | None) -> bool:
    """A requirement on one label (or field) whose value is ``value`` (None: absent)."""
    op = req.operator
    if op == "In":
        return value is not None and value in req.values
    if op == "NotIn":
        return value is None or value not in req.values
    if op == "Exists":
        return value is not None
    if op == "DoesNotExist":
        return value is None
    if op in ("Gt", "Lt") and value is not None and len(req.values) == 1:
        try:
            mine, theirs = int(value), int(req.values[0])
        except ValueError:
            return False
        return mine > theirs if op == "Gt" else mine < theirs
    return False


def term_holds(term: Term, node: KubeNode) -> bool:
    """A ``nodeSelectorTerm``; one with no requirement selects nothing, as in Kubernetes."""
    if not term.expressions and not term.fields:
        return False
    fields = {"metadata.name": node.name}
    return all(holds(r, node.labels.get(r.key)) for r in term.expressions) and all(
        holds(r, fields.get(r.key)) for r in term.fields
    )


def why_not(pod: KubePod, node: KubeNode, tolerated: Sequence[Toleration] = ()) -> str | None:
    """Why ``pod`` may not run on ``node`` (None: it may), in the default scheduler's words;
    ``tolerated``: tolerations the scheduler adds on behalf of every pod."""
    for key, value in pod.node_selector.items():
        if node.labels.get(key) != value:
            return f"nodeSelector {key}={value} does not match"
    if pod.affinity and not any(term_holds(t, node) for t in pod.affinity):
        return "required node affinity does not match"
    kept = blocking(node.taints, (*pod.tolerations, *tolerated))
    if kept:
        return f"taint {kept[0]} is not tolerated"
    return None


@dataclass(frozen=True)
class Needs:
    """What a pod asks of its node (pods of one template share it)."""

    selector: tuple[tuple[str, str], ...]
    affinity: tuple[Term, ...]
    tolerations: tuple[Toleration, ...]


def needs(pod: KubePod) -> Needs:
    return Needs(tuple(sorted(pod.node_selector.items())), pod.affinity, pod.tolerations)


class Fitter:
    """The nodes a gang may use, for one pass: ``nodes`` (parsed), each usable node's pool
    (``pool_of``: the registered ones not unschedulable), the tolerations added for every pod.
    Answers are kept by ``Needs``, so gangs of one template cost one look at the fleet."""

    def __init__(
        self,
        nodes: Mapping[str, KubeNode],
        pool_of: Mapping[str, str],
        tolerated: Sequence[Toleration],
        pool_label: str,
    ) -> None:
        self.usable = {n: nodes[n] for n in pool_of if n in nodes}
        self.pool_of, self.tolerated, self.pool_label = pool_of, tuple(tolerated), pool_label
        self._plain = not any(
            blocking(n.taints, self.tolerated) for n in self.usable.values()
        )  # no usable node keeps off a pod without tolerations
        self._fits: dict[Needs, tuple[frozenset[str], Counter[str]]] = {}

    def pools(self, pods: Iterable[KubePod]) -> list[str]:
        """The pools the gang of ``pods`` may be placed in: [] for any; raises
        ``Unplaceable`` when no usable node, or no whole pool, fits every pod."""
        kinds = {needs(p): p for p in pods}
        if not self.usable or all(self._free(k) for k in kinds):
            return []
        fits = frozenset(self.usable)
        for kind, pod in kinds.items():
            mine, why = self._fit(kind, pod)
            if not mine & fits:
                raise FitsNowhere(_none_fit(pod, len(self.usable), why))
            fits &= mine
        if len(fits) == len(self.usable):
            return []
        return self._whole_pools(fits)

    def _free(self, kind: Needs) -> bool:
        return self._plain and not kind.selector and not kind.affinity

    def _fit(self, kind: Needs, pod: KubePod) -> tuple[frozenset[str], Counter[str]]:
        known = self._fits.get(kind)
        if known is None:
            why: Counter[str] = Counter()
            fits = set()
            for name, node in self.usable.items():
                no = why_not(pod, node, self.tolerated)
                if no is None:
                    fits.add(name)
                else:
                    why[no] += 1
            known = self._fits[kind] = (frozenset(fits), why)
        return known

    def _whole_pools(self, fits: frozenset[str]) -> list[str]:
        members: dict[str, list[str]] = {}
        for name in self.usable:
            members.setdefault(self.pool_of[name], []).append(name)
        whole = sorted(p for p, names in members.items() if all(n in fits for n in names))
        if whole:
            return whole
        split = sorted({self.pool_of[n] for n in fits})
        raise Unplaceable(
            f"the {len(fits)} nodes its pods may run on ({_some(sorted(fits))}) share pool "
            f"{', '.join(split)} with nodes they may not, and Boltforge places a gang by pool. "
            f"To fix: give those nodes a pool of their own (node label {self.pool_label})"
        )


def _none_fit(pod: KubePod, total: int, why: Counter[str]) -> str:
    reasons = "; ".join(f"{n} nodes: {w}" for w, n in why.most_common(3))
    return (
        f"no node may run pod {pod.name}: 0 of {total} nodes fit ({reasons}). To fix: its "
        "nodeSelector, node affinity or tolerations, or the nodes' labels and taints"
    )


def _some(names: list[str], most: int = 5) -> str:
    more = f" and {len(names) - most} more" if len(names) > most else ""
    return ", ".join(names[:most]) + more

"""The crossing cost of a placement: ring all-reduce hops weighted by the level they cross.

A gang's collective is modelled as one ring through all of a role's GPUs in topology order.
Of its hops, those inside an NVLink island cost ``nvlink``; those between islands of one host
cost ``host``; between hosts of one rack ``rack``; between racks of one pod ``pod``; between
pods ``spine``. A data-parallel replica whose GPUs sit on other local indices than its peers'
(off-rail) pays ``rail`` once. CPU-only roles run no collective and cost nothing.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from boltforge.core.model.state import Grant
from boltforge.core.model.topology import TopologyTree

LEVEL_KEYS = ("nvlink", "host", "rack", "pod", "spine", "rail")


@dataclass(frozen=True, slots=True)
class CostBreakdown:
    """Hop counts per level and the weighted total."""

    hops: dict[str, int]
    total: float

    def weighted(self, tree: TopologyTree) -> dict[str, float]:
        w = tree.weights
        return {k: self.hops[k] * float(getattr(w, k)) for k in LEVEL_KEYS}


def role_cost(tree: TopologyTree, grants: list[Grant]) -> CostBreakdown:
    """Cost of one role's grants (all replicas of that role)."""
    hops = dict.fromkeys(LEVEL_KEYS, 0)
    if not grants or not any(g.gpus for g in grants):
        return CostBreakdown(hops, 0.0)
    if len(grants) == 1:
        return one_host_cost(tree, grants[0].host, grants[0].gpus)
    per_host: dict[int, list[int]] = defaultdict(list)
    for g in grants:
        per_host[g.host].extend(g.gpus)
    for host, gpus in per_host.items():
        islands = set(tree.gpu_island[host, gpus].tolist())
        hops["nvlink"] += len(gpus) - len(islands)
        hops["host"] += len(islands) - 1
    if len(per_host) > 1:
        hosts = list(per_host)
        racks = set(tree.host_rack[hosts].tolist())
        pods = set(tree.host_pod[hosts].tolist())
        hops["rack"] = len(per_host) - len(racks)
        hops["pod"] = len(racks) - len(pods)
        hops["spine"] = len(pods) - 1
        hops["rail"] = misaligned_replicas(grants)
    w = tree.weights
    total = sum(hops[k] * float(getattr(w, k)) for k in LEVEL_KEYS)
    return CostBreakdown(hops, total)


def one_host_cost(tree: TopologyTree, host: int, gpus: tuple[int, ...]) -> CostBreakdown:
    """Cost of one replica's ring on one host: NVLink hops inside islands, host hops between."""
    island_of = tree.host_lists.island[host]
    islands = len({island_of[g] for g in gpus})
    nvlink, host_hops = len(gpus) - islands, islands - 1
    hops = {"nvlink": nvlink, "host": host_hops, "rack": 0, "pod": 0, "spine": 0, "rail": 0}
    w = tree.weights
    return CostBreakdown(hops, nvlink * float(w.nvlink) + host_hops * float(w.host))


def misaligned_replicas(grants: list[Grant]) -> int:
    """Replicas whose local GPU indices match none of the lead host's replicas.

    The lead host is the one holding the most replicas (the lowest index on ties); a replica
    elsewhere is on-rail when some lead replica uses exactly the same local GPU indices.
    """
    by_host: dict[int, list[tuple[int, ...]]] = defaultdict(list)
    for g in grants:
        by_host[g.host].append(tuple(sorted(g.gpus)))
    lead = min(by_host, key=lambda h: (-len(by_host[h]), h))
    template = set(by_host[lead])
    return sum(gpus not in template for sets in by_host.values() for gpus in sets)


def add(a: CostBreakdown, b: CostBreakdown) -> CostBreakdown:
    return CostBreakdown({k: a.hops[k] + b.hops[k] for k in LEVEL_KEYS}, a.total + b.total)


ZERO = CostBreakdown(dict.fromkeys(LEVEL_KEYS, 0), 0.0)

"""Minimum-cost choice of hosts for one role: a dynamic program over racks, pods and the spine.

Overview. A role needs ``R`` replicas. ``HostFit`` says how many each host can take and what
that costs inside the host. The cost of a choice is the ring all-reduce's hops weighted by level:
host hops inside each rack, rack hops inside each pod, pod hops across the spine. So:

1. *Racks.* Inside a rack only the number of hosts used matters at rack level, so hosts are
   filled in order of capacity (largest first, cheapest inside, fullest first). ``rack_cost[k, r]``
   is the cost of ``r`` replicas in rack ``k``.
2. *Pods.* A pod's cost for ``r`` replicas is the cheapest split of ``r`` over its racks plus one
   pod hop per extra rack: a min-plus convolution folded over the racks, keeping the argmin so
   the split can be read back.
3. *Spine.* The same fold over pods.
4. *Candidates.* The best single host, rack and pod (and the whole fleet) that fit are candidates;
   the cheapest wins, and the rest become the alternatives in the explanation. A small term
   proportional to the free GPUs left in the touched domains breaks ties toward best fit, so the
   largest empty blocks survive for the next big job.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from boltforge.core.model.levels import Level
from boltforge.core.model.topology import FloatArray, IntArray, TopologyTree
from boltforge.core.placement.hostfit import HostFit

# Weight of one leftover free GPU in a touched domain: far below any hop weight, so it only
# orders placements of equal crossing cost.
TIE_BREAK = 1e-6
_INF = np.inf


@dataclass(frozen=True, slots=True)
class DomainCandidate:
    """One way to place a role: replicas per host, inside one domain at ``level``."""

    level: Level
    domain: int
    value: float
    counts: dict[int, int]


@dataclass(frozen=True, slots=True)
class RoleSearch:
    """The dynamic program's tables for one role (see module docstring)."""

    replicas: int
    fit: HostFit
    rack_order: IntArray  # (racks, hosts per rack) host ids in fill order, -1 padded
    rack_before: IntArray  # (racks, hosts per rack) replicas held by hosts ahead in fill order
    rack_slots: IntArray  # (racks, hosts per rack) slots in fill order
    rack_cost: FloatArray  # (racks, R+1)
    pod_cost: FloatArray  # (pods, R+1)
    pod_split: IntArray  # (pods, racks per pod, R+1)
    spine_cost: FloatArray  # (R+1,)
    spine_split: IntArray  # (1, pods, R+1)
    host_split: IntArray | None = None  # (racks, hosts per rack, R+1) when racks were folded


def run(
    tree: TopologyTree, fit: HostFit, replicas: int, gpus: int, cap: Level = Level.SPINE
) -> RoleSearch:
    """Fill the racks, pods and spine tables for ``replicas`` replicas of ``gpus`` GPUs.

    The pod and spine folds are skipped (left infinite) when ``cap`` stops at a rack, or when
    replicas take whole hosts (so rails cannot add cost) and the best single rack already costs
    no more than any placement spanning two racks could (``spread_bound``): the common case of
    a large gang that fits one rack.
    """
    w = tree.weights
    host_split = None
    if _linear(fit, gpus, tree.weights.nvlink):
        order, before, slots, rack_cost = _racks(tree, fit, replicas, gpus)
    else:
        order, before, slots = tree.rack_hosts, tree.rack_hosts * 0, tree.rack_hosts * 0
        rack_cost, host_split = _racks_exact(tree, fit, replicas, gpus)
    n_pods, width = len(tree.pod_names), replicas + 1
    best_rack = float(rack_cost[:, replicas].min()) if len(rack_cost) else _INF
    whole_hosts = bool(np.all(tree.host_gpus[fit.slots > 0] <= gpus))  # never off-rail
    skip = whole_hosts and best_rack <= spread_bound(tree, fit, replicas, gpus)
    if cap <= Level.RACK or skip:
        pod_cost = np.full((n_pods, width), _INF)
        pod_cost[:, 0] = 0.0
        pod_split = np.zeros((n_pods, tree.pod_racks.shape[1], width), dtype=np.int64)
        spine_cost, spine_split = pod_cost[:1].copy(), pod_split[:1, :1].copy()
    else:
        pad_row = np.full((1, width), _INF)
        pad_row[0, 0] = 0.0
        by_pod = np.concatenate([rack_cost, pad_row])[tree.pod_racks]
        pod_cost, pod_split = fold(by_pod, w.pod)
        spine_cost, spine_split = fold(pod_cost[None, :, :], w.spine)
    return RoleSearch(
        replicas,
        fit,
        order,
        before,
        slots,
        rack_cost,
        pod_cost,
        pod_split,
        spine_cost[0],
        spine_split,
        host_split,
    )


def _linear(fit: HostFit, gpus: int, nvlink: float) -> bool:
    """True when every host's inner cost is NVLink hops only (one island holds what it takes).

    Then only the number of hosts matters inside a rack and filling the roomiest hosts first
    is optimal; otherwise the rack is solved exactly by folding over its hosts.
    """
    if gpus == 0:
        return True
    k = np.arange(fit.intra.shape[1])
    linear = np.where(k == 0, 0.0, (k * gpus - 1) * nvlink)
    finite = np.isfinite(fit.intra)
    return bool(np.all(np.abs(fit.intra - linear[None, :])[finite] < 1e-9))


def _racks_exact(
    tree: TopologyTree, fit: HostFit, replicas: int, gpus: int
) -> tuple[FloatArray, IntArray]:
    """Rack costs by a min-plus fold over each rack's hosts (exact for any inner costs)."""
    hosts = tree.rack_hosts
    kmax = fit.intra.shape[1] - 1
    width = replicas + 1
    pad = np.full((1, kmax + 1), _INF)
    pad[0, 0] = 0.0
    intra = np.concatenate([fit.intra, pad])
    k = np.arange(width)
    per_host = intra[hosts][:, :, np.minimum(k, kmax)]
    per_host[:, :, k > kmax] = _INF
    free = np.append(fit.free, 0)[hosts]
    per_host += TIE_BREAK * np.maximum(free[:, :, None] - k[None, None, :] * gpus, 0)
    per_host[:, :, 0] = 0.0
    rack_cost, split = fold(per_host, tree.weights.rack)
    leftover = np.maximum(free.sum(axis=1)[:, None] - k[None, :] * gpus, 0)
    rack_cost = rack_cost + TIE_BREAK * leftover
    rack_cost[:, 0] = 0.0
    return rack_cost, split


def spread_bound(tree: TopologyTree, fit: HostFit, replicas: int, gpus: int) -> float:
    """A lower bound on the cost of any placement that spans two racks or more.

    With ``N`` GPUs on ``H`` hosts, every host's internal hops cost at least NVLink, so the
    ring costs at least ``(N - H)·nvlink + (H - 2)·rack + pod``; since a rack hop costs no less
    than an NVLink hop this grows with ``H``, so the fewest hosts that can hold the replicas give
    the bound.
    """
    w = tree.weights
    held = np.cumsum(np.sort(fit.slots)[::-1])
    fewest = int(np.searchsorted(held, replicas)) + 1
    total = replicas * gpus
    return (total - fewest) * w.nvlink + max(fewest - 2, 0) * w.rack + w.pod


def _racks(
    tree: TopologyTree, fit: HostFit, replicas: int, gpus: int
) -> tuple[IntArray, IntArray, IntArray, FloatArray]:
    hosts = tree.rack_hosts
    valid = hosts >= 0
    kmax = fit.intra.shape[1] - 1
    slots = np.where(valid, fit.slots[hosts], 0)
    most = fit.intra[hosts, np.minimum(np.minimum(fit.slots[hosts], replicas), kmax)]
    inside = np.where(valid, most, _INF)
    free = np.where(valid, fit.free[hosts], 0)
    # Fill order: more slots first, then cheaper inside the host when filled, then fuller.
    key = -slots * 1e6 + np.minimum(inside, 999.0) * 100.0 + np.minimum(free, 99)
    idx = np.argsort(key, axis=1, kind="stable")
    order = np.where(np.take_along_axis(valid, idx, 1), np.take_along_axis(hosts, idx, 1), -1)
    s = np.take_along_axis(slots, idx, 1)
    before = np.cumsum(s, axis=1) - s  # replicas held by the hosts ahead of each host
    r = np.arange(replicas + 1)
    # Hosts used for r replicas: those whose predecessors hold fewer than r.
    used = (before[:, :, None] < r[None, None, :]).sum(axis=1)  # (racks, R+1)
    used = np.where(r[None, :] == 0, 0, np.minimum(used, s.shape[1]))
    intra = np.concatenate([fit.intra, np.zeros((1, kmax + 1))])
    full = intra[order, np.minimum(s, kmax)]  # cost of filling each host completely
    full_before = np.concatenate([np.zeros((len(order), 1)), np.cumsum(full, axis=1)], axis=1)
    last = np.maximum(used - 1, 0)  # position of the partly filled host
    rows = np.arange(len(order))[:, None]
    share = r[None, :] - before[rows, last]
    partial = intra[order[rows, last], np.clip(share, 0, kmax)]
    cost = full_before[rows, last] + partial
    feasible = r[None, :] <= s.sum(axis=1)[:, None]
    leftover = np.maximum(free.sum(axis=1)[:, None] - r[None, :] * gpus, 0)
    rack_cost = cost + tree.weights.rack * np.maximum(used - 1, 0) + TIE_BREAK * leftover
    rack_cost = np.where(feasible, rack_cost, _INF)
    rack_cost[:, 0] = 0.0
    return order, before, s, rack_cost


def fold(children: FloatArray, hop: float) -> tuple[FloatArray, IntArray]:
    """Min-plus fold of children costs ``(N, J, R+1)`` into ``(N, R+1)``.

    Each used child beyond the first adds ``hop``. ``split[n, j, r]`` is how many of ``r``
    replicas child ``j`` takes when children ``0..j`` share them optimally.
    """
    n, j_count, width = children.shape
    g = children + hop
    g[:, :, 0] = 0.0
    r = np.arange(width)
    finite = np.isfinite(g)
    split = np.zeros((n, j_count, width), dtype=np.int64)
    split[:, 0, :] = r
    acc = g[:, 0, :]
    caps = np.any(finite, axis=0)  # (J, R+1): whether any parent's child j can take r
    diff = r[:, None] - r[None, :]  # [r, s] = r - s
    taken = np.maximum(diff, 0)
    invalid = np.where(diff >= 0, 0.0, _INF)
    for j in range(1, j_count):
        # Child j can take at most `cap` replicas anywhere, so only splits s <= cap matter.
        cap = int(np.flatnonzero(caps[j]).max())
        if cap == 0:
            continue  # this child can take nothing: every split gives it 0
        cand = acc[:, taken[:, : cap + 1]] + (g[:, j, None, : cap + 1] + invalid[:, : cap + 1])
        best = cand.argmin(axis=2)
        split[:, j, :] = best
        acc = np.take_along_axis(cand, best[:, :, None], axis=2)[:, :, 0]
    total = acc - hop
    total[:, 0] = 0.0
    return total, split


def unfold(split: IntArray, n: int, replicas: int) -> list[int]:
    """Read back how many replicas each child of parent ``n`` takes."""
    j_count = split.shape[1]
    out = [0] * j_count
    r = replicas
    for j in range(j_count - 1, 0, -1):
        out[j] = int(split[n, j, r])
        r -= out[j]
    out[0] = r
    return out


def candidates(
    tree: TopologyTree, fit: HostFit, search: RoleSearch, gpus: int, cap: Level
) -> list[DomainCandidate]:
    """The best placement in each level's single domain up to ``cap``, cheapest first.

    Equal costs go to the tightest fit: the fewest free GPUs left on the host, then in its rack,
    then in its pod, so whole empty racks and pods stay whole.
    """
    R = search.replicas
    pod_free = fit.pod_free
    out = host_candidates(tree, fit, R, gpus)
    if cap >= Level.RACK:
        out += _best(
            search.rack_cost[:, R],
            pod_free[tree.rack_pod],
            Level.RACK,
            lambda k: rack_counts(search, k, R),
        )
    if cap >= Level.POD:
        out += _best(
            search.pod_cost[:, R],
            np.zeros(len(pod_free)),
            Level.POD,
            lambda p: pod_counts(tree, search, p, R),
        )
    if cap >= Level.SPINE and np.isfinite(search.spine_cost[R]):
        counts = spine_counts(tree, search, R)
        out.append(DomainCandidate(Level.SPINE, 0, float(search.spine_cost[R]), counts))
    out.sort(key=lambda c: (round(c.value, 9), c.level))
    return _distinct(out)


def host_candidates(
    tree: TopologyTree, fit: HostFit, replicas: int, gpus: int
) -> list[DomainCandidate]:
    """The three best single hosts for all ``replicas``: cheapest inside, then tightest fit
    (fewest free GPUs left on the host, then in its rack, then in its pod)."""
    single = np.flatnonzero(fit.slots >= replicas)
    if not single.size:
        return []
    rack_free, pod_free = fit.rack_free, fit.pod_free
    k = min(replicas, fit.intra.shape[1] - 1)
    vals = fit.intra[single, k] + TIE_BREAK * np.maximum(fit.free[single] - replicas * gpus, 0)
    if single.size > 3:  # only hosts as cheap as the third best can rank in the top three
        keep = vals <= np.partition(vals, 2)[2] + 1e-12
        single, vals = single[keep], vals[keep]
    keys = (pod_free[tree.host_pod[single]], rack_free[tree.host_rack[single]], vals.round(9))
    out = []
    for i in np.lexsort(keys)[:3]:
        h = int(single[i])
        out.append(DomainCandidate(Level.HOST, h, float(vals[i]), {h: replicas}))
    return out


def _best(
    costs: FloatArray, then: FloatArray | IntArray, level: Level, counts_of: object
) -> list[DomainCandidate]:
    finite = np.flatnonzero(np.isfinite(costs))
    best = finite[np.lexsort((then[finite], costs[finite].round(9)))[:3]]
    assert callable(counts_of)
    return [DomainCandidate(level, int(d), float(costs[d]), counts_of(int(d))) for d in best]


def _distinct(cands: list[DomainCandidate]) -> list[DomainCandidate]:
    seen: set[frozenset[tuple[int, int]]] = set()
    out = []
    for c in cands:
        key = frozenset(c.counts.items())
        if key not in seen:
            seen.add(key)
            out.append(c)
    return out


def rack_counts(search: RoleSearch, rack: int, r: int) -> dict[int, int]:
    """Replicas per host when rack ``rack`` takes ``r`` replicas.

    Hosts fill in the table's order; the last, partly filled host is then swapped for the
    smallest host that still holds its share at no higher cost (best fit).
    """
    if search.host_split is not None:
        shares = unfold(search.host_split, rack, r)
        hosts = search.rack_order[rack]
        return {int(h): k for h, k in zip(hosts, shares, strict=True) if k > 0}
    order = search.rack_order[rack]
    slots = search.rack_slots[rack]
    take = np.clip(r - search.rack_before[rack], 0, slots)
    used = np.flatnonzero(take > 0)
    if used.size == 0:
        return {}
    counts = {int(order[p]): int(take[p]) for p in used}
    last = int(used[-1])
    share = int(take[last])
    intra = search.fit.intra
    k = min(share, intra.shape[1] - 1)
    free = search.fit.free
    best, best_cost = last, intra[order[last], k]
    for p in range(len(order) - 1, last, -1):
        h = order[p]
        tighter = free[h] < free[order[last]]
        if h >= 0 and tighter and slots[p] >= share and intra[h, k] <= best_cost:
            best, best_cost = p, intra[h, k]
            break
    if best != last:
        del counts[int(order[last])]
        counts[int(order[best])] = share
    return counts


def pod_counts(tree: TopologyTree, search: RoleSearch, pod: int, r: int) -> dict[int, int]:
    counts: dict[int, int] = {}
    for rack, share in zip(tree.pod_racks[pod], unfold(search.pod_split, pod, r), strict=True):
        if share:
            counts.update(rack_counts(search, int(rack), share))
    return counts


def spine_counts(tree: TopologyTree, search: RoleSearch, r: int) -> dict[int, int]:
    counts: dict[int, int] = {}
    for pod, share in enumerate(unfold(search.spine_split, 0, r)):
        if share:
            counts.update(pod_counts(tree, search, pod, share))
    return counts

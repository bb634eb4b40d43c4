"""Hierarchical queues with guaranteed and burst GPU quotas: admission, borrowing and reclaim.

Queues form a tree by path: ``org``, ``org/team``, ``org/team/project``; ``""`` is the root.
Quotas count GPUs per node pool; the key ``"*"`` means any pool.

- **Guaranteed** GPUs are an entitlement: a queue holding less than its guarantee may take the
  rest back from borrowers (``reclaimable_for``). A pool-specific entry guarantees GPUs of that
  pool; ``"*"`` guarantees that many more GPUs in pools without their own entry, counted over
  all those pools together (``{"*": 32}`` is 32 GPUs in total, not 32 in each pool).
- **Burst** is the most a queue may hold, borrowed GPUs included. A pool-specific entry caps
  that pool; ``"*"`` caps the queue's total over all pools. A queue without a burst entry is
  limited only by its ancestors.

**Entitlement holders.** The holder of a queue is its nearest ancestor-or-self that declares a
positive guarantee (the root when none does). Each holder owns a *pot*: its guarantee minus what
it passes on to the guaranteed queues whose holder-parent it is (a sub-queue's pool entry draws
on the holder's entry for that pool first, then on its ``"*"``; a sub-queue's ``"*"`` draws on
the holder's ``"*"``). Pots partition the guarantees, so a team using GPUs its sibling project
is guaranteed counts as borrowing them. The GPUs charged to the queues a holder holds for are
*borrowed* as far as they exceed its pot: per pool beyond the pool entry, and the sum of those
excesses beyond the ``"*"`` entry.

**Holdings** (``queue -> pool -> GPUs``) are charged to the queue a job was submitted to (the
leaf); a queue's holdings include those of every queue below it. Queues unknown to the tree
count where ``resolve`` puts them: at their nearest existing ancestor.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from types import MappingProxyType

ANY = "*"
ROOT = ""

Holdings = Mapping[str, Mapping[str, int]]


class QuotaError(ValueError):
    """Quotas that cannot be honoured; each problem names the queue, the numbers and a fix."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


@dataclass(frozen=True, slots=True)
class QueueSpec:
    """One queue's quotas: GPUs guaranteed and most GPUs held, per pool or ``"*"``."""

    path: str
    guaranteed: dict[str, int] = field(default_factory=dict)
    burst: dict[str, int] = field(default_factory=dict)
    weight: float = 1.0


@dataclass(frozen=True, slots=True)
class Verdict:
    """Whether a job may start now, how many of its GPUs are borrowed, and why, in words."""

    ok: bool
    borrowed: int
    reason: str


def lineage(queue: str) -> list[str]:
    """``queue`` and every path above it, nearest first, ending at the root (``""``)."""
    out = [queue]
    while queue:
        queue = queue.rpartition("/")[0]
        out.append(queue)
    return out


def within(queue: str, ancestor: str) -> bool:
    """True when ``queue`` is ``ancestor`` or lies below it (every queue lies below the root)."""
    return not ancestor or queue == ancestor or queue.startswith(ancestor + "/")


def held_by(holdings: Holdings, queue: str) -> dict[str, int]:
    """GPUs per pool held by ``queue`` and every queue below it."""
    out: dict[str, int] = {}
    for leaf, pools in holdings.items():
        if within(leaf, queue):
            for pool, n in pools.items():
                out[pool] = out.get(pool, 0) + n
    return out


def label(queue: str) -> str:
    """How messages name a queue."""
    return f"queue {queue}" if queue else "the root queue"


def _amounts(quota: Mapping[str, int]) -> str:
    return ", ".join(f"{'any pool' if k == ANY else k} {v}" for k, v in sorted(quota.items()))


@dataclass(frozen=True)
class QuotaTree:
    """The queue tree with its quotas; immutable. Make one with ``QuotaTree.build``.

    ``specs`` maps every queue, implicit ones and the root included, to its spec; ``pots`` maps
    every entitlement holder (and the root) to the GPUs it holds for its own queues.
    """

    specs: Mapping[str, QueueSpec]
    kids: Mapping[str, tuple[str, ...]]
    pots: Mapping[str, Mapping[str, int]]
    # what is derived from the tree alone, remembered per question (``fairshare``)
    answers: dict[object, object] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    @classmethod
    def build(cls, specs: Iterable[QueueSpec]) -> QuotaTree:
        """Validate ``specs``, add missing intermediate queues (no quota) and the root.

        Raises ``QuotaError`` listing every problem: duplicate or malformed paths, negative
        numbers, non-positive weights, a burst below the guarantee, or guarantees of sub-queues
        that do not fit in the guarantee of their nearest guaranteed ancestor.
        """
        given = _index(list(specs))
        full = {q: given.get(q) or QueueSpec(q) for p in given for q in lineage(p)}
        full.setdefault(ROOT, QueueSpec(ROOT))
        kids: dict[str, list[str]] = {q: [] for q in full}
        for q in full:
            if q:
                kids[lineage(q)[1]].append(q)
        pots, problems = _pots(full)
        if problems:
            raise QuotaError(problems)
        return cls(
            MappingProxyType(full),
            MappingProxyType({q: tuple(sorted(c)) for q, c in kids.items()}),
            MappingProxyType({h: MappingProxyType(p) for h, p in pots.items()}),
        )

    def __contains__(self, queue: object) -> bool:
        return queue in self.specs

    @cached_property
    def limits_any(self) -> bool:
        """Whether any queue has a guarantee or a burst limit. Without one, a job's queue
        never changes what it may take or reclaim, only where fair share ranks it."""
        return any(s.guaranteed or s.burst for s in self.specs.values())

    def resolve(self, queue: str) -> str:
        """``queue`` if the tree has it, else its nearest existing ancestor (at worst the root)."""
        return next(q for q in lineage(queue) if q in self.specs)

    def ancestors(self, queue: str) -> list[str]:
        """The resolved queue and every queue above it: itself first, the root ``""`` last."""
        return lineage(self.resolve(queue))

    def children(self, queue: str) -> tuple[str, ...]:
        """The queues directly below ``queue``, sorted (none for an unknown queue)."""
        return self.kids.get(queue, ())

    def guaranteed(self, queue: str, pool: str) -> int:
        """The pool's entry in the resolved queue's guarantee, else its ``"*"`` entry, else 0."""
        g = self.specs[self.resolve(queue)].guaranteed
        return g.get(pool, g.get(ANY, 0))

    def burst(self, queue: str, pool: str) -> int | None:
        """The pool's burst entry, else the ``"*"`` entry, else None (only ancestors limit it)."""
        b = self.specs[self.resolve(queue)].burst
        return b.get(pool, b.get(ANY))

    def weight(self, queue: str) -> float:
        """The resolved queue's fair-share weight among its siblings."""
        return self.specs[self.resolve(queue)].weight

    def holder(self, queue: str) -> str:
        """The entitlement holder: nearest ancestor-or-self with a positive guarantee, else root."""
        return next((q for q in self.ancestors(queue) if q in self.pots), ROOT)


def _index(specs: list[QueueSpec]) -> dict[str, QueueSpec]:
    problems: list[str] = []
    out: dict[str, QueueSpec] = {}
    for spec in specs:
        if spec.path in out:
            problems.append(
                f"{label(spec.path)} is defined twice. To fix: merge the two definitions"
            )
        problems += _spec_problems(spec)
        out[spec.path] = QueueSpec(spec.path, dict(spec.guaranteed), dict(spec.burst), spec.weight)
    if problems:
        raise QuotaError(problems)
    return out


def _spec_problems(spec: QueueSpec) -> list[str]:
    q, problems = label(spec.path), []
    if spec.path and ("" in spec.path.split("/") or spec.path != spec.path.strip()):
        problems.append(
            f"{spec.path!r} is not a queue path. To fix: write names joined by '/', like org/team"
        )
    for kind, quota in (("guarantee", spec.guaranteed), ("burst", spec.burst)):
        for pool, n in sorted(quota.items()):
            if n < 0:
                problems.append(
                    f"{q} has a negative {kind} of {n} for {'any pool' if pool == ANY else pool}."
                    f" To fix: use 0 or more GPUs"
                )
    if not (math.isfinite(spec.weight) and spec.weight > 0):
        problems.append(f"{q} has weight {spec.weight}. To fix: use a positive weight, like 1")
    return problems or _burst_problems(spec)


def _burst_problems(spec: QueueSpec) -> list[str]:
    q, g, problems = label(spec.path), spec.guaranteed, []
    for pool, limit in sorted(spec.burst.items()):
        need = sum(g.values()) if pool == ANY else g.get(pool, 0)
        if limit < need:
            where = "for all pools together" if pool == ANY else f"for pool {pool}"
            problems.append(
                f"{q} has a burst limit of {limit} GPUs {where}, below its guarantee of {need}."
                f" To fix: raise the burst to at least {need} or lower the guarantee"
            )
    return problems


def _guaranteed(spec: QueueSpec) -> bool:
    return any(n > 0 for n in spec.guaranteed.values())


def _pots(specs: Mapping[str, QueueSpec]) -> tuple[dict[str, dict[str, int]], list[str]]:
    """Each holder's pot, and a problem per holder whose sub-queues' guarantees do not fit."""
    holders = [q for q in specs if _guaranteed(specs[q])]
    pots: dict[str, dict[str, int]] = {h: dict(specs[h].guaranteed) for h in holders}
    pots.setdefault(ROOT, dict(specs[ROOT].guaranteed))
    draws: dict[str, list[str]] = {h: [] for h in pots}
    for q in holders:
        if q:
            draws[next(a for a in lineage(q)[1:] if a in pots)].append(q)
    problems: list[str] = []
    for h, subs in sorted(draws.items()):
        if subs and (h or _guaranteed(specs[ROOT])):
            short = _draw(pots[h], [specs[s].guaranteed for s in sorted(subs)])
            if short:
                problems.append(_short_problem(h, specs, sorted(subs), short))
    return pots, problems


def _draw(pot: dict[str, int], subs: list[dict[str, int]]) -> int:
    """Take ``subs``' guarantees out of ``pot`` in place; return how many GPUs it falls short."""
    spill = -pot.get(ANY, 0)
    for pool in sorted({p for g in subs for p in g} - {ANY}):
        want = sum(g.get(pool, 0) for g in subs)
        take = min(want, pot.get(pool, 0))
        if pool in pot:
            pot[pool] -= take
        spill += want - take
    spill += sum(g.get(ANY, 0) for g in subs)
    pot[ANY] = max(-spill, 0)
    return max(spill, 0)


def _short_problem(h: str, specs: Mapping[str, QueueSpec], subs: list[str], short: int) -> str:
    parts = ", ".join(f"{s} ({_amounts(specs[s].guaranteed)})" for s in subs)
    return (
        f"{label(h)} guarantees {_amounts(specs[h].guaranteed)}, but the queues below it are"
        f" guaranteed {short} GPU(s) more than that: {parts}."
        f" To fix: lower their guarantees by {short} or raise the guarantee of {label(h)}"
    )


def overage(pot: Mapping[str, int], held: Mapping[str, int]) -> int:
    """GPUs in ``held`` beyond ``pot``: per pool beyond its entry, then beyond ``"*"`` in all."""
    spill = sum(max(n - pot.get(p, 0), 0) for p, n in held.items() if p != ANY)
    return max(spill - pot.get(ANY, 0), 0)


def _group(tree: QuotaTree, holdings: Holdings, h: str) -> dict[str, dict[str, int]]:
    """The holdings charged to queues whose entitlement holder is ``h``."""
    return {q: dict(p) for q, p in holdings.items() if tree.holder(q) == h}


def _sum(groups: Iterable[Mapping[str, int]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for pools in groups:
        for pool, n in pools.items():
            out[pool] = out.get(pool, 0) + n
    return out


def _check_demand(demand: Mapping[str, int]) -> None:
    for pool, n in demand.items():
        if pool == ANY or n < 0:
            raise ValueError(f"demand {dict(demand)} must name pools with 0 or more GPUs each")


def admit(tree: QuotaTree, holdings: Holdings, queue: str, demand: Mapping[str, int]) -> Verdict:
    """May a job of ``queue`` needing ``demand`` (pool -> GPUs) start on top of ``holdings``?

    It may when, at the resolved queue and every ancestor up to the root, holdings plus demand
    stay within each burst limit the demand touches: per pool for pool entries, and over all
    pools for ``"*"``. ``borrowed`` is by how much the demand raises the overage of the queue's
    entitlement holder (see the module docstring): the number of the job's GPUs that land beyond
    the guarantees, reported whether or not the job may start.
    """
    _check_demand(demand)
    h = tree.holder(queue)
    before = _sum(_group(tree, holdings, h).values())
    borrowed = overage(tree.pots[h], _sum([before, demand])) - overage(tree.pots[h], before)
    for q in tree.ancestors(queue):
        refusal = _over_burst(tree, q, held_by(holdings, q), demand, queue)
        if refusal:
            return Verdict(False, borrowed, refusal)
    return Verdict(True, borrowed, _admitted(h, borrowed, sum(demand.values())))


def _over_burst(
    tree: QuotaTree, q: str, held: Mapping[str, int], demand: Mapping[str, int], asked: str
) -> str | None:
    limits = tree.specs[q].burst
    touched = [p for p in sorted(demand) if demand[p] > 0 and p in limits]
    checks = [(p, held.get(p, 0) + demand[p], limits[p]) for p in touched]
    if ANY in limits and sum(demand.values()) > 0:
        checks.append((ANY, sum(held.values()) + sum(demand.values()), limits[ANY]))
    for pool, would, limit in checks:
        if would > limit:
            return _refusal(q, asked, pool, would, limit)
    return None


def _refusal(q: str, asked: str, pool: str, would: int, limit: int) -> str:
    who = label(q) if q == asked else f"{label(q)} (which {asked} belongs to)"
    what = "across all pools" if pool == ANY else f"of pool {pool}"
    scope = " for all pools together" if pool == ANY else ""
    return (
        f"{who} would hold {would} GPUs {what}, above its burst limit of {limit}{scope}."
        f" To fix: wait for its running jobs, or raise burst for {q or 'the root queue'}"
    )


def _admitted(h: str, borrowed: int, gpus: int) -> str:
    if borrowed == 0:
        return f"fits within the guarantee of {label(h)}"
    return f"{borrowed} of its {gpus} GPU(s) are borrowed beyond the guarantee of {label(h)}"


def _apportion(total: int, weights: Mapping[str, int]) -> dict[str, int]:
    """Split ``total`` (at most the sum of weights) in proportion, largest remainder first."""
    whole = sum(weights.values())
    if total <= 0 or whole <= 0:
        return {}
    out = {k: total * w // whole for k, w in weights.items()}
    left = total - sum(out.values())
    for k in sorted(weights, key=lambda k: (-(total * weights[k] % whole), k))[:left]:
        out[k] += 1
    return {k: n for k, n in out.items() if n}


def borrowing(tree: QuotaTree, holdings: Holdings) -> dict[str, dict[str, int]]:
    """Per leaf queue and pool, the GPUs held beyond the guarantees: what owners may reclaim.

    Each holder's overage is split first over pools (its excess beyond the ``"*"`` entry, in
    proportion to each pool's excess beyond its own entry), then over the leaves it holds for, in
    proportion to what each holds in that pool (largest remainder; ties by name). The entries
    under one holder sum to its overage; only non-zero entries appear.
    """
    out: dict[str, dict[str, int]] = {}
    for h in sorted({tree.holder(q) for q in holdings}):
        group = _group(tree, holdings, h)
        held, pot = _sum(group.values()), tree.pots[h]
        excess = {p: max(n - pot.get(p, 0), 0) for p, n in held.items()}
        for pool, n in _apportion(overage(pot, held), excess).items():
            shares = {q: pools.get(pool, 0) for q, pools in group.items()}
            for q, m in _apportion(n, shares).items():
                out.setdefault(q, {})[pool] = m
    return out


def reclaimable_for(tree: QuotaTree, holdings: Holdings, queue: str, pool: str) -> int:
    """GPUs of ``pool`` the resolved queue is guaranteed but does not hold (all below included).

    That is the most it could add in ``pool`` and stay within its own guarantee: what is left of
    the pool's entry, plus what is left of ``"*"`` after the other pools' excesses.
    """
    _check_demand({pool: 0})
    g = tree.specs[tree.resolve(queue)].guaranteed
    held = held_by(holdings, tree.resolve(queue))
    own = max(g.get(pool, 0) - held.get(pool, 0), 0)
    return own + max(g.get(ANY, 0) - overage({p: n for p, n in g.items() if p != ANY}, held), 0)

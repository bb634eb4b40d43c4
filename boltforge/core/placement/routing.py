"""Cost-aware routing: which capacity tier and pool a job should run on.

Every pool a job may use is priced by its *effective* cost: what the job pays there for all
of its work, counting the work that interruptions throw away. Interruptions (spot reclaims,
node deaths) are modelled as a Poisson process of rate ``λ`` per second of the job's run.
Each one loses, on average, the work since the last checkpoint (half a checkpoint interval
``c``) plus the restart overhead ``r``::

    L = c/2 + r                      lost seconds per interruption
    f = 1 - λ L                      productive fraction of the time the job holds GPUs
    T = W / f   (f > 0, else ∞)      wall time for W seconds of work
    $ = price × GPUs × T / 3600      effective dollars
    finish = start + T

(a first-order model: it charges each interruption its expected loss once and ignores
interruptions during the restart itself; exact renewal models give ``T = W/c (1/λ + r)
(e^{λc} - 1)``, which agrees to first order in ``λ L``). A job that never checkpoints
(``c`` None or 0) restarts from scratch, so ``c = W``: it loses half its run on average per
interruption. A job with no runtime estimate is priced per hour of work (``W = 3600``) and
its deadline is not judged; if it also never checkpoints, any ``λ > 0`` makes the pool's
cost unbounded.

Pools whose finish misses the job's deadline rank after every pool that meets it (among
themselves by earliest finish). The rest rank by effective dollars; ties go to reserved
(already paid) before on-demand before spot. ``spot: prefer`` puts spot pools that meet the
deadline first, even when a cheaper reserved pool exists. ``spot: never`` drops spot pools.

**Break-even.** Spot stops being used for a job when its effective cost there exceeds that
of the reference pool (the cheapest on-demand pool the job may use, else the cheapest
reserved one)::

    p_spot / (1 - λ* L) = p_ref   ⇒   λ* = (1 - p_spot / p_ref) / L

so a spot pool is dropped when ``λ > λ*`` (exactly at ``λ*`` it ties and the tier order
decides), or when the job has already been interrupted on spot more than
``max_spot_interruptions`` times. Neither applies when the job has no other pool to go to.

Nothing here reads a clock or the store: rates, counts and start times come from the
caller (the control plane measures them, ``control/scheduling/interruptions.py``; the simulator may
pass its own).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from boltforge.core.model.gang import Gang, SpotPolicy
from boltforge.core.model.topology import Pool, Tier, TopologyTree
from boltforge.core.model.workload import Job
from boltforge.core.placement.answers import Placement

HOUR = 3600.0
TIER_ORDER = {Tier.RESERVED: 0, Tier.ON_DEMAND: 1, Tier.SPOT: 2}
_TOL = 1e-9


@dataclass(frozen=True, slots=True)
class Offer:
    """One pool a job may run on. ``interruptions_per_hour``: the rate at which the job's run
    there is interrupted (``job_rate`` turns a per-host rate into it); ``start``: when the job
    could start there (seconds, the caller's clock)."""

    name: str
    tier: Tier
    price_per_gpu_hour: float
    interruptions_per_hour: float = 0.0
    start: float = 0.0


@dataclass(frozen=True, slots=True)
class Needs:
    """What routing needs of a job: GPUs, seconds of work (None: unknown), checkpoint
    interval (None or 0: never checkpoints), restart overhead, deadline, spot policy, and how
    often it has been interrupted on spot so far."""

    gpus: int
    work_s: float | None
    checkpoint_interval_s: float | None = None
    restart_overhead_s: float = 60.0
    deadline: float | None = None
    spot: SpotPolicy = SpotPolicy.ALLOWED
    spot_interruptions: int = 0


@dataclass(frozen=True, slots=True)
class Priced:
    """One offer priced for one job (see the module docstring for the formulas)."""

    offer: Offer
    lost_per_interruption_s: float
    productive_fraction: float
    total_s: float
    dollars: float
    finish: float | None
    meets_deadline: bool | None
    excluded: str = ""


@dataclass(frozen=True, slots=True)
class Route:
    """Usable pools best first (``ranked``), the ones ruled out with why (``excluded``), and
    the reference price spot was held to (None: no non-spot pool to compare with)."""

    ranked: tuple[Priced, ...]
    excluded: tuple[Priced, ...]
    reference: Priced | None = None
    spot: SpotPolicy = SpotPolicy.ALLOWED

    @property
    def groups(self) -> tuple[tuple[Priced, ...], ...]:
        """``ranked`` cut into runs of equal rank: placement tries each run as one choice,
        so pools that tie keep today's topology-first choice between them."""
        out: list[list[Priced]] = []
        last: tuple[object, ...] | None = None
        for p in self.ranked:
            key = _rank(p, self.spot)[:-1]
            if out and key == last:
                out[-1].append(p)
            else:
                out.append([p])
            last = key
        return tuple(tuple(g) for g in out)

    @property
    def key(self) -> tuple[object, ...]:
        return (
            tuple(tuple(p.offer.name for p in g) for g in self.groups),
            tuple(p.offer.name for p in self.excluded),
        )

    def why(self, chosen: str) -> str:
        """One sentence on why ``chosen`` (a pool name): its effective cost against the best
        pool of another tier, and the deadline."""
        mine = next((p for p in self.ranked if p.offer.name == chosen), None)
        if mine is None:
            return ""
        others = [p for p in (*self.ranked, *self.excluded) if p.offer.tier != mine.offer.tier]
        other = min(others, key=lambda p: (p.dollars, p.offer.name), default=None)
        text = f"{mine.offer.tier} {mine.offer.name}: effective {_money(mine.dollars)}"
        if other is not None:
            text += f" vs {other.offer.tier} {other.offer.name} {_money(other.dollars)}"
        if mine.meets_deadline is None:
            return text
        if mine.meets_deadline:
            return text + "; meets deadline"
        return text + "; no pool meets the deadline, this one finishes first"


def _money(dollars: float) -> str:
    return "unbounded" if math.isinf(dollars) else f"${dollars:,.2f}"


def job_rate(per_host_hour: float, hosts: int) -> float:
    """Interruptions per hour of a gang's run spanning ``hosts`` hosts, each interrupted at
    ``per_host_hour``: a gang stops when any of its hosts goes, so rates add."""
    return per_host_hour * max(hosts, 1)


def lost_per_interruption(needs: Needs) -> float:
    """``L = c/2 + r``; ``c = W`` for a job that never checkpoints (∞ when W is unknown)."""
    c = needs.checkpoint_interval_s
    if c is None or c <= 0:
        c = needs.work_s if needs.work_s is not None else math.inf
    return c / 2 + needs.restart_overhead_s


def price(needs: Needs, offer: Offer) -> Priced:
    """Effective cost and expected finish of ``needs`` on ``offer`` (no exclusions)."""
    lost = lost_per_interruption(needs)
    rate = offer.interruptions_per_hour / HOUR
    fraction = 1.0 if rate <= 0 else max(1.0 - rate * lost, 0.0)
    work = needs.work_s if needs.work_s is not None else HOUR
    total = work / fraction if fraction > 0 else math.inf
    dollars = offer.price_per_gpu_hour * needs.gpus * total / HOUR if total < math.inf else math.inf
    finish = offer.start + total if needs.work_s is not None else None
    meets = None
    if needs.deadline is not None and finish is not None:
        meets = finish <= needs.deadline + _TOL
    return Priced(offer, lost, fraction, total, dollars, finish, meets)


def break_even_rate(needs: Needs, spot_price: float, reference_price: float) -> float:
    """λ* (per hour): the interruption rate at which spot costs as much as the reference."""
    lost = lost_per_interruption(needs)
    if reference_price <= 0 or spot_price >= reference_price:
        return 0.0
    return (1 - spot_price / reference_price) / lost * HOUR


def route(needs: Needs, offers: list[Offer], max_spot_interruptions: int | None = None) -> Route:
    """Price every offer for ``needs``, rule out what must not be used, rank the rest."""
    priced = [price(needs, o) for o in offers]
    spot = [p for p in priced if p.offer.tier == Tier.SPOT]
    other = [p for p in priced if p.offer.tier != Tier.SPOT]
    on_demand = [p for p in other if p.offer.tier == Tier.ON_DEMAND] or other
    reference = min(on_demand, key=lambda p: (p.dollars, p.offer.name), default=None)
    ranked: list[Priced] = list(other)
    excluded: list[Priced] = []
    for p in spot:
        why = ""
        if needs.spot == SpotPolicy.NEVER:
            why = "spot: never"
        elif reference is not None and p.dollars > reference.dollars * (1 + _TOL) + _TOL:
            limit = break_even_rate(
                needs, p.offer.price_per_gpu_hour, reference.offer.price_per_gpu_hour
            )
            why = (
                f"past spot break-even: effective {_money(p.dollars)} vs "
                f"{reference.offer.tier} {reference.offer.name} {_money(reference.dollars)} "
                f"(interrupted {p.offer.interruptions_per_hour:.2f}/h; spot pays below "
                f"{limit:.2f}/h)"
            )
        elif (
            reference is not None
            and max_spot_interruptions is not None
            and needs.spot_interruptions > max_spot_interruptions
        ):
            why = (
                f"interrupted {needs.spot_interruptions} times on spot, more than "
                f"{max_spot_interruptions}"
            )
        if why:
            excluded.append(_with(p, why))
        else:
            ranked.append(p)
    ranked.sort(key=lambda p: _rank(p, needs.spot))
    return Route(tuple(ranked), tuple(excluded), reference, needs.spot)


def _with(p: Priced, why: str) -> Priced:
    return Priced(
        p.offer,
        p.lost_per_interruption_s,
        p.productive_fraction,
        p.total_s,
        p.dollars,
        p.finish,
        p.meets_deadline,
        why,
    )


def _rank(p: Priced, spot: SpotPolicy | None) -> tuple[object, ...]:
    """Sort key: pools meeting the deadline first (the rest by finish), spot first under
    ``prefer``, then effective dollars, then reserved > on-demand > spot, then name."""
    missed = p.meets_deadline is False
    late = (p.finish or 0.0) if missed else 0.0
    preferred = 0 if spot != SpotPolicy.PREFER or p.offer.tier == Tier.SPOT else 1
    if missed:
        preferred = 0
    dollars = round(p.dollars, 6) if p.dollars < math.inf else math.inf
    return (missed, late, preferred, dollars, TIER_ORDER[p.offer.tier], p.offer.name)


# -- routing facts and the cycle's view -------------------------------------------------


@dataclass(frozen=True)
class RoutingFacts:
    """What the caller observed: interruptions per host-hour by pool name, spot
    interruptions so far by job id, and the count past which a job leaves spot."""

    interruptions: Mapping[str, float] = field(default_factory=dict)
    spot_interruptions: Mapping[str, int] = field(default_factory=dict)
    max_spot_interruptions: int | None = 3


def candidate_pools(tree: TopologyTree, gang: Gang) -> list[int]:
    """Indices of the GPU pools some GPU role of ``gang`` may run on."""
    out = []
    for i, pool in enumerate(tree.pools):
        if pool.gpus_per_host == 0:
            continue
        for role in gang.roles:
            if role.gpus == 0:
                continue
            cap = role.capability
            if (
                cap.accepts(pool, True)
                and pool.island_size >= role.tensor_parallel
                and pool.gpus_per_host >= role.gpus
            ):
                out.append(i)
                break
    return out


def _hosts(gang: Gang, pool: Pool) -> int:
    per = max(pool.gpus_per_host, 1)
    return sum(-(-r.total_gpus // per) for r in gang.roles if r.gpus > 0)


def _spot_policy(gang: Gang) -> SpotPolicy:
    policies = {r.capability.spot for r in gang.roles if r.gpus > 0}
    for p in (SpotPolicy.NEVER, SpotPolicy.PREFER):
        if p in policies:
            return p
    return SpotPolicy.ALLOWED


def route_job(tree: TopologyTree, job: Job, facts: RoutingFacts, now: float) -> Route | None:
    """The route for ``job`` starting now, or None when routing has nothing to decide: fewer
    than two pools to choose from, or every one of them free of charge."""
    pools = candidate_pools(tree, job.gang)
    if len(pools) < 2 or all(tree.pools[i].price_per_gpu_hour <= 0 for i in pools):
        return None
    needs = Needs(
        gpus=job.gpus,
        work_s=job.expected_runtime(),
        checkpoint_interval_s=job.checkpoint_interval,
        restart_overhead_s=job.restart_overhead,
        deadline=job.deadline,
        spot=_spot_policy(job.gang),
        spot_interruptions=facts.spot_interruptions.get(job.id, 0),
    )
    offers = [
        Offer(
            p.name,
            p.tier,
            p.price_per_gpu_hour,
            job_rate(facts.interruptions.get(p.name, 0.0), _hosts(job.gang, p)),
            now,
        )
        for p in (tree.pools[i] for i in pools)
    ]
    return route(needs, offers, facts.max_spot_interruptions)


def fences(tree: TopologyTree, route: Route) -> tuple[list[frozenset[int]], frozenset[int]]:
    """What placement tries, in order: for each group of ``route``, the hosts to fence off
    (those of every routed pool outside the group); and the hosts of excluded pools, fenced
    off for the fallback that may mix the usable pools."""
    names = tree.host_lists.pool_name
    routed = {p.offer.name for p in (*route.ranked, *route.excluded)}
    out = []
    for group in route.groups:
        keep = {p.offer.name for p in group}
        out.append(frozenset(h for h, n in enumerate(names) if n in routed and n not in keep))
    gone = {p.offer.name for p in route.excluded}
    return out, frozenset(h for h, n in enumerate(names) if n in gone)


def note_for(tree: TopologyTree, route: Route, placement: Placement) -> str:
    """Why ``placement`` sits in its pool (see ``Route.why``), named by its first GPU."""
    names = tree.host_lists.pool_name
    for g in placement.grants:
        if g.gpus:
            return route.why(names[g.host])
    return ""

"""Cost-aware routing (core/placement/routing.py): the cheapest pool that meets the deadline,
judged by effective cost under interruptions, and the fall back off spot past break-even."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

from boltforge.core.cycle import Snapshot, run_cycle
from boltforge.core.model.gang import Capability, Gang, Role, SpotPolicy
from boltforge.core.model.state import FleetState
from boltforge.core.model.topology import Tier
from boltforge.core.model.workload import Job
from boltforge.core.placement.explain import describe
from boltforge.core.placement.routing import (
    HOUR,
    Needs,
    Offer,
    RoutingFacts,
    break_even_rate,
    lost_per_interruption,
    price,
    route,
    route_job,
)
from boltforge.core.policy import Policy
from boltforge.testing.builders import make_fleet, make_pool

H = HOUR


def spot(rate: float = 0.0, price: float = 1.0, name: str = "h100-spot") -> Offer:
    return Offer(name, Tier.SPOT, price, rate)


def on_demand(price: float = 4.0, name: str = "h100-od") -> Offer:
    return Offer(name, Tier.ON_DEMAND, price)


def reserved(price: float = 2.0, name: str = "h100-res") -> Offer:
    return Offer(name, Tier.RESERVED, price)


def needs(
    work_h: float | None = 10.0,
    checkpoint_s: float | None = 1800.0,
    restart_s: float = 0.0,
    deadline_h: float | None = None,
    policy: SpotPolicy = SpotPolicy.ALLOWED,
    interrupted: int = 0,
) -> Needs:
    return Needs(
        gpus=8,
        work_s=work_h * H if work_h is not None else None,
        checkpoint_interval_s=checkpoint_s,
        restart_overhead_s=restart_s,
        deadline=deadline_h * H if deadline_h is not None else None,
        spot=policy,
        spot_interruptions=interrupted,
    )


@dataclass(frozen=True)
class Case:
    name: str
    needs: Needs
    offers: tuple[Offer, ...]
    first: str  # the pool routing picks
    excluded: tuple[str, ...] = ()
    max_interruptions: int | None = 3


# Break-even for spot at $1 against on-demand at $2 with L = 900 s: λ* = 0.5 / 0.25 h = 2/h.
AT_BREAK_EVEN = break_even_rate(needs(), 1.0, 2.0)

CASES = [
    Case(
        "spot is cheaper and meets the deadline: spot",
        needs(deadline_h=24),
        (on_demand(), spot(rate=0.1)),
        first="h100-spot",
    ),
    Case(
        "tight deadline that spot's interruptions would miss: on-demand",
        # L = 3600/2 + 300 = 2100 s; f = 1 - 0.5/h x 2100 s = 0.71; T = 14.1 h > 10.5 h.
        needs(checkpoint_s=3600, restart_s=300, deadline_h=10.5),
        (on_demand(), spot(rate=0.5)),
        first="h100-od",
    ),
    Case(
        "spot past break-even: on-demand, spot ruled out",
        needs(),
        (on_demand(price=2.0), spot(rate=2.4)),
        first="h100-od",
        excluded=("h100-spot",),
    ),
    Case(
        "exactly at break-even: spot stays usable, the tie goes to on-demand",
        needs(),
        (on_demand(price=2.0), spot(rate=AT_BREAK_EVEN)),
        first="h100-od",
    ),
    Case(
        "exactly at break-even with spot: prefer: spot",
        needs(policy=SpotPolicy.PREFER),
        (on_demand(price=2.0), spot(rate=AT_BREAK_EVEN)),
        first="h100-spot",
    ),
    Case(
        "just under break-even: spot",
        needs(),
        (on_demand(price=2.0), spot(rate=AT_BREAK_EVEN * 0.99)),
        first="h100-spot",
    ),
    Case(
        "spot: never rules spot out however cheap",
        needs(policy=SpotPolicy.NEVER),
        (on_demand(), spot(price=0.1)),
        first="h100-od",
        excluded=("h100-spot",),
    ),
    Case(
        "spot: prefer takes spot over a cheaper reserved pool when it meets the deadline",
        needs(policy=SpotPolicy.PREFER, deadline_h=24),
        (reserved(price=0.5), on_demand(), spot(rate=0.1)),
        first="h100-spot",
    ),
    Case(
        "spot: allowed takes the cheaper reserved pool",
        needs(deadline_h=24),
        (reserved(price=0.5), on_demand(), spot(rate=0.1)),
        first="h100-res",
    ),
    Case(
        "spot: prefer does not take spot that misses the deadline",
        needs(policy=SpotPolicy.PREFER, checkpoint_s=3600, restart_s=300, deadline_h=10.5),
        (reserved(price=3.0), on_demand(), spot(rate=0.5)),
        first="h100-res",
    ),
    Case(
        "reserved and on-demand at one price: reserved (already paid)",
        needs(),
        (on_demand(price=2.0), reserved(price=2.0)),
        first="h100-res",
    ),
    Case(
        "no pool meets the deadline: the one that finishes first",
        needs(deadline_h=5),
        (on_demand(), spot(rate=0.5, price=0.5)),
        first="h100-od",
    ),
    Case(
        "interrupted on spot more often than allowed: on-demand",
        needs(interrupted=4),
        (on_demand(), spot(rate=0.1)),
        first="h100-od",
        excluded=("h100-spot",),
    ),
    Case(
        "interrupted too often, but spot is the only pool: spot",
        needs(interrupted=4),
        (spot(rate=0.1), spot(rate=0.2, name="a100-spot", price=2.0)),
        first="h100-spot",
    ),
    Case(
        "a job that never checkpoints loses half its run per interruption: on-demand",
        # L = 5 h; f = 1 - 0.1/h x 5 h = 0.5; T = 20 h: $160 on spot, past $120 on-demand.
        needs(checkpoint_s=None),
        (on_demand(price=1.5), spot(rate=0.1)),
        first="h100-od",
        excluded=("h100-spot",),
    ),
    Case(
        "the same job with a checkpoint every 30 min: spot",
        needs(checkpoint_s=1800),
        (on_demand(price=1.5), spot(rate=0.1)),
        first="h100-spot",
    ),
    Case(
        "no runtime and no checkpoints: any interruption makes spot unbounded",
        needs(work_h=None, checkpoint_s=None),
        (on_demand(), spot(rate=0.01)),
        first="h100-od",
        excluded=("h100-spot",),
    ),
    Case(
        "no runtime but checkpoints: priced per hour of work, spot wins",
        needs(work_h=None, deadline_h=1),
        (on_demand(), spot(rate=0.1)),
        first="h100-spot",
    ),
]


def test_break_even_of_the_scenarios() -> None:
    assert pytest.approx(2.0) == AT_BREAK_EVEN


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_routing_scenarios(case: Case) -> None:
    verdict = route(case.needs, list(case.offers), case.max_interruptions)
    assert verdict.ranked[0].offer.name == case.first
    assert tuple(p.offer.name for p in verdict.excluded) == case.excluded
    for p in verdict.excluded:
        assert p.excluded


def test_worked_example_from_docs() -> None:
    """docs/cost.md, "Routing": 8 GPUs, 10 h of work, checkpoint every 30 min, 5 min restart."""
    job = Needs(8, 10 * H, 1800, 300, deadline=14 * H)
    verdict = route(job, [Offer("h100-od", Tier.ON_DEMAND, 4.0), spot(rate=0.25, price=1.5)])
    best, other = verdict.ranked
    assert lost_per_interruption(job) == 1200
    assert best.offer.name == "h100-spot"
    assert best.productive_fraction == pytest.approx(1 - 0.25 * 1200 / 3600)
    assert best.total_s / H == pytest.approx(10.909, abs=1e-3)
    assert best.dollars == pytest.approx(130.91, abs=0.01)
    assert other.dollars == pytest.approx(320.0)
    assert break_even_rate(job, 1.5, 4.0) == pytest.approx(1.875)
    assert verdict.why("h100-spot") == (
        "spot h100-spot: effective $130.91 vs on-demand h100-od $320.00; meets deadline"
    )


def test_spot_past_break_even_says_the_rate_at_which_it_would_pay() -> None:
    """docs/cost.md's job with spot reclaimed twice an hour: spot is dropped, and the
    explanation names the pool's rate and the break-even rate (1.875/h) it is past."""
    job = Needs(8, 10 * H, 1800, 300, deadline=14 * H)
    verdict = route(job, [Offer("h100-od", Tier.ON_DEMAND, 4.0), spot(rate=2.0, price=1.5)])
    assert [p.offer.name for p in verdict.excluded] == ["h100-spot"]
    assert verdict.excluded[0].excluded == (
        "past spot break-even: effective $360.00 vs on-demand h100-od $320.00 "
        "(interrupted 2.00/h; spot pays below 1.88/h)"
    )


rates = st.floats(0, 20, allow_nan=False)


@given(
    a=rates,
    b=rates,
    c=st.one_of(st.none(), st.floats(0, 4 * H)),
    r=st.floats(0, 1800),
    work=st.floats(60, 100 * H),
)
def test_effective_cost_never_falls_as_interruptions_rise(
    a: float, b: float, c: float | None, r: float, work: float
) -> None:
    job = Needs(8, work, c, r)
    lo, hi = sorted((a, b))
    cheap, dear = price(job, spot(rate=lo)), price(job, spot(rate=hi))
    assert cheap.dollars <= dear.dollars
    assert cheap.total_s <= dear.total_s
    assert cheap.total_s >= work


@given(
    p_spot=st.floats(0.1, 10),
    p_ref=st.floats(0.1, 10),
    c=st.floats(60, 4 * H),
    r=st.floats(0, 1800),
)
def test_break_even_rate_equalizes_the_costs(
    p_spot: float, p_ref: float, c: float, r: float
) -> None:
    job = Needs(8, 10 * H, c, r)
    rate = break_even_rate(job, p_spot, p_ref)
    ref = price(job, on_demand(price=p_ref))
    if p_spot >= p_ref:
        assert rate == 0.0
        return
    at = price(job, spot(rate=rate, price=p_spot))
    assert at.dollars == pytest.approx(ref.dollars, rel=1e-9)
    past = route(job, [on_demand(price=p_ref), spot(rate=rate * 1.01 + 1e-6, price=p_spot)])
    assert [p.offer.name for p in past.excluded] == ["h100-spot"]


def test_unreachable_productivity_is_unbounded() -> None:
    job = Needs(8, 10 * H, 3600, 0)  # L = 1800 s: two interruptions an hour eat everything
    p = price(job, spot(rate=2.0))
    assert p.productive_fraction == 0.0
    assert math.isinf(p.total_s) and math.isinf(p.dollars)


# -- the cycle ------------------------------------------------------------------------


def routed_fleet() -> FleetState:
    pools = [
        make_pool("h100-od", tier=Tier.ON_DEMAND, price=4.0),
        make_pool("h100-spot", tier=Tier.SPOT, price=1.0),
    ]
    return FleetState(make_fleet(racks=1, hosts=2, pools=pools))


def routed_job(deadline_h: float | None = 24.0, spot: SpotPolicy = SpotPolicy.ALLOWED) -> Job:
    role = Role("worker", 1, 8, capability=Capability(spot=spot))
    return Job(
        "j1",
        Gang("j1", (role,)),
        "team",
        0.0,
        estimate=10 * H,
        deadline=deadline_h * H if deadline_h is not None else None,
        checkpoint_interval=1800.0,
        restart_overhead=300.0,
    )


def bound_pool(facts: RoutingFacts | None, job: Job) -> tuple[str, tuple[str, ...]]:
    state = routed_fleet()
    result = run_cycle(Snapshot(state, (job,), (), 0.0, routing=facts), Policy("routing"))
    assert len(result.binds) == 1
    placement = result.binds[0].placement
    host = placement.grants[0].host
    assert placement.notes[-1] in describe(state.tree, placement)  # the explanation says why
    return state.tree.pool_of(host).name, placement.notes


def test_cycle_binds_in_the_routed_pool() -> None:
    pool, notes = bound_pool(RoutingFacts({"h100-spot": 0.1}), routed_job())
    assert pool == "h100-spot"
    assert notes[-1].startswith("spot h100-spot: effective $")
    assert notes[-1].endswith("vs on-demand h100-od $320.00; meets deadline")


def test_cycle_leaves_spot_past_break_even() -> None:
    # L = 1200 s; λ* = (1 - 1/4) / 1200 s = 2.25/h; 3/h per host is past it.
    pool, notes = bound_pool(RoutingFacts({"h100-spot": 3.0}), routed_job())
    assert pool == "h100-od"
    assert "on-demand h100-od: effective $320.00" in notes[-1]


def test_cycle_takes_on_demand_when_spot_would_miss_the_deadline() -> None:
    # 1.5/h: f = 0.5, 20 h on spot; the deadline at 12 h leaves on-demand alone.
    pool, _ = bound_pool(RoutingFacts({"h100-spot": 1.5}), routed_job(deadline_h=12))
    assert pool == "h100-od"


def test_cycle_waits_rather_than_use_spot_past_break_even() -> None:
    state = routed_fleet()
    od_hosts = [h.index for h in state.tree.hosts if state.tree.pool_of(h.index).name == "h100-od"]
    state.cordoned[od_hosts] = True  # no on-demand room now
    snap = Snapshot(state, (routed_job(),), (), 0.0, routing=RoutingFacts({"h100-spot": 3.0}))
    result = run_cycle(snap, Policy("routing"))
    assert not result.binds


def test_no_route_with_one_pool_or_free_pools() -> None:
    job = routed_job()
    free = [
        make_pool("h100-od", tier=Tier.ON_DEMAND, price=0.0),
        make_pool("h100-spot", tier=Tier.SPOT, price=0.0),
    ]
    assert route_job(make_fleet(racks=1, hosts=2, pools=free), job, RoutingFacts(), 0.0) is None
    one = make_fleet(racks=1, hosts=2, pools=[make_pool("h100-od", tier=Tier.ON_DEMAND)])
    assert route_job(one, job, RoutingFacts(), 0.0) is None
    assert route_job(routed_fleet().tree, job, RoutingFacts(), 0.0) is not None


def test_cycle_without_routing_facts_is_unchanged() -> None:
    state = routed_fleet()
    job = routed_job()
    plain = run_cycle(Snapshot(state, (job,), (), 0.0), Policy("routing"))
    routed_off = run_cycle(Snapshot(state, (job,), (), 0.0, routing=None), Policy("routing"))
    assert plain == routed_off

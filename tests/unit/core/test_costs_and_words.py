"""Crossing costs by level, and the words users read: explanations, needs, durations, policies."""

from __future__ import annotations

import itertools
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from boltforge.core.model.gang import Role
from boltforge.core.model.levels import CrossingWeights, Level
from boltforge.core.model.state import Allocation, FleetState, Grant
from boltforge.core.placement import crossing
from boltforge.core.placement.explain import describe, diagnose, need
from boltforge.core.placement.place import Outcome, place_gang
from boltforge.core.policy import (
    ARRIVAL_ORDER,
    CONSERVATIVE_BACKFILL,
    EASY_BACKFILL,
    FIRST_FIT,
    NO_BACKFILL,
    POLICIES,
    Backfill,
    BackfillMode,
    Ordering,
    Policy,
    named,
)
from boltforge.core.preempt.text import gpu_hours, span
from boltforge.core.preempt.victims import PreemptRules
from boltforge.testing.builders import make_fleet, make_gang, make_pool, make_role

# --- crossing costs ------------------------------------------------------------------------------


@st.composite
def weights(draw: st.DrawFn) -> CrossingWeights:
    """Valid weights: positive and not decreasing from nvlink to spine."""
    steps = draw(st.lists(st.floats(0.0, 50.0), min_size=4, max_size=4))
    chain = [draw(st.floats(0.1, 10.0))]
    for step in steps:
        chain.append(chain[-1] + step)
    rail = draw(st.floats(0.1, 50.0))
    nvlink, host, rack, pod, spine = chain
    w = CrossingWeights(nvlink, host, rack, pod, spine, rail)
    assert w.problem() is None
    return w


def spread(tree_pods: int, n: int, gpus: int, level: Level) -> list[Grant]:
    """``n`` replicas of ``gpus`` GPUs on local indices 0.., spread to differ at ``level``:
    one host (ISLAND/HOST), hosts of one rack, racks of one pod, or pods."""
    hosts_per_rack = racks_per_pod = n
    out = []
    for i in range(n):
        if level <= Level.HOST:
            host, local = 0, tuple(range(i * gpus, (i + 1) * gpus))
        elif level == Level.RACK:
            host, local = i, tuple(range(gpus))
        elif level == Level.POD:
            host, local = i * hosts_per_rack, tuple(range(gpus))
        else:
            host, local = i * hosts_per_rack * racks_per_pod, tuple(range(gpus))
        out.append(Grant("w", i, host, local))
    assert tree_pods >= n
    return out


@settings(max_examples=80, deadline=None)
@given(w=weights(), n=st.integers(2, 4), gpus=st.sampled_from([1, 2]))
def test_crossing_cost_never_decreases_as_the_gang_spreads_wider(
    w: CrossingWeights, n: int, gpus: int
) -> None:
    tree = make_fleet(pods=n, racks=n, hosts=n, weights=w)
    totals = []
    for level in (Level.HOST, Level.RACK, Level.POD, Level.SPINE):
        cost = crossing.role_cost(tree, spread(n, n, gpus, level))
        assert cost.hops["rail"] == 0
        assert cost.total == pytest.approx(sum(cost.weighted(tree).values()))
        totals.append(cost.total)
    assert all(a <= b + 1e-9 for a, b in itertools.pairwise(totals)), totals
    # Each widening step trades n - 1 hops of the narrower level for the wider one.
    spine = crossing.role_cost(tree, spread(n, n, gpus, Level.SPINE))
    assert spine.hops["spine"] == n - 1 and spine.hops["pod"] == 0 and spine.hops["rack"] == 0


@pytest.mark.parametrize(
    ("island", "gpus", "hops"),
    [
        (8, (0, 1, 2, 3), {"nvlink": 3, "host": 0}),
        (4, (0, 1, 2, 3), {"nvlink": 3, "host": 0}),
        (4, (2, 3, 4, 5), {"nvlink": 2, "host": 1}),
        (2, (0, 2, 4, 6), {"nvlink": 0, "host": 3}),
        (1, (0, 1), {"nvlink": 0, "host": 1}),
        (8, (5,), {"nvlink": 0, "host": 0}),
    ],
)
def test_one_host_cost_counts_island_hops(
    island: int, gpus: tuple[int, ...], hops: dict[str, int]
) -> None:
    tree = make_fleet(racks=1, hosts=1, island=island)
    cost = crossing.one_host_cost(tree, 0, gpus)
    assert {k: cost.hops[k] for k in hops} == hops
    w = tree.weights
    assert cost.total == hops["nvlink"] * w.nvlink + hops["host"] * w.host
    assert crossing.role_cost(tree, [Grant("w", 0, 0, gpus)]) == cost


def test_cpu_only_and_empty_roles_cost_nothing() -> None:
    tree = make_fleet()
    assert crossing.role_cost(tree, []) == crossing.ZERO
    cpu = [Grant("c", 0, 0, (), cpus=4), Grant("c", 1, 5, (), cpus=4)]
    assert crossing.role_cost(tree, cpu).total == 0.0


@pytest.mark.parametrize(
    ("layout", "off_rail"),
    [
        ([(0, (0, 1)), (1, (0, 1))], 0),
        ([(0, (0, 1)), (1, (2, 3))], 1),
        ([(0, (0, 1)), (0, (2, 3)), (1, (2, 3)), (2, (4, 5))], 1),
        ([(1, (0, 1)), (0, (6, 7)), (0, (4, 5))], 1),
        ([(0, (1, 0)), (1, (0, 1))], 0),
    ],
)
def test_off_rail_replicas_are_counted_against_the_lead_host(
    layout: list[tuple[int, tuple[int, ...]]], off_rail: int
) -> None:
    grants = [Grant("w", i, h, g) for i, (h, g) in enumerate(layout)]
    assert crossing.misaligned_replicas(grants) == off_rail
    tree = make_fleet(racks=1, hosts=4)
    cost = crossing.role_cost(tree, grants)
    assert cost.hops["rail"] == off_rail
    assert cost.weighted(tree)["rail"] == off_rail * tree.weights.rail


def test_add_sums_hops_and_totals() -> None:
    tree = make_fleet(racks=2, hosts=2)
    a = crossing.role_cost(tree, [Grant("w", 0, 0, (0, 1)), Grant("w", 1, 2, (0, 1))])
    b = crossing.one_host_cost(tree, 1, (0, 1, 2))
    both = crossing.add(a, b)
    assert both.total == a.total + b.total
    assert all(both.hops[k] == a.hops[k] + b.hops[k] for k in crossing.LEVEL_KEYS)
    assert crossing.add(a, crossing.ZERO) == a


@pytest.mark.parametrize(
    ("changes", "problem"),
    [
        ({}, None),
        ({"rack": 7.0}, None),
        ({"host": 0.5}, "must not decrease"),
        ({"spine": 10.0}, "must not decrease"),
        ({"rail": 0.0}, "positive"),
        ({"nvlink": -1.0}, "positive"),
    ],
)
def test_weight_problems_are_named(changes: dict[str, float], problem: str | None) -> None:
    found = CrossingWeights(**changes).problem()
    assert (found is None) if problem is None else (problem in (found or ""))


@pytest.mark.parametrize(
    ("text", "level"),
    [
        ("island", Level.ISLAND),
        ("NVLink", Level.ISLAND),
        (" Node ", Level.HOST),
        ("rack", Level.RACK),
        ("POD", Level.POD),
        ("spine", Level.SPINE),
    ],
)
def test_level_names_parse(text: str, level: Level) -> None:
    assert Level.parse(text) is level


def test_unknown_level_name_is_rejected() -> None:
    with pytest.raises(ValueError, match="row"):
        Level.parse("row")


# --- explanations --------------------------------------------------------------------------------


def test_describe_names_the_level_the_domain_and_the_cost() -> None:
    tree = make_fleet(racks=2, hosts=4)
    state = FleetState(tree)
    gang = make_gang("train", gpus=16, per_node=8)
    placement, failed = place_gang(state, gang)
    assert placement is not None and failed is None
    lines = describe(tree, placement)
    plan = placement.main
    assert plan.level == Level.RACK
    assert lines[0] == (
        f"worker: 2 replica(s), 16 x {plan.gpu_type} on 2 host(s) inside rack {plan.domain}"
    )
    assert plan.domain in tree.rack_names
    assert lines[1].startswith(f"  cost {plan.cost.total:g} (")
    assert f"rack {plan.cost.hops['rack']} x {tree.weights.rack:g}" in lines[1]
    beaten = [line for line in lines if line.startswith("  beat ")]
    assert len(beaten) == len(plan.alternatives)
    for line, alt in zip(beaten, plan.alternatives, strict=True):
        assert alt.domain in line and f"{alt.level.label} " in line
        assert ("costlier by" in line) or ("ties go to the tighter fit" in line)
    names = placement.nodes(tree)
    assert sorted(names) == sorted(tree.hosts[g.host].name for g in placement.grants)


def test_describe_of_a_one_host_job_says_no_hops_when_it_has_none() -> None:
    tree = make_fleet(racks=1, hosts=2)
    placement, _ = place_gang(FleetState(tree), make_gang("tiny", gpus=1, per_node=1))
    assert placement is not None
    lines = describe(tree, placement)
    assert lines[0].startswith("worker: 1 replica(s), 1 x H100-80GB on 1 host(s) inside ")
    assert placement.main.domain in lines[0]
    assert lines[1] == "  cost 0 (no hops)"


@pytest.mark.parametrize(
    ("role", "words"),
    [
        (make_role(replicas=2, gpus=8), "2 replica(s) of 8 GPU(s)"),
        (make_role(replicas=3, gpus=0, cpus=4), "3 CPU-only replica(s); 4 CPUs each"),
        (
            make_role(replicas=1, gpus=8, tp=4),
            "1 replica(s) of 8 GPU(s); tensor-parallel groups of 4 inside one NVLink island",
        ),
        (
            make_role(replicas=1, gpus=1, cpus=2.5, memory_gb=64),
            "1 replica(s) of 1 GPU(s); 2.5 CPUs each; 64 GB memory each",
        ),
    ],
)
def test_need_in_words(role: Role, words: str) -> None:
    assert need(role) == words


def test_diagnose_not_now_names_the_best_host_and_each_level() -> None:
    tree = make_fleet(racks=2, hosts=2)
    state = FleetState(tree)
    for h in range(4):
        state.allocate(Allocation(f"bg{h}", (Grant("w", 0, h, tuple(range(h + 2))),)))
    state.cordoned[3] = True
    gang = make_gang("big", gpus=16, per_node=8)
    role = gang.roles[0]
    decision = diagnose(state, gang, role, never=False)
    assert decision.outcome == Outcome.NOT_NOW
    reasons = decision.reasons
    assert reasons[0] == "role worker needs 2 replica(s) of 8 GPU(s)"
    assert (
        "1 matching host(s) take no new work now (cordoned, not ready, or kept for another "
        "job's reserved start)"
    ) in reasons
    host_line = next(r for r in reasons if r.startswith("host: "))
    assert f"({tree.hosts[0].name}, pool h100) has 6 free GPU(s)" in host_line
    assert "0 host(s) can take a replica now" in host_line
    assert "rack: the best rack can take 0 of 2 replica(s)" in reasons
    assert "pod: the best pod can take 0 of 2 replica(s)" in reasons
    assert "fleet: 0 of 2 replica(s) fit across the fleet" in reasons
    assert any("bolt place --mode when" in f for f in decision.fixes)


def test_diagnose_with_a_required_level_suggests_preferring_it() -> None:
    tree = make_fleet(racks=2, hosts=2)
    state = FleetState(tree)
    state.allocate(Allocation("bg", (Grant("w", 0, 0, (0,)), Grant("w", 1, 2, (0,)))))
    gang = make_gang("rackbound", gpus=24, per_node=8, required=Level.RACK)
    gang_roles = gang.roles[0]
    gang = type(gang)(gang.name, (gang_roles,), gang.topology, gang.team)
    decision = diagnose(state, gang, gang.roles[0], never=False)
    assert "the job requires a single rack" in decision.reasons
    assert decision.fixes[0] == "ask for 1 replica(s) to fit inside one rack"


def test_diagnose_suggests_spreading_when_the_fleet_holds_the_gang() -> None:
    tree = make_fleet(racks=2, hosts=2)
    state = FleetState(tree)
    gang = make_gang("wide", gpus=24, per_node=8, required=Level.RACK)
    decision = diagnose(state, gang, gang.roles[0], never=False)
    assert decision.fixes[0] == (
        "allow spreading with `topology: {preferred: rack}` instead of `required`"
    )


def test_diagnose_a_partial_fit_offers_the_size_that_fits_now() -> None:
    tree = make_fleet(racks=1, hosts=3)
    state = FleetState(tree)
    state.allocate(Allocation("bg", (Grant("w", 0, 0, (0,)),)))
    gang = make_gang("three", gpus=24, per_node=8)
    decision = diagnose(state, gang, gang.roles[0], never=False)
    assert decision.fixes[0] == "ask for 2 replica(s) (16 GPUs), which fit now"


def test_diagnose_never_names_the_pools_and_the_fix() -> None:
    pools = [make_pool("a100", gpu_type="A100-40GB", memory_gb=40, island=4)]
    tree = make_fleet(racks=1, hosts=1, pools=pools)
    state = FleetState(tree)
    role = make_role(gpus=8, gpu_types=("H100-80GB",))
    gang = make_gang("wrong", roles=(role,))
    decision = diagnose(state, gang, role, never=True)
    assert decision.outcome == Outcome.NEVER
    assert decision.reasons[0].startswith("role worker asks for GPU H100-80GB with 1 replica(s)")
    assert "a100 (A100-40GB, 40 GB, 8/host, islands of 4, reserved)" in decision.reasons[1]
    assert decision.fixes == ("ask for one of the fleet's GPU types: A100-40GB",)


@pytest.mark.parametrize(
    ("role", "fix"),
    [
        (make_role(gpus=1, min_memory=80), "lower min_gpu_memory_gb to 40 or less"),
        (make_role(gpus=8, tp=8), "lower tensor parallelism to 4"),
        (make_role(gpus=16), "set per_node to 8 or less"),
    ],
)
def test_diagnose_never_proposes_a_concrete_fix(role: Role, fix: str) -> None:
    pools = [make_pool("a100", gpu_type="A100-40GB", memory_gb=40, island=4)]
    state = FleetState(make_fleet(racks=1, hosts=1, pools=pools))
    decision = diagnose(state, make_gang("x", roles=(role,)), role, never=True)
    assert decision.outcome == Outcome.NEVER
    assert any(fix in f for f in decision.fixes), decision.fixes


# --- durations and GPU-hours ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("seconds", "words"),
    [
        (0, "0 s"),
        (45, "45 s"),
        (119, "119 s"),
        (120, "2 min"),
        (1500, "25 min"),
        (7199, "120 min"),
        (7200, "2.0 h"),
        (9000, "2.5 h"),
        (86400, "24.0 h"),
    ],
)
def test_span_in_words(seconds: float, words: str) -> None:
    assert span(seconds) == words


@settings(max_examples=200, deadline=None)
@given(st.floats(0, 10 * 86400, allow_nan=False))
def test_span_always_has_a_number_and_a_unit(seconds: float) -> None:
    words = span(seconds)
    match = re.fullmatch(r"(\d+(?:\.\d)?) (s|min|h)", words)
    assert match is not None, words
    value, unit = float(match.group(1)), match.group(2)
    scale = {"s": 1, "min": 60, "h": 3600}[unit]
    step = 0.1 if unit == "h" else 1.0  # hours show one decimal, seconds and minutes none
    assert abs(value * scale - seconds) <= scale * step / 2 + 1e-6


@pytest.mark.parametrize(
    ("gpu_seconds", "words"),
    [(0, "0.00"), (1800, "0.50"), (3599, "1.00"), (3600, "1.0"), (36000 * 2.5, "25.0")],
)
def test_gpu_hours_in_words(gpu_seconds: float, words: str) -> None:
    assert gpu_hours(gpu_seconds) == words


# --- policies ------------------------------------------------------------------------------------


def test_named_policies_carry_their_names() -> None:
    assert set(POLICIES) == {"default", "fifo", "slurm-like", "greedy", "tiresias"}
    for name, policy in POLICIES.items():
        assert policy.name == name
        assert named(name) is policy


def test_unknown_policy_lists_the_known_names() -> None:
    with pytest.raises(KeyError, match="unknown policy 'lottery'; known: default, fifo"):
        named("lottery")


@pytest.mark.parametrize(
    ("name", "ordering", "backfill", "preemption", "strict"),
    [
        ("default", Ordering.FAIR, BackfillMode.CONSERVATIVE, True, False),
        ("fifo", Ordering.FIFO, BackfillMode.NONE, False, True),
        ("slurm-like", Ordering.PRIORITY, BackfillMode.EASY, False, False),
        ("tiresias", Ordering.LAS, BackfillMode.NONE, True, False),
    ],
)
def test_policy_profiles(
    name: str, ordering: Ordering, backfill: BackfillMode, preemption: bool, strict: bool
) -> None:
    policy = named(name)
    assert (policy.order.by, policy.backfill.mode) == (ordering, backfill)
    assert (policy.preemption is not None) is preemption and policy.order.strict is strict
    if policy.backfill.mode == BackfillMode.NONE:
        assert policy.backfill.reservations == policy.backfill.depth == 0
    assert list(policy.order.las_thresholds) == sorted(policy.order.las_thresholds)


def test_with_changes_a_copy_only() -> None:
    base = Policy("base")
    other = base.with_(placement=FIRST_FIT, order=ARRIVAL_ORDER)
    assert (other.placement.lookahead, other.order.by, other.name) == (0, Ordering.FIFO, "base")
    assert (base.placement.lookahead, base.order.by) == (16, Ordering.FAIR)
    assert FIRST_FIT.with_(lookahead=4).lookahead == 4 and FIRST_FIT.lookahead == 0


def test_backfill_depth_follows_the_mode() -> None:
    assert [b.depth for b in (NO_BACKFILL, EASY_BACKFILL, CONSERVATIVE_BACKFILL)] == [0, 1, 4]
    assert CONSERVATIVE_BACKFILL.with_(reservations=2).depth == 2
    assert Backfill(BackfillMode.NONE, reservations=3).depth == 0


def test_preempt_rules_change_only_a_preempting_policy() -> None:
    rules = PreemptRules(churn_fraction=1.0)
    preempting = named("default").with_preempt_rules(rules)
    assert preempting.preemption is not None and preempting.preemption.rules == rules
    assert preempting.churn_window_s == rules.churn_window_s
    assert named("fifo").with_preempt_rules(rules) is named("fifo")
    assert named("fifo").churn_window_s == PreemptRules().churn_window_s

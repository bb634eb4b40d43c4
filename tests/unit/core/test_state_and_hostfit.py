"""Fleet state invariants (allocate, release, copy, fenced) and per-host fit for one role."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from boltforge.core.model.gang import Capability, Role
from boltforge.core.model.levels import Level
from boltforge.core.model.state import Allocation, Conflict, FleetState, Grant
from boltforge.core.placement.hostfit import eligible_hosts, host_fit, select_gpus, talks
from boltforge.core.placement.single import plan_single
from boltforge.testing.builders import STATE_ARRAYS, make_fleet, make_pool, make_role, occupy

FLEET = make_fleet(
    racks=2, hosts=3, pools=[make_pool("hgx", island=8), make_pool("pcie", island=4)]
)


def snapshot(state: FleetState) -> dict[str, object]:
    """Every array of ``state`` copied, plus its allocation table."""
    out: dict[str, object] = {name: getattr(state, name).copy() for name in STATE_ARRAYS}
    out["allocations"] = dict(state.allocations)
    return out


def assert_same(state: FleetState, before: dict[str, object]) -> None:
    for name in STATE_ARRAYS:
        assert np.array_equal(getattr(state, name), before[name]), name  # type: ignore[arg-type]
    assert state.allocations == before["allocations"]


def free_gpus(state: FleetState, host: int) -> list[int]:
    return [int(g) for g in np.flatnonzero(state.free[host])]


@st.composite
def grants_on(draw: st.DrawFn, state: FleetState) -> tuple[Grant, ...]:
    """Grants over distinct free GPUs on a few hosts, with CPUs and memory that fit."""
    hosts = draw(
        st.lists(st.integers(0, len(state.tree.hosts) - 1), min_size=1, max_size=4, unique=True)
    )
    out = []
    for i, h in enumerate(hosts):
        free = free_gpus(state, h)
        gpus = (
            draw(st.lists(st.sampled_from(free), max_size=len(free), unique=True)) if free else []
        )
        cpus = draw(st.sampled_from([0.0, 1.5, 16.0]))
        memory = draw(st.sampled_from([0.0, 64.0, 256.0]))
        out.append(Grant("w", i, h, tuple(gpus), cpus, memory))
    return tuple(out)


# --- allocate and release ---------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(data=st.data(), seed=st.integers(0, 5), fraction=st.sampled_from([0.0, 0.4, 0.8]))
def test_allocate_then_release_restores_the_state_exactly(
    data: st.DataObject, seed: int, fraction: float
) -> None:
    state = occupy(FLEET, fraction, seed=seed)
    before = snapshot(state)
    grants = data.draw(grants_on(state))
    allocation = Allocation("probe", grants, expected_end=100.0)
    state.allocate(allocation)
    taken = sum(len(g.gpus) for g in grants)
    assert state.free_gpus == int(before["free"].sum()) - taken  # type: ignore[attr-defined]
    assert state.allocations["probe"] is allocation
    assert state.release("probe") is allocation
    assert_same(state, before)


@settings(max_examples=40, deadline=None)
@given(data=st.data(), seed=st.integers(0, 5))
def test_release_many_matches_releasing_one_by_one(data: st.DataObject, seed: int) -> None:
    state = occupy(FLEET, 0.7, seed=seed)
    jobs = list(state.allocations)
    chosen = data.draw(st.lists(st.sampled_from(jobs), unique=True, max_size=len(jobs)))
    one_by_one = state.copy()
    for job in chosen:
        one_by_one.release(job)
    state.release_many(chosen)
    assert_same(state, snapshot(one_by_one))


@pytest.mark.parametrize(
    ("why", "grants"),
    [
        ("GPU listed twice in one grant", (Grant("w", 0, 0, (1, 1)),)),
        ("GPU listed in two grants", (Grant("w", 0, 0, (1,)), Grant("w", 1, 0, (1, 2)))),
        ("GPU beyond the host", (Grant("w", 0, 0, (8,)),)),
        ("GPU already taken", (Grant("w", 0, 0, (0,)),)),
        ("GPU already taken, second grant", (Grant("w", 0, 1, (0,)), Grant("w", 1, 0, (0,)))),
        ("more CPUs than the host has", (Grant("w", 0, 2, (), cpus=129),)),
        ("more memory than the host has", (Grant("w", 0, 2, (), memory_gb=2000),)),
        (
            "CPUs that fit one grant but not two on one host",
            (Grant("w", 0, 2, (), cpus=100), Grant("w", 1, 2, (), cpus=100)),
        ),
    ],
)
def test_a_clash_raises_conflict_and_changes_nothing(why: str, grants: tuple[Grant, ...]) -> None:
    state = FleetState(FLEET)
    state.allocate(Allocation("holder", (Grant("w", 0, 0, (0,)),)))
    before = snapshot(state)
    with pytest.raises(Conflict):
        state.allocate(Allocation("clash", grants))
    assert_same(state, before)


def test_conflict_names_the_gpu_and_the_host() -> None:
    state = FleetState(FLEET)
    state.allocate(Allocation("a", (Grant("w", 0, 4, (3,)),)))
    with pytest.raises(Conflict, match=rf"GPU 3 of {FLEET.hosts[4].name} is not free"):
        state.allocate(Allocation("b", (Grant("w", 0, 4, (2, 3)),)))


def test_a_job_cannot_allocate_twice_and_release_of_unknown_raises() -> None:
    state = FleetState(FLEET)
    state.allocate(Allocation("a", (Grant("w", 0, 0, (0,)),)))
    with pytest.raises(Conflict, match="already holds"):
        state.allocate(Allocation("a", (Grant("w", 0, 1, (0,)),)))
    assert state.host_free[1] == 8
    with pytest.raises(KeyError):
        state.release("nobody")
    with pytest.raises(KeyError):
        state.release_many(["a", "nobody"])


def test_a_negative_gpu_index_is_a_conflict() -> None:
    state = FleetState(FLEET)
    with pytest.raises(Conflict):
        state.allocate(Allocation("neg", (Grant("w", 0, 0, (7, -1)),)))


def test_allocation_counts_its_gpus_and_ignores_them_in_equality() -> None:
    a = Allocation("j", (Grant("w", 0, 0, (0, 1)), Grant("w", 1, 1, (2,))))
    assert a.gpus == 3
    assert a == Allocation("j", (Grant("w", 0, 0, (0, 1)), Grant("w", 1, 1, (2,))))
    assert Allocation("j", ()).gpus == 0


# --- copy ----------------------------------------------------------------------------------------


@settings(max_examples=30, deadline=None)
@given(data=st.data(), seed=st.integers(0, 5))
def test_a_copy_is_independent_both_ways(data: st.DataObject, seed: int) -> None:
    original = occupy(FLEET, 0.5, seed=seed)
    before = snapshot(original)
    other = original.copy()
    assert_same(other, before)
    other.allocate(Allocation("new", data.draw(grants_on(other))))
    other.cordoned[0] = True
    other.degraded[1] = True
    for job in list(original.allocations)[:2]:
        other.release(job)
    assert_same(original, before)
    copy_before = snapshot(other)
    original.cordoned[2] = True
    if original.allocations:
        original.release(next(iter(original.allocations)))
    assert_same(other, copy_before)
    assert other.tree is original.tree


# --- fenced --------------------------------------------------------------------------------------


@settings(max_examples=50, deadline=None)
@given(
    already=st.lists(st.integers(0, 11), unique=True, max_size=5),
    fence=st.lists(st.integers(0, 11), unique=True, max_size=6),
    as_mask=st.booleans(),
    raises=st.booleans(),
)
def test_fenced_restores_the_cordons_even_when_the_block_raises(
    already: list[int], fence: list[int], as_mask: bool, raises: bool
) -> None:
    state = FleetState(FLEET)
    state.cordoned[already] = True
    before = state.cordoned.copy()
    hosts: list[int] | np.ndarray = fence
    if as_mask:
        mask = np.zeros(len(FLEET.hosts), dtype=np.bool_)
        mask[fence] = True
        hosts = mask
    inside = None
    try:
        with state.fenced(hosts) as fenced:
            assert fenced is state
            inside = state.cordoned.copy()
            if raises:
                raise RuntimeError("boom")
    except RuntimeError:
        assert raises
    assert inside is not None
    assert set(np.flatnonzero(inside).tolist()) == set(already) | set(fence)
    assert np.array_equal(state.cordoned, before)
    if as_mask:
        assert not np.shares_memory(state.cordoned, hosts)


def test_nested_fences_unwind_in_order() -> None:
    state = FleetState(FLEET)
    with state.fenced([0]):
        with state.fenced([1, 2]):
            assert np.flatnonzero(state.cordoned).tolist() == [0, 1, 2]
        assert np.flatnonzero(state.cordoned).tolist() == [0]
    assert not state.cordoned.any()


def test_a_fenced_host_takes_no_replica() -> None:
    state = FleetState(make_fleet(racks=1, hosts=2))
    role = make_role(gpus=4)
    with state.fenced([0]):
        plan = plan_single(state, role, eligible_hosts(state, role), Level.HOST, "H100")
        assert plan is not None and plan.grants[0].host == 1
    plan = plan_single(state, role, eligible_hosts(state, role), Level.HOST, "H100")
    assert plan is not None and plan.grants[0].host == 0


# --- eligibility ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("role", "hosts"),
    [
        (make_role(gpus=8), range(12)),
        (make_role(gpus=8, tp=8), range(6)),  # islands of 4 cannot hold tp 8
        (make_role(gpus=4, tp=4), range(12)),
        (make_role(gpus=9), []),
        (make_role(gpus=0, cpus=4), range(12)),
    ],
    ids=["plain", "tp8-hgx-only", "tp4-both", "too-wide", "cpu-only"],
)
def test_eligible_hosts_by_shape(role: Role, hosts: range | list[int]) -> None:
    state = FleetState(FLEET)
    assert np.flatnonzero(eligible_hosts(state, role)).tolist() == list(hosts)


def test_eligible_hosts_by_capability() -> None:
    pools = [make_pool("a", gpu_type="A100", memory_gb=40), make_pool("h", gpu_type="H100")]
    state = FleetState(make_fleet(racks=1, hosts=2, pools=pools))
    by_type = make_role(gpus=1, gpu_types=("A100",))
    by_memory = make_role(gpus=1, min_memory=80)
    assert np.flatnonzero(eligible_hosts(state, by_type)).tolist() == [0, 1]
    assert np.flatnonzero(eligible_hosts(state, by_memory)).tolist() == [2, 3]


@pytest.mark.parametrize(
    ("replicas", "tp", "talking"), [(1, 1, False), (2, 1, True), (1, 2, True), (4, 4, True)]
)
def test_degraded_hosts_lose_only_roles_that_talk(replicas: int, tp: int, talking: bool) -> None:
    state = FleetState(FLEET)
    state.degraded[[0, 7]] = True
    role = make_role(replicas=replicas, gpus=4, tp=tp)
    assert talks(role) is talking
    ok = eligible_hosts(state, role)
    assert bool(ok[0]) is not talking and bool(ok[7]) is not talking
    assert ok[1] and ok[6]


def test_eligible_hosts_returns_a_fresh_array_each_time() -> None:
    state = FleetState(FLEET)
    role = make_role(gpus=2)
    first = eligible_hosts(state, role)
    first[:] = False
    assert eligible_hosts(state, role).all()


# --- host_fit ------------------------------------------------------------------------------------


def test_host_fit_slots_follow_free_gpus_cordons_and_the_limit() -> None:
    state = FleetState(FLEET)
    state.allocate(
        Allocation("a", (Grant("w", 0, 0, (0, 1, 2)), Grant("w", 1, 1, tuple(range(8)))))
    )
    state.cordoned[2] = True
    role = make_role(replicas=8, gpus=2)
    fit = host_fit(state, role, eligible_hosts(state, role), limit=3)
    assert fit.slots[:4].tolist() == [2, 0, 0, 3]
    assert fit.free[0] == 5
    assert np.isinf(fit.intra[0, 3]) and np.isfinite(fit.intra[0, 2])
    assert fit.intra[3, 0] == 0.0


@pytest.mark.parametrize(
    ("cpus", "memory", "slots"),
    [(0, 0, 4), (64, 0, 2), (50, 0, 2), (0, 300, 3), (40, 600, 1), (200, 0, 0)],
)
def test_host_fit_caps_slots_by_cpus_and_memory(cpus: float, memory: float, slots: int) -> None:
    state = FleetState(make_fleet(racks=1, hosts=1))
    role = make_role(replicas=8, gpus=2, cpus=cpus, memory_gb=memory)
    fit = host_fit(state, role, eligible_hosts(state, role), limit=8)
    assert int(fit.slots[0]) == slots


def test_host_fit_island_only_offers_the_largest_free_island() -> None:
    tree = make_fleet(racks=1, hosts=1, island=4)
    state = FleetState(tree)
    state.allocate(Allocation("a", (Grant("w", 0, 0, (0,)), Grant("w", 1, 0, (4, 5)))))
    role = make_role(replicas=4, gpus=2)
    assert host_fit(state, role, eligible_hosts(state, role), 4).slots[0] == 2
    assert host_fit(state, role, eligible_hosts(state, role), 4, island_only=True).slots[0] == 1


def test_intra_cost_counts_nvlink_and_host_hops() -> None:
    tree = make_fleet(racks=1, hosts=1, island=4)
    state = FleetState(tree)
    role = make_role(replicas=4, gpus=2)
    fit = host_fit(state, role, eligible_hosts(state, role), 4)
    w = tree.weights
    # k replicas of 2 GPUs: 2k GPUs in ceil(2k/4) islands.
    expected = [0.0, 1 * w.nvlink, 3 * w.nvlink, 4 * w.nvlink + w.host, 6 * w.nvlink + w.host]
    assert fit.intra[0].tolist() == expected
    assert all(a <= b for a, b in itertools.pairwise(expected))


# --- select_gpus ---------------------------------------------------------------------------------


def island_row(size: int, per_host: int = 8) -> np.ndarray:
    return np.array([g // size for g in range(per_host)], dtype=np.int64)


@pytest.mark.parametrize(
    ("taken", "gpus", "tp", "count", "island_size"),
    [
        ([], 4, 1, 2, 4),
        ([0], 2, 1, 3, 4),
        ([0, 4], 3, 1, 2, 4),
        ([1, 5], 4, 2, 1, 4),
        ([], 8, 4, 1, 4),
        ([0, 1, 2], 2, 2, 2, 8),
    ],
)
def test_select_gpus_picks_free_distinct_gpus_and_keeps_tp_groups_in_islands(
    taken: list[int], gpus: int, tp: int, count: int, island_size: int
) -> None:
    row = np.ones(8, dtype=np.bool_)
    row[taken] = False
    free_before = row.copy()
    islands = island_row(island_size)
    role = make_role(replicas=count, gpus=gpus, tp=tp)
    picks = select_gpus(row, islands, count, role)
    flat = [g for p in picks for g in p]
    assert len(picks) == count and all(len(p) == gpus for p in picks)
    assert len(set(flat)) == len(flat)
    assert all(free_before[g] for g in flat)
    assert not row[flat].any()
    assert row.sum() == free_before.sum() - len(flat)
    for p in picks:
        for i in range(0, gpus, tp):
            assert len({int(islands[g]) for g in p[i : i + tp]}) == 1


def test_select_gpus_prefers_the_tightest_island_that_holds_the_replica() -> None:
    row = np.ones(8, dtype=np.bool_)
    row[[0]] = False  # island 0 keeps 3 free, island 1 keeps 4
    picks = select_gpus(row, island_row(4), 1, make_role(gpus=3))
    assert picks == [(1, 2, 3)]


def test_select_gpus_reuses_the_template_where_free() -> None:
    row = np.ones(8, dtype=np.bool_)
    row[4] = False
    template: list[tuple[int, ...]] = [(4, 5), (6, 7), (0, 1)]
    picks = select_gpus(row, island_row(8), 2, make_role(gpus=2), template=template)
    assert picks == [(6, 7), (0, 1)]


def test_select_gpus_for_cpu_only_roles_takes_nothing() -> None:
    row = np.ones(8, dtype=np.bool_)
    assert select_gpus(row, island_row(8), 3, make_role(gpus=0, cpus=2)) == [(), (), ()]
    assert row.all()


# --- plan_single ---------------------------------------------------------------------------------


def test_plan_single_takes_the_tightest_host_and_lists_runners_up() -> None:
    tree = make_fleet(racks=2, hosts=2)
    state = FleetState(tree)
    state.allocate(Allocation("a", (Grant("w", 0, 1, (0, 1, 2, 3, 4)),)))
    state.allocate(Allocation("b", (Grant("w", 0, 2, (0, 1)),)))
    role = make_role(gpus=2)
    plan = plan_single(state, role, eligible_hosts(state, role), Level.HOST, "H100-80GB")
    assert plan is not None
    assert plan.grants[0].host == 1 and plan.domain == tree.hosts[1].name
    assert plan.level == Level.HOST and plan.gpu_type == "H100-80GB"
    assert len(plan.grants[0].gpus) == 2
    # Runners-up: host 2 (6 free), then host 0 over host 3 (8 free each): its rack is fuller.
    assert [a.domain for a in plan.alternatives] == [tree.hosts[2].name, tree.hosts[0].name]
    assert plan.cost.total == tree.weights.nvlink


def test_plan_single_with_an_island_cap_needs_one_island() -> None:
    tree = make_fleet(racks=1, hosts=1, island=4)
    state = FleetState(tree)
    state.allocate(Allocation("a", (Grant("w", 0, 0, (0, 4)),)))
    role = make_role(gpus=4)
    eligible = eligible_hosts(state, role)
    assert plan_single(state, role, eligible, Level.ISLAND, "x") is None
    spread = plan_single(state, role, eligible, Level.HOST, "x")
    assert spread is not None and spread.cost.hops["host"] == 1


def test_plan_single_returns_none_without_room() -> None:
    state = FleetState(make_fleet(racks=1, hosts=2))
    role = make_role(gpus=8)
    state.allocate(Allocation("a", (Grant("w", 0, 0, (0,)), Grant("w", 1, 1, (0,)))))
    assert plan_single(state, role, eligible_hosts(state, role), Level.HOST, "x") is None


def test_capability_words() -> None:
    assert Capability().describe() == "any GPU"
    cap = Capability(frozenset({"H100", "A100"}), 40)
    assert cap.describe() == "GPU A100 or H100, at least 40 GB of GPU memory"

"""Properties every placement keeps, on random small fleets, occupancies and gangs."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from boltforge.core.model.gang import Gang, Role
from boltforge.core.model.levels import Level
from boltforge.core.model.state import Allocation, FleetState, Grant
from boltforge.core.model.topology import Tier, TopologyTree
from boltforge.core.placement.crossing import role_cost
from boltforge.core.placement.modes import (
    _ending,
    _replica_bound,
    by_end,
    could_ever_fit,
    place_now,
    when_and_where,
)
from boltforge.core.placement.place import Decision, Outcome, Placement, place_gang
from boltforge.testing.builders import (
    STATE_ARRAYS,
    make_fleet,
    make_gang,
    make_pool,
    make_role,
    occupy,
)

GPU_POOLS = {
    "hgx": make_pool("hgx", "H100-80GB", 80, gpus=8, island=8),
    "spot": make_pool("spot", "H100-80GB", 80, gpus=8, island=8, tier=Tier.SPOT, price=1.0),
    "quad": make_pool("quad", "A100-40GB", 40, gpus=8, island=4),
    "v100": make_pool("v100", "V100-32GB", 32, gpus=4, island=4, price=1.0),
    "pcie": make_pool("pcie", "L4-24GB", 24, gpus=4, island=1, price=0.8),
}
CPU_POOL = make_pool("cpu", gpu_type="none", memory_gb=0, gpus=0, cpus=64, host_memory_gb=512)
LEVELS = (Level.HOST, Level.RACK, Level.POD, Level.SPINE)
NOW = 1000.0
EXAMPLES = settings(
    max_examples=250,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@dataclass(frozen=True)
class World:
    """A fleet with some of it busy (and perhaps cordoned), and a gang that wants to run."""

    state: FleetState
    gang: Gang

    @property
    def tree(self) -> TopologyTree:
        return self.state.tree


@st.composite
def fleets(draw: st.DrawFn) -> TopologyTree:
    """1-2 pools (PCIe-only, islands of 4 and 8, spot, CPU nodes), 1-2 pods of 1-3 racks of 1-4."""
    first = draw(st.sampled_from(sorted(GPU_POOLS)))
    second = draw(st.sampled_from([None, "cpu", *sorted(set(GPU_POOLS) - {first})]))
    pools = [GPU_POOLS[first]]
    if second is not None:
        pools.append(CPU_POOL if second == "cpu" else GPU_POOLS[second])
    return make_fleet(
        pods=draw(st.integers(1, 2)),
        racks=draw(st.integers(1, 3)),
        hosts=draw(st.integers(1, 4)),
        pools=pools,
    )


@st.composite
def states(draw: st.DrawFn, tree: TopologyTree, busy: bool = False) -> FleetState:
    """Busy GPUs as one job per host (any pattern), or ``occupy``'s packed-then-churned fleet.

    ``busy`` makes hosts mostly full, every job's end known and no host cordoned, so that the
    gang usually has to wait (what ``when_and_where`` is about).
    """
    gpu_counts = {int(g) for g in tree.host_gpus if g}
    if len(gpu_counts) == 1 and draw(st.booleans()):
        low = 0.5 if busy else 0.0
        state = occupy(tree, draw(st.floats(low, 0.9)), seed=draw(st.integers(0, 2**16)))
    else:
        state = FleetState(tree)
        known = st.floats(NOW - 500, NOW + 36_000)
        ends = known if busy else st.one_of(st.none(), known, known, known)
        for h in range(len(tree.hosts)):
            n = int(tree.host_gpus[h])
            if n:
                every = (1 << n) - 1
                full = [every] * (4 if busy else 2)
                mask = draw(st.sampled_from([0, *full]) | st.integers(0, every))
                gpus = tuple(g for g in range(n) if mask >> g & 1)
                grant = Grant("w", 0, h, gpus, cpus=draw(st.sampled_from([0.0, 32.0])))
            else:
                grant = Grant("w", 0, h, (), cpus=draw(st.sampled_from([0.0, 16.0, 48.0, 64.0])))
            if grant.gpus or grant.cpus:
                state.allocate(Allocation(f"busy-{h}", (grant,), draw(ends)))
    if not busy and draw(st.booleans()):
        for h in draw(st.sets(st.integers(0, len(tree.hosts) - 1), max_size=2)):
            state.cordoned[h] = True
    return state


@st.composite
def gangs(draw: st.DrawFn, tree: TopologyTree) -> Gang:
    """1-2 roles: a GPU role (TP 1/2/4, capability floors) and maybe a CPU-only or small GPU one."""
    types = sorted({p.gpu_type for p in tree.pools if p.gpus_per_host})
    gpus = draw(st.sampled_from([1, 2, 4, 8]))
    some = st.lists(st.sampled_from(types), min_size=1, max_size=2).map(tuple)
    wanted = st.one_of(st.just(()), st.just(()), st.just(()), some, st.just(("MI300X",)))
    roles = [
        make_role(
            "trainer",
            replicas=draw(st.integers(1, 6)),
            gpus=gpus,
            tp=draw(st.sampled_from([t for t in (1, 2, 4) if t <= gpus])),
            cpus=draw(st.sampled_from([0, 0, 8, 112])),
            memory_gb=draw(st.sampled_from([0, 0, 64])),
            gpu_types=draw(wanted),
            min_memory=draw(st.sampled_from([0, 0, 0, 40, 80])),
        )
    ]
    second = draw(st.sampled_from([None, "cpu", "gpu"]))
    if second == "cpu":
        roles.append(
            Role(
                "loader",
                draw(st.integers(1, 4)),
                0,
                cpus=draw(st.sampled_from([8.0, 32.0, 64.0])),
                memory_gb=draw(st.sampled_from([0.0, 128.0])),
            )
        )
    elif second == "gpu":
        roles.append(make_role("eval", replicas=draw(st.integers(1, 2)), gpus=2))
    return make_gang(
        "job",
        roles=tuple(roles),
        required=draw(st.sampled_from([None, *LEVELS])),
        preferred=draw(st.sampled_from([None, Level.HOST, Level.RACK, Level.POD])),
    )


@st.composite
def worlds(draw: st.DrawFn, busy: bool = False) -> World:
    tree = draw(fleets())
    return World(draw(states(tree, busy)), draw(gangs(tree)))


# --- what a valid placement looks like ---------------------------------------------------


def snapshot(state: FleetState) -> tuple[object, ...]:
    return (
        state.free.copy(),
        state.free_cpus.copy(),
        state.free_memory.copy(),
        state.cordoned.copy(),
        dict(state.allocations),
    )


def same(a: tuple[object, ...], b: tuple[object, ...]) -> bool:
    return all(
        np.array_equal(x, y) if isinstance(x, np.ndarray) and isinstance(y, np.ndarray) else x == y
        for x, y in zip(a, b, strict=True)
    )


def assert_fits(state: FleetState, placement: Placement) -> None:
    """Only free GPUs, CPUs and memory are taken, and no GPU twice."""
    taken = [(g.host, gpu) for g in placement.grants for gpu in g.gpus]
    assert len(taken) == len(set(taken)), "a GPU is granted twice"
    assert all(state.free[h, gpu] for h, gpu in taken), "a busy GPU is granted"
    state.copy().allocate(placement.allocation())  # raises Conflict on any clash


def assert_valid(state: FleetState, gang: Gang, placement: Placement) -> None:
    """``placement`` places the whole ``gang`` on ``state`` and keeps every rule."""
    tree = state.tree
    assert_fits(state, placement)
    assert {r.role for r in placement.roles} == {r.name for r in gang.roles}
    total = 0.0
    for role in gang.roles:
        plan = next(p for p in placement.roles if p.role == role.name)
        grants = plan.grants
        assert len(grants) == role.replicas, "a gang is placed whole, replica for replica"
        assert sorted(g.replica for g in grants) == list(range(role.replicas))
        pools = {tree.pool_of(g.host) for g in grants}
        assert all(role.capability.accepts(p, role.gpus > 0) for p in pools)
        if role.gpus:
            assert len({p.gpu_type for p in pools}) == 1, "GPU models are never mixed in a role"
            assert {p.gpu_type for p in pools} == {plan.gpu_type}
        for g in grants:
            assert g.role == role.name
            assert not state.cordoned[g.host], "nothing lands on a cordoned host"
            assert len(g.gpus) == role.gpus and len(set(g.gpus)) == role.gpus
            assert (g.cpus, g.memory_gb) == (role.cpus, role.memory_gb)
            islands = tree.gpu_island[g.host]
            t = role.tensor_parallel
            for i in range(0, len(g.gpus), t):
                group = g.gpus[i : i + t]
                assert len({int(islands[gpu]) for gpu in group}) == 1, "TP group spans islands"
        # The explanation is honest: the named domain holds the role, the cost is exact.
        assert {domain(tree, plan.level, g.host) for g in grants} == {plan.domain}
        assert plan.cost == role_cost(tree, list(grants))
        total += plan.cost.total
        if gang.topology.required is not None:
            assert spans(tree, grants, gang.topology.required) == 1
    assert placement.cost.total == pytest.approx(total)
    # Across roles the required level is broken today: see test_placement_scenarios.KNOWN_BUGS.
    if gang.topology.required is not None and len(gang.roles) == 1:
        assert spans(tree, placement.grants, gang.topology.required) == 1
    preferred = gang.topology.preferred
    cap = gang.topology.required or Level.SPINE
    main = placement.main
    if preferred is not None and preferred < cap and main.level > preferred:
        assert any(f"role {main.role}: no single {preferred.label}" in n for n in placement.notes)


def domain(tree: TopologyTree, level: Level, host: int) -> str:
    return tree.domain_name(level, tree.domain_of(host, level))


def spans(tree: TopologyTree, grants: tuple[Grant, ...], level: Level) -> int:
    """How many domains of ``level`` the grants touch."""
    return len({tree.domain_of(g.host, level) for g in grants})


# --- properties ----------------------------------------------------------------------------


@EXAMPLES
@given(worlds())
def test_place_now_places_the_whole_gang_validly_or_nothing(world: World) -> None:
    before = snapshot(world.state)
    decision = place_now(world.state, world.gang)
    assert same(before, snapshot(world.state)), "place_now changed the state"
    if decision.outcome == Outcome.NOW:
        assert decision.placement is not None
        assert_valid(world.state, world.gang, decision.placement)
    else:
        assert decision.placement is None
        assert decision.reasons and decision.fixes


@EXAMPLES
@given(worlds())
def test_place_now_is_deterministic(world: World) -> None:
    first = place_now(world.state, world.gang)
    again = place_now(world.state.copy(), world.gang)
    assert first.outcome == again.outcome
    assert first.reasons == again.reasons
    if first.placement is not None:
        assert again.placement is not None
        assert first.placement.nodes(world.tree) == again.placement.nodes(world.tree)
        assert first.placement.grants == again.placement.grants


@EXAMPLES
@given(worlds())
def test_place_now_agrees_with_could_ever_fit(world: World) -> None:
    now = place_now(world.state, world.gang)
    ever = could_ever_fit(world.tree, world.gang)
    if ever.outcome == Outcome.NEVER:
        assert now.outcome != Outcome.NOW
        assert ever.placement is None
    if now.outcome == Outcome.NEVER:
        assert ever.outcome == Outcome.NEVER
    if ever.outcome == Outcome.NOW:
        assert ever.placement is not None
        assert_valid(FleetState(world.tree), world.gang, ever.placement)


@EXAMPLES
@given(worlds(busy=True))
def test_when_and_where_places_on_what_the_waited_for_jobs_free(world: World) -> None:
    state = world.state
    before = snapshot(state)
    decision = when_and_where(state, world.gang, NOW)
    assert same(before, snapshot(state)), "when_and_where changed the state"
    now = place_now(state, world.gang)
    if now.outcome == Outcome.NOW:
        assert decision.outcome == Outcome.NOW
        assert decision.start_time == NOW
        assert decision.placement is not None and now.placement is not None
        assert decision.placement.grants == now.placement.grants
        return
    if decision.outcome != Outcome.LATER:
        assert decision.outcome in (Outcome.NOT_NOW, Outcome.NEVER)
        assert decision.placement is None
        ever = could_ever_fit(world.tree, world.gang).outcome
        if decision.outcome == Outcome.NEVER:
            assert ever == Outcome.NEVER
        else:
            # Busy worlds cordon nothing and every job has a known end, so once all have ended
            # the fleet is empty: a gang that fits the empty fleet must get a start time.
            assert ever == Outcome.NEVER, "fits the empty fleet but was given no start time"
        return
    placement, start = decision.placement, decision.start_time
    assert placement is not None and start is not None and start >= NOW
    ends = {job: a.expected_end for job, a in state.allocations.items()}
    assert len(set(decision.waits_for)) == len(decision.waits_for)
    for job in decision.waits_for:
        end = ends[job]
        assert end is not None and end <= start, f"{job} is not known to end by {start}"
    # Everything it needs (GPUs, CPUs, memory) is free once the jobs it waits for have ended.
    released = state.copy()
    for job in decision.waits_for:
        released.release(job)
    assert_valid(released, world.gang, placement)


@EXAMPLES
@given(worlds(busy=True))
def test_when_and_where_finds_the_earliest_end_after_which_the_gang_fits(world: World) -> None:
    """Against a plain linear search: release the running jobs one by one in order of end
    and stop at the first release after which the gang places (the galloping search, and the
    bound it starts from, skip only releases after which it cannot)."""
    state, gang = world.state, world.gang
    decision = when_and_where(state, gang, NOW)
    if decision.outcome != Outcome.LATER:
        return
    released = state.copy()
    for allocation in by_end(state):
        released.release(allocation.job)
        placement, _ = place_gang(released, gang)
        if placement is not None:
            assert decision.start_time == max(allocation.expected_end or NOW, NOW)
            assert decision.placement is not None
            assert decision.placement.grants == placement.grants
            return
    raise AssertionError("a start time was given but the gang never fits")


@st.composite
def shared_hosts(draw: st.DrawFn) -> FleetState:
    """Eight-GPU hosts that several running jobs share, each job on one to three hosts with
    a known end (ties likely), some hosts cordoned: what the replica bound counts."""
    tree = make_fleet(racks=2, hosts=3)
    state = FleetState(tree)
    free = {h: list(range(8)) for h in range(len(tree.hosts))}
    for i in range(draw(st.integers(0, 12))):
        hosts = draw(st.lists(st.sampled_from(sorted(free)), min_size=1, max_size=3, unique=True))
        grants = []
        for rank, h in enumerate(hosts):
            n = min(draw(st.integers(1, 4)), len(free[h]))
            gpus, free[h] = tuple(free[h][:n]), free[h][n:]
            if gpus:
                grants.append(Grant("w", rank, h, gpus))
        if grants:
            end = draw(st.sampled_from([NOW + 100.0, NOW + 200.0, NOW + 300.0, NOW + 900.0]))
            state.allocate(Allocation(f"r{i}", tuple(grants), end))
    for h in draw(st.sets(st.integers(0, len(tree.hosts) - 1), max_size=2)):
        state.cordoned[h] = True
    return state


@EXAMPLES
@given(shared_hosts(), st.sampled_from([1, 2, 4, 8]), st.integers(1, 12))
def test_the_replica_bound_is_the_first_release_with_slots_enough(
    state: FleetState, gpus: int, replicas: int
) -> None:
    """Against releasing the ending jobs one by one: the bound the reservation search starts
    from is the first release after which the open hosts' free GPUs, host by host, hold a
    slot for every replica (however many jobs share a host and end together)."""
    gang = Gang("g", (make_role("w", replicas=replicas, gpus=gpus),))
    ends = _ending(state)
    open_hosts = ~state.cordoned

    def slots(s: FleetState) -> int:
        return int((s.host_free[open_hosts] // gpus).sum())

    if slots(state) >= replicas or not ends.allocations:
        expected = 0
    else:
        enough = (
            k for k in range(len(ends.allocations)) if slots(ends.released_to(state, k)) >= replicas
        )
        expected = next(enough, len(ends.allocations))
    assert _replica_bound(state, gang, ends) == expected


@EXAMPLES
@given(worlds())
def test_unexplained_placement_answers_the_same(world: World) -> None:
    explained = place_now(world.state, world.gang)
    bare = place_now(world.state, world.gang, explain=False)
    assert bare.outcome == explained.outcome
    assert bare.placement == explained.placement
    assert bare.reasons == () and bare.fixes == ()
    assert when_and_where(world.state, world.gang, NOW, explain=False).start_time == (
        when_and_where(world.state, world.gang, NOW).start_time
    )


# --- bugs the properties found, pinned down as small examples ------------------------------


def test_waits_for_names_jobs_holding_the_cpus_a_gang_needs() -> None:
    tree = make_fleet(racks=1, hosts=1, pools=[make_pool("h100"), CPU_POOL])
    trainer, cpu_node = tree.host_index["h100-p0-r0-h0"], tree.host_index["cpu-p0-r0-h0"]
    state = FleetState(tree)
    state.allocate(Allocation("etl", (Grant("w", 0, cpu_node, (), cpus=64),), 100.0))
    state.allocate(Allocation("train", (Grant("w", 0, trainer, (0, 1, 2, 3)),), 200.0))
    gang = make_gang(roles=(make_role("trainer", gpus=8), Role("loader", 1, 0, cpus=64)))
    decision = when_and_where(state, gang, NOW)
    assert decision.outcome == Outcome.LATER
    assert set(decision.waits_for) == {"etl", "train"}


def test_generated_worlds_cover_the_interesting_cases() -> None:
    """The generators reach every outcome, CPU roles, TP groups and required levels."""
    seen: Counter[str] = Counter()

    @settings(max_examples=150, deadline=None, database=None, derandomize=True)
    @given(worlds())
    def sample(world: World) -> None:
        decision: Decision = place_now(world.state, world.gang)
        seen[decision.outcome.name] += 1
        roles = world.gang.roles
        seen["cpu role"] += any(r.gpus == 0 for r in roles)
        seen["tp > 1"] += any(r.tensor_parallel > 1 for r in roles)
        seen["required"] += world.gang.topology.required is not None
        if decision.placement is not None:
            seen["spans hosts"] += len({g.host for g in decision.placement.grants}) > 1

    sample()
    for label in ("NOW", "NOT_NOW", "NEVER", "cpu role", "tp > 1", "required", "spans hosts"):
        assert seen[label] > 0, f"generators never produced {label}: {dict(seen)}"


# --- the released states ``when_and_where`` shares between its searches ------------------


def assert_same_state(got: FleetState, want: FleetState) -> None:
    """Every array equal element for element (floats exactly), the same allocations in the
    same order and the same shares."""
    for part in STATE_ARRAYS:
        assert np.array_equal(getattr(got, part), getattr(want, part)), part
    assert list(got.allocations.items()) == list(want.allocations.items())
    assert got.shared == want.shared


@EXAMPLES
@given(worlds(busy=True), st.data())
def test_released_states_equal_releasing_from_scratch(world: World, data: st.DataObject) -> None:
    """``_Ending.released_to`` makes each state from the nearest one made before; asked in
    any order, under any cordons, each equals the state with the first ending jobs
    released at once, cordoned as the state is now."""
    state = world.state
    ends = _ending(state)
    assume(ends.allocations)
    hosts = len(state.cordoned)
    for k in data.draw(st.lists(st.integers(0, len(ends.allocations) - 1), max_size=8)):
        for h in data.draw(st.sets(st.integers(0, hosts - 1), max_size=2)):
            state.cordoned[h] = not state.cordoned[h]
        fresh = state.copy()
        fresh.release_many([a.job for a in ends.allocations[: k + 1]])
        assert_same_state(ends.released_to(state, k), fresh)


@EXAMPLES
@given(worlds(busy=True), st.data())
def test_when_and_where_answers_as_on_a_state_nothing_was_asked_of(
    world: World, data: st.DataObject
) -> None:
    """Searches after others on the same state (sharing their released states) answer as
    the same search on a copy that remembers nothing."""
    state = world.state
    for gang in [world.gang, *data.draw(st.lists(gangs(world.tree), max_size=3))]:
        warm = when_and_where(state, gang, NOW)
        cold_state = state.copy()
        cold_state.memo = {}
        cold = when_and_where(cold_state, gang, NOW)
        assert warm == cold

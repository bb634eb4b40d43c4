"""Lookahead placement: a gang is placed so that the jobs queued behind it still fit.

Scenarios are data: a fleet, what is busy, the gang, the jobs behind it, and what the plain
engine does with them one at a time. Properties on small random fleets check that lookahead
never places fewer of the upcoming jobs than the plain engine and never returns an invalid
placement.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from boltforge.core.model.gang import Gang
from boltforge.core.model.levels import Level
from boltforge.core.model.state import Allocation, FleetState, Grant
from boltforge.core.model.topology import BoolArray, TopologyTree
from boltforge.core.placement.answers import Placement
from boltforge.core.placement.lookahead import place_with_lookahead
from boltforge.core.placement.place import place_gang
from boltforge.testing.builders import make_fleet, make_gang, make_pool

ALL = tuple(range(8))


@dataclass(frozen=True)
class Stranding:
    """A gang whose cheapest placement leaves no room for a job behind it that would fit.

    ``held`` maps host names to the GPUs running jobs hold there. ``upcoming`` are the jobs
    queued behind ``gang``, in order; ``stranded`` names those that the one-at-a-time engine
    cannot place after ``gang`` but that place after the lookahead's choice. ``engine_within``
    and ``lookahead_within`` are the racks that hold the two choices.
    """

    id: str
    fleet: TopologyTree
    held: dict[str, tuple[int, ...]]
    gang: Gang
    upcoming: tuple[Gang, ...]
    stranded: tuple[str, ...]
    engine_within: str
    lookahead_within: str

    def state(self) -> FleetState:
        state = FleetState(self.fleet)
        for i, (host, gpus) in enumerate(sorted(self.held.items())):
            grant = Grant("w", 0, self.fleet.host_index[host], gpus)
            state.allocate(Allocation(f"busy-{i}", (grant,)))
        return state


FOUR_HOSTS_ONE_RACK = make_gang("job-2", gpus=32, per_node=8, required=Level.RACK)

STRANDINGS = [
    Stranding(
        "off-rail halves in rack r0 cost more than a whole host of rack r1",
        fleet=make_fleet(racks=2, hosts=4),
        held={
            "h100-p0-r0-h0": (4, 5, 6, 7),
            "h100-p0-r0-h1": (0, 1, 2, 3),
            "h100-p0-r0-h2": ALL,
            "h100-p0-r0-h3": ALL,
        },
        gang=make_gang("job-1", gpus=8, per_node=4),  # 2 replicas of 4 GPUs
        upcoming=(FOUR_HOSTS_ONE_RACK,),
        stranded=("job-2",),
        engine_within="h100-p0-r1",
        lookahead_within="h100-p0-r0",
    ),
    Stranding(
        "a replica straddling two NVLink islands in rack r0 costs more than one island in r1",
        fleet=make_fleet(racks=2, hosts=4, island=4),
        held={
            "h100-p0-r0-h0": (0, 1, 6, 7),  # free: 2, 3 | 4, 5 (two islands of 4)
            "h100-p0-r0-h1": ALL,
            "h100-p0-r0-h2": ALL,
            "h100-p0-r0-h3": ALL,
        },
        gang=make_gang("job-1", gpus=4, per_node=4),
        upcoming=(FOUR_HOSTS_ONE_RACK,),
        stranded=("job-2",),
        engine_within="h100-p0-r1",
        lookahead_within="h100-p0-r0",
    ),
    Stranding(
        "a job that fits nowhere is skipped and the one behind it is saved",
        fleet=make_fleet(racks=2, hosts=4),
        held={
            "h100-p0-r0-h0": (4, 5, 6, 7),
            "h100-p0-r0-h1": (0, 1, 2, 3),
            "h100-p0-r0-h2": ALL,
            "h100-p0-r0-h3": ALL,
        },
        gang=make_gang("job-1", gpus=8, per_node=4),
        upcoming=(make_gang("too-big", gpus=64, per_node=8), FOUR_HOSTS_ONE_RACK),
        stranded=("job-2",),
        engine_within="h100-p0-r1",
        lookahead_within="h100-p0-r0",
    ),
]


def placed_names(
    state: FleetState, choice: Placement | None, upcoming: Sequence[Gang]
) -> list[str]:
    """The jobs of ``upcoming`` the plain engine places, offered in order (a job that does not
    fit is skipped), after ``choice`` is taken (None: nothing taken)."""
    work = state.copy()
    if choice is not None:
        work.allocate(Allocation("choice", choice.grants))
    names = []
    for i, job in enumerate(upcoming):
        placement, _ = place_gang(work, job)
        if placement is not None:
            work.allocate(Allocation(f"upcoming-{i}", placement.grants))
            names.append(job.name)
    return names


def placed_after(state: FleetState, choice: Placement | None, upcoming: Sequence[Gang]) -> int:
    """How many of ``upcoming`` the plain engine places, in order, after ``choice`` is taken."""
    return len(placed_names(state, choice, upcoming))


def racks_of(tree: TopologyTree, placement: Placement) -> set[str]:
    return {tree.rack_names[int(tree.host_rack[g.host])] for g in placement.grants}


def assert_valid(state: FleetState, placement: Placement) -> None:
    """Only free, uncordoned GPUs are taken (``allocate`` raises on any clash)."""
    assert not any(state.cordoned[g.host] for g in placement.grants)
    state.copy().allocate(placement.allocation())


Snapshot = tuple[BoolArray, BoolArray, dict[str, Allocation]]


def snapshot(state: FleetState) -> Snapshot:
    return (state.free.copy(), state.cordoned.copy(), dict(state.allocations))


def unchanged(before: Snapshot, state: FleetState) -> bool:
    free, cordoned, allocations = snapshot(state)
    same_arrays = np.array_equal(before[0], free) and np.array_equal(before[1], cordoned)
    return same_arrays and before[2] == allocations


# --- scenarios ---------------------------------------------------------------------------


@pytest.mark.parametrize("case", STRANDINGS, ids=[c.id for c in STRANDINGS])
def test_one_job_at_a_time_strands_the_next_job(case: Stranding) -> None:
    state = case.state()
    first, _ = place_gang(state, case.gang)
    assert first is not None
    assert racks_of(case.fleet, first) == {case.engine_within}
    work = state.copy()
    work.allocate(first.allocation())
    for job in case.upcoming:
        if job.name in case.stranded:
            second, _ = place_gang(work, job)
            assert second is None, f"{job.name} should not fit after the engine's choice"
    without_gang = placed_names(state, None, case.upcoming)
    assert set(case.stranded) <= set(without_gang), "each stranded job fits without the gang"


@pytest.mark.parametrize("case", STRANDINGS, ids=[c.id for c in STRANDINGS])
def test_lookahead_leaves_room_for_the_next_job(case: Stranding) -> None:
    state = case.state()
    before = snapshot(state)
    chosen = place_with_lookahead(state, case.gang, case.upcoming, depth=len(case.upcoming))
    assert unchanged(before, state), "lookahead changed the state"
    assert chosen is not None
    assert_valid(state, chosen)
    assert racks_of(case.fleet, chosen) == {case.lookahead_within}
    engine, _ = place_gang(state, case.gang)
    assert engine is not None
    assert chosen.cost.total > engine.cost.total, "lookahead pays more to save the next job"
    after = placed_names(state, chosen, case.upcoming)
    assert set(case.stranded) <= set(after), "the stranded jobs fit after the lookahead's choice"
    assert not set(case.stranded) & set(placed_names(state, engine, case.upcoming))


@pytest.mark.parametrize("case", STRANDINGS, ids=[c.id for c in STRANDINGS])
def test_depth_zero_and_no_budget_give_the_plain_engine(case: Stranding) -> None:
    state = case.state()
    engine, _ = place_gang(state, case.gang)
    assert engine is not None
    for depth in (0, -1):
        got = place_with_lookahead(state, case.gang, case.upcoming, depth)
        assert got is not None and got.grants == engine.grants
    got = place_with_lookahead(state, case.gang, (), 4)
    assert got is not None and got.grants == engine.grants
    got = place_with_lookahead(state, case.gang, case.upcoming, 4, max_alternatives=0)
    assert got is not None and got.grants == engine.grants


@pytest.mark.parametrize("case", STRANDINGS, ids=[c.id for c in STRANDINGS])
def test_lookahead_is_deterministic(case: Stranding) -> None:
    state = case.state()
    depth = len(case.upcoming)
    first = place_with_lookahead(state, case.gang, case.upcoming, depth)
    again = place_with_lookahead(state.copy(), case.gang, case.upcoming, depth)
    engine, _ = place_gang(state, case.gang)
    given_engine = place_with_lookahead(state, case.gang, case.upcoming, depth, engine=engine)
    assert first is not None and again is not None and given_engine is not None
    assert first.grants == again.grants == given_engine.grants
    assert first.cost == again.cost


def test_nothing_stranded_keeps_the_engines_choice() -> None:
    """Job 2 needs two whole hosts of one rack: rack r1 still has three after job 1."""
    case = STRANDINGS[0]
    state = case.state()
    small_next = (make_gang("job-2", gpus=16, per_node=8, required=Level.RACK),)
    engine, _ = place_gang(state, case.gang)
    chosen = place_with_lookahead(state, case.gang, small_next, depth=1)
    assert engine is not None and chosen is not None
    assert chosen.grants == engine.grants


def test_a_job_that_fits_nowhere_does_not_move_the_gang() -> None:
    """Nothing the gang does can make room for a job larger than the free fleet."""
    case = STRANDINGS[0]
    state = case.state()
    hopeless = (make_gang("huge", gpus=64, per_node=8),)
    engine, _ = place_gang(state, case.gang)
    chosen = place_with_lookahead(state, case.gang, hopeless, depth=1)
    assert engine is not None and chosen is not None
    assert chosen.grants == engine.grants


def test_a_gang_the_engine_cannot_place_gets_none() -> None:
    case = STRANDINGS[0]
    state = case.state()
    too_big = make_gang("job-1", gpus=64, per_node=8)
    assert place_gang(state, too_big)[0] is None
    assert place_with_lookahead(state, too_big, case.upcoming, 1) is None
    assert place_with_lookahead(state, too_big, case.upcoming, 0) is None


def test_lookahead_keeps_cordons_and_the_gangs_required_rack() -> None:
    """With rack r0 cordoned there is no room to save job 2; the gang stays on r1."""
    case = STRANDINGS[0]
    state = case.state()
    state.cordoned[case.fleet.rack_hosts[0]] = True
    gang = make_gang("job-1", gpus=8, per_node=4, required=Level.RACK)
    chosen = place_with_lookahead(state, gang, case.upcoming, 1)
    assert chosen is not None
    assert_valid(state, chosen)
    assert racks_of(case.fleet, chosen) == {"h100-p0-r1"}


# --- properties on small random fleets -----------------------------------------------------

EXAMPLES = settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
LEVELS = (None, None, Level.HOST, Level.RACK, Level.RACK, Level.POD)


@dataclass(frozen=True)
class Queue:
    """A busy small fleet, a gang to place and the jobs queued behind it."""

    state: FleetState
    gang: Gang
    upcoming: tuple[Gang, ...]
    depth: int


@st.composite
def fleets(draw: st.DrawFn) -> TopologyTree:
    """1-2 pods of 1-3 racks of 1-4 hosts, 8 GPUs each in NVLink islands of 8 or 4."""
    pool = make_pool(island=draw(st.sampled_from([8, 4])))
    pods, racks = draw(st.integers(1, 2)), draw(st.integers(1, 3))
    return make_fleet(pods=pods, racks=racks, hosts=draw(st.integers(1, 4)), pools=[pool])


@st.composite
def states(draw: st.DrawFn, tree: TopologyTree) -> FleetState:
    """Each host empty, full or holding any pattern of busy GPUs; maybe one host cordoned."""
    state = FleetState(tree)
    every = (1 << 8) - 1
    for h in range(len(tree.hosts)):
        mask = draw(st.sampled_from([0, 0, every, every]) | st.integers(0, every))
        gpus = tuple(g for g in range(8) if mask >> g & 1)
        if gpus:
            state.allocate(Allocation(f"busy-{h}", (Grant("w", 0, h, gpus),)))
    if draw(st.booleans()):
        state.cordoned[draw(st.integers(0, len(tree.hosts) - 1))] = True
    return state


@st.composite
def jobs(draw: st.DrawFn, name: str, whole_hosts: bool = False) -> Gang:
    """1-4 replicas of 1, 2, 4 or 8 GPUs, perhaps confined to one host, rack or pod.

    ``whole_hosts`` leans toward replicas of a whole host that must share a rack: the jobs a
    cheap choice for the gang ahead of them can strand.
    """
    sizes = [4, 8, 8, 8] if whole_hosts else [1, 2, 4, 8]
    per_node = draw(st.sampled_from(sizes))
    replicas = draw(st.integers(1, 4))
    required = draw(st.sampled_from([Level.RACK, *LEVELS] if whole_hosts else LEVELS))
    return make_gang(name, gpus=per_node * replicas, per_node=per_node, required=required)


@st.composite
def queues(draw: st.DrawFn) -> Queue:
    tree = draw(fleets())
    count = draw(st.integers(1, 3))
    upcoming = tuple(draw(jobs(f"next-{i}", whole_hosts=True)) for i in range(count))
    depth = draw(st.integers(0, len(upcoming)))
    return Queue(draw(states(tree)), draw(jobs("gang")), upcoming, depth)


@st.composite
def stranding_queues(draw: st.DrawFn) -> Queue:
    """Queues shaped like the scenarios, where the cheapest choice often strands the next job.

    One pod of 2-3 racks; each rack has some empty hosts and the rest full or half busy; the
    gang is two replicas of 2 or 4 GPUs (cheapest on one empty host, dearer across the half
    busy ones); the job behind it needs the roomiest rack's empty hosts, all in one rack.
    """
    tree = make_fleet(
        racks=draw(st.integers(2, 3)),
        hosts=draw(st.integers(2, 4)),
        pools=[make_pool(island=draw(st.sampled_from([8, 4])))],
    )
    state = FleetState(tree)
    patterns = st.sampled_from([0xFF, 0x0F, 0xF0, 0x3C, 0xC3]) | st.integers(0, 0xFF)
    empty_hosts = []
    for rack in tree.rack_hosts:
        hosts = [int(h) for h in rack if h >= 0]
        empty = draw(st.integers(0, len(hosts)))
        empty_hosts.append(empty)
        for h in hosts[empty:]:
            mask = draw(patterns)
            gpus = tuple(g for g in range(8) if mask >> g & 1)
            if gpus:
                state.allocate(Allocation(f"busy-{h}", (Grant("w", 0, h, gpus),)))
    per_node = draw(st.sampled_from([2, 4, 4]))
    gang = make_gang("gang", gpus=2 * per_node, per_node=per_node)
    roomiest = max(max(empty_hosts), 1)
    behind = make_gang("next", gpus=8 * roomiest, per_node=8, required=Level.RACK)
    upcoming = (behind, *draw(st.lists(jobs("later", whole_hosts=True), max_size=1)))
    return Queue(state, gang, upcoming, draw(st.integers(1, len(upcoming))))


@EXAMPLES
@given(st.one_of(queues(), stranding_queues()))
def test_lookahead_never_places_fewer_upcoming_jobs(queue: Queue) -> None:
    state, gang, upcoming, depth = queue.state, queue.gang, queue.upcoming, queue.depth
    before = snapshot(state)
    engine, _ = place_gang(state, gang)
    chosen = place_with_lookahead(state, gang, upcoming, depth)
    assert unchanged(before, state), "lookahead changed the state"
    if engine is None:
        assert chosen is None
        return
    assert chosen is not None
    assert_valid(state, chosen)
    window = upcoming[:depth]
    plain, ahead = placed_after(state, engine, window), placed_after(state, chosen, window)
    assert ahead >= plain
    if chosen.grants != engine.grants:
        assert ahead > plain, "the engine's choice is replaced only to place more jobs"
    again = place_with_lookahead(state.copy(), gang, upcoming, depth)
    assert again is not None and again.grants == chosen.grants


def test_random_queues_reach_the_interesting_cases() -> None:
    """The generators produce queues where lookahead changes the choice, and where it does not."""
    seen: Counter[str] = Counter()

    @settings(max_examples=150, deadline=None, database=None, derandomize=True)
    @given(st.one_of(queues(), stranding_queues()))
    def sample(queue: Queue) -> None:
        engine, _ = place_gang(queue.state, queue.gang)
        chosen = place_with_lookahead(queue.state, queue.gang, queue.upcoming, queue.depth)
        if engine is None or chosen is None:
            seen["unplaceable"] += 1
        elif chosen.grants != engine.grants:
            seen["changed"] += 1
        else:
            seen["kept"] += 1

    sample()
    for label in ("unplaceable", "changed", "kept"):
        assert seen[label] > 0, f"generators never produced {label}: {dict(seen)}"

"""Fleet state bookkeeping: the counters kept in step with allocations stay exact."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from boltforge.core.model.state import Allocation, FleetState, Grant
from boltforge.core.model.topology import HostLayout, TopologyTree
from boltforge.core.placement.modes import by_end
from boltforge.testing.builders import make_fleet, make_pool, occupy

FLEET = make_fleet(
    racks=2, hosts=3, pools=[make_pool("hgx", island=8), make_pool("pcie", island=4)]
)


def recount(state: FleetState) -> dict[str, np.ndarray]:
    """Every derived counter, recomputed from scratch from ``free``."""
    tree = state.tree
    island = np.einsum("hg,hgi->hi", state.free.astype(np.int64), tree.island_onehot)
    host = state.free.sum(axis=1)
    rack = np.bincount(tree.host_rack, weights=host, minlength=len(tree.rack_names))
    pod = np.bincount(tree.host_pod, weights=host, minlength=len(tree.pod_names))
    spans = tree.fit_spans
    return {
        "island_free": island,
        "island_max": island.max(axis=1, initial=0),
        "host_free": host,
        "rack_free": rack,
        "pod_free": pod,
        "fit_key": host * spans.rack * spans.pod
        + rack[tree.host_rack] * spans.pod
        + pod[tree.host_pod],
    }


def assert_consistent(state: FleetState) -> None:
    for name, expected in recount(state).items():
        assert np.array_equal(getattr(state, name), expected), name


@settings(max_examples=60, deadline=None)
@given(st.floats(0.0, 0.9), st.integers(0, 50), st.data())
def test_counters_follow_allocate_release_and_release_many(
    fraction: float, seed: int, data: st.DataObject
) -> None:
    state = occupy(make_fleet(racks=2, hosts=3), fraction, seed)
    assert_consistent(state)
    jobs = sorted(state.allocations)
    some = data.draw(st.lists(st.sampled_from(jobs), unique=True) if jobs else st.just([]))
    one_by_one = state.copy()
    for job in some:
        one_by_one.release(job)
    at_once = state.copy()
    at_once.release_many(some)
    assert_consistent(one_by_one)
    assert_consistent(at_once)
    assert np.array_equal(one_by_one.free, at_once.free)
    assert sorted(one_by_one.allocations) == sorted(at_once.allocations)


def test_copies_do_not_share_counters() -> None:
    state = occupy(FLEET, 0.5, 3)
    copy = state.copy()
    copy.release_many(sorted(copy.allocations))
    assert_consistent(state)
    assert_consistent(copy)
    assert copy.free_gpus == FLEET.total_gpus and state.free_gpus < FLEET.total_gpus


def test_counters_stay_exact_when_a_rack_s_hosts_are_not_numbered_together() -> None:
    pool = FLEET.pools[0]
    layout = [HostLayout(f"h{i}", 0, f"p{i % 2}", f"r{i % 3}") for i in range(6)]
    tree = TopologyTree.build("interleaved", (pool,), layout)
    state = FleetState(tree)
    state.allocate(Allocation("a", (Grant("w", 0, 4, (0, 1, 2)),)))
    state.allocate(Allocation("b", (Grant("w", 0, 1, (5,)), Grant("w", 1, 3, (0,)))))
    assert_consistent(state)
    state.release("a")
    assert_consistent(state)


# --- what callers derive from the allocations, remembered until they change ---------------------


def _ends(state: FleetState) -> list[str]:
    return [a.job for a in by_end(state)]


def test_jobs_by_end_follow_every_allocation_and_release() -> None:
    state = FleetState(make_fleet(racks=1, hosts=2))
    state.allocate(Allocation("late", (Grant("w", 0, 0, (0, 1)),), 300.0))
    assert _ends(state) == ["late"]
    state.allocate(Allocation("soon", (Grant("w", 0, 1, (0,)),), 100.0))
    assert _ends(state) == ["soon", "late"]
    state.release("soon")
    assert _ends(state) == ["late"]
    state.allocate(Allocation("a", (Grant("w", 0, 1, (1,)),), 50.0))
    state.allocate(Allocation("b", (Grant("w", 0, 1, (2,)),), 60.0))
    state.release_many(["a", "late"])
    assert _ends(state) == ["b"]


def test_a_copy_and_its_original_remember_their_own_allocations() -> None:
    state = FleetState(make_fleet(racks=1, hosts=2))
    state.allocate(Allocation("x", (Grant("w", 0, 0, (0,)),), 100.0))
    assert _ends(state) == ["x"]  # remembered, then copied with the state
    other = state.copy()
    other.release("x")  # one change each since the copy: the counts are equal again
    state.allocate(Allocation("z", (Grant("w", 0, 1, (1,)),), 70.0))
    assert state.changes == other.changes
    assert _ends(other) == []
    assert _ends(state) == ["z", "x"]
    assert _ends(other) == []


def test_an_allocation_spreads_its_gpus_by_grant() -> None:
    held = Allocation("j", (Grant("w", 0, 3, (0, 1)), Grant("w", 1, 5, ()), Grant("w", 2, 4, (7,))))
    assert held.spread == ((3, 2), (4, 1)) and held.gpus == 3

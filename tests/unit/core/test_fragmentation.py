"""The fragmentation index over a subset of hosts (one pool's), as ``/metrics`` reports it."""

from __future__ import annotations

import numpy as np
import pytest

from boltforge.core.model.state import Allocation, FleetState, Grant
from boltforge.core.placement.fragmentation import index_over, measure
from boltforge.testing.builders import make_fleet, make_pool, occupy


def test_over_every_host_it_is_the_fleet_index() -> None:
    tree = make_fleet(pods=2, racks=2, hosts=4)
    for seed in range(5):
        state = occupy(tree, 0.6, seed=seed)
        everything = np.ones(len(tree.hosts), dtype=np.bool_)
        assert index_over(state, everything) == pytest.approx(measure(state).index)


def test_each_pool_counts_only_its_own_free_gpus() -> None:
    tree = make_fleet(racks=1, hosts=2, pools=[make_pool("a"), make_pool("b")])
    state = FleetState(tree)
    state.allocate(Allocation("j", (Grant("w", 0, 0, (0, 1, 2, 3)),)))  # half of a's host 0
    state.cordoned[3] = True  # b's second host
    pool_a, pool_b = tree.host_pool == 0, tree.host_pool == 1
    assert index_over(state, pool_a) == pytest.approx(4 / 12)  # 4 of 12 free on a partial host
    assert index_over(state, pool_b) == pytest.approx(8 / 16)  # 8 of 16 free on a cordoned one
    state.allocate(
        Allocation("k", (Grant("w", 0, 0, (4, 5, 6, 7)), Grant("w", 1, 1, tuple(range(8)))))
    )
    assert index_over(state, pool_a) == 0.0  # no free GPU left in a

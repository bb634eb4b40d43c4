"""The collector settings of the server and the simulator's workers (``boltforge.gctune``)."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from boltforge import gctune


@pytest.fixture
def collector() -> Iterator[None]:
    """The test process's collector as it was, put back after."""
    before = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*before)


def test_tuning_collects_young_objects_less_often_and_older_ones_rarer_still(
    collector: None,
) -> None:
    gctune.tune()
    assert gc.get_threshold() == (gctune.YOUNG, gctune.OLDER, gctune.OLDER)
    gctune.tune()  # idempotent
    assert gc.get_threshold() == (gctune.YOUNG, gctune.OLDER, gctune.OLDER)


def test_settling_sets_what_is_alive_aside_from_later_collections(collector: None) -> None:
    world = [{"job": i} for i in range(1000)]
    gctune.settle()
    assert gc.get_freeze_count() >= len(world)
    gc.collect()
    assert gc.get_freeze_count() >= len(world)  # a later collection leaves them aside

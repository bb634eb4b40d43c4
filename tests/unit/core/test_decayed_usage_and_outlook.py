"""Decayed usage from holdings (``queueing/usage.py``) and the deadline verdicts
(``queueing/deadlines.py``) on their own, with numbers checked by hand."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from boltforge.core.model.gang import Gang
from boltforge.core.model.state import Allocation, FleetState, Grant
from boltforge.core.model.workload import Job, Running, Usage
from boltforge.core.queueing.deadlines import (
    NEVER_RUNS,
    NO_RUNTIME,
    NO_START,
    deadline_outlook,
    judge,
    running_outlook,
)
from boltforge.core.queueing.usage import Holding, carry, decayed_gpu_s, usage_of
from boltforge.testing.builders import make_fleet, make_gang

H = 3600.0  # the half-life of these examples

# --- usage --------------------------------------------------------------------------------


def test_every_queue_above_a_holding_is_charged_the_same_amount() -> None:
    got = usage_of([Holding("org/nlp/llm", 4, 0.0, H)], H, H).by_queue
    assert set(got) == {"org/nlp/llm", "org/nlp", "org", ""}
    assert len(set(got.values())) == 1
    assert got[""] == pytest.approx(4 * H / (2 * math.log(2)))


def test_a_holding_that_starts_later_still_names_its_queues_with_zero() -> None:
    got = usage_of([Holding("ops", 8, 2 * H)], H, H)
    assert got.by_queue == {"ops": 0.0, "": 0.0}
    assert got.as_of == H


def test_sibling_queues_add_up_at_their_parent_and_the_root() -> None:
    held = [Holding("org/a", 2, 0.0, H), Holding("org/b", 6, 0.0, H), Holding("ops", 8, 0.0)]
    got = usage_of(held, H, H).by_queue
    assert got["org"] == pytest.approx(got["org/a"] + got["org/b"])
    assert got[""] == pytest.approx(got["org"] + got["ops"])
    assert got["org/b"] == pytest.approx(3 * got["org/a"])  # linear in GPUs


@pytest.mark.parametrize("half_life", [0.0, -H, math.nan], ids=["zero", "negative", "nan"])
def test_a_half_life_that_is_not_positive_is_refused(half_life: float) -> None:
    with pytest.raises(ValueError, match="half_life_s must be positive"):
        usage_of([], H, half_life)
    with pytest.raises(ValueError, match="half_life_s must be positive"):
        carry(Usage({}, 0.0), H, half_life, [])


def test_carry_counts_only_what_was_held_after_the_usage_was_taken() -> None:
    # Usage taken at H already counts [0, H]; carrying to 2H decays it by half and adds only
    # the stretch (H, 2H] of the same holding, not [0, H] a second time.
    held = [Holding("ops", 8, 0.0)]
    at_h = usage_of(held, H, H)
    carried = carry(at_h, 2 * H, H, held)
    assert carried.by_queue["ops"] == pytest.approx(usage_of(held, 2 * H, H).by_queue["ops"])
    assert carried.by_queue["ops"] == pytest.approx(
        at_h.by_queue["ops"] / 2 + decayed_gpu_s(8, H, 2 * H, 2 * H, H)
    )


def test_carrying_over_no_time_changes_nothing() -> None:
    start = Usage({"ops": 123.0, "": 123.0}, H)
    assert carry(start, H, H, [Holding("ops", 8, 0.0)]).by_queue == start.by_queue


instants = st.floats(0.0, 20 * H, allow_nan=False)


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 64), instants, instants, instants, instants)
def test_a_stretch_split_in_two_counts_what_it_counts_whole(
    gpus: int, a: float, b: float, c: float, now: float
) -> None:
    start, cut, end = sorted((a, b, c))
    whole = decayed_gpu_s(gpus, start, end, now, H)
    parts = decayed_gpu_s(gpus, start, cut, now, H) + decayed_gpu_s(gpus, cut, end, now, H)
    assert parts == pytest.approx(whole, rel=1e-9, abs=1e-6)
    # Never more than the GPU-seconds held before now, never less than nothing.
    assert 0.0 <= whole <= gpus * max(min(end, now) - start, 0.0) + 1e-6


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 64), instants, instants, st.floats(0.0, 5 * H))
def test_usage_only_fades_while_nothing_is_held(
    gpus: int, a: float, b: float, later: float
) -> None:
    start, end = sorted((a, b))
    held = [Holding("ops", gpus, start, end)]
    now = end + 1.0
    first, second = usage_of(held, now, H), usage_of(held, now + later, H)
    expect = first.by_queue["ops"] * 2 ** (-later / H)
    assert second.by_queue["ops"] == pytest.approx(expect, rel=1e-9, abs=1e-9)


# --- deadline outlooks ----------------------------------------------------------------------

LAB = make_fleet(racks=1, hosts=2)  # 16 GPUs


def job(gpus: int = 8, limit: float | None = H, deadline: float | None = None) -> Job:
    base = make_gang("d", gpus=gpus, per_node=min(gpus, 8))
    return Job("d", Gang("d", base.roles, base.topology, "t", 3), "t", 0.0, limit, None, deadline)


@pytest.mark.parametrize(
    ("limit", "deadline", "start", "reachable", "slack", "message"),
    [
        pytest.param(
            H, 3 * H, 0.0, True, 2 * H,
            "deadline reachable: expected start now, finish in 60 min; due in 3.0 h, "
            "2.0 h to spare",
            id="two hours to spare",
        ),
        pytest.param(
            H, H, 0.0, True, 0.0,
            "deadline reachable: expected start now, finish in 60 min; due in 60 min, 0 s to spare",
            id="finishing exactly at the deadline meets it",
        ),
        pytest.param(
            H, H, 1800.0, False, -1800.0,
            "deadline not reachable: expected start in 30 min, finish in 90 min; due in 60 min, "
            "30 min late",
            id="half an hour late",
        ),
        pytest.param(
            H, None, 600.0, None, None,
            "expected start in 10 min, finish in 70 min",
            id="no deadline: only the timing",
        ),
        pytest.param(
            None, 2 * H, 600.0, None, None,
            f"deadline unknown: {NO_RUNTIME}; expected start in 10 min; due in 2.0 h",
            id="no runtime: unknown, with what is known",
        ),
        pytest.param(
            None, None, 0.0, None, None,
            f"outlook unknown: {NO_RUNTIME}; expected start now",
            id="neither runtime nor deadline",
        ),
    ],
)  # fmt: skip
def test_judge(
    limit: float | None,
    deadline: float | None,
    start: float,
    reachable: bool | None,
    slack: float | None,
    message: str,
) -> None:
    outlook = judge(job(limit=limit, deadline=deadline), start, 0.0)
    assert (outlook.reachable, outlook.slack, outlook.message) == (reachable, slack, message)
    assert outlook.start == start and outlook.deadline == deadline
    assert (outlook.gap == "") == (limit is not None)


def test_times_in_the_past_read_as_ago_and_within_a_second_as_now() -> None:
    outlook = judge(job(limit=H, deadline=0.5), -2 * H, 0.4)
    assert outlook.message == (
        "deadline reachable: expected start 2.0 h ago, finish 60 min ago; due now, 60 min to spare"
    )


def busy_forever(tree_hosts: int = 2) -> FleetState:
    state = FleetState(LAB)
    for h in range(tree_hosts):
        state.allocate(Allocation(f"b{h}", (Grant("w", 0, h, tuple(range(8))),), None))
    return state


def test_behind_jobs_with_no_end_no_start_can_be_promised() -> None:
    outlook = deadline_outlook(busy_forever(), job(deadline=5 * H), 0.0)
    assert (outlook.reachable, outlook.start, outlook.finish) == (None, None, None)
    assert outlook.gap == NO_START
    assert outlook.message == f"deadline unknown: {NO_START}; due in 5.0 h"


def test_a_job_too_big_for_the_fleet_can_never_meet_its_deadline() -> None:
    outlook = deadline_outlook(FleetState(LAB), job(gpus=32, deadline=5 * H), 0.0)
    assert outlook.reachable is False and outlook.gap == NEVER_RUNS
    assert outlook.message == f"deadline not reachable: {NEVER_RUNS}; due in 5.0 h"


def test_a_free_fleet_starts_the_job_now_and_judges_from_there() -> None:
    state = FleetState(LAB)
    outlook = deadline_outlook(state, job(deadline=2 * H), 100.0)
    assert (outlook.start, outlook.finish, outlook.slack) == (100.0, 100.0 + H, H - 100.0)
    assert state.free_gpus == LAB.total_gpus  # the state is only read


def test_a_running_job_is_judged_from_when_it_started_not_from_now() -> None:
    state = FleetState(LAB)
    state.allocate(Allocation("d", (Grant("worker", 0, 0, tuple(range(8))),), None))
    run = Running(job(limit=2 * H, deadline=3 * H), state.allocations["d"], 0.5 * H)
    outlook = running_outlook(run, 2 * H)
    assert (outlook.start, outlook.finish, outlook.slack) == (0.5 * H, 2.5 * H, 0.5 * H)
    assert outlook.at == 2 * H and outlook.reachable is True

"""The default's order inside a class: least work left first, aged, with fair share folded in;
promised starts keep their place; the greedy baseline starts whatever fits in arrival order."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from boltforge.core.cycle import Snapshot, promised_first, run_cycle
from boltforge.core.model.gang import Gang
from boltforge.core.model.state import Allocation, FleetState, Grant
from boltforge.core.model.workload import Hold, Job, Running
from boltforge.core.policy import FAIR_SHARE, POLICIES, SHORTEST_AGED
from boltforge.core.queueing.shortest import (
    UNKNOWN_RUNTIME_S,
    SizeRule,
    aged_work,
    aged_works,
    rank,
    runtime_left,
    work_left,
)
from boltforge.testing.builders import make_fleet, make_gang

HOUR = 3600.0
DEFAULT = POLICIES["default"]
LAB = make_fleet(racks=2, hosts=2)  # 4 hosts of 8 GPUs
RULE = SizeRule(aging_s=10 * HOUR)


def job(
    name: str,
    gpus: int,
    hours: float | None = 1.0,
    submit: float = 0.0,
    attained: float = 0.0,
    priority: int = 3,
) -> Job:
    gang = make_gang(name, gpus=gpus, per_node=min(8, gpus))
    gang = Gang(gang.name, gang.roles, gang.topology, "team", priority)
    limit = None if hours is None else hours * HOUR
    return Job(name, gang, "team", submit, time_limit=limit, attained_gpu_seconds=attained)


def busy(state: FleetState, name: str, hosts: range, end: float) -> Running:
    grants = tuple(Grant("w", i, h, tuple(range(8))) for i, h in enumerate(hosts))
    state.allocate(Allocation(name, grants, end))
    running = Job(name, make_gang(name, gpus=8 * len(hosts)), "team", -1.0, time_limit=end)
    return Running(running, state.allocations[name], 0.0)


# --- the rank ---------------------------------------------------------------------------------


def test_work_left_is_gpus_times_runtime_less_what_was_attained() -> None:
    assert work_left(job("a", 8, hours=2)) == 8 * 2 * HOUR
    assert work_left(job("b", 8, hours=2, attained=4 * 2 * HOUR)) == 4 * 2 * HOUR
    assert work_left(job("c", 2, hours=None)) == 2 * UNKNOWN_RUNTIME_S
    # past its limit a job is expected to run as long again as it ran (2.5 h on 4 GPUs)
    assert work_left(job("overran", 4, hours=1, attained=10 * HOUR)) == 4 * 2.5 * HOUR
    # with no estimate at all: at least the unknown runtime, then as long again as it ran
    assert work_left(job("d", 2, hours=None, attained=2 * 10 * HOUR)) == 2 * UNKNOWN_RUNTIME_S
    assert work_left(job("e", 2, hours=None, attained=2 * 30 * HOUR)) == 2 * 30 * HOUR


def test_the_longer_a_job_ran_past_its_estimate_the_more_it_is_expected_to_need() -> None:
    ran = [runtime_left(job("a", 1, hours=2), h * HOUR) for h in (2, 3, 10, 40)]
    assert ran == [2 * HOUR, 3 * HOUR, 10 * HOUR, 40 * HOUR]
    assert runtime_left(job("a", 1, hours=2), 1.5 * HOUR) == 0.5 * HOUR


def test_a_waiting_job_counts_half_per_aging_period() -> None:
    fresh = rank(job("a", 8, submit=0.0), 0.5, 0.0, RULE)
    assert rank(job("a", 8, submit=0.0), 0.5, 10 * HOUR, RULE) == pytest.approx(fresh / 2)
    assert rank(job("a", 8, submit=0.0), 0.5, 30 * HOUR, RULE) == pytest.approx(fresh / 8)


def test_a_big_job_overtakes_fresh_small_ones_after_about_ten_half_lives() -> None:
    big = job("big", 32, hours=32, submit=0.0)  # 1,024 times the small job's work

    def small_at(t: float) -> Job:
        return job("small", 1, hours=1, submit=t)

    at_9 = 9 * RULE.aging_s
    assert rank(big, 0.5, at_9, RULE) > rank(small_at(at_9), 0.5, at_9, RULE)
    at_11 = 11 * RULE.aging_s
    assert rank(big, 0.5, at_11, RULE) < rank(small_at(at_11), 0.5, at_11, RULE)


def test_fair_share_scales_work_around_a_queue_at_its_share() -> None:
    rule = SizeRule(aging_s=HOUR, fair_weight=1.0)
    j = job("a", 8)
    at_share = rank(j, 0.5, 0.0, rule)
    assert at_share == work_left(j)
    assert rank(j, 0.25, 0.0, rule) == pytest.approx(2 * at_share)  # used twice its share
    assert rank(j, 1.0, 0.0, rule) == pytest.approx(at_share / 2)  # used nothing
    half = SizeRule(aging_s=HOUR, fair_weight=0.5)
    assert rank(j, 0.25, 0.0, half) == pytest.approx(2**0.5 * at_share)


@pytest.mark.parametrize(("aging", "weight"), [(0.0, 0.0), (-1.0, 0.0), (HOUR, -0.5)])
def test_a_size_rule_refuses_nonsense(aging: float, weight: float) -> None:
    with pytest.raises(ValueError, match=r"aging_s|fair_weight"):
        SizeRule(aging, weight)


@given(
    gpus=st.integers(1, 64),
    hours=st.floats(0.01, 1000.0),
    waited=st.floats(0.0, 1e7),
    more=st.floats(0.0, 1e7),
    factor=st.floats(0.01, 1.0),
)
def test_rank_never_grows_with_waiting_and_never_shrinks_with_work(
    gpus: int, hours: float, waited: float, more: float, factor: float
) -> None:
    j = job("a", gpus, hours=hours)
    assert rank(j, factor, waited + more, SHORTEST_AGED) <= rank(j, factor, waited, SHORTEST_AGED)
    bigger = job("b", gpus, hours=hours * 2)
    assert rank(bigger, factor, waited, SHORTEST_AGED) >= rank(j, factor, waited, SHORTEST_AGED)


queue = st.lists(
    st.tuples(
        st.integers(1, 64),
        st.one_of(st.none(), st.floats(0.01, 1000.0)),  # time limit, hours
        st.one_of(st.none(), st.floats(1.0, 1e6)),  # learned estimate, seconds
        st.floats(0.0, 1e7),  # submitted
        st.floats(0.0, 1e8),  # attained GPU-seconds
    ),
    max_size=20,
)


@given(queue, st.floats(0.0, 2e7))
def test_a_whole_queues_aged_work_is_each_jobs_bit_for_bit(
    jobs: list[tuple[int, float | None, float | None, float, float]], now: float
) -> None:
    made = [
        replace(job(f"j{i}", g, hours=h, submit=t, attained=a), estimate=e)
        for i, (g, h, e, t, a) in enumerate(jobs)
    ]
    assert aged_works(made, now, RULE) == [aged_work(j, now, RULE) for j in made]


# --- the cycle --------------------------------------------------------------------------------


def test_the_default_starts_the_least_work_first_within_a_class() -> None:
    state = FleetState(LAB)
    running = [busy(state, "r", range(3), 10 * HOUR)]  # one host of 8 GPUs left
    pending = (
        job("long", 8, hours=24, submit=0.0),
        job("short", 8, hours=1, submit=60.0),
        job("urgent-class", 8, hours=48, submit=120.0, priority=2),
    )
    result = run_cycle(Snapshot(state, pending, tuple(running), 600.0), DEFAULT)
    assert [b.job for b in result.binds] == ["urgent-class"]  # class still comes first
    two = pending[:2]
    result = run_cycle(Snapshot(state, two, tuple(running), 600.0), DEFAULT)
    assert [b.job for b in result.binds] == ["short"]
    arrival = POLICIES["default"].with_(order=FAIR_SHARE)
    in_arrival = run_cycle(Snapshot(state, two, tuple(running), 600.0), arrival)
    assert [b.job for b in in_arrival.binds] == ["long"]


def test_a_reserved_job_keeps_its_place_ahead_of_smaller_later_arrivals() -> None:
    state = FleetState(LAB)
    running = (busy(state, "r", range(2), 2 * HOUR),)  # half the fleet busy for 2 h
    big = job("big", 32, hours=8, submit=0.0)
    first = run_cycle(Snapshot(state, (big,), running, 0.0), DEFAULT)
    assert [r.job for r in first.reservations] == ["big"]

    small = job("small", 16, hours=4, submit=60.0)  # would end after big's reserved start
    unpromised = Snapshot(state, (big, small), running, 60.0)
    assert [b.job for b in run_cycle(unpromised, DEFAULT).binds] == ["small"]
    promised = Snapshot(state, (big, small), running, 60.0, promised=frozenset({"big"}))
    again = run_cycle(promised, DEFAULT)
    assert again.binds == ()
    assert again.reservations[0].job == "big"


def test_promised_and_held_jobs_go_first_within_their_class_only() -> None:
    held = Hold(Allocation("held:h", (Grant("w", 0, 0, (0,)),)))
    jobs = [
        job("serving", 8, priority=0),
        job("tiny", 1),
        job("promised", 32),
        job("h", 16),
    ]
    jobs[3] = Job("h", jobs[3].gang, "team", 0.0, time_limit=HOUR, held=held)
    order = promised_first(jobs, DEFAULT, frozenset({"promised"}))
    assert [j.id for j in order] == ["serving", "promised", "h", "tiny"]
    arrival = DEFAULT.with_(order=FAIR_SHARE)
    assert promised_first(jobs, arrival, frozenset({"promised"})) == jobs


def test_greedy_starts_whatever_fits_in_arrival_order_and_reserves_nothing() -> None:
    state = FleetState(LAB)
    running = (busy(state, "r", range(2), 2 * HOUR),)
    pending = (job("big", 32, submit=0.0), job("small", 8, hours=24, submit=1.0))
    result = run_cycle(Snapshot(state, pending, running, 10.0), POLICIES["greedy"])
    assert [b.job for b in result.binds] == ["small"]
    assert result.reservations == ()
    conservative = run_cycle(
        Snapshot(state, pending, running, 10.0), DEFAULT.with_(order=FAIR_SHARE)
    )
    assert conservative.binds == () and [r.job for r in conservative.reservations] == ["big"]

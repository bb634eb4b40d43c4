"""Replays of traces of two or three jobs on one 8-GPU host, small enough to work out by hand:
when each job starts and ends under each policy, what a preemption costs in lost work and
restart, and the metrics computed from those few numbers."""

from __future__ import annotations

import pytest

from boltforge.core.policy import Policy, named
from boltforge.core.preempt.victims import PreemptRules
from boltforge.sim.engine import SimConfig, simulate
from boltforge.sim.metrics import Metrics, compute
from boltforge.sim.records import SimResult, TraceJob
from boltforge.testing.builders import make_fleet

HOST = make_fleet(racks=1, hosts=1)  # 8 GPUs at $2.50 per GPU-hour
# A churn budget a single host can spend (the default 5% of 8 GPUs rounds down to none).
BUMPS = named("default").with_preempt_rules(PreemptRules(churn_fraction=1.0))


def replay(trace: list[TraceJob], policy: str | Policy) -> SimResult:
    chosen = named(policy) if isinstance(policy, str) else policy
    return simulate(HOST, trace, SimConfig(chosen, failures_per_1000_gpu_day=0.0))


def times(result: SimResult) -> dict[str, tuple[float | None, float | None]]:
    return {j.id: (j.start_s, j.finish_s) for j in result.jobs}


# --- two whole-host jobs, one after the other ----------------------------------------------


BACK_TO_BACK = [TraceJob("a", 0.0, 100.0, 8, "x"), TraceJob("b", 0.0, 50.0, 8, "y")]


def test_two_whole_host_jobs_run_back_to_back_in_arrival_order() -> None:
    result = replay(BACK_TO_BACK, "fifo")
    assert times(result) == {"a": (0.0, 100.0), "b": (100.0, 150.0)}
    assert [(s.t, s.allocated_gpus, s.queued) for s in result.samples] == [
        (0.0, 8, 1),
        (100.0, 8, 0),
        (150.0, 0, 0),
    ]


def test_the_metrics_of_two_jobs_back_to_back() -> None:
    m = compute(replay(BACK_TO_BACK, "fifo"))
    assert (m.jobs, m.finished, m.started) == (2, 2, 2)
    assert (m.avg_jct_s, m.avg_queue_s, m.makespan_s) == (125.0, 50.0, 150.0)  # (100+150)/2
    assert m.avg_bounded_slowdown == pytest.approx(2.0)  # a: 1, b: 150 / 50 = 3
    assert m.util_allocated == pytest.approx(1.0) and m.util_productive == pytest.approx(1.0)
    assert m.util_productive_contended == pytest.approx(1.0)  # b waits while a runs flat out
    assert m.dollars == pytest.approx(1200 / 3600 * 2.5)  # 1,200 GPU-seconds at $2.50/h
    assert m.preemptions == 0 and m.gpu_hours_lost == 0.0


def test_deadlines_met_are_counted_against_those_set() -> None:
    trace = [
        TraceJob("a", 0.0, 100.0, 8, "x", deadline_s=100.0),  # finishes exactly on time
        TraceJob("b", 0.0, 50.0, 8, "y", deadline_s=120.0),  # finishes at 150: late
        TraceJob("c", 0.0, 10.0, 8, "y"),  # no deadline: not counted
    ]
    m = compute(replay(trace, "fifo"))
    assert (m.deadline_jobs, m.deadlines_met, m.deadline_hit_rate) == (2, 1, 0.5)


# --- a half-host job, a whole-host job and a short half-host job ---------------------------


BLOCKED = [
    TraceJob("a", 0.0, 100.0, 4, "x"),
    TraceJob("b", 1.0, 100.0, 8, "x"),
    TraceJob("c", 2.0, 10.0, 4, "x"),
]


@pytest.mark.parametrize(
    ("policy", "expect"),
    [
        ("fifo", {"a": (0.0, 100.0), "b": (100.0, 200.0), "c": (200.0, 210.0)}),
        ("greedy", {"a": (0.0, 100.0), "b": (100.0, 200.0), "c": (2.0, 12.0)}),
        ("default", {"a": (0.0, 100.0), "b": (100.0, 200.0), "c": (2.0, 12.0)}),
    ],
    ids=[
        "strict FIFO keeps the short job behind the blocked whole-host job",
        "greedy starts the short job in the free half at once",
        "backfill starts it too: it ends long before the whole-host job's start",
    ],
)
def test_who_waits_behind_a_blocked_job(
    policy: str, expect: dict[str, tuple[float, float]]
) -> None:
    assert times(replay(BLOCKED, policy)) == expect


def test_utilization_of_the_blocked_queue_under_fifo_and_backfill() -> None:
    fifo, backfill = (compute(replay(BLOCKED, p)) for p in ("fifo", "default"))
    # 1,240 GPU-seconds of work over 210 s and over 200 s of an 8-GPU host.
    assert fifo.util_allocated == pytest.approx(1240 / (8 * 210))
    assert backfill.util_allocated == pytest.approx(1240 / (8 * 200))
    # While a job waits (from t=1 on): FIFO runs 4 GPUs to t=100, then 8 to t=200;
    # backfill runs 4 to t=2, 8 to t=12, then 4 to t=100, when the queue empties.
    assert fifo.util_productive_contended == pytest.approx((4 * 99 + 8 * 100) / (8 * 199))
    assert backfill.util_productive_contended == pytest.approx((4 + 80 + 4 * 88) / (8 * 99))
    assert fifo.avg_bounded_slowdown == pytest.approx((1 + 199 / 100 + 208 / 10) / 3)
    assert backfill.avg_bounded_slowdown == pytest.approx((1 + 199 / 100 + 1) / 3)


def test_the_default_starts_the_job_with_the_shorter_time_limit_when_the_host_frees() -> None:
    # The scheduler sees time limits, not runtimes: 20,000 s asks for 8 h, 10 s for 1 h.
    trace = [
        TraceJob("hold", 0.0, 100.0, 8, "z"),
        TraceJob("long", 1.0, 20_000.0, 8, "x"),
        TraceJob("short", 2.0, 10.0, 8, "y"),
    ]
    assert times(replay(trace, "default"))["short"] == (100.0, 110.0)
    assert times(replay(trace, "fifo"))["short"] == (20_100.0, 20_110.0)


def test_of_jobs_with_equal_limits_the_one_waiting_longer_starts_first() -> None:
    trace = [
        TraceJob("hold", 0.0, 100.0, 8, "z"),
        TraceJob("long", 1.0, 1000.0, 8, "x"),  # both ask for a 1 h limit
        TraceJob("short", 2.0, 10.0, 8, "y"),
    ]
    assert times(replay(trace, "default"))["long"] == (100.0, 1100.0)


# --- preemption, priced by hand -------------------------------------------------------------


def bump_at(t: float, policy: Policy = BUMPS) -> tuple[SimResult, Metrics]:
    trace = [
        TraceJob("low", 0.0, 7200.0, 8, "x"),
        TraceJob("high", t, 100.0, 8, "y", priority=1),
    ]
    result = replay(trace, policy)
    return result, compute(result)


def test_a_bump_before_the_first_checkpoint_loses_all_work_so_far_and_the_restart() -> None:
    result, m = bump_at(1000.0)
    low = next(j for j in result.jobs if j.id == "low")
    assert times(result) == {"low": (0.0, 8420.0), "high": (1000.0, 1100.0)}
    # Bumped at 1,000 s with no checkpoint yet (every 1,800 s): 8 x 1,000 GPU-s lost; back at
    # 1,100 s it spends the 120 s restart, then all 7,200 s of its work: done at 8,420 s.
    assert low.preemptions == 1
    assert low.lost_gpu_s == pytest.approx(8 * 1000 + 8 * 120)
    assert low.productive_gpu_s == pytest.approx(8 * 7200)
    assert low.allocated_gpu_s == pytest.approx(8 * 1000 + 8 * (120 + 7200))
    assert m.gpu_hours_lost == pytest.approx(8960 / 3600)


def test_a_bump_after_a_checkpoint_keeps_the_work_up_to_it() -> None:
    result, _ = bump_at(2000.0)
    low = next(j for j in result.jobs if j.id == "low")
    # Checkpointed at 1,800 s: loses the 200 s since and the restart, resumes with 5,400 s left.
    assert low.finish_s == pytest.approx(2100.0 + 120.0 + 5400.0)
    assert low.lost_gpu_s == pytest.approx(8 * 200 + 8 * 120)


def test_the_default_churn_budget_of_one_host_bumps_nothing_so_the_urgent_job_waits() -> None:
    result, m = bump_at(1000.0, named("default"))
    assert times(result) == {"low": (0.0, 7200.0), "high": (7200.0, 7300.0)}
    assert m.preemptions == 0


def test_a_preempting_run_still_accounts_for_every_gpu_second_it_held() -> None:
    result, m = bump_at(1000.0)
    for job in result.jobs:
        assert job.allocated_gpu_s == pytest.approx(job.productive_gpu_s + job.lost_gpu_s)
    held = sum(j.allocated_gpu_s for j in result.jobs)
    assert m.util_allocated == pytest.approx(held / (8 * m.makespan_s))

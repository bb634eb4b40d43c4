"""Simulation metrics on small hand-built results whose numbers are worked out by hand."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from sim_kit import rec

from boltforge.sim.metrics import Metrics, compute, jain, to_json, water_fill, window
from boltforge.sim.records import JobRecord, Sample, SimResult


def sample(t: float, allocated: int, productive: float | None = None, frag: float = 0.0) -> Sample:
    prod = float(allocated) if productive is None else productive
    return Sample(t=t, allocated_gpus=allocated, productive_gpus=prod, queued=0, fragmentation=frag)


def result(
    jobs: list[JobRecord], samples: list[Sample] | None = None, total_gpus: int = 8
) -> SimResult:
    return SimResult(policy="p", fleet="f", total_gpus=total_gpus, jobs=jobs, samples=samples or [])


def three_jobs() -> Metrics:
    # JCT:   j1 100 - 0 = 100,  j2 150 - 10 = 140,  j3 30 - 20 = 10
    # queue: j1 0 - 0 = 0,      j2 100 - 10 = 90,   j3 25 - 20 = 5
    # bounded slowdown: j1 max(1, 100/100) = 1; j2 140/50 = 2.8; j3 max(1, 10/max(5, 10)) = 1
    return compute(
        result(
            [
                rec("j1", 0, 0, 100, duration=100, gpus=4),
                rec("j2", 10, 100, 150, duration=50, gpus=4),
                rec("j3", 20, 25, 30, duration=5, gpus=2),
            ]
        )
    )


def test_job_completion_time_is_finish_minus_submit_with_linear_percentiles() -> None:
    m = three_jobs()
    assert m.jobs == m.finished == m.started == 3
    assert m.avg_jct_s == pytest.approx(250 / 3)
    assert m.median_jct_s == pytest.approx(100.0)
    # sorted [10, 100, 140]; rank 0.99 * 2 = 1.98 -> 100 + 0.98 * 40
    assert m.p99_jct_s == pytest.approx(139.2)


def test_queueing_delay_is_first_start_minus_submit() -> None:
    m = three_jobs()
    assert m.avg_queue_s == pytest.approx(95 / 3)
    assert m.median_queue_s == pytest.approx(5.0)
    # sorted [0, 5, 90]; rank 1.98 -> 5 + 0.98 * 85
    assert m.p99_queue_s == pytest.approx(88.3)


def test_bounded_slowdown_floors_short_jobs_at_ten_seconds() -> None:
    assert three_jobs().avg_bounded_slowdown == pytest.approx((1 + 2.8 + 1) / 3)


def test_makespan_runs_from_first_submit_to_last_finish() -> None:
    assert three_jobs().makespan_s == pytest.approx(150.0)


def uneven() -> SimResult:
    """10 GPUs over [0, 100]; samples at 0, 10, 70 and 100 hold until the next one."""
    samples = [
        sample(0, 2, 2.0, frag=0.5),
        sample(10, 10, 8.0, frag=0.0),
        sample(70, 5, 5.0, frag=1.0),
        sample(100, 0, 0.0, frag=0.0),
    ]
    jobs = [
        rec("x", 0, 0, 100, duration=100, gpus=5, allocated=500, productive=450),
        rec("y", 0, 10, 70, duration=60, gpus=5, allocated=270, productive=200),
    ]
    return result(jobs, samples, total_gpus=10)


def test_utilization_weights_each_sample_by_how_long_it_holds() -> None:
    m = compute(uneven())
    # allocated: 2*10 + 10*60 + 5*30 = 770 GPU-s over 10 GPUs * 100 s
    assert m.util_allocated == pytest.approx(0.77)
    # productive from the samples: 2*10 + 8*60 + 5*30 = 650
    assert m.util_productive_samples == pytest.approx(0.65)
    # productive from the job records: 450 + 200 = 650
    assert m.util_productive == pytest.approx(0.65)


def test_productive_utilization_never_exceeds_allocated() -> None:
    m = compute(uneven())
    assert m.util_productive <= m.util_allocated
    assert m.util_productive_samples <= m.util_allocated


def test_contended_utilization_counts_only_the_time_a_job_waits() -> None:
    r = uneven()
    # a job waits from 10 to 70 only (8 productive of 10 GPUs), and from 100 on (outside)
    r.samples = [replace(s, queued=1 if s.t in (10, 100) else 0) for s in r.samples]
    assert compute(r).util_productive_contended == pytest.approx(0.8)
    assert compute(uneven()).util_productive_contended == 0.0  # nobody ever waits


def test_slowed_gpu_hours_are_held_time_beyond_useful_and_lost_work() -> None:
    # x: 500 held, 450 useful; y: 270 held, 200 useful, 40 lost -> 50 + 30 GPU-s slowed
    r = uneven()
    r.jobs[1].lost_gpu_s = 40.0
    assert compute(r).gpu_hours_slowed == pytest.approx(80 / 3600)


def test_fragmentation_is_time_weighted() -> None:
    # 0.5*10 + 0*60 + 1.0*30 = 35 over 100 s
    assert compute(uneven()).avg_fragmentation == pytest.approx(0.35)


def test_samples_given_out_of_order_are_read_in_time_order() -> None:
    r = uneven()
    r.samples.reverse()
    assert compute(r).util_allocated == pytest.approx(0.77)


def test_jain_is_one_when_every_team_gets_exactly_its_entitlement() -> None:
    jobs = [
        rec("a1", 0, 0, 100, duration=100, team="a", allocated=100),
        rec("b1", 0, 0, 100, duration=100, team="b", allocated=100),
    ]
    m = compute(result(jobs))
    assert m.teams["a"].entitlement == pytest.approx(0.5)
    assert m.teams["a"].share_received == pytest.approx(0.5)
    assert m.jain_fairness == pytest.approx(1.0)


def test_jain_drops_to_one_over_n_when_one_team_gets_everything() -> None:
    jobs = [
        rec("a1", 0, 0, 100, duration=100, team="a", allocated=100),
        rec("b1", 0, None, None, duration=100, team="b"),
    ]
    m = compute(result(jobs, [sample(0, 1), sample(200, 1)]))
    # x_a = 1.0 / 0.5 = 2, x_b = 0 / 0.5 = 0 -> (2 + 0)^2 / (2 * 4) = 0.5
    assert m.jain_fairness == pytest.approx(0.5)


def test_water_filling_caps_a_small_team_at_its_demand_and_splits_the_rest() -> None:
    fair = water_fill({"small": 100, "b": 1000, "c": 1000}, 1100)
    assert fair == pytest.approx({"small": 100, "b": 500, "c": 500})


def test_entitlement_of_a_small_team_is_its_demand_so_matching_it_is_fair() -> None:
    # demands: small 1 GPU * 100 s = 100, big 1 * 10000; 1000 GPU-s allocated -> 100 / 900
    jobs = [
        rec("s", 0, 0, 100, duration=100, team="small", allocated=100),
        rec("b", 0, 0, 900, duration=10000, team="big", allocated=900),
    ]
    m = compute(result(jobs, [sample(0, 2), sample(1000, 0)]))
    assert m.teams["small"].entitlement == pytest.approx(0.1)
    assert m.teams["big"].entitlement == pytest.approx(0.9)
    assert m.jain_fairness == pytest.approx(1.0)


def test_jain_of_equal_values_is_one_and_of_nothing_is_none() -> None:
    assert jain([3.0, 3.0, 3.0]) == pytest.approx(1.0)
    assert jain([]) is None
    assert jain([0.0, 0.0]) is None


def test_single_team_is_perfectly_fair() -> None:
    jobs = [rec("a1", 0, 0, 100, duration=100, allocated=30), rec("a2", 0, 0, 9, duration=9)]
    assert compute(result(jobs)).jain_fairness == pytest.approx(1.0)


def test_finish_time_fairness_compares_with_an_equal_slice_of_the_fleet() -> None:
    # 8 GPUs, 2 teams -> 4 GPUs each.
    # a: 8-GPU job runs 100 s alone on 4 GPUs in 200 s; JCT 200 -> rho 1
    # b: 2-GPU job fits its slice, t_iso 100 s; JCT 300 -> rho 3
    jobs = [
        rec("a", 0, 0, 200, duration=100, gpus=8, team="a"),
        rec("b", 0, 200, 300, duration=100, gpus=2, team="b"),
    ]
    m = compute(result(jobs))
    assert m.teams["a"].mean_ftf == pytest.approx(1.0)
    assert m.teams["b"].mean_ftf == pytest.approx(3.0)
    assert m.worst_ftf == pytest.approx(3.0)


def test_counters_sum_over_jobs_and_pools() -> None:
    jobs = [
        rec("x", 0, 0, 10, duration=10, preemptions=2, failures=1, lost_gpu_s=3600, dollars=4),
        rec("y", 0, 0, 10, duration=10, preemptions=1, lost_gpu_s=1800, dollars=6),
    ]
    r = result(jobs)
    r.dollars_by_pool = {"spot": 4.0, "reserved": 6.0}
    m = compute(r)
    assert (m.preemptions, m.failures) == (3, 1)
    assert m.gpu_hours_lost == pytest.approx(1.5)
    assert m.dollars == pytest.approx(10.0)
    assert list(m.dollars_by_pool) == ["reserved", "spot"]
    assert m.teams["a"].dollars == pytest.approx(10.0)


def test_an_empty_result_gives_zeros_and_nones_without_crashing() -> None:
    m = compute(result([]))
    assert (m.jobs, m.finished, m.makespan_s) == (0, 0, 0.0)
    assert m.avg_jct_s is None and m.p99_queue_s is None and m.avg_bounded_slowdown is None
    assert (m.util_allocated, m.util_productive, m.avg_fragmentation) == (0.0, 0.0, 0.0)
    assert m.jain_fairness is None and m.worst_ftf is None and m.teams == {}


def test_unfinished_jobs_end_the_window_at_the_last_sample() -> None:
    jobs = [
        rec("done", 0, 0, 50, duration=50, allocated=50, productive=50),
        rec("running", 10, 50, None, duration=500, allocated=150, productive=150),
        rec("waiting", 20, None, None, duration=10),
    ]
    r = result(jobs, [sample(0, 1), sample(50, 1), sample(200, 1)], total_gpus=2)
    assert window(r) == (0.0, 200.0)
    m = compute(r)
    assert (m.jobs, m.started, m.finished) == (3, 2, 1)
    assert m.makespan_s == pytest.approx(200.0)
    assert m.avg_jct_s == pytest.approx(50.0)
    assert m.avg_queue_s == pytest.approx(20.0)
    assert m.util_allocated == pytest.approx(0.5)  # 1 GPU of 2 throughout


def test_no_finished_jobs_give_none_statistics() -> None:
    r = result([rec("w", 0, None, None, duration=10)], [sample(0, 0), sample(5, 0)])
    m = compute(r)
    assert m.avg_jct_s is None and m.worst_ftf is None and m.jain_fairness is None
    assert m.teams["a"].avg_jct_s is None


def test_to_json_is_plain_rounded_json() -> None:
    for m in (three_jobs(), compute(uneven()), compute(result([]))):
        data = to_json(m)
        text = json.dumps(data, allow_nan=False)
        assert json.loads(text) == data
    data = to_json(three_jobs())
    assert data["avg_jct_s"] == 83.33
    assert isinstance(data["teams"], dict) and "a" in data["teams"]

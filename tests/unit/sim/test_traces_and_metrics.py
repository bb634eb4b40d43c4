"""Trace readers on small files of each format, the deadline and elastic trace transforms, and
metrics on hand-built job records and samples."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sim_kit import rec

from boltforge.sim.jobs import elastic_range, per_replica, with_deadlines, with_elastic
from boltforge.sim.metrics import BOUND_S, compute, jain, water_fill, window
from boltforge.sim.records import JobRecord, Sample, SimResult, TraceJob
from boltforge.sim.traces import (
    DEFAULT_TEAM,
    MIN_DURATION_S,
    TraceError,
    load_trace,
    read_csv,
    read_itp,
    read_philly,
)

CSV_HEADER = "job_id,submit_s,duration_s,gpus,team\n"
ITP_HEADER = "job_id,submission_time,duration,num_gpu\n"
PHILLY_HEADER = "timestamp,duration,num_gpus,gpu_time,cluster\n"


def write(tmp_path: Path, text: str, name: str = "t.csv", encoding: str = "utf-8") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding=encoding)
    return path


# --- Boltforge CSV ------------------------------------------------------------------------


def test_csv_rows_are_sorted_by_submit_then_id_and_keep_times_as_written(tmp_path: Path) -> None:
    path = write(tmp_path, CSV_HEADER + "b,50,10,1,x\nc,5,20,2,y\na,50,30,4,\n")
    jobs = read_csv(path)
    assert [j.id for j in jobs] == ["c", "a", "b"]
    assert jobs[0] == TraceJob("c", 5.0, 20.0, 2, "y")
    assert jobs[1] == TraceJob("a", 50.0, 30.0, 4, DEFAULT_TEAM)


def test_csv_header_is_case_and_space_insensitive_and_a_bom_is_skipped(tmp_path: Path) -> None:
    text = " Job_ID , SUBMIT_S ,Duration_s,GPUs\n j1 , 3 , 7 , 8.0 \n"
    path = write(tmp_path, "\ufeff" + text)
    assert read_csv(path) == [TraceJob("j1", 3.0, 7.0, 8, DEFAULT_TEAM)]
    assert load_trace(path) == read_csv(path)


def test_csv_zero_duration_becomes_the_minimum(tmp_path: Path) -> None:
    jobs = read_csv(write(tmp_path, CSV_HEADER + "a,0,0,1,t\n"))
    assert jobs[0].duration_s == MIN_DURATION_S


def test_csv_repeated_column_uses_the_first_one(tmp_path: Path) -> None:
    path = write(tmp_path, "job_id,submit_s,duration_s,gpus,gpus\na,0,10,2,99\n")
    assert read_csv(path)[0].gpus == 2


CSV_BAD = [
    pytest.param("a,0,10,1,t\nb,x,10,1,t\n", 2, "submit_s", "'x'", "must be a number", id="text"),
    pytest.param("a,0,inf,1,t\n", 1, "duration_s", "'inf'", "must be a number", id="inf"),
    pytest.param("a,0,nan,1,t\n", 1, "duration_s", "'nan'", "must be a number", id="nan"),
    pytest.param("a,0,,1,t\n", 1, "duration_s", "''", "is empty", id="blank duration"),
    pytest.param("a,0,10,2.5,t\n", 1, "gpus", "'2.5'", "whole number", id="fraction"),
    pytest.param("a,0,10,0,t\n", 1, "gpus", "'0'", "at least 1", id="zero gpus"),
    pytest.param("a,0,-1,1,t\n", 1, "duration_s", "'-1'", "must not be negative", id="neg"),
    pytest.param("a,0,1,1,t\nb,0,1,1,t\na,1,1,1,t\n", 3, "job_id", "'a'", "row 1", id="dup id"),
    pytest.param("  ,0,1,1,t\n", 1, "job_id", "''", "is empty", id="blank id"),
]


@pytest.mark.parametrize(("rows", "row", "column", "value", "words"), CSV_BAD)
def test_a_bad_csv_row_names_the_row_line_column_and_value(
    tmp_path: Path, rows: str, row: int, column: str, value: str, words: str
) -> None:
    path = write(tmp_path, CSV_HEADER + rows)
    with pytest.raises(TraceError) as caught:
        read_csv(path)
    err = caught.value
    assert (err.row, err.line, err.column) == (row, row + 1, column)
    message = str(err)
    assert message.startswith(f"{path}, row {row} (line {row + 1}), column '{column}'")
    assert f"(got {value})" in message
    assert words in message and "To fix:" in message
    assert not isinstance(err, KeyError)


def test_blank_lines_before_the_header_and_between_rows_keep_lines_exact(tmp_path: Path) -> None:
    path = write(tmp_path, "\n\n" + CSV_HEADER + "a,0,1,1,t\n\n\nb,0,-1,1,t\n")
    with pytest.raises(TraceError) as caught:
        read_csv(path)
    assert (caught.value.row, caught.value.line) == (2, 7)


def test_a_missing_csv_column_is_reported_at_the_header_with_the_wanted_header(
    tmp_path: Path,
) -> None:
    path = write(tmp_path, "job_id,submit_s,gpus\na,0,1\n")
    with pytest.raises(TraceError) as caught:
        read_csv(path)
    err = caught.value
    assert (err.row, err.line, err.column) == (0, 1, "duration_s")
    assert "header" in str(err)
    assert "job_id,submit_s,duration_s,gpus,team" in str(err)


def test_a_latin1_file_is_reported_as_not_utf8(tmp_path: Path) -> None:
    path = write(tmp_path, CSV_HEADER + "caf\xe9,0,1,1,t\n", encoding="latin-1")
    with pytest.raises(TraceError, match="not UTF-8"):
        read_csv(path)


job_rows = st.lists(
    st.tuples(
        st.integers(0, 10**6),  # submit
        st.integers(0, 10**5),  # duration
        st.integers(1, 512),  # gpus
        st.sampled_from(["", "ml", "infra"]),
    ),
    min_size=1,
    max_size=20,
)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(job_rows)
def test_csv_round_trip_reads_back_every_row_sorted(
    tmp_path: Path, rows: list[tuple[int, int, int, str]]
) -> None:
    body = "".join(f"j{i},{s},{d},{g},{t}\n" for i, (s, d, g, t) in enumerate(rows))
    jobs = read_csv(write(tmp_path, CSV_HEADER + body, "round.csv"))
    expected = sorted(
        (
            TraceJob(f"j{i}", float(s), float(max(d, MIN_DURATION_S)), g, t or DEFAULT_TEAM)
            for i, (s, d, g, t) in enumerate(rows)
        ),
        key=lambda j: (j.submit_s, j.id),
    )
    assert jobs == expected


# --- ITP and Philly -----------------------------------------------------------------------


def test_itp_submits_shift_to_zero_and_teams_come_from_the_seed(tmp_path: Path) -> None:
    path = write(tmp_path, ITP_HEADER + "x,1000,60,2\ny,900,30,1\n")
    jobs = read_itp(path, teams=4, seed=1)
    assert [(j.id, j.submit_s) for j in jobs] == [("y", 0.0), ("x", 100.0)]
    assert all(j.team.startswith("team-") for j in jobs)
    assert read_itp(path, teams=4, seed=1) == jobs
    assert {j.team for j in read_itp(path, teams=1)} == {"team-00"}


def test_itp_rejects_teams_below_one(tmp_path: Path) -> None:
    path = write(tmp_path, ITP_HEADER + "x,0,60,2\n")
    with pytest.raises(TraceError, match="teams must be"):
        read_itp(path, teams=0)


def test_philly_ids_follow_file_order_and_teams_are_the_cluster(tmp_path: Path) -> None:
    text = PHILLY_HEADER + (
        "2017-10-09 08:00:00,100,4,400,vc2\n"
        "2017-10-09 07:00:00,50,1,50,vc1\n"
        "2017-10-09 07:30:00,0,8,0,vc1\n"
    )
    jobs = read_philly(write(tmp_path, text))
    assert [(j.id, j.submit_s, j.team) for j in jobs] == [
        ("philly-1", 0.0, "vc1"),
        ("philly-2", 1800.0, "vc1"),
        ("philly-0", 3600.0, "vc2"),
    ]
    assert jobs[1].duration_s == MIN_DURATION_S and jobs[1].gpus == 8


def test_philly_zoned_timestamps_are_converted_to_utc(tmp_path: Path) -> None:
    text = PHILLY_HEADER + "2017-10-09T07:00:00+00:00,1,1,1,a\n2017-10-09T09:30:00+02:00,1,1,1,b\n"
    jobs = read_philly(write(tmp_path, text))
    assert [(j.team, j.submit_s) for j in jobs] == [("a", 0.0), ("b", 1800.0)]


def test_philly_bad_gpus_names_its_row_and_column(tmp_path: Path) -> None:
    text = PHILLY_HEADER + "2017-10-09 07:00:00,1,1,1,a\n2017-10-09 07:00:01,1,two,1,a\n"
    with pytest.raises(TraceError) as caught:
        read_philly(write(tmp_path, text))
    assert (caught.value.row, caught.value.line, caught.value.column) == (2, 3, "num_gpus")
    assert caught.value.value == "two"


def test_load_trace_prefers_csv_when_a_header_fits_several_formats(tmp_path: Path) -> None:
    header = "job_id,submit_s,duration_s,gpus,submission_time,duration,num_gpu\n"
    path = write(tmp_path, header + "a,5,10,1,100,20,2\n")
    assert load_trace(path) == [TraceJob("a", 5.0, 10.0, 1, DEFAULT_TEAM)]
    assert load_trace(path, "itp", teams=1)[0].duration_s == 20.0


def test_load_trace_rejects_a_bad_synthetic_count() -> None:
    with pytest.raises(TraceError, match="job count"):
        load_trace("synthetic:many")


# --- with_deadlines and with_elastic ------------------------------------------------------

trace_st = st.lists(
    st.tuples(st.floats(0, 1e5), st.floats(1, 1e5), st.sampled_from([1, 4, 8, 16, 24, 64])),
    min_size=0,
    max_size=40,
).map(lambda rows: [TraceJob(f"j{i}", s, d, g, "t") for i, (s, d, g) in enumerate(rows)])
share_st = st.floats(0.0, 1.0)


@settings(max_examples=60, deadline=None)
@given(trace_st, share_st, share_st, st.floats(0.1, 10.0), st.integers(0, 1000))
def test_with_deadlines_larger_share_is_a_superset_and_deadlines_follow_slack(
    trace: list[TraceJob], a: float, b: float, slack: float, seed: int
) -> None:
    low, high = sorted((a, b))
    few = with_deadlines(trace, slack, low, seed)
    many = with_deadlines(trace, slack, high, seed)
    picked_few = {t.id for t in few if t.deadline_s is not None}
    picked_many = {t.id for t in many if t.deadline_s is not None}
    assert picked_few <= picked_many
    for before, after in zip(trace, many, strict=True):
        assert (after.id, after.submit_s, after.duration_s, after.gpus) == (
            before.id,
            before.submit_s,
            before.duration_s,
            before.gpus,
        )
        if after.deadline_s is not None:
            assert after.deadline_s == before.submit_s + slack * before.duration_s
            assert after.deadline_s > after.submit_s


def test_with_deadlines_share_zero_changes_nothing_and_one_picks_all() -> None:
    trace = [TraceJob(f"j{i}", float(i), 10.0, 1, "t", deadline_s=5.0) for i in range(30)]
    assert with_deadlines(trace, 2.0, 0.0, 3) == trace
    assert all(t.deadline_s == t.submit_s + 20.0 for t in with_deadlines(trace, 2.0, 1.0, 3))
    with pytest.raises(ValueError, match="slack"):
        with_deadlines(trace, 0.0, 0.5, 3)


@settings(max_examples=60, deadline=None)
@given(trace_st, share_st, st.integers(0, 1000), st.sampled_from([None, 64, 128, 1024]))
def test_with_elastic_ranges_hold_the_requested_size_and_fit_the_fleet(
    trace: list[TraceJob], share: float, seed: int, fleet: int | None
) -> None:
    out = with_elastic(trace, share, seed, host_gpus=8, fleet_gpus=fleet)
    assert [t.id for t in out] == [t.id for t in trace]
    multi = sum(1 for t in trace if t.gpus > 8)
    assert sum(1 for t in out if t.elastic) == math.floor(share * multi + 0.5)
    for t in out:
        if t.elastic is None:
            continue
        g = per_replica(t.gpus, 8)
        replicas = t.gpus // g
        low, high = t.elastic
        assert t.gpus > 8
        assert 1 <= low <= replicas <= high <= 2 * replicas
        assert low == math.ceil(replicas / 2)
        if fleet is not None:
            assert high * g <= max(fleet, t.gpus)


def test_with_elastic_rounds_half_up_and_keeps_other_jobs_ranges() -> None:
    trace = [
        TraceJob("a", 0.0, 1.0, 16, "t"),
        TraceJob("b", 1.0, 1.0, 16, "t"),
        TraceJob("c", 2.0, 1.0, 16, "t"),
        TraceJob("small", 3.0, 1.0, 4, "t", elastic=(1, 3)),
    ]
    out = with_elastic(trace, 0.5, 0, host_gpus=8)
    assert sum(1 for t in out[:3] if t.elastic) == 2  # 1.5 rounds up
    assert out[3].elastic == (1, 3)
    with pytest.raises(ValueError, match="host size"):
        with_elastic(trace, 0.5, 0, host_gpus=0)


def test_elastic_range_always_includes_the_requested_replicas() -> None:
    assert elastic_range(None, 4) is None
    assert elastic_range((2, 2), 2) is None
    assert elastic_range((6, 10), 4) == (4, 10)  # widened down to the requested size
    assert elastic_range((1, 2), 4) == (1, 4)  # widened up to it
    assert elastic_range((0, 8), 4) == (1, 8)  # at least one replica


# --- metrics ------------------------------------------------------------------------------


def sample(t: float, allocated: int, queued: int = 0, productive: float | None = None) -> Sample:
    useful = float(allocated) if productive is None else productive
    return Sample(t, allocated, useful, queued, 0.0)


def result(jobs: list[JobRecord], samples: list[Sample] | None = None, gpus: int = 4) -> SimResult:
    return SimResult("p", "f", gpus, jobs=jobs, samples=samples or [])


def test_jct_percentiles_interpolate_linearly_over_five_jobs() -> None:
    # JCTs 10, 20, 30, 40, 1000.
    jcts = [10.0, 20.0, 30.0, 40.0, 1000.0]
    jobs = [rec(f"j{i}", 0.0, 0.0, jct) for i, jct in enumerate(jcts)]
    m = compute(result(jobs))
    assert m.avg_jct_s == pytest.approx(220.0)
    assert m.median_jct_s == 30.0
    assert m.p99_jct_s == pytest.approx(40.0 + 0.96 * 960.0)


def test_queueing_delay_counts_started_jobs_even_if_unfinished() -> None:
    jobs = [
        rec("a", 0.0, 10.0, 50.0),
        rec("b", 5.0, 65.0, None),
        rec("c", 5.0, None, None),
    ]
    m = compute(result(jobs, [sample(0.0, 1), sample(100.0, 0)]))
    assert (m.started, m.finished) == (2, 1)
    assert m.avg_queue_s == pytest.approx(35.0)
    assert m.median_queue_s == pytest.approx(35.0)
    assert m.avg_jct_s == 50.0


def test_utilization_integrates_samples_as_steps_over_the_window() -> None:
    # 4 GPUs, window 0..100: 4 GPUs for 25 s, 2 for 50 s, 0 for 25 s -> 200 / 400.
    jobs = [rec("a", 0.0, 0.0, 100.0, allocated=200.0, productive=150.0)]
    samples = [sample(0.0, 4, queued=1), sample(25.0, 2), sample(75.0, 0)]
    m = compute(result(jobs, samples))
    assert window(result(jobs, samples)) == (0.0, 100.0)
    assert m.util_allocated == pytest.approx(0.5)
    assert m.util_productive == pytest.approx(150.0 / 400.0)
    assert m.util_productive_contended == pytest.approx(1.0)  # all 4 busy while one waited


def test_samples_before_the_first_submit_are_not_counted() -> None:
    jobs = [rec("a", 50.0, 50.0, 150.0)]
    m = compute(result(jobs, [sample(0.0, 4), sample(100.0, 2)], gpus=4))
    # Window 50..150: 4 GPUs for 50 s, 2 for 50 s -> 300 / 400.
    assert m.makespan_s == 100.0
    assert m.util_allocated == pytest.approx(0.75)


@settings(max_examples=80, deadline=None)
@given(
    st.lists(
        st.tuples(st.floats(0, 1000), st.integers(0, 8), st.integers(0, 3)),
        min_size=1,
        max_size=20,
    ),
    st.floats(1, 2000),
)
def test_utilization_stays_between_zero_and_one(
    points: list[tuple[float, int, int]], length: float
) -> None:
    samples = [sample(t, g, q) for t, g, q in points]
    jobs = [rec("a", 0.0, 0.0, length)]
    m = compute(result(jobs, samples, gpus=8))
    for u in (m.util_allocated, m.util_productive_samples, m.util_productive_contended):
        assert -1e-12 <= u <= 1.0 + 1e-9


@settings(max_examples=150, deadline=None)
@given(st.lists(st.one_of(st.just(0.0), st.floats(1e-6, 1e6)), min_size=1, max_size=30))
def test_jain_lies_between_one_over_n_and_one(xs: list[float]) -> None:
    value = jain(xs)
    if sum(xs) == 0.0:
        assert value is None
        return
    assert value is not None
    n = len(xs)
    assert 1.0 / n - 1e-9 <= value <= 1.0 + 1e-9


@settings(max_examples=80, deadline=None)
@given(st.lists(st.floats(0.001, 1e6), min_size=1, max_size=30), st.floats(0.001, 1e3))
def test_jain_is_scale_invariant(xs: list[float], scale: float) -> None:
    a, b = jain(xs), jain([x * scale for x in xs])
    assert a is not None and b is not None
    assert a == pytest.approx(b, rel=1e-9)


def test_jain_hits_one_over_n_when_one_of_n_gets_everything() -> None:
    assert jain([5.0, 0.0, 0.0, 0.0]) == pytest.approx(0.25)


def test_jain_of_tiny_positive_values_is_still_one() -> None:
    assert jain([1e-200, 1e-200]) == pytest.approx(1.0)


@settings(max_examples=100, deadline=None)
@given(
    st.dictionaries(st.text("abc", min_size=1, max_size=3), st.floats(0, 1e4), max_size=6),
    st.floats(0, 3e4),
)
def test_water_fill_never_exceeds_a_demand_and_hands_out_what_it_can(
    demands: dict[str, float], capacity: float
) -> None:
    fair = water_fill(demands, capacity)
    assert set(fair) == set(demands)
    assert all(0.0 <= fair[k] <= demands[k] + 1e-9 for k in demands)
    assert sum(fair.values()) == pytest.approx(
        min(capacity, sum(demands.values())), rel=1e-9, abs=1e-6
    )
    # Max-min fairness: a team below its demand gets at least as much as anyone else.
    for k in demands:
        if fair[k] < demands[k] - 1e-6:
            assert all(fair[k] >= v - 1e-6 for v in fair.values())


def test_finish_time_fairness_floors_tiny_jobs_and_counts_team_slices() -> None:
    # 8 GPUs over 4 teams: 2 GPUs each. A 1 s, 1-GPU job finishing at 20 s: rho 20 / BOUND_S.
    # A 4-GPU job of 100 s needs 2 slices: t_iso 200; JCT 300 -> 1.5.
    jobs = [
        rec("tiny", 0.0, 0.0, 20.0, duration=1.0, team="a"),
        rec("wide", 0.0, 0.0, 300.0, duration=100.0, gpus=4, team="b"),
        rec("idle1", 0.0, None, None, team="c"),
        rec("idle2", 0.0, None, None, team="d"),
    ]
    m = compute(result(jobs, [sample(0.0, 0), sample(400.0, 0)], gpus=8))
    assert m.teams["a"].mean_ftf == pytest.approx(20.0 / BOUND_S)
    assert m.teams["b"].mean_ftf == pytest.approx(1.5)
    assert m.teams["c"].mean_ftf is None
    assert m.worst_ftf == pytest.approx(2.0)


@settings(max_examples=30, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["a", "b", "c"]),
            st.floats(1.0, 1e4),  # allocated GPU-seconds
            st.floats(BOUND_S, 1e4),  # duration
            st.integers(1, 5),  # fits a third of 16 GPUs
        ),
        min_size=1,
        max_size=12,
    )
)
def test_team_shares_sum_to_one_and_jain_stays_in_bounds(
    rows: list[tuple[str, float, float, int]],
) -> None:
    jobs = [
        rec(f"j{i}", 0.0, 0.0, d, duration=d, gpus=g, team=team, allocated=alloc)
        for i, (team, alloc, d, g) in enumerate(rows)
    ]
    m = compute(result(jobs, gpus=16))
    assert sum(t.share_received for t in m.teams.values()) == pytest.approx(1.0)
    assert sum(t.entitlement for t in m.teams.values()) <= 1.0 + 1e-9
    assert m.jain_fairness is not None
    n = sum(1 for t in m.teams.values() if t.entitlement > 0)
    assert 1.0 / n - 1e-9 <= m.jain_fairness <= 1.0 + 1e-9
    # Every job ran for exactly its duration inside its team's slice: perfectly fair.
    assert m.worst_ftf == pytest.approx(1.0)

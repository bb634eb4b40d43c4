"""Trace readers turn ITP, Philly and Boltforge CSV logs (and a synthetic generator) into sorted
TraceJobs, and bad files fail with the file, row, column, value and fix."""

from __future__ import annotations

import csv
import hashlib
import itertools
import math
import pickle
import statistics
from collections import Counter
from fractions import Fraction
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from boltforge.sim.records import TraceJob
from boltforge.sim.traces import (
    SYNTHETIC_MAX_S,
    SYNTHETIC_MIN_S,
    TraceError,
    load_trace,
    offered_load,
    read_csv,
    read_itp,
    read_philly,
    scale_load,
    synthetic,
    team_for,
)

TRACES = Path(__file__).resolve().parents[4] / "shared" / "data" / "traces"
ITP_HEADER = "job_id,submission_time,duration,num_gpu\n"
PHILLY_HEADER = "timestamp,duration,num_gpus,gpu_time,cluster\n"
CSV_HEADER = "job_id,submit_s,duration_s,gpus,team\n"


def write(tmp_path: Path, text: str, name: str = "trace.csv") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def real(relative: str) -> Path:
    path = TRACES / relative
    if not path.is_file():
        pytest.skip(f"{path} is not available")
    return path


def csv_data_rows(path: Path) -> int:
    """Count non-blank CSV rows after the header, independently of the readers."""
    with path.open(newline="") as f:
        return sum(1 for row in csv.reader(f) if row) - 1


def is_sorted(jobs: list[TraceJob]) -> bool:
    keys = [(j.submit_s, j.id) for j in jobs]
    return keys == sorted(keys)


# --- ITP ---------------------------------------------------------------------------------


def test_itp_rows_become_jobs_shifted_to_start_at_zero_and_sorted(tmp_path: Path) -> None:
    path = write(tmp_path, ITP_HEADER + "b,1500,60,8\na,1000,3600,1\nc,1000,10,2\n")
    jobs = read_itp(path)
    assert [(j.id, j.submit_s, j.duration_s, j.gpus) for j in jobs] == [
        ("a", 0.0, 3600.0, 1),
        ("c", 0.0, 10.0, 2),
        ("b", 500.0, 60.0, 8),
    ]
    assert all(j.team.startswith("team-0") for j in jobs)


def test_a_zero_duration_is_kept_and_raised_to_one_second(tmp_path: Path) -> None:
    jobs = read_itp(write(tmp_path, ITP_HEADER + "a,0,0,1\n"))
    assert jobs[0].duration_s == 1.0


def many_itp_jobs(tmp_path: Path, n: int = 4000) -> Path:
    rows = "".join(f"job-{k},{k},100,1\n" for k in range(n))
    return write(tmp_path, ITP_HEADER + rows, "many.csv")


def test_itp_teams_are_the_same_for_the_same_seed(tmp_path: Path) -> None:
    path = many_itp_jobs(tmp_path)
    assert read_itp(path, seed=3) == read_itp(path, seed=3)
    assert all(j.team == team_for(j.id, 8, 3) for j in read_itp(path, seed=3))


def test_itp_teams_change_with_another_seed(tmp_path: Path) -> None:
    path = many_itp_jobs(tmp_path)
    first, other = read_itp(path, seed=0), read_itp(path, seed=1)
    moved = sum(a.team != b.team for a, b in zip(first, other, strict=True))
    assert moved > len(first) // 2


def test_itp_teams_are_skewed_like_real_orgs(tmp_path: Path) -> None:
    jobs = read_itp(many_itp_jobs(tmp_path), teams=8)
    sizes = Counter(j.team for j in jobs)
    assert sorted(sizes) == [f"team-{k:02d}" for k in range(8)]
    assert sizes["team-00"] > 2 * sizes["team-07"]
    # Zipf weights 1/(k+1): team-00 should hold about 1/H(8) = 37% of jobs.
    assert 0.33 < sizes["team-00"] / len(jobs) < 0.41


def documented_team(job_id: str, teams: int, seed: int) -> str:
    """The rule in docs/traces.md, with exact fractions: u / 2**64 * sum(w) falls in team k's
    slice of the cumulative Zipf weights w_k = 1 / (k + 1)."""
    digest = hashlib.blake2b(f"{seed}:{job_id}".encode(), digest_size=8).digest()
    weights = [Fraction(1, k + 1) for k in range(teams)]
    x = Fraction(int.from_bytes(digest, "big"), 2**64) * sum(weights)
    for k, cumulative in enumerate(itertools.accumulate(weights)):
        if x < cumulative:
            return f"team-{k:02d}"
    raise AssertionError("unreachable")


def test_team_rule_is_the_documented_hash_and_never_depends_on_the_process() -> None:
    # Pinned values: Python's hash() would change them from one process to the next.
    pinned = ["team-02", "team-01", "team-02", "team-07", "team-02", "team-00"]
    assert [team_for(f"job-{k}", 8, 0) for k in range(6)] == pinned
    for teams, seed in [(1, 0), (3, 5), (8, 0), (13, 2)]:
        for k in range(200):
            assert team_for(f"j{k}", teams, seed) == documented_team(f"j{k}", teams, seed)
    assert team_for("x", 120, 0).startswith("team-") and len(team_for("x", 120, 0)) == 8


def test_real_itp_cluster01_reads_every_row_and_is_mostly_one_gpu() -> None:
    path = real("itp/cluster01.csv")
    jobs = read_itp(path)
    assert len(jobs) == csv_data_rows(path)
    assert jobs[0].submit_s == 0.0 and is_sorted(jobs)
    assert sum(j.gpus == 1 for j in jobs) / len(jobs) >= 0.8
    assert len({j.id for j in jobs}) == len(jobs)


# --- Philly ------------------------------------------------------------------------------


def test_philly_timestamps_become_seconds_from_the_earliest(tmp_path: Path) -> None:
    text = PHILLY_HEADER + (
        "2017-10-09 07:01:55,66.0,1,66.0,vc-a\n"
        "2017-10-09 06:00:00,2951.0,4,11804.0,vc-b\n"
        "2017-10-10 06:00:00,10.0,1,10.0,vc-a\n"
    )
    jobs = read_philly(write(tmp_path, text))
    assert [(j.id, j.submit_s, j.duration_s, j.gpus, j.team) for j in jobs] == [
        ("philly-1", 0.0, 2951.0, 4, "vc-b"),
        ("philly-0", 3715.0, 66.0, 1, "vc-a"),
        ("philly-2", 86400.0, 10.0, 1, "vc-a"),
    ]


def test_real_philly_reads_every_row_in_submission_order() -> None:
    path = real("philly/philly.csv")
    jobs = read_philly(path)
    assert len(jobs) == csv_data_rows(path)
    assert jobs[0].submit_s == 0.0 and is_sorted(jobs)
    assert len({j.team for j in jobs}) > 1
    assert 100 * 86400 < jobs[-1].submit_s < 120 * 86400


# --- Boltforge CSV -----------------------------------------------------------------------


def test_boltforge_csv_keeps_times_and_defaults_a_blank_team(tmp_path: Path) -> None:
    text = CSV_HEADER + "j2,30,7200,8,vision\nj1,30.5,60,1,\n"
    jobs = read_csv(write(tmp_path, text))
    assert jobs == [
        TraceJob("j2", 30.0, 7200.0, 8, "vision"),
        TraceJob("j1", 30.5, 60.0, 1, "default"),
    ]


def test_boltforge_csv_without_a_team_column_or_with_extra_columns(tmp_path: Path) -> None:
    text = "note,gpus,duration_s,submit_s,job_id\nhello,2,5,0,a\n"
    assert read_csv(write(tmp_path, text)) == [TraceJob("a", 0.0, 5.0, 2, "default")]


# --- errors ------------------------------------------------------------------------------

BAD_FILES = [
    pytest.param("itp", ITP_HEADER + "a,0,10,1\nb,5,ten,1\n", "duration", 2, id="text duration"),
    pytest.param("itp", ITP_HEADER + "a,0,10,1\nb,5,-3,1\n", "duration", 2, id="negative time"),
    pytest.param("itp", ITP_HEADER + "a,0,10,0\n", "num_gpu", 1, id="zero gpus"),
    pytest.param("itp", ITP_HEADER + "a,0,10,1.5\n", "num_gpu", 1, id="fractional gpus"),
    pytest.param("itp", ITP_HEADER + "a,0,10,many\n", "num_gpu", 1, id="text gpus"),
    pytest.param("itp", ITP_HEADER + "a,nan,10,1\n", "submission_time", 1, id="nan submit"),
    pytest.param("itp", ITP_HEADER + "a,0,10\n", "num_gpu", 1, id="a short row"),
    pytest.param("itp", ITP_HEADER + "a,0,10,1\na,1,10,1\n", "job_id", 2, id="repeated id"),
    pytest.param("itp", ITP_HEADER + ",0,10,1\n", "job_id", 1, id="empty id"),
    pytest.param("itp", "job_id,submission_time,duration\na,0,1\n", "num_gpu", 0, id="no column"),
    pytest.param("philly", PHILLY_HEADER + "yesterday,1,1,1,vc\n", "timestamp", 1, id="bad time"),
    pytest.param("philly", PHILLY_HEADER + "2017-10-09 07:01:55,1,1,1,\n", "cluster", 1, id="vc"),
    pytest.param("csv", CSV_HEADER + "a,-1,10,1,t\n", "submit_s", 1, id="negative submit"),
    pytest.param("csv", CSV_HEADER + "a,0,10,-2,t\n", "gpus", 1, id="negative gpus"),
    pytest.param("csv", "job_id,submit,duration_s,gpus\na,0,1,1\n", "submit_s", 0, id="misspelt"),
]


@pytest.mark.parametrize(("fmt", "text", "column", "row"), BAD_FILES)
def test_a_bad_file_names_the_file_row_column_and_fix(
    tmp_path: Path, fmt: str, text: str, column: str, row: int
) -> None:
    path = write(tmp_path, text, "bad.csv")
    with pytest.raises(TraceError) as caught:
        load_trace(path, fmt)
    message = str(caught.value)
    assert str(path) in message
    assert f"column '{column}'" in message
    assert ("header" if row == 0 else f"row {row} (line {row + 1})") in message
    assert "To fix:" in message
    assert (caught.value.row, caught.value.column) == (row, column)


def test_a_trace_error_survives_pickling_for_worker_processes(tmp_path: Path) -> None:
    with pytest.raises(TraceError) as caught:
        read_itp(write(tmp_path, ITP_HEADER + "a,0,-1,1\n"))
    copy = pickle.loads(pickle.dumps(caught.value))
    assert str(copy) == str(caught.value)
    assert (copy.row, copy.line, copy.column, copy.value) == (1, 2, "duration", "-1")
    missing = TraceError("x.csv", "file not found", "check the path")
    assert str(pickle.loads(pickle.dumps(missing))) == str(missing)


def test_a_blank_line_does_not_shift_the_row_but_the_line_is_exact(tmp_path: Path) -> None:
    path = write(tmp_path, ITP_HEADER + "a,0,10,1\n\nb,1,-5,1\n")
    with pytest.raises(TraceError, match=r"row 2 \(line 4\), column 'duration'.*'-5'"):
        read_itp(path)


FILE_PROBLEMS = [
    pytest.param("", "csv", "empty", id="an empty file"),
    pytest.param(ITP_HEADER, "itp", "no jobs", id="a header without jobs"),
    pytest.param("a,b,c\n1,2,3\n", None, "matches no known trace format", id="unknown columns"),
    pytest.param(ITP_HEADER + "a,0,1,1\n", "parquet", "unknown trace format", id="unknown fmt"),
]


@pytest.mark.parametrize(("text", "fmt", "words"), FILE_PROBLEMS)
def test_a_file_that_is_not_a_trace_says_why(
    tmp_path: Path, text: str, fmt: str | None, words: str
) -> None:
    path = write(tmp_path, text)
    with pytest.raises(TraceError, match=words) as caught:
        load_trace(path, fmt)
    assert str(path) in str(caught.value) and "To fix:" in str(caught.value)


def test_a_missing_file_a_directory_and_binary_data_raise_trace_errors(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="file not found"):
        load_trace(tmp_path / "nope.csv")
    with pytest.raises(TraceError, match="directory"):
        read_itp(tmp_path)
    binary = tmp_path / "binary.csv"
    binary.write_bytes(ITP_HEADER.encode() + b"\xff\xfe,1,1,1\n")
    with pytest.raises(TraceError, match="UTF-8"):
        read_itp(binary)


def test_bad_arguments_raise_trace_errors() -> None:
    with pytest.raises(TraceError, match="teams"):
        synthetic(10, teams=0)
    with pytest.raises(TraceError, match="jobs"):
        synthetic(0)
    with pytest.raises(TraceError, match="mean_interarrival_s"):
        synthetic(10, mean_interarrival_s=0.0)
    with pytest.raises(TraceError, match="synthetic:N"):
        load_trace("synthetic:lots")
    with pytest.raises(TraceError, match="total_gpus"):
        offered_load([], 0)


# --- synthetic ---------------------------------------------------------------------------


def test_synthetic_is_the_same_for_a_seed_and_differs_for_another() -> None:
    assert synthetic(500, seed=7) == synthetic(500, seed=7)
    assert synthetic(500, seed=7) != synthetic(500, seed=8)


def test_synthetic_is_heavy_tailed_and_mostly_one_gpu() -> None:
    jobs = synthetic(20_000, seed=1)
    durations = [j.duration_s for j in jobs]
    assert 2400 < statistics.median(durations) < 5400
    assert statistics.median(durations) < statistics.mean(durations) / 2
    assert 0.75 < sum(j.gpus == 1 for j in jobs) / len(jobs) < 0.85
    assert max(j.gpus for j in jobs) >= 16
    gaps = [b.submit_s - a.submit_s for a, b in itertools.pairwise(jobs)]
    assert 100 < statistics.mean(gaps) < 140
    assert len({j.team for j in jobs}) == 8


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**63), jobs=st.integers(1, 300), teams=st.integers(1, 20))
def test_synthetic_sizes_are_powers_of_two_and_durations_in_bounds(
    seed: int, jobs: int, teams: int
) -> None:
    trace = synthetic(jobs, seed=seed, teams=teams)
    assert len(trace) == jobs and len({j.id for j in trace}) == jobs
    assert trace[0].submit_s == 0.0 and is_sorted(trace)
    for job in trace:
        assert job.gpus >= 1 and job.gpus & (job.gpus - 1) == 0
        assert SYNTHETIC_MIN_S <= job.duration_s <= SYNTHETIC_MAX_S
        assert int(job.team.removeprefix("team-")) < teams


# --- load_trace, scaling, offered load -----------------------------------------------------


def test_load_trace_detects_each_format_from_the_header(tmp_path: Path) -> None:
    itp = write(tmp_path, ITP_HEADER + "a,10,5,1\n", "itp.csv")
    philly = write(tmp_path, PHILLY_HEADER + "2017-10-09 07:01:55,66.0,2,132.0,vc\n", "p.csv")
    mine = write(tmp_path, CSV_HEADER + "a,10,5,1,t\n", "mine.csv")
    assert load_trace(itp, seed=4) == read_itp(itp, seed=4)
    assert load_trace(philly) == [TraceJob("philly-0", 0.0, 66.0, 2, "vc")]
    assert load_trace(mine) == [TraceJob("a", 10.0, 5.0, 1, "t")]
    assert load_trace(str(mine), "csv") == read_csv(mine)


def test_load_trace_makes_synthetic_traces_from_the_path() -> None:
    assert load_trace("synthetic:50", seed=2, teams=3) == synthetic(50, seed=2, teams=3)


def test_scale_load_at_factor_two_halves_submit_times() -> None:
    jobs = synthetic(200, seed=3)
    scaled = scale_load(jobs, 2.0)
    assert [j.submit_s for j in scaled] == [j.submit_s / 2 for j in jobs]
    assert [(j.id, j.duration_s, j.gpus, j.team) for j in scaled] == [
        (j.id, j.duration_s, j.gpus, j.team) for j in jobs
    ]
    assert math.isclose(offered_load(scaled, 64), 2 * offered_load(jobs, 64))
    for factor in (0.0, -1.0, math.inf, math.nan):
        with pytest.raises(TraceError, match="factor"):
            scale_load(jobs, factor)


def test_offered_load_is_work_over_capacity_during_arrivals() -> None:
    jobs = [TraceJob("a", 0.0, 100.0, 2, "t"), TraceJob("b", 50.0, 300.0, 1, "t")]
    assert offered_load(jobs, 4) == (2 * 100 + 300) / (50 * 4)
    assert offered_load([], 4) == 0.0
    assert offered_load(jobs[:1], 4) == math.inf

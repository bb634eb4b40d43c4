"""``bolt simulate`` as a user runs it on small inputs: bad fleets, traces, policies and
options exit 2 naming what to fix; ``--json`` carries the documented figures per policy (or
per run on several fleets, labelled as documented); the terminal table, ``--markdown`` and
``--limit``. Replays run in this process through the real worker function (``_replay``),
except one test that checks the process pool gives the same figures."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner, Result

import boltforge.cli.simulate as simulate_module
import boltforge.gctune as gctune
from boltforge.cli.main import app
from boltforge.cli.simulate import (
    JSON_KEYS,
    SimulationRun,
    _label,
    _replay,
    _short,
    progress_line,
)
from boltforge.core.policy import POLICIES
from boltforge.sim.engine import SimConfig
from boltforge.sim.records import SimResult
from boltforge.sim.traces import load_trace

runner = CliRunner()
LAB = Path(__file__).resolve().parents[3] / "examples" / "fleets" / "lab.yaml"
POOL = """\
  - name: {pool}
    gpu: H100-80GB
    gpu_memory_gb: 80
    gpus_per_host: 8
    nvlink_island: 8
    cpus: 192
    memory_gb: 2048
    price_per_gpu_hour: {price}
    layout: {{pods: 1, racks_per_pod: {racks}, hosts_per_rack: 2}}
"""
TRACE = "job_id,submit_s,duration_s,gpus,team\n" + "".join(
    f"j{i},{60 * i},{1800 + 300 * i},{(1, 2, 8, 16)[i % 4]},{'ab'[i % 2]}\n" for i in range(12)
)


def fleet_file(
    tmp_path: Path, name: str, racks: int = 2, file: str = "", price: float = 2.5
) -> Path:
    path = tmp_path / (file or f"{name}.yaml")
    path.write_text(f"name: {name}\npools:\n" + POOL.format(pool="h100", racks=racks, price=price))
    return path


def in_process(runs: list[SimulationRun], workers: int) -> dict[str, SimResult]:
    """``_run_all`` without the process pool: each run through the worker function."""
    return {run.label: _replay(run, {}) for run in runs}


@pytest.fixture
def here(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Replays in this process; the worker's collector settings are recorded, not applied
    (the test process keeps its own)."""
    monkeypatch.setattr(simulate_module, "_run_all", in_process)
    monkeypatch.setenv("COLUMNS", "100")
    collector: list[str] = []
    monkeypatch.setattr(gctune, "tune", lambda: collector.append("tune"))
    monkeypatch.setattr(gctune, "settle", lambda: collector.append("settle"))
    return collector


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    path = tmp_path / "trace.csv"
    path.write_text(TRACE)
    return path


def bolt(*args: str | Path) -> Result:
    return runner.invoke(app, ["simulate", *(str(a) for a in args)])


def clean_exit(result: Result, code: int) -> None:
    assert result.exit_code == code, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert "Traceback" not in result.output


def words(text: str) -> str:
    """``text`` with its line breaks (a wrapped message's) undone."""
    return " ".join(text.split())


def as_json(result: Result) -> dict[str, Any]:
    clean_exit(result, 0)
    data: dict[str, Any] = json.loads(result.stdout)
    return data


# --- bad input --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("policy", "says"),
    [
        ("default,bogus", "unknown bogus"),
        ("nope,fifo,also-nope", "unknown nope, also-nope"),
        (" , ", "unknown (none given)"),
    ],
    ids=["one unknown", "two unknown", "none given"],
)
def test_an_unknown_policy_exits_2_listing_the_known_ones(
    here: None, trace: Path, policy: str, says: str
) -> None:
    result = bolt("--fleet", LAB, "--trace", trace, "--policy", policy)
    clean_exit(result, 2)
    assert result.stdout == ""
    assert f"error --policy: {says}; known: {', '.join(POLICIES)}" in result.stderr


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("--elastic-share", "1.5"), "--elastic-share: 1.5 is not between 0 and 1"),
        (("--elastic-share", "-0.2"), "--elastic-share: -0.2 is not between 0 and 1"),
        (("--deadline-share", "2"), "--deadline-share"),
        (("--deadline-slack", "-1"), "--deadline-slack"),
        (("--workers", "0"), "--workers"),
    ],
    ids=["elastic above 1", "elastic below 0", "deadline share", "deadline slack", "workers"],
)
def test_an_option_out_of_range_exits_2_naming_it(
    here: None, trace: Path, args: tuple[str, ...], says: str
) -> None:
    result = bolt("--fleet", LAB, "--trace", trace, *args)
    clean_exit(result, 2)
    assert says in result.stderr


def test_the_elastic_share_error_gives_an_example_fix(here: None, trace: Path) -> None:
    result = bolt("--fleet", LAB, "--trace", trace, "--elastic-share", "3")
    assert "e.g. --elastic-share 0.3 for 30%" in result.stderr


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("job_id,submit_s,duration_s,gpus\nj1,-5,60,1\n", "submit_s"),
        ("job_id,submit_s,duration_s,gpus\nj1,0,60,0\n", "gpus"),
        ("job_id,submit_s,duration_s,gpus\nj1,0,60,1\nj1,5,60,1\n", "j1"),
        ("when,what\n1,2\n", "the header matches no known trace format"),
    ],
    ids=["negative submit", "zero gpus", "duplicate id", "unknown header"],
)
def test_a_bad_trace_exits_2_naming_the_column_and_the_fix(
    here: None, tmp_path: Path, text: str, says: str
) -> None:
    path = tmp_path / "bad.csv"
    path.write_text(text)
    result = bolt("--fleet", LAB, "--trace", path)
    clean_exit(result, 2)
    said = words(result.stderr)
    assert says in said and f"{path}," in said and "To fix:" in said


@pytest.mark.parametrize(
    ("trace_arg", "extra", "says"),
    [
        ("synthetic:many", (), "synthetic:N needs a job count N"),
        ("MISSING", (), "MISSING"),
        ("TRACE", ("--format", "parquet"), "unknown trace format 'parquet'"),
    ],
    ids=["synthetic without a count", "missing file", "unknown format"],
)
def test_a_trace_that_cannot_be_used_exits_2(
    here: None, trace: Path, tmp_path: Path, trace_arg: str, extra: tuple[str, ...], says: str
) -> None:
    given = {"MISSING": str(tmp_path / "gone.csv"), "TRACE": str(trace)}.get(trace_arg, trace_arg)
    result = bolt("--fleet", LAB, "--trace", given, *extra)
    clean_exit(result, 2)
    assert says.replace("MISSING", str(tmp_path / "gone.csv")) in words(result.stderr)


def test_a_bad_fleet_exits_2_naming_the_field(here: None, trace: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text("name: broken\npools:\n  - name: p\n    gpus_per_host: -8\n")
    result = bolt("--fleet", LAB, "--fleet", broken, "--trace", trace)
    clean_exit(result, 2)
    assert result.stderr.startswith("error ") and "problem(s)" in result.stderr
    assert "gpus_per_host" in result.stderr


def test_fleet_and_trace_are_required(here: None) -> None:
    result = bolt("--trace", "synthetic:5")
    clean_exit(result, 2)
    assert "--fleet" in result.stderr


# --- what a replay reports --------------------------------------------------------------------


def test_json_on_one_fleet_has_every_figure_per_policy(here: None, trace: Path) -> None:
    data = as_json(bolt("--fleet", LAB, "--trace", trace, "--policy", "default,fifo", "--json"))
    assert set(data) == {"policies", "wall_s"}
    assert list(data["policies"]) == ["default", "fifo"]
    for figures in data["policies"].values():
        assert set(figures) == {*JSON_KEYS, "wall_s"}
        assert figures["jobs"] == figures["finished"] == 12
        assert 0.0 < figures["util_allocated"] <= 1.0
        assert figures["avg_queue_s"] <= figures["p99_queue_s"]
        assert figures["median_jct_s"] <= figures["p99_jct_s"]


def test_a_policy_named_twice_runs_once(here: None, trace: Path) -> None:
    data = as_json(
        bolt("--fleet", LAB, "--trace", trace, "--policy", "fifo, default,fifo", "--json")
    )
    assert list(data["policies"]) == ["fifo", "default"]


@pytest.mark.parametrize("limit", [1, 5, 12, 40])
def test_limit_replays_only_the_first_jobs(here: None, trace: Path, limit: int) -> None:
    args = ("--fleet", LAB, "--trace", trace, "--policy", "fifo", "--json", "--limit", str(limit))
    data = as_json(bolt(*args))
    assert data["policies"]["fifo"]["jobs"] == min(limit, 12)


def test_the_offered_load_line_goes_to_stderr(here: None, trace: Path) -> None:
    result = bolt("--fleet", LAB, "--trace", trace, "--policy", "fifo", "--json")
    clean_exit(result, 0)
    assert "12 jobs on lab (32 GPUs), offered load" in result.stderr
    json.loads(result.stdout)  # nothing but the JSON on stdout


def test_off_a_terminal_progress_comes_as_plain_lines(
    trace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    jobs = load_trace(trace)
    run = SimulationRun("fifo", LAB, jobs, SimConfig(policy=POLICIES["fifo"]))
    results = simulate_module._run_all([run], workers=1)  # a real worker process
    assert results["fifo"].jobs
    assert "fifo: 12 of 12 jobs finished (100%)" in capsys.readouterr().err


def test_the_runs_that_search_most_are_handed_out_first(trace: Path) -> None:
    """Victim searches first (with reservation searches before without), then reservation
    searches alone, then the rest, strict order last."""
    jobs = load_trace(trace)
    names = ("fifo", "greedy", "slurm-like", "tiresias", "default")
    runs = [SimulationRun(n, LAB, jobs, SimConfig(policy=POLICIES[n])) for n in names]
    handed = [r.label for r in sorted(runs, key=simulate_module._heavy)]
    assert handed == ["default", "tiresias", "slurm-like", "greedy", "fifo"]


def test_a_progress_line_comes_once_per_tenth_of_a_run() -> None:
    reported: dict[str, int] = {}
    lines = [progress_line("default", done, 1000, reported) for done in (0, 50, 99, 100, 150)]
    assert lines == ["", "", "", "default: 100 of 1,000 jobs finished (10%)", ""]
    assert progress_line("default", 1000, 1000, reported).endswith("(100%)")
    assert progress_line("default", 1000, 1000, reported) == ""


def test_several_fleets_with_one_policy_are_labelled_by_fleet(
    here: None, trace: Path, tmp_path: Path
) -> None:
    small = fleet_file(tmp_path, "small", racks=1)
    big = fleet_file(tmp_path, "big", racks=4)
    data = as_json(
        bolt("--fleet", small, "--fleet", big, "--trace", trace, "--policy", "fifo", "--json")
    )
    assert set(data) == {"runs", "wall_s"}
    runs = data["runs"]
    assert list(runs) == ["small", "big"]
    assert runs["small"]["fleet"] == str(small) and runs["big"]["policy"] == "fifo"
    assert set(runs["big"]) == {"fleet", "policy", *JSON_KEYS, "wall_s"}
    assert runs["big"]["avg_queue_s"] <= runs["small"]["avg_queue_s"]  # more room, less wait


def test_several_fleets_and_policies_are_labelled_fleet_colon_policy(
    here: None, trace: Path, tmp_path: Path
) -> None:
    a, b = fleet_file(tmp_path, "a"), fleet_file(tmp_path, "b")
    args = ("--fleet", a, "--fleet", b, "--trace", trace, "--policy", "default,fifo", "--json")
    runs = as_json(bolt(*args))["runs"]
    assert list(runs) == ["a:default", "a:fifo", "b:default", "b:fifo"]
    assert {(r["fleet"], r["policy"]) for r in runs.values()} == {
        (str(p), n) for p in (a, b) for n in ("default", "fifo")
    }


def test_each_replay_tunes_the_collector_then_sets_its_fleet_and_trace_aside(
    here: list[str], trace: Path
) -> None:
    as_json(bolt("--fleet", LAB, "--trace", trace, "--policy", "default,fifo", "--json"))
    assert here == ["tune", "settle"] * 2


def test_fleets_that_share_a_name_are_told_apart_by_file(
    here: None, trace: Path, tmp_path: Path
) -> None:
    one = fleet_file(tmp_path, "same", racks=1, file="one.yaml")
    two = fleet_file(tmp_path, "same", racks=2, file="two.yaml")
    args = ("--fleet", one, "--fleet", two, "--trace", trace, "--policy", "fifo", "--json")
    assert list(as_json(bolt(*args))["runs"]) == [str(one), str(two)]


@pytest.mark.parametrize(
    ("fleets", "policies", "label"),
    [(1, 1, "fifo"), (1, 3, "fifo"), (2, 1, "lab"), (3, 2, "lab:fifo")],
)
def test_labels_follow_how_many_fleets_and_policies_run(
    fleets: int, policies: int, label: str
) -> None:
    assert _label("lab", "fifo", fleets, policies) == label


def test_the_terminal_table_has_a_row_per_policy_and_fits_100_columns(
    here: None, trace: Path
) -> None:
    result = bolt("--fleet", LAB, "--trace", trace, "--policy", "default,fifo,greedy")
    clean_exit(result, 0)
    lines = result.stdout.splitlines()
    assert lines[0].strip() == "Policy comparison"
    [at] = [i for i, line in enumerate(lines) if line.split()[:1] == ["policy"]]
    assert lines[at].split()[:4] == ["policy", "done", "JCT", "h"]
    rows = [line.split() for line in lines[at + 2 : at + 5]]
    assert [r[0] for r in rows] == ["default", "fifo", "greedy"]
    assert all(r[1] == "12" for r in rows)
    assert lines[-1].startswith("wall ") and "each run, seconds (jobs/s): default " in lines[-1]
    assert all(len(line) <= 100 for line in lines)
    assert "Cost, spot reclaims and deadlines" not in result.stdout  # one fleet, no extras


def test_deadlines_add_the_cost_table(here: None, trace: Path) -> None:
    args = ("--fleet", LAB, "--trace", trace, "--policy", "fifo", "--deadline-share", "0.5")
    result = bolt(*args)
    clean_exit(result, 0)
    assert "Cost, spot reclaims and deadlines" in result.stdout


def test_markdown_prints_one_table_row_per_policy(here: None, trace: Path) -> None:
    result = bolt("--fleet", LAB, "--trace", trace, "--policy", "default,fifo", "--markdown")
    clean_exit(result, 0)
    lines = result.stdout.splitlines()
    assert lines[0].startswith("| ") and lines[1].startswith("|---|")
    assert [line.split("|")[1].strip() for line in lines[2:]] == ["default", "fifo"]
    widths = {line.count("|") for line in lines}
    assert len(widths) == 1, "every row has as many cells as the header"
    assert "each run, seconds (jobs/s): default " in result.stderr  # the page stays clean


def test_markdown_on_two_fleets_adds_the_cost_table(
    here: None, trace: Path, tmp_path: Path
) -> None:
    a, b = fleet_file(tmp_path, "a"), fleet_file(tmp_path, "b", price=1.0)
    args = ("--fleet", a, "--fleet", b, "--trace", trace, "--policy", "fifo", "--markdown")
    result = bolt(*args)
    clean_exit(result, 0)
    tables = result.stdout.split("\n\n")
    assert len(tables) == 2
    assert tables[1].startswith("| Run | Dollars | Dollars by pool |")
    rows = [line.split("|")[1].strip() for line in tables[1].strip().splitlines()[2:]]
    assert rows == ["a", "b"]


def test_the_same_seed_gives_the_same_figures(here: None, tmp_path: Path) -> None:
    args = ("--fleet", LAB, "--trace", "synthetic:30", "--policy", "default", "--json")
    first = as_json(bolt(*args, "--seed", "3"))["policies"]["default"]
    again = as_json(bolt(*args, "--seed", "3"))["policies"]["default"]
    first.pop("wall_s"), again.pop("wall_s")
    assert first == again


def test_the_process_pool_gives_the_figures_of_an_in_process_replay(
    trace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    args = ("--fleet", LAB, "--trace", trace, "--policy", "default,fifo", "--json")
    pooled = as_json(bolt(*args, "--workers", "2"))["policies"]
    monkeypatch.setattr(simulate_module, "_run_all", in_process)
    alone = as_json(bolt(*args))["policies"]
    for figures in (*pooled.values(), *alone.values()):
        figures.pop("wall_s")
    assert pooled == alone


@pytest.mark.parametrize(
    ("key", "text", "shown"),
    [
        ("jain", "0.98765", "0.99"),
        ("worst_ftf", "1.5", "1.50"),
        ("worst_ftf", "-", "-"),
        ("avg_jct_h", "1.23456", "1.23456"),
    ],
)
def test_ratios_are_shortened_to_two_places_and_the_rest_kept(
    key: str, text: str, shown: str
) -> None:
    assert _short(key, text) == shown


def test_elastic_jobs_get_a_line_of_their_own_under_the_table(here: None, trace: Path) -> None:
    args = ("--fleet", LAB, "--trace", trace, "--policy", "default,fifo", "--elastic-share", "1")
    result = bolt(*args)
    clean_exit(result, 0)
    [line] = [x for x in result.stdout.splitlines() if x.startswith("elastic jobs: ")]
    said = re.findall(r"(\w+) (\d+) started smaller, (\d+) grows, (\d+) shrinks", line)
    assert [name for name, *_ in said] == ["default", "fifo"]
    data = as_json(bolt(*args, "--json"))["policies"]
    for name, started, grows, shrinks in said:
        figures = data[name]
        assert (figures["elastic_starts"], figures["grows"], figures["shrinks"]) == (
            int(started),
            int(grows),
            int(shrinks),
        )
    assert any(int(n) for _, *counts in said for n in counts), "some job was resized"


def test_without_elastic_jobs_there_is_no_elastic_line(here: None, trace: Path) -> None:
    result = bolt("--fleet", LAB, "--trace", trace, "--policy", "fifo")
    clean_exit(result, 0)
    assert "elastic jobs:" not in result.stdout


def test_report_writes_the_page_and_says_where_beside_the_json(
    here: None, trace: Path, tmp_path: Path
) -> None:
    out = tmp_path / "report"
    result = bolt("--fleet", LAB, "--trace", trace, "--policy", "fifo", "--json", "--report", out)
    data = as_json(result)
    assert data["policies"]["fifo"]["jobs"] == 12
    assert f"report: {out / 'index.html'}" in words(result.stderr)
    assert (out / "index.html").is_file()
    summary = json.loads((out / "summary.json").read_text())
    assert "fifo" in json.dumps(summary)

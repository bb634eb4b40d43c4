"""``bolt`` commands that answer from spec files without a server, run in-process."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner, Result

from boltforge.cli.main import app

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
FLEETS = EXAMPLES / "fleets"
JOBS = EXAMPLES / "jobs"

runner = CliRunner()


def bolt(*args: str | Path) -> Result:
    return runner.invoke(app, [str(a) for a in args])


def place_json(fleet: str, job: str | Path, *extra: str) -> dict[str, Any]:
    path = job if isinstance(job, Path) else JOBS / job
    result = bolt("place", "--fleet", FLEETS / fleet, "--job", path, "--json", *extra)
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert isinstance(data, dict)
    return data


def no_traceback(result: Result) -> None:
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)


@pytest.mark.parametrize(
    ("fleet", "job", "outcome", "gpus"),
    [
        ("lab.yaml", "small-debug.yaml", "now", 4),
        ("lab.yaml", "train-16-rack.yaml", "now", 16),
        ("h100-16k.yaml", "train-256-rack.yaml", "now", 256),
        ("hetero-1024.yaml", "impossible.yaml", "never", 0),
    ],
)
def test_place_json_answers_with_the_documented_keys(
    fleet: str, job: str, outcome: str, gpus: int
) -> None:
    data = place_json(fleet, job)
    assert {"placed", "outcome", "nodes", "cost", "explanation", "reason", "fixes"} <= set(data)
    assert data["outcome"] == outcome and data["placed"] is (outcome == "now")
    assert sum(len(g) for g in data["nodes"].values()) == gpus
    if outcome == "never":
        assert data["fixes"] and data["reason"]


def test_a_rack_job_lands_in_one_rack() -> None:
    data = place_json("lab.yaml", "train-16-rack.yaml")
    assert len({host.rsplit("-h", 1)[0] for host in data["nodes"]}) == 1


@pytest.mark.parametrize("mode", ["now", "ever", "when"])
def test_every_mode_places_a_small_job_on_an_empty_fleet(mode: str) -> None:
    data = place_json("lab.yaml", "small-debug.yaml", "--mode", mode)
    assert data["placed"] is True
    assert data["fragmentation"]["before"]["free_gpus"] == 32
    assert data["fragmentation"]["after"]["free_gpus"] == 28


def test_place_for_people_says_where_and_how_long_it_took() -> None:
    result = bolt("place", "--fleet", FLEETS / "lab.yaml", "--job", JOBS / "train-16-rack.yaml")
    assert result.exit_code == 0, result.output
    assert "placed (now)" in result.stdout
    assert "h100-p0-r0" in result.stdout and "0-7" in result.stdout
    assert "decided in" in result.stdout and "fragmentation index" in result.stdout
    assert not result.stdout.lstrip().startswith("{")


def test_an_impossible_job_says_it_can_never_fit_with_the_fix() -> None:
    result = bolt(
        "place", "--fleet", FLEETS / "hetero-1024.yaml", "--job", JOBS / "impossible.yaml"
    )
    assert result.exit_code == 0, result.output
    assert "can never fit this fleet" in result.stdout
    assert "To fix: lower min_gpu_memory_gb to 80 or less" in result.stdout


def test_a_busy_fleet_in_now_mode_does_not_place_and_in_when_mode_says_when(
    tmp_path: Path,
) -> None:
    state = tmp_path / "state.yaml"
    state.write_text(
        "running:\n"
        "  - {job: a, nodes: {h100-p0-r00-h00: [0,1,2,3,4,5,6,7]}, ends_in: 30m}\n"
        "  - {job: b, nodes: {h100-p0-r00-h01: [0,1,2,3,4,5,6,7]}, ends_in: 1h}\n"
        "  - {job: c, nodes: {h100-p0-r01-h00: [0,1,2,3,4,5,6,7]}, ends_in: 2h}\n"
        "  - {job: d, nodes: {h100-p0-r01-h01: [0,1,2,3,4,5,6,7]}, ends_in: 3h}\n"
    )
    now = place_json("lab.yaml", "small-debug.yaml", "--state", str(state), "--mode", "now")
    assert now["placed"] is False and now["outcome"] != "never" and now["nodes"] == {}
    later = place_json("lab.yaml", "small-debug.yaml", "--state", str(state))
    assert later["outcome"] == "later"
    assert later["start_in_s"] == 1800 and later["waits_for"] == ["a"]
    assert list(later["nodes"]) == ["h100-p0-r00-h00"]


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("name: x\ngpus: 8\n", "job.team: is required: every job belongs to a team. To fix: add"),
        ("name: x\nteam: t\ngpus: -1\n", "job.gpus: must be at least 1. To fix: ask for 1"),
        (
            "name: x\nteam: t\ngpus: 8\ntopology: {required: aisle}\n",
            "job.topology.required: must be one of island, host, rack, pod, spine. To fix",
        ),
        ("name: x\nteam: t\ngpus: [\n", "yaml (line 4, column 1)"),
        ("- a\n- b\n", "job: must be a mapping"),
    ],
    ids=["missing team", "negative gpus", "unknown level", "broken yaml", "not a mapping"],
)
def test_a_bad_job_exits_2_naming_the_field_without_a_traceback(
    tmp_path: Path, content: str, expected: str
) -> None:
    job = tmp_path / "job.yaml"
    job.write_text(content)
    result = bolt("place", "--fleet", FLEETS / "lab.yaml", "--job", job)
    assert result.exit_code == 2
    assert "error" in result.stderr and str(job) in result.stderr
    assert expected in result.stderr
    assert result.stdout == ""
    no_traceback(result)


def test_a_missing_job_file_exits_2_and_names_the_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    result = bolt("place", "--fleet", FLEETS / "lab.yaml", "--job", missing)
    assert result.exit_code == 2
    assert "nope.yaml" in result.stderr
    no_traceback(result)


def test_a_bad_fleet_exits_2_naming_the_field(tmp_path: Path) -> None:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text("name: f\npools:\n  - name: p\n    gpus_per_host: many\n")
    result = bolt("place", "--fleet", fleet, "--job", JOBS / "small-debug.yaml")
    assert result.exit_code == 2
    assert "gpus_per_host" in result.stderr
    no_traceback(result)


def test_an_unknown_mode_is_a_usage_error() -> None:
    result = bolt(
        "place",
        "--fleet",
        FLEETS / "lab.yaml",
        "--job",
        JOBS / "small-debug.yaml",
        "--mode",
        "sometime",
    )
    assert result.exit_code == 2
    assert "sometime" in result.output
    no_traceback(result)


@pytest.mark.parametrize("job", sorted(p.name for p in JOBS.glob("*.yaml")))
def test_every_example_job_is_valid(job: str) -> None:
    result = bolt("check", JOBS / job)
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("ok ")


def test_check_against_a_fleet_says_how_many_gpus_fit_when_free() -> None:
    result = bolt("check", JOBS / "train-16-rack.yaml", "--fleet", FLEETS / "lab.yaml")
    assert result.exit_code == 0, result.output
    assert "16 GPUs, fits lab when free" in result.stdout


def test_check_refuses_a_job_that_can_never_run_with_the_fix() -> None:
    result = bolt("check", JOBS / "impossible.yaml", "--fleet", FLEETS / "hetero-1024.yaml")
    assert result.exit_code == 1
    assert "too-big can never run on" in result.stdout
    assert "To fix: lower min_gpu_memory_gb" in result.stdout


@pytest.mark.parametrize("fleet", sorted(p.name for p in FLEETS.glob("*.yaml")))
def test_fleet_show_json_adds_up(fleet: str) -> None:
    result = bolt("fleet", "show", FLEETS / fleet, "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert {"fleet", "hosts", "gpus", "racks", "pods", "pools", "fragmentation"} <= set(data)
    assert sum(p["hosts"] for p in data["pools"]) == data["hosts"]
    assert sum(p["gpus"] for p in data["pools"]) == data["gpus"]
    assert data["fragmentation"]["free_gpus"] == data["gpus"], "an empty fleet is all free"


def test_fleet_show_for_people_lists_each_pool() -> None:
    result = bolt("fleet", "show", FLEETS / "lab.yaml")
    assert result.exit_code == 0, result.output
    assert "lab: 32 GPUs on 4 hosts, 2 racks, 1 pods" in result.stdout
    assert "h100" in result.stdout and "2.49" in result.stdout and "32/32" in result.stdout


def test_fleet_occupy_writes_a_state_that_fleet_show_reads(tmp_path: Path) -> None:
    out = tmp_path / "busy.yaml"
    result = bolt("fleet", "occupy", FLEETS / "lab.yaml", "--occupancy", "0.5", "--out", out)
    assert result.exit_code == 0, result.output
    assert "running jobs to" in result.stdout
    shown = bolt("fleet", "show", FLEETS / "lab.yaml", "--state", out, "--json")
    assert shown.exit_code == 0, shown.output
    free = json.loads(shown.stdout)["fragmentation"]["free_gpus"]
    assert 0 < free < 32


def test_fleet_occupy_is_the_same_for_the_same_seed() -> None:
    args = ("fleet", "occupy", FLEETS / "lab.yaml", "--occupancy", "0.6", "--seed", "3")
    first, second = bolt(*args), bolt(*args)
    assert first.exit_code == 0 and first.stdout == second.stdout
    assert first.stdout.startswith("running:")


def test_bolt_without_arguments_lists_the_commands() -> None:
    result = bolt()
    assert "place" in result.output and "queue" in result.output and "nodes" in result.output

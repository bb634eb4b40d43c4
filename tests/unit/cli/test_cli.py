"""The ``bolt`` command as users run it: real processes, JSON for scripts, clean errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[3]
FLEETS = ROOT / "examples" / "fleets"
JOBS = ROOT / "examples" / "jobs"


def bolt(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "boltforge.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def place_json(fleet: str, job: Path, *extra: str) -> dict[str, Any]:
    run = bolt("place", "--fleet", str(FLEETS / fleet), "--job", str(job), "--json", *extra)
    assert run.returncode == 0, run.stderr
    data = json.loads(run.stdout)
    assert isinstance(data, dict)
    return data


def test_place_json_has_the_documented_keys() -> None:
    data = place_json("h100-16k.yaml", JOBS / "train-256-rack.yaml")
    assert {"placed", "nodes", "cost", "explanation", "reason"} <= data.keys()
    assert data["placed"] is True
    nodes = data["nodes"]
    assert isinstance(nodes, dict) and len(nodes) == 32
    assert len({host.rsplit("-h", 1)[0] for host in nodes}) == 1, "256 GPUs fit one rack"
    assert all(gpus == list(range(8)) for gpus in nodes.values())


def test_impossible_job_is_never_with_a_fix() -> None:
    data = place_json("hetero-1024.yaml", JOBS / "impossible.yaml")
    assert data["placed"] is False and data["outcome"] == "never"
    assert "lower min_gpu_memory_gb to 80 or less" in data["fixes"]


def test_busy_fleet_says_when_and_where(tmp_path: Path) -> None:
    state = tmp_path / "state.yaml"
    state.write_text(
        "running:\n"
        "  - {job: a, nodes: {h100-p0-r00-h00: [0,1,2,3,4,5,6,7]}, ends_in: 40m}\n"
        "  - {job: b, nodes: {h100-p0-r00-h01: [0,1,2,3,4,5,6,7]}, ends_in: 2h}\n"
        "  - {job: c, nodes: {h100-p0-r01-h00: [0,1,2,3]}, ends_in: 10m}\n"
        "  - {job: d, nodes: {h100-p0-r01-h01: [0,1,2,3,4,5,6,7]}}\n"
    )
    job = tmp_path / "job.yaml"
    job.write_text("name: wide\nteam: nlp\ngpus: 16\ntopology: {required: rack}\n")
    data = place_json("lab.yaml", job, "--state", str(state))
    assert data["placed"] is False and data["outcome"] == "later"
    assert data["start_in_s"] == 7200
    assert data["waits_for"] == ["a", "b"]
    assert sorted(data["nodes"]) == ["h100-p0-r00-h00", "h100-p0-r00-h01"]


def test_human_output_tells_where_and_why() -> None:
    run = bolt(
        "place", "--fleet", str(FLEETS / "lab.yaml"), "--job", str(JOBS / "small-debug.yaml")
    )
    assert run.returncode == 0, run.stderr
    assert "placed (now)" in run.stdout and "cost 3" in run.stdout


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("name: x\ngpus: 8\n", "job.team: is required"),
        ("name: x\nteam: t\ngpus: 8\ntopology: {required: aisle}\n", "job.topology.required"),
        ("name: x\nteam: t\ngpus: [\n", "line 4"),
    ],
    ids=["missing team", "unknown level", "broken yaml"],
)
def test_bad_input_exits_2_without_traceback(tmp_path: Path, content: str, expected: str) -> None:
    job = tmp_path / "job.yaml"
    job.write_text(content)
    run = bolt("place", "--fleet", str(FLEETS / "lab.yaml"), "--job", str(job))
    assert run.returncode == 2
    assert expected in run.stderr
    assert "Traceback" not in run.stderr + run.stdout


def test_fleet_show_json_counts_the_heterogeneous_cluster() -> None:
    run = bolt("fleet", "show", str(FLEETS / "hetero-1024.yaml"), "--json")
    assert run.returncode == 0, run.stderr
    data = json.loads(run.stdout)
    assert data["gpus"] == 1024
    by_pool = {p["pool"]: (p["hosts"], p["gpus_per_host"]) for p in data["pools"]}
    assert by_pool["a100-80"] == (50, 8) and by_pool["a100-40"] == (53, 8)
    assert by_pool["v100"] == (50, 4)


def test_sixteen_thousand_gpu_fleet_has_the_documented_shape() -> None:
    data = json.loads(bolt("fleet", "show", str(FLEETS / "h100-16k.yaml"), "--json").stdout)
    assert (data["gpus"], data["hosts"], data["racks"], data["pods"]) == (16384, 2048, 64, 8)


def test_occupy_writes_a_state_that_place_accepts(tmp_path: Path) -> None:
    state = tmp_path / "busy.yaml"
    run = bolt(
        "fleet", "occupy", str(FLEETS / "lab.yaml"), "--occupancy", "0.5", "--out", str(state)
    )
    assert run.returncode == 0, run.stderr
    data = place_json("lab.yaml", JOBS / "small-debug.yaml", "--state", str(state))
    assert data["outcome"] in ("now", "later")


def test_check_rejects_a_job_that_can_never_run() -> None:
    run = bolt("check", str(JOBS / "impossible.yaml"), "--fleet", str(FLEETS / "hetero-1024.yaml"))
    assert run.returncode == 1
    assert "can never run" in run.stdout


def test_tour_runs_end_to_end() -> None:
    run = bolt("tour")
    assert run.returncode == 0, run.stderr
    assert run.stdout.count("placed (now)") >= 6
    assert "can never fit this fleet" in run.stdout

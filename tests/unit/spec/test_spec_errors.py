"""Bad fleet, job and state specs fail with the field, the value and the fix, never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from boltforge.spec.errors import SpecError
from boltforge.spec.fleet import load_fleet, parse_fleet
from boltforge.spec.job import parse_job
from boltforge.spec.resolve import to_gang
from boltforge.spec.state import load_state

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
LAB = load_fleet(EXAMPLES / "fleets" / "lab.yaml")
HETERO = load_fleet(EXAMPLES / "fleets" / "hetero-1024.yaml")

BAD_JOBS = [
    pytest.param({"name": "j", "gpus": 8}, "job.team", "required", id="a job without a team"),
    pytest.param(
        {"name": "j", "team": "t", "gpus": "lots"}, "job.gpus", "64xH100", id="gpus not a count"
    ),
    pytest.param(
        {"name": "j", "team": "t", "gpus": 8, "topology": {"required": "building"}},
        "job.topology.required",
        "island, host, rack, pod, spine",
        id="an unknown topology level",
    ),
    pytest.param(
        {"name": "j", "team": "t", "gpus": 8, "gpsu": 2},
        "job.gpsu",
        "not a known field",
        id="a misspelt field",
    ),
    pytest.param(
        {"name": "j", "team": "t", "priority": "urgent", "gpus": 8},
        "job.priority",
        "",
        id="an unknown priority",
    ),
    pytest.param(
        {
            "name": "j",
            "team": "t",
            "roles": [{"replicas": 2, "gpus": 6, "parallelism": {"tensor": 4}}],
        },
        "job.roles[0]",
        "To fix",
        id="tensor parallelism that does not divide a replica",
    ),
    pytest.param(
        {"name": "j", "team": "t", "gpus": 8, "elastic": {"min": 4, "max": 2}},
        "job",
        "swap",
        id="an elastic range upside down",
    ),
    pytest.param({"name": "j", "team": "t"}, "job", "asks for nothing", id="a job asking nothing"),
    pytest.param(
        {"name": "j", "team": "t", "gpus": 8, "health": {"progress_timeout": "soon"}},
        "job.health.progress_timeout",
        "'40m'",
        id="a progress timeout that is not a duration",
    ),
    pytest.param(
        {"name": "j", "team": "t", "gpus": 8, "health": {"timeout": "10m"}},
        "job.health.timeout",
        "not a known field",
        id="a misspelt health setting",
    ),
]


@pytest.mark.parametrize(("data", "field", "hint"), BAD_JOBS)
def test_bad_job_names_field_and_fix(data: dict[str, object], field: str, hint: str) -> None:
    with pytest.raises(SpecError) as caught:
        parse_job(data, "job.yaml")
    rendered = caught.value.render()
    assert any(p.field.startswith(field) for p in caught.value.problems), rendered
    assert hint in rendered


def test_shorthand_with_unknown_gpu_lists_the_fleets_models() -> None:
    spec = parse_job({"name": "j", "team": "t", "gpus": "64xH200"})
    with pytest.raises(SpecError) as caught:
        to_gang(spec, HETERO)
    text = caught.value.render()
    assert "job.gpus" in text and "A100-40GB, A100-80GB, V100-32GB" in text and "H200" in text


def test_total_gpus_that_do_not_split_into_hosts_suggest_per_node() -> None:
    spec = parse_job({"name": "j", "team": "t", "gpus": 12, "per_node": 8})
    with pytest.raises(SpecError) as caught:
        to_gang(spec, LAB)
    assert "per_node: 6" in caught.value.render()


def test_shorthand_resolves_prefix_and_splits_into_whole_hosts() -> None:
    gang = to_gang(parse_job({"name": "j", "team": "t", "gpus": "64xA100"}), HETERO)
    (role,) = gang.roles
    assert (role.replicas, role.gpus) == (8, 8)
    assert role.capability.gpu_types == frozenset({"A100-40GB", "A100-80GB"})


def test_small_job_stays_on_one_host() -> None:
    (role,) = to_gang(parse_job({"name": "j", "team": "t", "gpus": 4}), LAB).roles
    assert (role.replicas, role.gpus) == (1, 4)


def test_priority_words_map_to_classes() -> None:
    assert parse_job({"name": "j", "team": "t", "gpus": 1, "priority": "high"}).priority_class == 1
    assert parse_job({"name": "j", "team": "t", "gpus": 1, "priority": "low"}).priority_class == 3
    assert parse_job({"name": "j", "team": "t", "gpus": 1, "priority": 0}).priority_class == 0


BAD_FLEETS = [
    pytest.param(
        {
            "name": "f",
            "pools": [
                {
                    "name": "p",
                    "gpu": "H100",
                    "gpu_memory_gb": 80,
                    "gpus_per_host": 8,
                    "nvlink_island": 3,
                }
            ],
        },
        "does not divide",
        id="an island size that does not divide the host",
    ),
    pytest.param(
        {"name": "f", "pools": [{"name": "p", "gpus_per_host": 8}]},
        "`gpu` model",
        id="a GPU pool without a GPU model",
    ),
    pytest.param(
        {"name": "f", "pools": [{"name": "p", "gpus_per_host": 0}], "weights": {"rack": 100}},
        "nvlink <= host <= rack",
        id="weights that shrink with distance",
    ),
    pytest.param(
        {
            "name": "f",
            "pools": [{"name": "p", "gpus_per_host": 0}, {"name": "p", "gpus_per_host": 0}],
        },
        "repeat",
        id="two pools with one name",
    ),
    pytest.param({"name": "f", "pools": []}, "fleet.pools", id="a fleet without pools"),
]


@pytest.mark.parametrize(("data", "hint"), BAD_FLEETS)
def test_bad_fleet_names_the_fix(data: dict[str, object], hint: str) -> None:
    with pytest.raises(SpecError) as caught:
        parse_fleet(data, "fleet.yaml")
    assert hint in caught.value.render()


def test_yaml_syntax_error_names_line(tmp_path: Path) -> None:
    path = tmp_path / "f.yaml"
    path.write_text("name: f\npools: [\n")
    with pytest.raises(SpecError) as caught:
        load_fleet(path)
    assert "line" in caught.value.render()


def test_missing_file_is_a_spec_error(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="does not exist"):
        load_fleet(tmp_path / "nope.yaml")


def test_state_with_a_gpu_given_twice_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(
        "running:\n"
        "  - {job: a, nodes: {h100-p0-r00-h00: [0, 1]}}\n"
        "  - {job: b, nodes: {h100-p0-r00-h00: [1, 2]}}\n"
        "  - {job: c, nodes: {nowhere: [0]}}\n"
    )
    with pytest.raises(SpecError) as caught:
        load_state(path, LAB)
    text = caught.value.render()
    assert "GPU 1 of h100-p0-r00-h00 is not free" in text
    assert "state.running[2].nodes.nowhere" in text


def test_state_durations_set_expected_ends(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text("running:\n  - {job: a, nodes: {h100-p0-r00-h00: [0]}, ends_in: 40m}\n")
    state = load_state(path, LAB, now=100.0)
    assert state.allocations["a"].expected_end == 100.0 + 2400
    assert state.free_gpus == LAB.total_gpus - 1

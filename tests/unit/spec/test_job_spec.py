"""Job specs as users write them: the one-role shorthand or explicit roles, priorities,
durations, elastic ranges and arrays; every mistake named by field with its fix; and the
resolution of a spec into a gang on a concrete fleet."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from boltforge.control.jobs.submit import parse_array
from boltforge.core.model.gang import SpotPolicy
from boltforge.core.model.levels import Level
from boltforge.core.model.topology import TopologyTree
from boltforge.spec.errors import SpecError
from boltforge.spec.job import DEFAULT_MAX_RESTARTS, PRIORITY_CLASSES, JobSpec, load_job, parse_job
from boltforge.spec.resolve import match_types, to_gang
from boltforge.testing.builders import make_fleet, make_pool

# Two pools: 2 racks x 2 hosts of 8 H100s, and the same of 4 A100s.
FLEET = make_fleet(
    racks=2,
    hosts=2,
    pools=[make_pool(), make_pool("a100", "A100-40GB", 40, gpus=4, island=4)],
)


def job(**fields: Any) -> JobSpec:
    return parse_job({"name": "train", "team": "nlp", **fields}, "job.yaml")


def problems_of(data: dict[str, Any]) -> SpecError:
    with pytest.raises(SpecError) as caught:
        parse_job(data, "job.yaml")
    return caught.value


def gang_problems(spec: JobSpec, tree: TopologyTree = FLEET) -> SpecError:
    with pytest.raises(SpecError) as caught:
        to_gang(spec, tree, "job.yaml")
    return caught.value


# --- what a spec means when it leaves things out ---------------------------------------------


def test_a_minimal_job_gets_the_documented_defaults() -> None:
    spec = job(gpus=8)
    assert spec.priority == "normal" and spec.priority_class == 2
    assert spec.preemptible is True
    assert spec.max_restarts == DEFAULT_MAX_RESTARTS == 3
    assert (spec.checkpoint.grace, spec.checkpoint.interval) == (120.0, None)
    assert spec.health.progress_timeout is None
    assert spec.spot is SpotPolicy.ALLOWED
    assert (spec.deadline, spec.time_limit, spec.elastic) == (None, None, None)
    assert (spec.env, spec.pools, spec.roles) == ({}, [], [])
    assert spec.topology.to_rule().required is None
    assert spec.topology.to_rule().preferred is None
    p = spec.parallelism
    assert (p.tensor, p.pipeline, p.data) == (1, 1, 0)


def test_a_spec_cannot_be_changed_once_validated() -> None:
    spec = job(gpus=8)
    with pytest.raises(ValidationError):
        spec.gpus = 16  # type: ignore[misc]


# --- the one-role shorthand ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("gpus", "total"),
    [
        pytest.param(64, (64, None), id="a count"),
        pytest.param("64", (64, None), id="a count written as text"),
        pytest.param("64xH100", (64, "H100"), id="count x model"),
        pytest.param(" 8 X a100-80gb ", (8, "a100-80gb"), id="spaces and a capital X"),
        pytest.param("1xH100-80GB", (1, "H100-80GB"), id="one GPU of a full model name"),
    ],
)
def test_the_gpus_shorthand_gives_a_count_and_an_optional_model(
    gpus: int | str, total: tuple[int, str | None]
) -> None:
    assert job(gpus=gpus).total_gpus() == total


def test_a_cpu_only_job_asks_for_no_gpus() -> None:
    assert job(cpus=4).total_gpus() == (0, None)


@pytest.mark.parametrize(
    ("gpu", "types"),
    [
        pytest.param("A100", ["A100"], id="one model as text"),
        pytest.param(["A100", "H100"], ["A100", "H100"], id="a list of models"),
        pytest.param({"types": ["H100"], "min_memory_gb": 80}, ["H100"], id="a mapping"),
    ],
)
def test_gpu_models_may_be_one_name_a_list_or_a_mapping(gpu: object, types: list[str]) -> None:
    assert job(gpus=8, gpu=gpu).gpu.types == types


# --- priorities, durations, deadlines, env ---------------------------------------------------


@pytest.mark.parametrize(("word", "cls"), sorted(PRIORITY_CLASSES.items()))
def test_priority_words_name_their_class(word: str, cls: int) -> None:
    assert job(gpus=1, priority=word).priority_class == cls


@pytest.mark.parametrize("cls", [0, 1, 2, 3])
def test_a_priority_class_may_be_given_as_its_number(cls: int) -> None:
    assert job(gpus=1, priority=cls).priority_class == cls


def test_serving_outranks_high_outranks_normal_outranks_low() -> None:
    classes = [job(gpus=1, priority=w).priority_class for w in ("serving", "high", "normal", "low")]
    assert classes == sorted(classes) and len(set(classes)) == 4


def test_time_limit_checkpoint_and_progress_timeout_take_durations() -> None:
    spec = job(
        gpus=8,
        time_limit="6h",
        checkpoint={"grace": "5m", "interval": "30m"},
        health={"progress_timeout": 0},
    )
    assert spec.time_limit == 6 * 3600
    assert (spec.checkpoint.grace, spec.checkpoint.interval) == (300.0, 1800.0)
    assert spec.health.progress_timeout == 0.0


def test_a_deadline_is_a_timestamp_with_its_zone() -> None:
    spec = job(gpus=8, deadline="2030-01-02T03:04:05Z")
    assert spec.deadline == datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)


def test_env_holds_text_values() -> None:
    assert job(gpus=8, env={"NCCL_DEBUG": "INFO"}).env == {"NCCL_DEBUG": "INFO"}
    error = problems_of({"name": "j", "team": "t", "gpus": 8, "env": {"SEED": 1}})
    assert [p.field for p in error.problems] == ["job.env.SEED"]


def test_roles_default_to_one_replica_named_worker() -> None:
    (role,) = job(roles=[{"gpus": 8}]).roles
    assert (role.name, role.replicas, role.gpus, role.parallelism.tensor) == ("worker", 1, 8, 1)


def test_an_elastic_range_may_be_a_single_size() -> None:
    spec = job(gpus=16, elastic={"min": 2, "max": 2})
    assert spec.elastic is not None and (spec.elastic.min, spec.elastic.max) == (2, 2)


# --- mistakes: the field, the fix, no traceback -------------------------------------------


def _j(**fields: Any) -> dict[str, Any]:
    return {"name": "train", "team": "nlp", **fields}


BAD_SPECS = [
    pytest.param(_j(gpus=0), "job.gpus", "ask for 1 or more GPUs", id="zero GPUs"),
    pytest.param(_j(gpus="8 GPUs"), "job.gpus", "`64xH100`", id="gpus in words"),
    pytest.param(_j(gpus=8, per_node=0), "job.per_node", "To fix", id="zero GPUs per node"),
    pytest.param(_j(gpus=8, per_node=65), "job.per_node", "To fix", id="more per node than 64"),
    pytest.param(
        _j(roles=[{"gpus": 65}]), "job.roles[0].gpus", "To fix", id="a role over 64 GPUs a host"
    ),
    pytest.param(
        _j(roles=[{"gpus": 8}, {"name": "Policy", "gpus": 8}]),
        "job.roles[1].name",
        "`llama-pretrain`",
        id="a role name in capitals",
    ),
    pytest.param(
        _j(roles=[{"gpus": 8, "replicas": 0}]),
        "job.roles[0].replicas",
        "To fix",
        id="a role with no replicas",
    ),
    pytest.param(
        {"name": "Llama", "team": "nlp", "gpus": 8},
        "job.name",
        "`llama-pretrain`",
        id="a job name in capitals",
    ),
    pytest.param(
        {"team": "nlp", "gpus": 8}, "job.name", "is required. To fix: add it", id="no name"
    ),
    pytest.param(
        {"name": "j", "gpus": 8}, "job.team", "`team: <your team>`", id="no team (says why)"
    ),
    pytest.param(
        _j(roles=[{"gpus": 8}], gpus=8), "job", "move the GPUs into a role", id="roles and gpus"
    ),
    pytest.param(
        _j(gpus=8, elastic={"min": 8, "max": 2}), "job", "swap them", id="elastic min above max"
    ),
    pytest.param(
        _j(gpus=8, elastic={"min": 0, "max": 2}), "job.elastic.min", "To fix", id="elastic min 0"
    ),
    pytest.param(_j(gpus=8, max_restarts=-1), "job.max_restarts", "To fix", id="negative restarts"),
    pytest.param(_j(gpus=8, priority=4), "job.priority", "`priority: high`", id="class 4"),
    pytest.param(_j(gpus=8, priority=True), "job.priority", "class 0-3", id="priority true"),
    pytest.param(_j(gpus=8, preemptable=False), "job.preemptable", "spelling", id="misspelt"),
    pytest.param(
        _j(gpus=8, parallelism={"tensor": 0}), "job.parallelism.tensor", "To fix", id="tensor 0"
    ),
    pytest.param(
        _j(roles=[{"gpus": 0, "parallelism": {"tensor": 2}}]),
        "job.roles[0]",
        "set gpus to a multiple of 2",
        id="tensor parallel on a role without GPUs",
    ),
    pytest.param(_j(gpus=8, spot="maybe"), "job.spot", "'prefer'", id="an unknown spot policy"),
    pytest.param(
        _j(gpus=8, topology={"preferred": "datacenter"}),
        "job.topology.preferred",
        "e.g. `rack`",
        id="an unknown preferred level",
    ),
]


@pytest.mark.parametrize(("data", "field", "fix"), BAD_SPECS)
def test_a_bad_job_names_the_field_and_the_fix(data: dict[str, Any], field: str, fix: str) -> None:
    error = problems_of(data)
    assert [p.field for p in error.problems] == [field]
    assert fix in error.problems[0].message
    text = error.render()
    assert text.startswith("job.yaml: 1 problem(s)\n  " + field + ": ")
    assert "Traceback" not in text and "pydantic" not in text
    assert error.__suppress_context__ and error.__cause__ is None


def test_every_problem_is_reported_at_once() -> None:
    error = problems_of({"name": "Bad Name", "team": "nlp", "gpus": 8, "per_node": 0, "gpsu": 1})
    assert sorted(p.field for p in error.problems) == ["job.gpsu", "job.name", "job.per_node"]
    assert error.render().startswith("job.yaml: 3 problem(s)")


@pytest.mark.parametrize("data", [[1, 2], "gpus: 8", None, 8])
def test_a_job_that_is_not_a_mapping_is_refused(data: object) -> None:
    with pytest.raises(SpecError) as caught:
        parse_job(data, "job.yaml")
    (problem,) = caught.value.problems
    assert (problem.field, problem.value) == ("job", type(data).__name__)
    assert problem.message.startswith("must be a mapping of fields. To fix: write the job as")


def test_a_job_file_is_read_and_validated(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text("name: train\nteam: nlp\ngpus: 16xH100\ntime_limit: 2h\n")
    spec = load_job(path)
    assert (spec.total_gpus(), spec.time_limit) == ((16, "H100"), 7200.0)
    path.write_text("name: train\nteam: nlp\n")
    with pytest.raises(SpecError, match="asks for nothing") as caught:
        load_job(path)
    assert caught.value.source == str(path)


@pytest.mark.parametrize("gpus", ["0", "0xH100"])
def test_zero_gpus_written_as_text_is_refused_like_the_number(gpus: str) -> None:
    error = problems_of(_j(gpus=gpus))
    assert [p.field for p in error.problems] == ["job.gpus"]


def test_a_bad_deadline_says_how_to_write_one() -> None:
    error = problems_of(_j(gpus=8, deadline="tomorrow"))
    assert [p.field for p in error.problems] == ["job.deadline"]
    assert "To fix" in error.problems[0].message


# --- arrays ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "indices"),
    [
        ("0-3", [0, 1, 2, 3]),
        ("0-9:3", [0, 3, 6, 9]),
        ("1,3,5-7", [1, 3, 5, 6, 7]),
        ("7", [7]),
        (" 2 , 2,1", [1, 2]),
    ],
)
def test_array_ranges_give_sorted_unique_indices(text: str, indices: list[int]) -> None:
    assert parse_array(text) == indices


def test_the_task_limit_counts_each_index_once() -> None:
    assert len(parse_array("0-9999,5,0-99")) == 10_000  # overlaps repeat indices


@pytest.mark.parametrize(
    ("text", "hint"),
    [
        ("5-1", "must go up"),
        ("0-4:0", "step of 1 or more"),
        ("a-b", "e.g. 0-9"),
        ("", "e.g. 0-9"),
        ("0-10000", "more than 10000 tasks. To fix: split it"),
        ("0-9999,10000", "more than 10000 tasks. To fix: split it"),
        ("0-999999999999", "more than 10000 tasks. To fix: split it"),
    ],
)
def test_bad_array_ranges_name_the_array_and_the_fix(text: str, hint: str) -> None:
    with pytest.raises(SpecError) as caught:
        parse_array(text, "job.yaml")
    (problem,) = caught.value.problems
    assert (problem.field, problem.value) == ("array", text)
    assert hint in problem.message


# --- resolving a spec into a gang on a fleet ---------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "replicas", "per_replica", "types"),
    [
        pytest.param({"gpus": 4}, 1, 4, set(), id="a small job stays on one host"),
        pytest.param({"gpus": 8}, 1, 8, set(), id="a full host"),
        pytest.param({"gpus": 16}, 2, 8, set(), id="whole 8-GPU hosts"),
        pytest.param({"gpus": 16, "per_node": 4}, 4, 4, set(), id="per_node splits finer"),
        pytest.param({"gpus": "16xA100"}, 4, 4, {"A100-40GB"}, id="a model with 4-GPU hosts"),
        pytest.param({"gpus": 2, "gpu": "a100"}, 1, 2, {"A100-40GB"}, id="model by prefix"),
        pytest.param({"cpus": 4}, 1, 0, set(), id="a CPU-only job"),
    ],
)
def test_the_shorthand_splits_into_replicas_per_node(
    fields: dict[str, Any], replicas: int, per_replica: int, types: set[str]
) -> None:
    (role,) = to_gang(job(**fields), FLEET).roles
    assert (role.name, role.replicas, role.gpus) == ("worker", replicas, per_replica)
    assert role.capability.gpu_types == frozenset(types)


def test_the_gang_carries_team_priority_topology_and_placement_limits() -> None:
    spec = job(
        gpus=8,
        priority="serving",
        topology={"required": "rack", "preferred": "host"},
        pools=["h100"],
        spot="never",
        min_gpu_memory_gb=50,
        cpus=16,
        memory_gb=256,
        parallelism={"tensor": 4, "pipeline": 2},
    )
    gang = to_gang(spec, FLEET)
    assert (gang.name, gang.team, gang.priority) == ("train", "nlp", 0)
    assert (gang.topology.required, gang.topology.preferred) == (Level.RACK, Level.HOST)
    (role,) = gang.roles
    cap = role.capability
    assert (cap.pools, cap.spot, cap.min_gpu_memory_gb) == (
        frozenset({"h100"}),
        SpotPolicy.NEVER,
        50.0,
    )
    assert (role.cpus, role.memory_gb, role.tensor_parallel, role.pipeline_stages) == (
        16,
        256,
        4,
        2,
    )


def test_roles_keep_their_shape_and_the_largest_memory_floor_applies() -> None:
    spec = job(
        min_gpu_memory_gb=40,
        roles=[
            {"name": "policy", "replicas": 2, "gpus": 8, "parallelism": {"tensor": 8}},
            {"name": "reward", "gpus": 4, "gpu": {"types": ["H100"], "min_memory_gb": 80}},
            {"name": "loader", "replicas": 3, "cpus": 16},
        ],
    )
    roles = to_gang(spec, FLEET).roles
    assert [(r.name, r.replicas, r.gpus, r.tensor_parallel) for r in roles] == [
        ("policy", 2, 8, 8),
        ("reward", 1, 4, 1),
        ("loader", 3, 0, 1),
    ]
    assert [r.capability.min_gpu_memory_gb for r in roles] == [40, 80, 40]
    assert roles[1].capability.gpu_types == frozenset({"H100-80GB"})


def test_gpu_names_match_fleet_models_exactly_or_by_prefix_ignoring_case() -> None:
    found, missing = match_types(FLEET, ["a100", "h100-80gb", "V100"])
    assert found == frozenset({"A100-40GB", "H100-80GB"})
    assert missing == ["V100"]


RESOLVE_PROBLEMS = [
    pytest.param(
        {"gpus": 32, "elastic": {"min": 1, "max": 2}},
        "job.elastic",
        "must include the 4 replicas asked for. To fix: widen the range",
        id="an elastic range that excludes the size asked for",
    ),
    pytest.param(
        {"roles": [{"name": "a", "gpus": 8}, {"name": "a", "gpus": 8}]},
        "job.roles",
        "role names repeat. To fix: rename them",
        id="two roles with one name",
    ),
    pytest.param(
        {"roles": [{"gpus": 8, "gpu": "V100"}]},
        "job.roles[0].gpu",
        "names no GPU model in fleet test. To fix: use one of A100-40GB, H100-80GB",
        id="a role asking for a model the fleet lacks",
    ),
    pytest.param(
        {"gpus": "8xB200"},
        "job.gpus",
        "use one of A100-40GB, H100-80GB",
        id="a shorthand model the fleet lacks",
    ),
    pytest.param(
        {"gpus": 12, "per_node": 8},
        "job.gpus",
        "set `per_node: 6` or ask for 16 GPUs",
        id="GPUs that do not split into hosts",
    ),
    pytest.param(
        {"gpus": 16, "per_node": 8, "parallelism": {"tensor": 3}},
        "job.parallelism.tensor",
        "must divide the 8 GPUs per node",
        id="tensor parallelism that does not divide a node",
    ),
]


@pytest.mark.parametrize(("fields", "field", "message"), RESOLVE_PROBLEMS)
def test_a_job_the_fleet_cannot_express_names_the_field_and_fix(
    fields: dict[str, Any], field: str, message: str
) -> None:
    error = gang_problems(job(**fields))
    assert [p.field for p in error.problems] == [field]
    assert message in error.problems[0].message
    assert error.source == "job.yaml"


def test_resolution_reports_every_problem_together() -> None:
    spec = job(gpus=32, gpu="V100", elastic={"min": 1, "max": 2})
    error = gang_problems(spec)
    assert [p.field for p in error.problems] == ["job.gpu", "job.elastic"]


@given(per_node=st.sampled_from([1, 2, 4, 8]), hosts=st.integers(min_value=1, max_value=64))
def test_an_even_split_keeps_every_gpu_asked_for(per_node: int, hosts: int) -> None:
    total = per_node * hosts
    (role,) = to_gang(job(gpus=total, per_node=per_node), FLEET).roles
    assert role.replicas * role.gpus == total
    assert role.gpus == per_node


@given(total=st.integers(min_value=1, max_value=512))
def test_without_per_node_a_job_fills_whole_hosts_or_fits_on_one(total: int) -> None:
    spec = job(gpus=total, gpu="H100")
    if total > 8 and total % 8:
        assert "per_node: " in gang_problems(spec).render()
        return
    (role,) = to_gang(spec, FLEET).roles
    assert role.replicas * role.gpus == total
    assert role.gpus == min(total, 8)

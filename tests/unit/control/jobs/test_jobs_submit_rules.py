"""The rules of submission (``jobs/submit.py``) that the API tests do not reach one by one:
the array syntax as a table, the command line's overrides, the image policy, whether the
fleet could ever run a job, how a spec becomes rows, and the job counter."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from store_builders import a_job, migrated, spec_dict

from boltforge.control.auth import Caller
from boltforge.control.jobs.submit import (
    MAX_TASKS,
    check_fit,
    check_images,
    find_by_key,
    job_rows,
    next_numbers,
    parse_array,
    parse_request,
    priority_class,
)
from boltforge.control.scheduling.fleet import Fleet, build_fleet
from boltforge.control.store.db import Database
from boltforge.spec.errors import SpecError
from boltforge.spec.job import JobSpec
from boltforge.spec.teams import parse_teams
from boltforge.wire.agent import Inventory
from boltforge.wire.jobs import SubmitRequest

ADMIN = Caller("root", "admin")


def spec_of(**fields: Any) -> JobSpec:
    spec, _ = parse_request(SubmitRequest(spec=spec_dict(**fields)))
    return spec


def problems(err: SpecError) -> list[tuple[str, str]]:
    return [(p.field, p.message) for p in err.problems]


# -- array ranges ----------------------------------------------------------------------------

ARRAYS = {
    "a range": ("0-4", [0, 1, 2, 3, 4]),
    "a range with a step": ("0-9:3", [0, 3, 6, 9]),
    "a list with a range": ("1,3,5-7", [1, 3, 5, 6, 7]),
    "one index": ("7", [7]),
    "a range of one": ("4-4", [4]),
    "spaces": (" 1 , 2- 3 ", [1, 2, 3]),
    "repeats and disorder": ("9,1,5,1,0-2", [0, 1, 2, 5, 9]),
    "a step past the end": ("2-3:5", [2]),
    "the most tasks": (f"0-{MAX_TASKS - 1}", list(range(MAX_TASKS))),
}


@pytest.mark.parametrize("case", ARRAYS, ids=list(ARRAYS))
def test_an_array_range_gives_its_indices_sorted_and_unique(case: str) -> None:
    text, indices = ARRAYS[case]
    assert parse_array(text) == indices


BAD_ARRAYS = {
    "words": ("all", "must be like 0-99, 0-99:2 or 1,3,5"),
    "an open range": ("3-", "must be like"),
    "a negative index": ("-1", "must be like"),
    "two steps": ("0-9:2:3", "must be like"),
    "an empty part": ("1,,2", "must be like"),
    "nothing": ("", "must be like"),
    "downwards": ("9-1", "a range must go up with a step of 1 or more"),
    "a step of zero": ("0-9:0", "a range must go up with a step of 1 or more"),
    "one too many": (f"0-{MAX_TASKS}", f"more than {MAX_TASKS} tasks. To fix: split it"),
    "too many across parts": (
        f"0-{MAX_TASKS // 2},{MAX_TASKS // 2 + 1}-{MAX_TASKS}",
        "more than",
    ),
}


@pytest.mark.parametrize("case", BAD_ARRAYS, ids=list(BAD_ARRAYS))
def test_a_bad_array_is_refused_naming_the_field_and_what_was_given(case: str) -> None:
    text, says = BAD_ARRAYS[case]
    with pytest.raises(SpecError) as refused:
        parse_array(text, "sweep.yaml")
    [problem] = refused.value.problems
    assert problem.field == "array" and says in problem.message
    assert problem.value == text
    assert str(refused.value).startswith("sweep.yaml")


def test_a_request_without_an_array_has_no_tasks() -> None:
    _, tasks = parse_request(SubmitRequest(spec=spec_dict(), array=""))
    assert tasks is None


# -- the command line's overrides ------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "cls"),
    [("0", 0), ("serving", 0), (" high ", 1), ("2", 2), ("batch", 3), ("3", 3)],
)
def test_a_priority_override_is_a_class_number_or_a_word(given: str, cls: int) -> None:
    spec, _ = parse_request(SubmitRequest(spec=spec_dict(priority="low"), priority=given))
    assert spec.priority_class == cls


def test_a_gpu_override_replaces_the_specs_and_may_name_a_model() -> None:
    counted, _ = parse_request(SubmitRequest(spec=spec_dict(gpus=8), gpus=" 16 "))
    modelled, _ = parse_request(SubmitRequest(spec=spec_dict(gpus=8), gpus="16xH100"))
    assert counted.total_gpus() == (16, None)
    assert modelled.total_gpus() == (16, "H100")


def test_a_team_override_replaces_the_specs() -> None:
    spec, _ = parse_request(SubmitRequest(spec=spec_dict(team="research"), team="vision"))
    assert spec.team == "vision"


@pytest.mark.parametrize(
    ("extra", "workdir"),
    [
        ({}, "/home/me/project"),
        ({"workdir": "/srv/mine"}, "/srv/mine"),
        ({"image": "localhost/train:1"}, None),
    ],
    ids=["filled in", "the spec's own", "a container's file system is its image's"],
)
def test_the_submitting_directory_is_the_workdir_only_when_nothing_says_otherwise(
    extra: dict[str, Any], workdir: str | None
) -> None:
    spec, _ = parse_request(SubmitRequest(spec=spec_dict(**extra), workdir="/home/me/project"))
    assert spec.workdir == workdir


def test_a_role_in_a_container_keeps_the_submitting_directory_out_too() -> None:
    roles = [
        {
            "name": "learner",
            "replicas": 1,
            "gpus": 8,
            "command": ["learn"],
            "image": "localhost/rl:1",
        },
        {"name": "actor", "replicas": 2, "gpus": 0, "cpus": 4, "command": ["act"]},
    ]
    spec, _ = parse_request(
        SubmitRequest(spec={"name": "rl", "team": "t", "roles": roles}, workdir="/home/me")
    )
    assert spec.workdir is None


def test_a_job_of_roles_that_each_name_a_command_needs_no_job_command() -> None:
    roles = [
        {"name": "a", "replicas": 1, "gpus": 1, "command": ["x"]},
        {"name": "b", "replicas": 1, "gpus": 1, "command": ["y"]},
    ]
    spec, _ = parse_request(SubmitRequest(spec={"name": "r", "team": "t", "roles": roles}))
    assert [r.command for r in spec.roles] == [["x"], ["y"]]


def test_a_role_without_a_command_is_refused_when_the_job_names_none() -> None:
    roles = [
        {"name": "a", "replicas": 1, "gpus": 1, "command": ["x"]},
        {"name": "b", "replicas": 1, "gpus": 1},
    ]
    with pytest.raises(SpecError) as refused:
        parse_request(
            SubmitRequest(spec={"name": "r", "team": "t", "roles": roles}, source="rl.yaml")
        )
    assert problems(refused.value) == [
        (
            "job.command",
            "is required to run the job. To fix: add e.g. `command: [python, train.py]` "
            "(or a command on every role)",
        )
    ]


@pytest.mark.parametrize(
    ("yaml", "field"),
    [("name: [unclosed", "yaml (line 1, column 16)"), ("- a\n- b\n", "job")],
    ids=["not YAML", "not a mapping"],
)
def test_yaml_that_is_not_a_job_is_refused_naming_the_file(yaml: str, field: str) -> None:
    with pytest.raises(SpecError) as refused:
        parse_request(SubmitRequest(yaml=yaml, source="train.yaml"))
    assert str(refused.value).startswith("train.yaml")
    assert [f for f, _ in problems(refused.value)] == [field]


# -- the image policy ------------------------------------------------------------------------

POLICY = parse_teams(
    {
        "images": {"require": True, "registries": ["localhost/"], "digest": True},
        "teams": {"infra": {"images": {"require": False}}},
    }
)
DIGEST = "@sha256:" + "a" * 64


def test_no_teams_file_means_no_image_policy() -> None:
    check_images(spec_of(), None)


@pytest.mark.parametrize(
    ("extra", "field", "says"),
    [
        ({}, "job.image", "is required"),
        ({"image": "docker.io/x" + DIGEST}, "job.image", "not from an allowed registry"),
        ({"image": "localhost/x:1"}, "job.image", "must be pinned by digest"),
    ],
    ids=["none", "another registry", "a tag"],
)
def test_an_image_that_breaks_the_policy_is_refused_naming_the_field(
    extra: dict[str, Any], field: str, says: str
) -> None:
    with pytest.raises(SpecError) as refused:
        check_images(spec_of(**extra), POLICY, "train.yaml")
    [(where, message)] = problems(refused.value)
    assert where == field and says in message and "To fix" in message


def test_an_image_that_meets_the_policy_and_a_team_with_its_own_pass() -> None:
    check_images(spec_of(image="localhost/x" + DIGEST), POLICY)
    check_images(spec_of(team="infra"), POLICY)


# -- could the fleet ever run it -------------------------------------------------------------


def fleet_of(hosts: int) -> Fleet:
    return build_fleet(
        "test",
        [
            Inventory.model_validate(
                {
                    "name": f"host-{i}",
                    "pool": "h100",
                    "gpu": "H100-80GB",
                    "gpu_memory_gb": 80,
                    "gpus": 8,
                    "nvlink_island": 8,
                    "cpus": 64,
                    "memory_gb": 512,
                    "pod": "p0",
                    "rack": f"r{i // 2}",
                }
            )
            for i in range(hosts)
        ],
    )


def test_a_job_the_fleet_can_hold_gets_its_gang() -> None:
    gang = check_fit(spec_of(gpus=16), fleet_of(2))
    assert gang is not None
    assert gang.total_gpus == 16 and [r.replicas for r in gang.roles] == [2]


def test_a_job_bigger_than_the_fleet_is_refused_with_why_and_the_fixes() -> None:
    with pytest.raises(SpecError) as refused:
        check_fit(spec_of(gpus=64), fleet_of(2), "big.yaml")
    said = problems(refused.value)
    assert all(field == "job" for field, _ in said)
    reasons = [m for _, m in said if m.startswith("can never run on this fleet: ")]
    fixes = [m for _, m in said if m.startswith("To fix: ")]
    assert reasons and fixes and len(reasons) + len(fixes) == len(said)
    assert any("ask for 2 replica(s) (16 GPUs), which fit now" in f for f in fixes)


def test_a_gpu_model_the_fleet_lacks_is_refused_naming_the_models_it_has() -> None:
    with pytest.raises(SpecError) as refused:
        check_fit(spec_of(gpus="8xA100"), fleet_of(2))
    [(field, message)] = problems(refused.value)
    assert field == "job.gpus" and "H100-80GB" in message


def test_an_empty_fleet_judges_nothing() -> None:
    empty = Fleet(fleet_of(1).tree, (), {})
    assert check_fit(spec_of(gpus=4096), empty) is None


# -- rows ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "gpus", "replicas"),
    [
        ({"gpus": 16}, 16, 2),
        ({"gpus": 4}, 4, 1),
        ({"gpus": 8, "per_node": 2}, 8, 4),
        ({"gpus": None, "cpus": 4}, 0, 1),
    ],
    ids=["16 on 8-GPU hosts", "a part of one host", "two per node", "CPUs only"],
)
def test_a_rows_size_is_its_gpus_and_replicas(
    extra: dict[str, Any], gpus: int, replicas: int
) -> None:
    fields = {k: v for k, v in {**spec_dict(), **extra}.items() if v is not None}
    spec, _ = parse_request(SubmitRequest(spec=fields))
    [row] = job_rows(spec, None, None, ADMIN, 1.0, None, 1)
    assert (row["gpus"], row["replicas"]) == (gpus, replicas)


def test_a_job_of_roles_counts_every_roles_gpus_and_replicas() -> None:
    roles = [
        {"name": "learner", "replicas": 2, "gpus": 8, "command": ["learn"]},
        {"name": "actor", "replicas": 3, "gpus": 0, "cpus": 4, "command": ["act"]},
    ]
    spec, _ = parse_request(SubmitRequest(spec={"name": "rl", "team": "t", "roles": roles}))
    [row] = job_rows(spec, None, None, ADMIN, 1.0, None, 1)
    assert (row["gpus"], row["replicas"]) == (16, 5)


def test_a_row_keeps_only_what_the_spec_set_and_its_priority_class() -> None:
    spec, _ = parse_request(SubmitRequest(spec=spec_dict(project="llm"), priority="high"))
    [row] = job_rows(spec, None, None, Caller("amy", "member", "research"), 3.0, None, 9)
    assert row["spec"] == {**spec_dict(project="llm"), "priority": "high"}
    assert (row["priority"], row["queue"], row["project"]) == (1, "research/llm", "llm")
    assert (row["user"], row["submitted_at"], row["num"], row["id"]) == ("amy", 3.0, 9, "9")


@pytest.mark.parametrize(
    ("word", "cls"),
    [("serving", 0), ("high", 1), ("normal", 2), ("interactive", 2), ("low", 3), ("batch", 3)],
)
def test_priority_words_map_to_their_class(word: str, cls: int) -> None:
    assert priority_class(word) == cls


# -- the job counter and keys ----------------------------------------------------------------


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Database]:
    with migrated(tmp_path / "numbers.db") as store:
        yield store


def test_numbers_are_handed_out_in_blocks_without_gaps(db: Database) -> None:
    with db.session() as s:
        assert list(next_numbers(s, 3)) == [1, 2, 3]
        assert list(next_numbers(s, 1)) == [4]
    with db.session() as s:
        assert list(next_numbers(s, 2)) == [5, 6]


def test_numbers_taken_by_a_transaction_that_rolled_back_are_handed_out_again(
    db: Database,
) -> None:
    with pytest.raises(RuntimeError), db.session() as s:
        next_numbers(s, 5)
        raise RuntimeError("the insert failed")
    with db.session() as s:
        assert list(next_numbers(s, 1)) == [1]


def test_a_key_finds_the_job_it_made_and_no_other(db: Database) -> None:
    with db.session() as s:
        made = a_job(s, "succeeded", idempotency_key="nightly-2027-01-15")
        a_job(s, "pending")
    with db.session() as s:
        found = find_by_key(s, "nightly-2027-01-15")
        assert found is not None and found.id == made.id
        assert find_by_key(s, "nightly-2027-01-16") is None
        assert find_by_key(s, "") is None

"""Pure parts of the views (``views/billing.py`` grouping and visibility, ``views/jobs.py``
summaries and node states) and of submission (``jobs/submit.py``: requests to specs, rows
and the first timeline line)."""

from __future__ import annotations

from typing import Any

import pytest
from control_kit import make_spec

from boltforge.control.auth import Caller
from boltforge.control.jobs.submit import (
    check_fit,
    job_rows,
    parse_request,
    queued_message,
)
from boltforge.control.views.billing import JobMeter, group, total, visible
from boltforge.control.views.jobs import node_state, stored_summary
from boltforge.core.billing.meter import Meter
from boltforge.spec.errors import SpecError
from boltforge.wire.jobs import SubmitRequest

H = 3600.0


def meter(job: str, team: str, project: str | None, gpu_h: float, usd: float) -> JobMeter:
    """A job's meter of ``gpu_h`` GPU-hours and ``usd`` dollars, half of each productive."""
    return JobMeter(
        job, f"name-{job}", team, project, Meter(gpu_h * H, usd, gpu_h * H / 2, usd / 2)
    )


METERS = [
    meter("1", "vision", "detr", 10.0, 30.0),
    meter("2", "vision", None, 2.0, 6.0),
    meter("3", "nlp", "llm", 40.0, 120.0),
    meter("4", "vision", "detr", 1.0, 3.0),
]


def test_grouping_by_team_sums_each_team_and_sorts_by_dollars() -> None:
    rows = group(METERS, "team")
    assert [(r.key, r.jobs, r.gpu_hours, r.dollars) for r in rows] == [
        ("nlp", 1, 40.0, 120.0),
        ("vision", 3, 13.0, 39.0),
    ]
    assert all(r.project is None and r.job is None for r in rows)
    assert rows[1].productive_dollars == pytest.approx(19.5)


def test_grouping_by_project_marks_jobs_without_one() -> None:
    rows = group(METERS, "project")
    assert [(r.key, r.project, r.jobs) for r in rows] == [
        ("nlp/llm", "llm", 1),
        ("vision/detr", "detr", 2),
        ("vision/-", None, 1),
    ]


def test_grouping_by_job_names_each_job() -> None:
    rows = group(METERS, "job")
    assert [(r.key, r.job, r.name, r.team) for r in rows] == [
        ("3", "3", "name-3", "nlp"),
        ("1", "1", "name-1", "vision"),
        ("2", "2", "name-2", "vision"),
        ("4", "4", "name-4", "vision"),
    ]


def test_equal_dollars_are_ordered_by_key() -> None:
    rows = group([meter("b", "t2", None, 1, 5), meter("a", "t1", None, 1, 5)], "team")
    assert [r.key for r in rows] == ["t1", "t2"]


@pytest.mark.parametrize("by", ["team", "project", "job"])
def test_the_total_adds_up_whatever_the_grouping(by: Any) -> None:
    t = total(group(METERS, by))
    assert (t.key, t.jobs) == ("total", 4)
    assert t.gpu_hours == pytest.approx(53.0)
    assert t.dollars == pytest.approx(159.0)
    assert t.productive_dollars == pytest.approx(79.5)


def test_no_meters_make_no_rows_and_a_zero_total() -> None:
    assert group([], "team") == []
    t = total([])
    assert (t.jobs, t.dollars, t.gpu_hours) == (0, 0.0, 0.0)


def test_a_member_sees_their_team_s_jobs_and_only_other_teams_totals() -> None:
    mine, theirs = visible(METERS, Caller("m", "member", "vision"), "job")
    assert {r.key for r in mine} == {"1", "2", "4"}
    assert [(r.key, r.jobs, r.job) for r in theirs] == [("nlp", 1, None)]


@pytest.mark.parametrize("who", [Caller("a", "admin"), Caller("v", "viewer")])
def test_admins_and_viewers_see_every_project(who: Caller) -> None:
    mine, theirs = visible(METERS, who, "project")
    assert len(mine) == 3 and theirs == []


def test_by_team_everyone_sees_every_team() -> None:
    mine, theirs = visible(METERS, Caller("x", "agent"), "team")
    assert [r.key for r in mine] == ["nlp", "vision"] and theirs == []


# -- job summaries and node states ----------------------------------------------------------


def stored(**extra: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "id": "7",
        "name": "train",
        "team": "vision",
        "project": None,
        "user": "alice",
        "priority": 2,
        "state": "pending",
        "gpus": 16,
        "replicas": 2,
        "submitted_at": 1.0,
    }
    row.update(extra)
    return row


def test_a_just_stored_job_reads_as_a_queue_row_with_defaults() -> None:
    out = stored_summary(stored())
    assert (out.id, out.priority_name, out.state, out.gpus, out.replicas) == (
        "7",
        "normal",
        "pending",
        16,
        2,
    )
    assert (out.reason, out.preemptions, out.restarts) == ("", 0, 0)
    assert out.started_at is None and out.array is None


@pytest.mark.parametrize(("priority", "name"), [(0, "serving"), (1, "high"), (3, "low"), (9, "9")])
def test_priority_names_fall_back_to_the_number(priority: int, name: str) -> None:
    assert stored_summary(stored(priority=priority)).priority_name == name


@pytest.mark.parametrize(
    ("state", "cordoned", "used", "shown"),
    [
        ("ready", False, 8, "ready"),
        ("ready", True, 8, "draining"),
        ("ready", True, 0, "cordoned"),
        ("suspect", True, 1, "draining"),
        ("suspect", True, 0, "cordoned"),
        ("lost", True, 4, "lost"),
        ("suspect", False, 0, "suspect"),
    ],
)
def test_a_cordoned_live_node_drains_then_shows_cordoned(
    state: str, cordoned: bool, used: int, shown: str
) -> None:
    assert node_state(state, cordoned, used) == shown


# -- submission -----------------------------------------------------------------------------


def request(**fields: Any) -> SubmitRequest:
    return SubmitRequest(**fields)


def problems(err: SpecError) -> str:
    return str(err)


def test_a_json_spec_is_parsed_with_the_command_line_s_overrides() -> None:
    spec, tasks = parse_request(
        request(spec=make_spec("train", 8), gpus="16", priority="high", team="nlp", array="0-2")
    )
    assert (spec.name, spec.team, spec.priority_class) == ("train", "nlp", 1)
    assert spec.total_gpus()[0] == 16
    assert tasks == [0, 1, 2]


def test_a_yaml_spec_is_parsed_like_a_json_one() -> None:
    text = "name: train\nteam: vision\ngpus: 8\ncommand: [python, train.py]\n"
    spec, tasks = parse_request(request(yaml=text))
    assert (spec.name, spec.team, tasks) == ("train", "vision", None)


def test_a_workdir_is_filled_in_only_when_the_spec_names_none() -> None:
    given, _ = parse_request(request(spec=make_spec("a", 1, workdir="/mine"), workdir="/cwd"))
    filled, _ = parse_request(request(spec=make_spec("a", 1), workdir="/cwd"))
    assert (given.workdir, filled.workdir) == ("/mine", "/cwd")


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({}, "is required"),
        ({"spec": make_spec("a", 1), "yaml": "name: a"}, "send the spec once"),
        ({"spec": {"name": "a", "team": "t", "gpus": 1}}, "command"),
        ({"spec": make_spec("a", 1), "array": "9-1"}, "go up"),
        ({"spec": make_spec("a", 1), "array": "x"}, "must be like"),
    ],
    ids=["nothing", "twice", "no-command", "downward-array", "bad-array"],
)
def test_a_bad_request_is_refused_with_the_fix(fields: dict[str, Any], says: str) -> None:
    with pytest.raises(SpecError) as err:
        parse_request(request(source="train.yaml", **fields))
    assert says in problems(err.value)
    assert "train.yaml" in problems(err.value)


def test_with_no_fleet_yet_nothing_is_judged() -> None:
    spec, _ = parse_request(request(spec=make_spec("a", 4096)))
    assert check_fit(spec, None) is None


def test_one_submission_makes_one_pending_row_with_its_key() -> None:
    spec, _ = parse_request(request(spec=make_spec("train", 16)))
    [row] = job_rows(spec, None, None, Caller("alice", "member", "research"), 5.0, "k1", 12)
    assert (row["id"], row["num"], row["state"], row["user"]) == ("12", 12, "pending", "alice")
    assert (row["gpus"], row["replicas"], row["queue"]) == (16, 2, "research")
    assert (row["idempotency_key"], row["array_id"], row["submitted_at"]) == ("k1", None, 5.0)


def test_an_array_makes_one_row_per_task_and_the_key_only_on_the_first() -> None:
    spec, tasks = parse_request(request(spec=make_spec("sweep", 1, project="p"), array="0-4:2"))
    rows = job_rows(spec, tasks, None, Caller("bob", "admin"), 1.0, "key", 3)
    assert [r["id"] for r in rows] == ["3_0", "3_2", "3_4"]
    assert [r["array_index"] for r in rows] == [0, 2, 4]
    assert {r["array_id"] for r in rows} == {"3"}
    assert [r["idempotency_key"] for r in rows] == ["key", None, None]
    assert {r["queue"] for r in rows} == {"research/p"}
    assert len({r["array_spec"] for r in rows}) == 1


@pytest.mark.parametrize(
    ("gpus", "replicas", "priority", "line"),
    [
        (16, 2, 2, "queued: 16 GPU(s) in 2 replica(s) for team t, priority normal"),
        (0, 3, 0, "queued: 3 replica(s) for team t, priority serving"),
    ],
)
def test_the_first_timeline_line_says_what_was_queued(
    gpus: int, replicas: int, priority: int, line: str
) -> None:
    row = {"gpus": gpus, "replicas": replicas, "priority": priority, "team": "t"}
    assert queued_message(row) == line

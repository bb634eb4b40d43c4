"""Containerized work through the real API in-process: the image intake policy refuses a job
at submit (422 naming the field, nothing stored), and a placed job's replicas carry the image,
CPUs and memory the node's container engine enforces."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from control_kit import Fleet, make_spec
from sqlalchemy import func, select

from boltforge.control.store.models import JobRow
from boltforge.spec.teams import parse_teams

TEAMS = {
    "images": {"require": True, "registries": ["localhost/"]},
    "teams": {"infra": {"images": {"require": False}}},
}


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    with Fleet(tmp_path, teams=parse_teams(TEAMS)) as f:
        yield f


def stored_jobs(fleet: Fleet) -> int:
    with fleet.rt.db.session() as s:
        return int(s.scalar(select(func.count()).select_from(JobRow)) or 0)


@pytest.mark.parametrize(
    ("image", "said"),
    [
        (None, "is required: this server runs containerized work only"),
        ("docker.io/library/python:3", "is not from an allowed registry (this server accepts "),
    ],
)
def test_a_job_that_breaks_the_image_policy_is_refused_and_nothing_is_stored(
    fleet: Fleet, image: str | None, said: str
) -> None:
    spec = make_spec("plain", 8) | ({"image": image} if image else {})
    r = fleet.post("/v1/jobs", {"spec": spec})
    assert r.status_code == 422, r.text
    [problem] = r.json()["problems"]
    assert problem["field"] == "job.image"
    assert said in problem["message"] and "To fix" in problem["message"]
    assert stored_jobs(fleet) == 0


def test_a_team_with_its_own_rule_may_run_processes(fleet: Fleet) -> None:
    job = fleet.submit(make_spec("tools", 8, team="infra"))
    assert fleet.job(job).state == "scheduled"


def test_replicas_carry_the_roles_image_and_their_share_of_the_node(fleet: Fleet) -> None:
    spec = {
        "name": "rl",
        "team": "research",
        "image": "localhost/base:1",
        "roles": [
            {"name": "actor", "gpus": 2, "cpus": 8, "memory_gb": 64, "command": "act"},
            {"name": "learner", "gpus": 4, "image": "localhost/learn:2", "command": "learn"},
        ],
    }
    fleet.submit(spec)
    runs = [r for n in fleet.nodes.values() for r in n.to_run()]
    by_role = {r.env["BOLT_ROLE"]: r for r in runs}
    assert by_role["actor"].image == "localhost/base:1"
    assert (by_role["actor"].cpus, by_role["actor"].memory_gb) == (8, 64)
    assert by_role["learner"].image == "localhost/learn:2"
    assert by_role["learner"].command == ["learn"]

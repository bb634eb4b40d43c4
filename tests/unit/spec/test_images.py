"""The image intake policy: required images, allowed registries, pinned digests, per team."""

from __future__ import annotations

from typing import Any

import pytest

from boltforge.spec.images import ImagePolicy
from boltforge.spec.job import parse_job
from boltforge.spec.teams import parse_teams

DIGEST = "sha256:" + "ab" * 32


def job(**fields: Any) -> Any:
    size = {} if "roles" in fields else {"gpus": 1}
    return parse_job({"name": "j", "team": "nlp", "command": "train", **size, **fields})


def fields_of(policy: ImagePolicy, **spec: Any) -> list[str]:
    return [p.field for p in policy.problems(job(**spec))]


def test_no_policy_accepts_anything() -> None:
    assert not ImagePolicy().active
    assert fields_of(ImagePolicy()) == []
    assert fields_of(ImagePolicy(), image="docker.io/x") == []


def test_a_required_image_names_the_field_and_the_fix() -> None:
    policy = ImagePolicy(require=True)
    [problem] = policy.problems(job())
    assert problem.field == "job.image"
    assert "containerized work only" in problem.message and "To fix" in problem.message
    assert fields_of(policy, image="localhost/train:1") == []


def test_each_role_needs_an_image_of_its_own_or_the_jobs() -> None:
    roles = [
        {"name": "actor", "gpus": 1, "image": "localhost/a:1"},
        {"name": "critic", "gpus": 1},
    ]
    policy = ImagePolicy(require=True)
    assert fields_of(policy, roles=roles) == ["job.roles[1].image"]
    assert fields_of(policy, roles=roles, image="localhost/base:1") == []


def test_registries_are_name_prefixes() -> None:
    policy = ImagePolicy(registries=["registry.acme.com/", "ghcr.io/acme/"])
    assert fields_of(policy, image="registry.acme.com/nlp/train:3") == []
    assert fields_of(policy, image="ghcr.io/acme/train:3") == []
    [bad] = policy.problems(job(image="ghcr.io/evil/train:3"))
    assert bad.field == "job.image" and bad.value == "ghcr.io/evil/train:3"
    assert "registry.acme.com/, ghcr.io/acme/" in bad.message
    assert fields_of(policy) == []  # no image and none required


def test_a_digest_pins_the_image() -> None:
    policy = ImagePolicy(digest=True)
    assert fields_of(policy, image=f"localhost/train@{DIGEST}") == []
    [bad] = policy.problems(job(image="localhost/train:latest"))
    assert "pinned by digest" in bad.message and "NAME@sha256:" in bad.message


@pytest.mark.parametrize(("team", "accepted"), [("nlp", False), ("infra", True), ("vision", False)])
def test_a_teams_own_rule_replaces_the_servers(team: str, accepted: bool) -> None:
    teams = parse_teams(
        {
            "images": {"require": True},
            "teams": {"infra": {"images": {"require": False}}, "vision": {}},
        }
    )
    problems = teams.image_rule(team).problems(job(team=team))
    assert (problems == []) is accepted


def test_a_bad_images_entry_names_its_field() -> None:
    with pytest.raises(Exception, match=r"teams\.nlp\.images\.registry"):
        parse_teams({"teams": {"nlp": {"images": {"registry": ["x/"]}}}})

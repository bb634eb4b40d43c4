"""``bolt slurm-bridge --team-user TEAM=USER --team-user-pattern P``: the Slurm user each
team's ``bolt submit`` jobs run as. A bad map is refused at start (exit 2, naming the option
and the fix) rather than when a job needs it."""

from __future__ import annotations

import os
from typing import Any

import pytest
from typer.testing import CliRunner, Result

import boltforge.slurm.bridge as slurm_bridge
from boltforge.cli.main import app
from boltforge.slurm.identity import parse_team_users

Made = list[tuple[tuple[Any, ...], dict[str, Any]]]


@pytest.fixture
def bridged(monkeypatch: pytest.MonkeyPatch) -> Made:
    made: Made = []

    class Recorder:
        def __init__(self, *args: Any, **kw: Any) -> None:
            made.append((args, kw))

        async def run(self) -> None:
            return None

    monkeypatch.setattr(slurm_bridge, "SlurmBridge", Recorder)
    monkeypatch.setattr(os, "geteuid", lambda: 0)  # as the bridge runs: root
    return made


def bridge(*args: str) -> Result:
    cmd = ["slurm-bridge", "--server", "http://10.0.0.1:8600", *args]
    return CliRunner().invoke(app, cmd, env={"BOLT_TOKEN": "adm", "COLUMNS": "200"})


def test_each_team_user_and_the_pattern_reach_the_bridge(bridged: Made) -> None:
    result = bridge("--team-user", "nlp=nobody", "--team-user-pattern", "bolt-{team}")
    assert result.exit_code == 0, result.output
    [(_, kw)] = bridged
    users = kw["team_users"]
    assert (dict(users.users), users.pattern) == ({"nlp": "nobody"}, "bolt-{team}")
    assert users.run_as("nlp").user == "nobody"


def test_without_a_map_the_bridge_starts_and_maps_no_team(bridged: Made) -> None:
    assert bridge().exit_code == 0
    [(_, kw)] = bridged
    assert dict(kw["team_users"].users) == {} and kw["team_users"].pattern is None


@pytest.mark.parametrize(
    ("args", "says"),
    [
        pytest.param(("--team-user", "nlp=root"), "who is root", id="root"),
        pytest.param(("--team-user", "nlp"), "is not TEAM=USER", id="no user"),
        pytest.param(("--team-user", "nlp=no-such-user-here"), "does not exist", id="missing"),
        pytest.param(
            ("--team-user", "a=nobody", "--team-user", "b=nobody"), "team b's too", id="shared"
        ),
        pytest.param(("--team-user-pattern", "svc"), "has no {team}", id="one user for all"),
    ],
)
def test_a_bad_map_is_refused_at_start_naming_the_option(
    bridged: Made, args: tuple[str, ...], says: str
) -> None:
    result = bridge(*args)
    assert result.exit_code == 2, result.output
    assert says in result.output and "error --team-user" in result.output
    assert bridged == []


def test_team_user_pairs_are_trimmed_and_a_team_given_twice_is_refused() -> None:
    assert parse_team_users([" nlp = svc1 ", "cv=cv_svc"]) == {"nlp": "svc1", "cv": "cv_svc"}
    with pytest.raises(ValueError, match="team nlp is mapped twice"):
        parse_team_users(["nlp=svc1", "nlp=svc2"])

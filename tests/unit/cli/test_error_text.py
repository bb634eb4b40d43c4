"""What the user typed comes back in an error exactly as typed: square brackets in names,
paths and option values are text, never rich markup, and a refused ``--state`` names the
states there are. The commands run against the real server app in-process (cli_app_kit)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_app_kit import clean_exit, serve_cli
from control_kit import Fleet
from typer.testing import CliRunner, Result

from boltforge.cli.main import app
from boltforge.control.nodes.agents import LeaseTerms

runner = CliRunner()
DAY = 86400.0


@pytest.fixture(scope="module")
def quiet_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    fleet = Fleet(tmp_path_factory.mktemp("words"), hosts=2, terms=LeaseTerms(2.0, DAY, DAY))
    fleet.clock.now = time.time()
    with fleet:
        yield fleet


@pytest.fixture
def served(quiet_fleet: Fleet, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Fleet:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.delenv("BOLT_SERVER", raising=False)
    monkeypatch.delenv("BOLT_CA", raising=False)
    monkeypatch.setenv("BOLT_TOKEN", "adm")
    monkeypatch.setenv("COLUMNS", "200")
    serve_cli(quiet_fleet, monkeypatch)
    return quiet_fleet


def bolt(*args: str | Path) -> Result:
    return runner.invoke(app, [str(a) for a in args])


def refused(result: Result) -> str:
    """The error text of a command that exited 2 on its own, on one line."""
    clean_exit(result, 2)
    return " ".join(result.output.split())


def test_a_token_name_in_brackets_is_echoed_as_typed(served: Fleet) -> None:
    text = refused(bolt("token", "create", "[bold]x", "--role", "viewer"))
    assert "'[bold]x'" in text
    assert "To fix: letters, digits and _.@-" in text


def test_the_pattern_a_team_must_match_is_shown_whole(served: Fleet) -> None:
    text = refused(bolt("token", "create", "al", "--team", "NLP"))
    assert "[a-z0-9]" in text  # the pattern's character classes survive
    assert "team" in text and "`nlp`" in text  # the example fits the field


def test_a_spec_path_with_brackets_is_named_whole(served: Fleet, tmp_path: Path) -> None:
    missing = tmp_path / "[draft]" / "job.yaml"
    result = bolt("submit", missing)
    assert result.exit_code != 0
    assert "Traceback" not in result.output
    assert "[draft]" in " ".join(result.output.split())


def test_a_reclaim_delay_in_brackets_is_echoed_as_typed(served: Fleet) -> None:
    text = refused(bolt("nodes", "reclaim", "host-0", "--in", "[red]soon"))
    assert "[red]soon" in text


@pytest.mark.parametrize("state", ["runing", "pending,runing"])
def test_an_unknown_queue_state_is_refused_with_the_known_ones(served: Fleet, state: str) -> None:
    result = bolt("queue", "--state", state)
    assert result.exit_code != 0, result.output
    assert "Traceback" not in result.output
    text = " ".join(result.output.split())
    assert "'runing'" in text
    assert "pending" in text and "succeeded" in text
    assert "no jobs" not in text


def test_a_bad_trace_says_error_once_without_markup(tmp_path: Path) -> None:
    trace = tmp_path / "[odd].csv"
    trace.write_text("this is not a trace\n")
    fleet = Path(__file__).parents[3] / "examples" / "fleets" / "eval" / "itp-02.yaml"
    result = bolt("simulate", "--fleet", fleet, "--trace", trace)
    text = refused(result)
    assert text.startswith("error ")
    assert "[/]" not in text and "[bold red]" not in text

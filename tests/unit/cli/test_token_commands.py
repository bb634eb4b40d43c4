"""``bolt token create --node --expires``, ``bolt token list`` and ``bolt token revoke`` run
as a user types them against the real server app in-process (see cli_app_kit): what each
prints, its ``--json``, a table that fits a terminal and never shows a secret, and bad input
exiting 2 with the option and the fix before anything is sent."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cli_app_kit import clean_exit, fits, serve_cli
from control_kit import Fleet
from typer.testing import CliRunner, Result

import boltforge.cli.remote as remote
from boltforge.cli.main import app
from boltforge.control.nodes.agents import LeaseTerms

runner = CliRunner()
DAY = 86400.0


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The admin token in BOLT_TOKEN, no other BOLT_* variable or saved config, 80 columns."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.delenv("BOLT_SERVER", raising=False)
    monkeypatch.delenv("BOLT_CA", raising=False)
    monkeypatch.setenv("BOLT_TOKEN", "adm")
    monkeypatch.setenv("COLUMNS", "80")


@pytest.fixture
def fleet(env: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Fleet]:
    f = Fleet(tmp_path / "fleet", hosts=2, terms=LeaseTerms(2.0, DAY, DAY))
    f.clock.now = time.time()
    with f:
        serve_cli(f, monkeypatch)
        yield f


@pytest.fixture
def serverless(env: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """No server at all: a command that tries to connect fails the test."""

    def client(*_: object, **__: object) -> None:
        raise AssertionError("the command must refuse the input before connecting")

    monkeypatch.setattr(remote, "Client", client)


def bolt(*args: str) -> Result:
    return runner.invoke(app, list(args))


def as_json(result: Result) -> Any:
    clean_exit(result, 0)
    return json.loads(result.stdout)


def test_an_agent_token_bound_to_nodes_says_so_and_lasts_as_asked(fleet: Fleet) -> None:
    result = bolt(
        "token", "create", "h3", "--role", "agent", "--node", "host-3", "--expires", "30d"
    )
    clean_exit(result, 0)
    head, secret = result.stdout.splitlines()
    assert head == "agent token for h3 for node host-3 expires in 30 d (shown once):"
    assert secret.startswith("bf_")
    data = as_json(
        bolt("token", "create", "rack", "--role", "agent", "--nodes", "gpu-*,cpu-1", "--json")
    )
    assert data["nodes"] == ["gpu-*", "cpu-1"] and data["expires_at"] is None


def test_an_unbound_agent_token_is_said_to_claim_nodes(fleet: Fleet) -> None:
    result = bolt("token", "create", "a1", "--role", "agent")
    clean_exit(result, 0)
    assert "claims each node it is the first to act for" in result.stdout


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--role", "viewer", "--node", "host-1"], "error --node binds agent tokens only"),
        (["--role", "agent", "--expires", "soon"], "error --expires 'soon': must be a duration"),
        (["--role", "agent", "--expires", "0"], "error --expires '0': must be more than 0"),
        (["--role", "agent", "--node", "host 1"], "error node: "),
        (["--role", "agent", "--expires", "9999d"], "error expires: "),
    ],
    ids=["node-for-viewer", "bad-duration", "zero", "bad-pattern", "too-long"],
)
def test_bad_bindings_and_expiries_exit_2_before_sending(
    serverless: None, args: list[str], said: str
) -> None:
    result = bolt("token", "create", "x", *args)
    clean_exit(result, 2)
    assert result.stderr.startswith(said) and "To fix" in result.stderr


def test_the_token_list_fits_80_columns_and_shows_no_secret(fleet: Fleet) -> None:
    long = "a-rather-long-token-name-for-the-nightly-ci"
    made = as_json(bolt("token", "create", long, "--role", "viewer", "--json"))
    result = bolt("token", "list")
    clean_exit(result, 0)
    assert fits(result.stdout, 80), result.stdout
    assert made["token"] not in result.stdout and "adm" not in result.stdout.split()
    assert result.stdout.splitlines()[0].split() == [
        *("ID", "NAME", "ROLE", "TEAM", "NODES", "AGE", "EXPIRES", "USED", "STATE")
    ]


def test_the_token_list_shows_bindings_expiry_and_state(
    fleet: Fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "120")
    bolt("token", "create", "bridge", "--role", "agent", "--node", "*", "--expires", "2h")
    bolt("token", "create", "gone", "--role", "viewer")
    bolt("token", "revoke", "gone")
    result = bolt("token", "list")
    clean_exit(result, 0)
    row = {line.split()[1]: line for line in result.stdout.splitlines()[1:]}
    assert "claims: host-0,host-1" in row["agents"]
    assert "every node" in row["bridge"] and "2.0 h" in row["bridge"]
    assert "never" in row["admin"] and row["admin"].rstrip().endswith("active")
    assert row["gone"].rstrip().endswith("revoked")


def test_the_token_list_json_has_every_field_but_the_secret(fleet: Fleet) -> None:
    data = as_json(bolt("token", "list", "--json"))
    first = data["tokens"][0]
    assert set(first) == {
        "id",
        "name",
        "role",
        "team",
        "nodes",
        "claimed",
        "created_at",
        "expires_at",
        "last_used_at",
        "revoked_at",
        "state",
    }


def test_revoke_by_name_says_so_and_the_token_stops_working(fleet: Fleet) -> None:
    made = as_json(bolt("token", "create", "eve", "--role", "viewer", "--json"))
    result = bolt("token", "revoke", "eve")
    clean_exit(result, 0)
    assert result.stdout == (
        f"token {made['id']} (viewer eve) revoked; it stops working within seconds\n"
    )
    refused = bolt("queue", "--token", made["token"])
    clean_exit(refused, 1)
    assert "revoked API token" in refused.stderr
    data = as_json(bolt("token", "revoke", str(made["id"]), "--json"))
    assert data["state"] == "revoked"


def test_revoke_by_a_member_is_refused(fleet: Fleet) -> None:
    member = as_json(bolt("token", "create", "mia", "--team", "nlp", "--json"))["token"]
    result = bolt("token", "revoke", "admin", "--token", member)
    clean_exit(result, 1)
    assert "error (403)" in result.stderr

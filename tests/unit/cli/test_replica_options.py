"""How ``bolt server`` refuses replica options that cannot work, before it opens anything."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from boltforge.cli.main import app

runner = CliRunner()


@pytest.mark.parametrize("advertise", [[], ["--advertise", "s1:8080"]])
def test_a_replica_needs_an_http_address_to_advertise(tmp_path: Path, advertise: list[str]) -> None:
    db = f"sqlite:///{tmp_path / 'store.db'}"
    result = runner.invoke(app, ["server", "--db", db, "--replica", "s1", *advertise])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert "--advertise" in result.output and "To fix: add --advertise http://" in result.output
    assert not (tmp_path / "store.db").exists()  # refused before the store was opened


def test_a_lease_under_a_second_is_refused(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'store.db'}"
    args = ["server", "--db", db, "--replica", "s1", "--advertise", "http://s1:1"]
    result = runner.invoke(app, [*args, "--leader-lease", "0.5"])
    assert result.exit_code == 2
    assert "--leader-lease" in result.output

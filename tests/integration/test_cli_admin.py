"""``bolt admin backup`` and ``bolt admin restore`` as operators type them: what they print,
``--json``, the default store, exit codes, and one clear line for each thing that can go
wrong. The store is made by the real server app in-process (see control_kit)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from control_kit import Fleet, make_spec
from typer.testing import CliRunner, Result

from boltforge.cli.main import app

runner = CliRunner()


def bolt(*args: str | Path) -> Result:
    return runner.invoke(app, [str(a) for a in args])


def as_json(result: Result) -> dict[str, Any]:
    assert result.exit_code == 0, result.output
    data: dict[str, Any] = json.loads(result.stdout)
    return data


def refused(result: Result, *says: str) -> None:
    """The command exited 1 with one line on stderr that names the problem and the fix."""
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output and result.stdout == ""
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("error ") and "To fix:" in line
    for text in says:
        assert text in line


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A store a server wrote to: a job that ran and one that waits."""
    home = tmp_path_factory.mktemp("store")
    with Fleet(home, hosts=1) as fleet:
        fleet.submit(make_spec("train", 8))
        fleet.start_everything()
        fleet.submit(make_spec("waits", 8))
    return fleet.config.db_url


def test_backup_prints_each_table_and_what_it_wrote(store: str, tmp_path: Path) -> None:
    path = tmp_path / "store.bak.gz"
    result = bolt("admin", "backup", path, "--db", store)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["TABLE", "ROWS"]
    assert any(line.split() == ["jobs", "2"] for line in lines)
    assert lines[-1].startswith("backed up ") and f"to {path} (" in lines[-1]
    assert path.is_file()


def test_backup_and_restore_answer_in_json(store: str, tmp_path: Path) -> None:
    path = tmp_path / "store.bak.gz"
    wrote = as_json(bolt("admin", "backup", path, "--db", store, "--json"))
    assert wrote["file"] == str(path) and wrote["bytes"] == path.stat().st_size
    assert wrote["rows"] == sum(wrote["tables"].values()) and wrote["tables"]["jobs"] == 2

    target = f"sqlite:///{tmp_path / 'restored.db'}"
    loaded = as_json(bolt("admin", "restore", path, "--db", target, "--json"))
    assert loaded["tables"] == wrote["tables"] and loaded["replaced"] == 0
    assert loaded["revision"] == loaded["schema"] == wrote["revision"]
    assert loaded["created_at"] == wrote["created_at"]


def test_restore_refuses_a_store_that_holds_data_unless_forced(store: str, tmp_path: Path) -> None:
    path = tmp_path / "store.bak.gz"
    target = f"sqlite:///{tmp_path / 'restored.db'}"
    assert bolt("admin", "backup", path, "--db", store).exit_code == 0
    assert bolt("admin", "restore", path, "--db", target).exit_code == 0
    refused(bolt("admin", "restore", path, "--db", target), "already holds data", "--force")

    forced = bolt("admin", "restore", path, "--db", target, "--force")
    assert forced.exit_code == 0, forced.output
    assert "replacing the" in forced.stdout and f"bolt server --db {target}" in forced.stdout


def test_both_use_the_store_the_server_uses_by_default(
    store: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    path = tmp_path / "store.bak.gz"
    refused(bolt("admin", "backup", path), "no store at", "boltforge.db")
    assert not path.exists()

    assert bolt("admin", "backup", path, "--db", store).exit_code == 0
    assert as_json(bolt("admin", "restore", path, "--json"))["tables"]["jobs"] == 2
    assert (tmp_path / "data" / "boltforge" / "boltforge.db").is_file()
    again = as_json(bolt("admin", "backup", tmp_path / "again.bak.gz", "--json"))
    assert again["db"].endswith("/data/boltforge/boltforge.db")


def test_each_problem_is_one_line_with_its_fix(store: str, tmp_path: Path) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_text("not a backup\n")
    target = f"sqlite:///{tmp_path / 'target.db'}"
    refused(bolt("admin", "restore", notes, "--db", target), "is not a Boltforge backup")
    refused(bolt("admin", "restore", tmp_path / "gone.gz", "--db", target), "no file at")
    unreachable = "postgresql+psycopg://bolt:secret@127.0.0.1:1/store"
    result = bolt("admin", "backup", tmp_path / "b.gz", "--db", unreachable)
    refused(result, "cannot reach the store at postgresql+psycopg://bolt:***@127.0.0.1:1/store")
    refused(bolt("admin", "backup", tmp_path / "no" / "b.gz", "--db", store), "cannot write")
    assert not (tmp_path / "target.db").exists()


def test_the_installed_command_exits_1_with_no_traceback(tmp_path: Path) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_text("not a backup\n")
    target = f"sqlite:///{tmp_path / 'target.db'}"
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "boltforge.cli.main",
            "admin",
            "restore",
            str(notes),
            "--db",
            target,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 1 and run.stdout == ""
    assert run.stderr.startswith(f"error {notes} is not a Boltforge backup")
    assert "Traceback" not in run.stderr

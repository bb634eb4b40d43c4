"""Rolling upgrades need migrations an older server survives (docs/operations.md): every
step from one revision to the next only expands the schema (no table or column goes away
or changes type, and a new column is nullable or has a server default, so the older
server's inserts still work), unless the migration says ``contract = True``, which may
only remove what no release since the one before it uses. Checked by running each step
on a real SQLite store and reading the schema back."""

from __future__ import annotations

import importlib.util
import itertools
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory
from sqlalchemy import inspect

from boltforge.control.store.db import MIGRATIONS, Database

Schema = dict[str, dict[str, dict[str, Any]]]  # table -> column -> what an insert cares about


def config() -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    return cfg


def steps() -> list[tuple[str, str]]:
    """Every (revision, next revision), oldest first."""
    script = ScriptDirectory.from_config(config())
    revisions = [r.revision for r in reversed(list(script.walk_revisions()))]
    return list(itertools.pairwise(revisions))


def module_of(revision: str) -> ModuleType:
    script = ScriptDirectory.from_config(config())
    path = Path(script.get_revision(revision).path)
    spec = importlib.util.spec_from_file_location(f"migration_{revision}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def schema_at(url: str, revision: str) -> Schema:
    db = Database(url)
    with db.engine.begin() as connection:
        cfg = config()
        cfg.attributes["connection"] = connection
        command.upgrade(cfg, revision)
    found = inspect(db.engine)
    out = {
        table: {
            c["name"]: {
                "type": str(c["type"]),
                "required": not c["nullable"] and c.get("default") is None,
            }
            for c in found.get_columns(table)
        }
        for table in found.get_table_names()
        if table != "alembic_version"
    }
    db.close()
    return out


def contraction(before: Schema, after: Schema) -> list[str]:
    """What an older server would trip on after the step: a table or column gone or
    retyped, or a new column it would have to fill."""
    problems = []
    for table, columns in before.items():
        if table not in after:
            problems.append(f"table {table} removed")
            continue
        for name, column in columns.items():
            now = after[table].get(name)
            if now is None:
                problems.append(f"column {table}.{name} removed")
            elif now["type"] != column["type"]:
                problems.append(f"column {table}.{name} retyped {column['type']} -> {now['type']}")
        for name, column in after[table].items():
            if name not in columns and column["required"]:
                problems.append(f"column {table}.{name} added NOT NULL without a server default")
    return problems


@pytest.mark.parametrize(("old", "new"), steps(), ids=lambda r: str(r))
def test_each_migration_only_expands_unless_it_says_it_contracts(
    old: str, new: str, tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    before = schema_at(url, old)
    after = schema_at(url, new)
    if getattr(module_of(new), "contract", False):
        pytest.skip(f"{new} is a contract step (see its docstring)")
    assert contraction(before, after) == []


def test_the_check_catches_a_contraction() -> None:
    before: Schema = {"jobs": {"id": {"type": "VARCHAR", "required": True}}}
    after: Schema = {
        "jobs": {
            "id": {"type": "INTEGER", "required": True},
            "owner": {"type": "VARCHAR", "required": True},
        }
    }
    assert contraction(before, after) == [
        "column jobs.id retyped VARCHAR -> INTEGER",
        "column jobs.owner added NOT NULL without a server default",
    ]
    assert contraction(before, {}) == ["table jobs removed"]

"""The store a restore loads into: refused when it holds data (unless replacing it was
asked for), emptied, and its schema brought to the backup's revision."""

from __future__ import annotations

import functools
from typing import Any

from alembic import command
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Table, create_engine, delete, select

from boltforge.control.store.backups.engines import (
    alembic_config,
    count,
    data_tables,
    known_revisions,
    migrate,
    shown_url,
    transaction,
)
from boltforge.control.store.backups.errors import BackupError, StoreNotEmpty
from boltforge.control.store.backups.fileformat import Header


def make_room(conn: Connection, url: str, header: Header, force: bool) -> int:
    """Bring the target's schema to the backup's revision and empty it (refused unless
    ``force`` when it holds rows other than those its migrations put there); the number of
    rows deleted that were not."""
    current = MigrationContext.configure(conn).get_current_revision()
    tables = data_tables(conn)
    if current is None and tables:
        raise BackupError(
            f"{shown_url(url)} holds tables but no Boltforge store. To fix: restore into an "
            "empty database"
        )
    if current is not None and current not in known_revisions():
        raise BackupError(
            f"{shown_url(url)} is at schema revision {current}, which this bolt does not know. "
            "To fix: restore with the Boltforge version its server runs, or into an empty store"
        )
    held = _held(conn, tables, current)
    if held and not force:
        listed = ", ".join(f"{n} in {name}" for name, n in held.items())
        raise StoreNotEmpty(
            f"{shown_url(url)} already holds data ({listed}). To fix: restore into an empty "
            "store, or pass --force to replace what it holds"
        )
    _empty(conn, tables)
    _step_schema(conn, current, header.revision)
    _empty(conn, data_tables(conn))  # what the migrations just run put there
    return sum(held.values())


def _held(conn: Connection, tables: list[Table], revision: str | None) -> dict[str, int]:
    """The rows of each table that holds any but those a new store at ``revision`` has."""
    seeds = _seeds(revision) if revision is not None else {}
    held = {}
    for table in tables:
        n = count(conn, table)
        if n and (n != len(seeds.get(table.name, ())) or _rows(conn, table) != seeds[table.name]):
            held[table.name] = n
    return held


@functools.cache
def _seeds(revision: str) -> dict[str, list[dict[str, Any]]]:
    """The rows a new store has at ``revision``: those its migrations put there."""
    engine = create_engine("sqlite://")
    try:
        with transaction(engine) as conn:
            migrate(conn, revision)
            return {t.name: _rows(conn, t) for t in data_tables(conn)}
    finally:
        engine.dispose()


def _rows(conn: Connection, table: Table) -> list[dict[str, Any]]:
    query = select(table).order_by(*table.primary_key.columns)
    return [dict(row._mapping) for row in conn.execute(query)]


def _empty(conn: Connection, tables: list[Table]) -> None:
    """Delete every row of ``tables`` (children first)."""
    for table in reversed(tables):
        conn.execute(delete(table))


def _step_schema(conn: Connection, current: str | None, revision: str) -> None:
    """Upgrade (or, for an emptied store ahead of the backup, downgrade) to ``revision``."""
    script = ScriptDirectory.from_config(alembic_config(conn))
    behind = {s.revision for s in script.iterate_revisions(revision, "base")}
    if current is None or current in behind:
        migrate(conn, revision)
    else:
        command.downgrade(alembic_config(conn), revision)

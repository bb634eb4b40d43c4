"""Restoring: the whole backup file checked, then loaded into the store in one transaction
and upgraded to the newest schema, ready for a server to carry on from."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from alembic.runtime.migration import MigrationContext
from sqlalchemy import Connection, Integer, Table, cast, func, insert, select
from sqlalchemy.dialects.postgresql import REGCLASS

from boltforge.control.store.backups import batches
from boltforge.control.store.backups.engines import (
    data_tables,
    database_errors,
    migrate,
    new_sqlite_file,
    open_engine,
    remove_sqlite,
    shown_url,
    transaction,
)
from boltforge.control.store.backups.errors import RETAKE, BackupError
from boltforge.control.store.backups.fileformat import (
    Header,
    check_file,
    decoded_row,
    read_records,
)
from boltforge.control.store.backups.target import make_room


@dataclass(frozen=True, slots=True)
class RestoreSummary:
    """What a restore did: the backup at ``path`` (taken at ``revision``, ``created_at``)
    loaded into ``url`` (password hidden), ``replaced`` rows deleted first, the rows of each
    table inserted, and the schema revision the store was then upgraded to (``schema``)."""

    path: str
    url: str
    revision: str
    created_at: str
    tables: dict[str, int]
    replaced: int
    schema: str

    @property
    def rows(self) -> int:
        return sum(self.tables.values())


def restore(
    path: str | Path, url: str, force: bool = False, progress: batches.Progress | None = None
) -> RestoreSummary:
    """Load the backup at ``path`` into the store at ``url``, then upgrade it to the newest
    schema, ready for a server to carry on from.

    The whole file is checked before the store is touched. Raises ``BackupError`` when it is
    not a Boltforge backup, is truncated or damaged, is of a newer format, or holds a
    revision this software's migrations do not know. A target that holds any row (but those
    its migrations put there, such as the job counter at 0) is refused with ``StoreNotEmpty``
    unless ``force``. The rest is one transaction: delete the target's rows, bring its schema
    to the backup's revision, insert every row, reset PostgreSQL's id sequences, upgrade to
    the newest revision; a failure leaves the target as it was (a SQLite file the restore
    made is removed)."""
    source = Path(path)
    header = check_file(source)
    created = new_sqlite_file(url)
    engine = open_engine(url, must_exist=False)
    try:
        with (
            database_errors(url, "restore into", "Nothing was changed there"),
            transaction(engine) as conn,
        ):
            replaced = make_room(conn, url, header, force)
            _load(conn, source, header, progress)
            migrate(conn, "head")
            schema = MigrationContext.configure(conn).get_current_revision() or ""
    except BaseException:
        engine.dispose()
        if created is not None:
            remove_sqlite(created)
        raise
    engine.dispose()
    shown = shown_url(url)
    return RestoreSummary(
        str(source), shown, header.revision, header.created_at, header.tables, replaced, schema
    )


def _load(conn: Connection, path: Path, header: Header, progress: batches.Progress | None) -> None:
    """Insert every row of the backup, ``BATCH`` at a time, then reset id sequences."""
    tables = {t.name: t for t in data_tables(conn)}
    _check_schema(tables, header)
    for name, total in header.tables.items():
        batches.tell(progress, name, 0, total)
    done = dict.fromkeys(header.tables, 0)
    records = read_records(path)
    next(records)
    for chunk in batches.chunks(records, batches.BATCH):
        for name, rows in _by_table(chunk):
            table = tables[name]
            conn.execute(insert(table), [decoded_row(table, row) for row in rows])
            done[name] += len(rows)
            batches.tell(progress, name, done[name], header.tables[name])
    _reset_sequences(conn, list(tables.values()))


def _check_schema(tables: dict[str, Table], header: Header) -> None:
    """Every table and column of the backup exists in the target at the backup's revision."""
    for name, columns in header.columns.items():
        missing = set(columns) - set(tables[name].c.keys()) if name in tables else {name}
        if missing:
            raise BackupError(
                f"the backup's {name} does not match schema revision {header.revision} "
                f"(no {', '.join(sorted(missing))} there). {RETAKE}"
            )


def _by_table(records: list[Any]) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """Consecutive rows of one table, grouped: ``(table, rows)``."""
    start = 0
    for i in range(1, len(records) + 1):
        if i == len(records) or records[i]["t"] != records[start]["t"]:
            yield records[start]["t"], [r["r"] for r in records[start:i]]
            start = i


def _reset_sequences(conn: Connection, tables: list[Table]) -> None:
    """On PostgreSQL, point each serial id's sequence past the largest id inserted, so the
    next row the server adds gets a new id."""
    if conn.dialect.name != "postgresql":
        return  # SQLite hands out the largest rowid plus one by itself
    for table in tables:
        keys = list(table.primary_key.columns)
        if len(keys) != 1 or not isinstance(keys[0].type, Integer):
            continue
        quoted = conn.dialect.identifier_preparer.format_table(table)
        sequence = conn.scalar(select(func.pg_get_serial_sequence(quoted, keys[0].name)))
        if sequence is not None:
            largest = select(func.max(keys[0])).scalar_subquery()
            next_id = func.coalesce(largest, 0) + 1
            conn.execute(select(func.setval(cast(sequence, REGCLASS), next_id, False)))

"""Taking a backup: every row of the store read in one snapshot, written to a file that
appears under its name only once complete and on disk."""

from __future__ import annotations

import contextlib
import gzip
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from alembic.runtime.migration import MigrationContext
from sqlalchemy import Connection, Engine, Table, select

from boltforge.control.store.backups import batches
from boltforge.control.store.backups.engines import (
    connect,
    count,
    data_tables,
    database_errors,
    open_engine,
    shown_url,
)
from boltforge.control.store.backups.errors import RETAKE, BackupError
from boltforge.control.store.backups.fileformat import FORMAT, VERSION, dumps, encoded_row

PRIVATE_FILE = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
PARTIAL = ".partial"  # a backup is written under its name plus this, renamed when complete


@dataclass(frozen=True, slots=True)
class BackupSummary:
    """What a backup wrote: ``path``, the store (``url``, password hidden) at ``revision``,
    the rows of each table, and the file's size in bytes."""

    path: str
    url: str
    revision: str
    created_at: str
    tables: dict[str, int]
    bytes: int

    @property
    def rows(self) -> int:
        return sum(self.tables.values())


def backup(url: str, path: str | Path, progress: batches.Progress | None = None) -> BackupSummary:
    """Write every row of the store at ``url`` to the backup file ``path``.

    All tables are read in one read-only transaction, so the file is one consistent
    snapshot even while a server writes (PostgreSQL: REPEATABLE READ; SQLite in WAL mode:
    one read transaction). The file is written as ``path`` + ``.partial`` and renamed to
    ``path`` only once complete and on disk: a failed backup leaves no file that looks
    complete, and an older file at ``path`` stays as it was. Raises ``BackupError`` when the
    store cannot be reached or holds no Boltforge schema, or ``path`` cannot be written."""
    final = Path(path)
    partial = final.with_name(final.name + PARTIAL)
    engine = open_engine(url, must_exist=True)
    try:
        with database_errors(url, "back up", "No backup was written"), _snapshot(engine) as conn:
            tables = data_tables(conn)
            header = _header_of(conn, url, tables)
            size = _write(partial, final, _backup_lines(conn, tables, header, progress))
        _publish(partial, final)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    finally:
        engine.dispose()
    shown = shown_url(url)
    return BackupSummary(
        str(final), shown, header["revision"], header["created_at"], header["tables"], size
    )


@contextlib.contextmanager
def _snapshot(engine: Engine) -> Iterator[Connection]:
    """A connection inside one read-only transaction: every read sees the same snapshot."""
    with connect(engine) as conn:
        if engine.dialect.name == "sqlite":
            conn.exec_driver_sql("BEGIN")  # pysqlite itself begins none before a SELECT
        else:
            readonly = {"postgresql_readonly": True} if engine.dialect.name == "postgresql" else {}
            conn.execution_options(isolation_level="REPEATABLE READ", **readonly)
        try:
            yield conn
        finally:
            conn.rollback()


def _header_of(conn: Connection, url: str, tables: list[Table]) -> dict[str, Any]:
    """The backup's header line, read inside the snapshot: the revision and row counts."""
    revision = MigrationContext.configure(conn).get_current_revision()
    if revision is None:
        raise BackupError(
            f"{shown_url(url)} holds no Boltforge store (no schema revision). To fix: pass "
            "--db the URL of the store `bolt server` uses"
        )
    return {
        "format": FORMAT,
        "version": VERSION,
        "revision": revision,
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "engine": conn.dialect.name,
        "tables": {t.name: count(conn, t) for t in tables},
        "columns": {t.name: [c.name for c in t.columns] for t in tables},
    }


def _backup_lines(
    conn: Connection, tables: list[Table], header: dict[str, Any], progress: batches.Progress | None
) -> Iterator[str]:
    """The header line, then one line per row of each of ``tables``, in their order."""
    yield dumps(header)
    for table in tables:
        total = header["tables"][table.name]
        done = 0
        batches.tell(progress, table.name, done, total)
        query = select(table).order_by(*table.primary_key.columns)
        result = conn.execute(query.execution_options(yield_per=batches.BATCH))
        for rows in result.partitions():
            for row in rows:
                yield dumps({"t": table.name, "r": encoded_row(table, row._mapping)})
            done += len(rows)
            batches.tell(progress, table.name, done, total)
        if done != total:  # cannot happen inside a snapshot
            raise BackupError(f"{table.name} changed while it was read. {RETAKE}")


def _write(partial: Path, final: Path, lines: Iterable[str]) -> int:
    """Write ``lines`` gzip-compressed to ``partial`` (on its way to be ``final``) and to
    disk, readable by the server's user alone (mode 0600); its size in bytes."""
    try:
        with os.fdopen(os.open(partial, PRIVATE_FILE, 0o600), "wb") as raw:
            os.fchmod(raw.fileno(), 0o600)  # only the server's user reads a backup
            with gzip.GzipFile(filename="", mode="wb", fileobj=raw) as out:
                for chunk in batches.chunks(lines, batches.BATCH):
                    out.write("".join(line + "\n" for line in chunk).encode())
            raw.flush()
            os.fsync(raw.fileno())
        return partial.stat().st_size
    except OSError as e:
        raise BackupError(
            f"cannot write {final}: {e.strerror or e}. To fix: pass a path in a folder "
            "that exists, that you may write to, with room for the backup"
        ) from None


def _publish(partial: Path, final: Path) -> None:
    """Rename the complete ``partial`` to ``final`` (atomically) and make the rename last."""
    try:
        os.replace(partial, final)
    except OSError as e:
        raise BackupError(
            f"cannot write {final}: {e.strerror or e}. To fix: pass a file path, not a folder"
        ) from None
    with contextlib.suppress(OSError):  # not every file system lets a folder be synced
        folder = os.open(final.parent, os.O_RDONLY)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)

"""Backups of the store: every row, read in one snapshot while a server keeps writing, into
one portable file; and restores of such a file into a store a new server carries on from.
Either side may be SQLite or PostgreSQL (a SQLite backup restores into PostgreSQL and back).

The file is gzip-compressed JSON Lines (format version 1). The first line is the header::

    {"format": "boltforge-backup", "version": 1, "revision": "0006", "created_at": ISO-8601,
     "engine": "sqlite", "tables": {name: rows}, "columns": {name: [column, ...]}}

``revision`` is the store's Alembic revision (the ``alembic_version`` table is not copied as
rows, nor is ``leader``, the lease of the servers on the store). Then one line per row,
table by table in dependency order (parents first)::

    {"t": "jobs", "r": {"id": "...", "spec": {...}, "submitted_at": 1800000000.25, ...}}

Values are JSON as they are. In a column that is not a JSON column, a value JSON cannot
carry exactly is an object with one marker key: ``{"$float": "nan"}`` (NaN and infinities),
``{"$bytes": BASE64}``, ``{"$datetime": ISO}``, ``{"$date": ISO}``, ``{"$decimal": TEXT}``.
JSON columns hold any JSON, so their values are never read as markers.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import gzip
import json
import math
import os
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime
from decimal import Decimal
from itertools import islice
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import (
    JSON,
    Column,
    Connection,
    Engine,
    Integer,
    MetaData,
    Table,
    cast,
    create_engine,
    delete,
    func,
    insert,
    select,
)
from sqlalchemy.dialects.postgresql import REGCLASS
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, NoSuchModuleError, SQLAlchemyError

from boltforge.control.store.db import MIGRATIONS, make_engine
from boltforge.control.store.models import Base

FORMAT = "boltforge-backup"
VERSION = 1
PARTIAL = ".partial"  # a backup is written under its name plus this, renamed when complete
VERSION_TABLE = "alembic_version"
NOT_DATA = (VERSION_TABLE, "leader")  # the schema's revision; the servers' lease
BATCH = 1000  # rows read, written and inserted at a time
FROM_BACKUP = "To fix: pass the file `bolt admin backup` wrote"
RETAKE = "To fix: take the backup again, or restore another copy of it"

Progress = Callable[[str, int, int], None]
"""Told ``(table, rows_done, rows_total)`` as a backup or restore goes through a table."""


class BackupError(Exception):
    """A backup or restore that cannot be done; the message names the problem and its fix."""


class StoreNotEmpty(BackupError):
    """The restore's target already holds rows, and replacing them was not asked for."""


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


@dataclass(frozen=True, slots=True)
class Header:
    """A backup file's first line, checked."""

    revision: str
    created_at: str
    tables: dict[str, int]
    columns: dict[str, list[str]]


# -- backup ------------------------------------------------------------------------------------


def backup(url: str, path: str | Path, progress: Progress | None = None) -> BackupSummary:
    """Write every row of the store at ``url`` to the backup file ``path``.

    All tables are read in one read-only transaction, so the file is one consistent
    snapshot even while a server writes (PostgreSQL: REPEATABLE READ; SQLite in WAL mode:
    one read transaction). The file is written as ``path`` + ``.partial`` and renamed to
    ``path`` only once complete and on disk: a failed backup leaves no file that looks
    complete, and an older file at ``path`` stays as it was. Raises ``BackupError`` when the
    store cannot be reached or holds no Boltforge schema, or ``path`` cannot be written."""
    final = Path(path)
    partial = final.with_name(final.name + PARTIAL)
    engine = _open(url, must_exist=True)
    try:
        with _database_errors(url, "back up", "No backup was written"), _snapshot(engine) as conn:
            tables = _tables(conn)
            header = _header_of(conn, url, tables)
            size = _write(partial, final, _backup_lines(conn, tables, header, progress))
        _publish(partial, final)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    finally:
        engine.dispose()
    shown = _shown(url)
    return BackupSummary(
        str(final), shown, header["revision"], header["created_at"], header["tables"], size
    )


@contextlib.contextmanager
def _snapshot(engine: Engine) -> Iterator[Connection]:
    """A connection inside one read-only transaction: every read sees the same snapshot."""
    with _connect(engine) as conn:
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
            f"{_shown(url)} holds no Boltforge store (no schema revision). To fix: pass "
            "--db the URL of the store `bolt server` uses"
        )
    return {
        "format": FORMAT,
        "version": VERSION,
        "revision": revision,
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "engine": conn.dialect.name,
        "tables": {t.name: _count(conn, t) for t in tables},
        "columns": {t.name: [c.name for c in t.columns] for t in tables},
    }


def _backup_lines(
    conn: Connection, tables: list[Table], header: dict[str, Any], progress: Progress | None
) -> Iterator[str]:
    """The header line, then one line per row of each of ``tables``, in their order."""
    yield _dumps(header)
    for table in tables:
        total = header["tables"][table.name]
        done = 0
        _tell(progress, table.name, done, total)
        query = select(table).order_by(*table.primary_key.columns)
        result = conn.execute(query.execution_options(yield_per=BATCH))
        for rows in result.partitions():
            for row in rows:
                yield _dumps({"t": table.name, "r": _encoded_row(table, row._mapping)})
            done += len(rows)
            _tell(progress, table.name, done, total)
        if done != total:  # cannot happen inside a snapshot
            raise BackupError(f"{table.name} changed while it was read. {RETAKE}")


def _write(partial: Path, final: Path, lines: Iterable[str]) -> int:
    """Write ``lines`` gzip-compressed to ``partial`` (on its way to be ``final``) and to
    disk; its size in bytes."""
    try:
        with open(partial, "wb") as raw:
            with gzip.GzipFile(filename="", mode="wb", fileobj=raw) as out:
                for chunk in _chunks(lines, BATCH):
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


# -- restore -----------------------------------------------------------------------------------


def restore(
    path: str | Path, url: str, force: bool = False, progress: Progress | None = None
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
    created = _new_sqlite_file(url)
    engine = _open(url, must_exist=False)
    try:
        with (
            _database_errors(url, "restore into", "Nothing was changed there"),
            _transaction(engine) as conn,
        ):
            replaced = _make_room(conn, url, header, force)
            _load(conn, source, header, progress)
            _migrate(conn, "head")
            schema = MigrationContext.configure(conn).get_current_revision() or ""
    except BaseException:
        engine.dispose()
        if created is not None:
            _remove_sqlite(created)
        raise
    engine.dispose()
    shown = _shown(url)
    return RestoreSummary(
        str(source), shown, header.revision, header.created_at, header.tables, replaced, schema
    )


def check_file(path: Path) -> Header:
    """The header of the backup at ``path`` once the whole file is read and found complete
    (every line a row of a table the header lists, as many rows as it promises); raises
    ``BackupError`` naming what is wrong otherwise."""
    records = _records(path)
    header = _header(path, next(records, None))
    seen = dict.fromkeys(header.tables, 0)
    for record in records:
        table, _row = _row_of(path, header, record)
        seen[table] += 1
    if seen != header.tables:
        found, listed = sum(seen.values()), sum(header.tables.values())
        raise BackupError(
            f"{path} is truncated or damaged: it holds {found} rows where its header lists "
            f"{listed}. {RETAKE}"
        )
    return header


def _records(path: Path) -> Iterator[Any]:
    """Each line of the gzip file at ``path``, parsed as JSON."""
    number = 0
    try:
        with gzip.open(path, "rb") as lines:
            for number, line in enumerate(lines, 1):
                yield _parsed(path, line, number)
    except FileNotFoundError:
        raise BackupError(f"no file at {path}. {FROM_BACKUP}") from None
    except (EOFError, zlib.error, gzip.BadGzipFile) as e:
        if number == 0 and isinstance(e, gzip.BadGzipFile):
            raise BackupError(
                f"{path} is not a Boltforge backup (not gzip). {FROM_BACKUP}"
            ) from None
        raise BackupError(f"{path} is truncated or damaged ({e}). {RETAKE}") from None
    except OSError as e:
        raise BackupError(f"cannot read {path}: {e.strerror or e}. {FROM_BACKUP}") from None


def _parsed(path: Path, line: bytes, number: int) -> Any:
    try:
        return json.loads(line)
    except ValueError:
        if number == 1:
            raise BackupError(f"{path} is not a Boltforge backup. {FROM_BACKUP}") from None
        raise BackupError(f"{path} is damaged: line {number} is not JSON. {RETAKE}") from None


def _header(path: Path, first: Any) -> Header:
    """``first`` (the file's first line) checked as a backup header this software reads."""
    if not isinstance(first, dict) or first.get("format") != FORMAT:
        raise BackupError(f"{path} is not a Boltforge backup. {FROM_BACKUP}")
    version = first.get("version")
    if isinstance(version, int) and version > VERSION:
        raise BackupError(
            f"{path} is a backup of format version {version}, newer than this bolt reads "
            f"({VERSION}). To fix: restore it with the Boltforge version that wrote it, or newer"
        )
    tables: Any = first.get("tables")
    columns: Any = first.get("columns")
    revision, created = first.get("revision"), first.get("created_at")
    if (
        version != VERSION
        or not isinstance(revision, str)
        or not _counts(tables)
        or not _column_lists(columns, tables)
    ):
        raise BackupError(f"{path} is damaged: its header is not valid. {RETAKE}")
    if revision not in _known_revisions():
        raise BackupError(
            f"{path} is a store at schema revision {revision}, which this bolt's migrations do "
            "not know. To fix: restore it with the Boltforge version of the server it was "
            "taken from, or newer"
        )
    return Header(revision, str(created), tables, columns)


def _counts(tables: Any) -> bool:
    return isinstance(tables, dict) and all(
        isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in tables.values()
    )


def _column_lists(columns: Any, tables: dict[str, int]) -> bool:
    return (
        isinstance(columns, dict)
        and set(columns) == set(tables)
        and all(
            isinstance(c, list) and all(isinstance(n, str) for n in c) for c in columns.values()
        )
    )


def _row_of(path: Path, header: Header, record: Any) -> tuple[str, dict[str, Any]]:
    """A row line's table and row, checked against the header's tables and columns."""
    table = record.get("t") if isinstance(record, dict) else None
    row = record.get("r") if isinstance(record, dict) else None
    if table not in header.tables or not isinstance(row, dict):
        raise BackupError(f"{path} is damaged: a line is not a row of a table it lists. {RETAKE}")
    if sorted(row) != sorted(header.columns[table]):
        raise BackupError(f"{path} is damaged: a row of {table} has other columns. {RETAKE}")
    return table, row


@contextlib.contextmanager
def _transaction(engine: Engine) -> Iterator[Connection]:
    """A connection in one transaction, committed when the block ends normally, schema
    changes included (on SQLite too: pysqlite itself would leave those outside it)."""
    with _connect(engine) as conn:
        if engine.dialect.name == "sqlite":
            conn.exec_driver_sql("BEGIN")
        try:
            yield conn
        except BaseException:
            conn.rollback()
            raise
        conn.commit()


def _make_room(conn: Connection, url: str, header: Header, force: bool) -> int:
    """Bring the target's schema to the backup's revision and empty it (refused unless
    ``force`` when it holds rows other than those its migrations put there); the number of
    rows deleted that were not."""
    current = MigrationContext.configure(conn).get_current_revision()
    tables = _tables(conn)
    if current is None and tables:
        raise BackupError(
            f"{_shown(url)} holds tables but no Boltforge store. To fix: restore into an "
            "empty database"
        )
    if current is not None and current not in _known_revisions():
        raise BackupError(
            f"{_shown(url)} is at schema revision {current}, which this bolt does not know. "
            "To fix: restore with the Boltforge version its server runs, or into an empty store"
        )
    held = _held(conn, tables, current)
    if held and not force:
        listed = ", ".join(f"{n} in {name}" for name, n in held.items())
        raise StoreNotEmpty(
            f"{_shown(url)} already holds data ({listed}). To fix: restore into an empty "
            "store, or pass --force to replace what it holds"
        )
    _empty(conn, tables)
    _step_schema(conn, current, header.revision)
    _empty(conn, _tables(conn))  # what the migrations just run put there
    return sum(held.values())


def _held(conn: Connection, tables: list[Table], revision: str | None) -> dict[str, int]:
    """The rows of each table that holds any but those a new store at ``revision`` has."""
    seeds = _seeds(revision) if revision is not None else {}
    held = {}
    for table in tables:
        n = _count(conn, table)
        if n and (n != len(seeds.get(table.name, ())) or _rows(conn, table) != seeds[table.name]):
            held[table.name] = n
    return held


@functools.cache
def _seeds(revision: str) -> dict[str, list[dict[str, Any]]]:
    """The rows a new store has at ``revision``: those its migrations put there."""
    engine = create_engine("sqlite://")
    try:
        with _transaction(engine) as conn:
            _migrate(conn, revision)
            return {t.name: _rows(conn, t) for t in _tables(conn)}
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
    script = ScriptDirectory.from_config(_config(conn))
    behind = {s.revision for s in script.iterate_revisions(revision, "base")}
    if current is None or current in behind:
        _migrate(conn, revision)
    else:
        command.downgrade(_config(conn), revision)


def _load(conn: Connection, path: Path, header: Header, progress: Progress | None) -> None:
    """Insert every row of the backup, ``BATCH`` at a time, then reset id sequences."""
    tables = {t.name: t for t in _tables(conn)}
    _check_schema(tables, header)
    for name, total in header.tables.items():
        _tell(progress, name, 0, total)
    done = dict.fromkeys(header.tables, 0)
    records = _records(path)
    next(records)
    for chunk in _chunks(records, BATCH):
        for name, rows in _by_table(chunk):
            table = tables[name]
            conn.execute(insert(table), [_decoded_row(table, row) for row in rows])
            done[name] += len(rows)
            _tell(progress, name, done[name], header.tables[name])
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


# -- the store's tables and values -------------------------------------------------------------


def _tables(conn: Connection) -> list[Table]:
    """The store's tables but ``alembic_version`` and ``leader`` (the lease of the servers
    running on it, not data), parents before children, each with the
    columns the store has, typed as models.py types them (as found, for a column it does not
    know); no defaults, so only the values given are written."""
    found = MetaData()
    found.reflect(conn)
    typed = MetaData()
    return [_typed(t, typed) for t in found.sorted_tables if t.name not in NOT_DATA]


def _typed(found: Table, into: MetaData) -> Table:
    model = Base.metadata.tables.get(found.name)
    columns = [
        Column(
            c.name,
            model.c[c.name].type if model is not None and c.name in model.c else c.type,
            primary_key=c.primary_key,
            autoincrement=False,
        )
        for c in found.columns
    ]
    return Table(found.name, into, *columns)


def _count(conn: Connection, table: Table) -> int:
    return int(conn.scalar(select(func.count()).select_from(table)) or 0)


def _encoded_row(table: Table, row: Any) -> dict[str, Any]:
    return {c.name: _encode(row[c.name], isinstance(c.type, JSON)) for c in table.columns}


def _decoded_row(table: Table, row: dict[str, Any]) -> dict[str, Any]:
    return {
        name: _decode(value, isinstance(table.c[name].type, JSON)) for name, value in row.items()
    }


def _encode(value: Any, is_json: bool) -> Any:
    """``value`` as JSON that ``_decode`` turns back into exactly it."""
    if is_json or value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else {"$float": repr(value)}
    if isinstance(value, bytes | bytearray | memoryview):
        return {"$bytes": base64.b64encode(bytes(value)).decode()}
    if isinstance(value, datetime):
        return {"$datetime": value.isoformat()}
    if isinstance(value, date):
        return {"$date": value.isoformat()}
    if isinstance(value, Decimal):
        return {"$decimal": str(value)}
    raise BackupError(
        f"cannot back up a value of type {type(value).__name__}. To fix: report this to "
        "Boltforge's maintainers with the column it came from"
    )


DECODERS: dict[str, Callable[[str], Any]] = {
    "$float": float,
    "$bytes": base64.b64decode,
    "$datetime": datetime.fromisoformat,
    "$date": date.fromisoformat,
    "$decimal": Decimal,
}


def _decode(value: Any, is_json: bool) -> Any:
    if is_json or not isinstance(value, dict):
        return value
    [(marker, text)] = value.items()
    return DECODERS[marker](text)


# -- plumbing ----------------------------------------------------------------------------------


def _open(url: str, must_exist: bool) -> Engine:
    """An engine for ``url`` (as the server makes it). With ``must_exist``, a SQLite file
    that is not there is refused rather than made."""
    parsed = _parsed_url(url)
    database = parsed.database or ""
    sqlite_file = parsed.get_backend_name() == "sqlite" and database != ":memory:"
    if must_exist and sqlite_file and not Path(database).is_file():
        raise BackupError(
            f"no store at {database or url}. To fix: pass --db the URL of the store "
            "`bolt server` uses (sqlite:///PATH or postgresql+psycopg://USER@HOST/DB)"
        )
    try:
        return make_engine(url)
    except (ArgumentError, NoSuchModuleError, ImportError) as e:
        raise BackupError(f"cannot open {_shown(url)}: {e}. To fix: check --db") from None


def _parsed_url(url: str) -> URL:
    try:
        return make_url(url)
    except ArgumentError:
        raise BackupError(
            f"{url!r} is not a database URL. To fix: pass --db sqlite:///PATH or "
            "postgresql+psycopg://USER@HOST/DB"
        ) from None


def _new_sqlite_file(url: str) -> Path | None:
    """The SQLite file ``url`` names when it does not exist yet (a restore makes it)."""
    parsed = _parsed_url(url)
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return None
    path = Path(parsed.database or "")
    return None if path.exists() else path


def _remove_sqlite(path: Path) -> None:
    """Remove a SQLite file a failed restore made (with its WAL files)."""
    for name in (path.name, path.name + "-wal", path.name + "-shm"):
        path.with_name(name).unlink(missing_ok=True)


@contextlib.contextmanager
def _connect(engine: Engine) -> Iterator[Connection]:
    """A connection; ``BackupError`` when the database cannot be reached."""
    try:
        conn = engine.connect()
    except SQLAlchemyError as e:
        raise BackupError(
            f"cannot reach the store at {_shown(engine.url)}: {_reason(e)}. To fix: check "
            "--db and that the database is up and lets you in"
        ) from None
    with conn:
        yield conn


@contextlib.contextmanager
def _database_errors(url: str, doing: str, outcome: str) -> Iterator[None]:
    """Turn a database error into ``BackupError`` saying what was being done to the store
    and what that left (``outcome``)."""
    try:
        yield
    except SQLAlchemyError as e:
        raise BackupError(
            f"could not {doing} {_shown(url)}: {_reason(e)}. {outcome}. To fix: check the "
            "database, then run the command again"
        ) from None


def _reason(e: SQLAlchemyError) -> str:
    """The first line of what the database said."""
    said = str(e.orig) if isinstance(e, DBAPIError) else str(e)
    return (said.strip().splitlines() or [type(e).__name__])[0]


def _shown(url: str | URL) -> str:
    """``url`` for messages: its password hidden."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return str(url)


def _config(conn: Connection) -> Config:
    """Alembic's configuration for running this store's migrations on ``conn``."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.attributes["connection"] = conn
    return config


def _migrate(conn: Connection, revision: str) -> None:
    command.upgrade(_config(conn), revision)


def _known_revisions() -> set[str]:
    script = ScriptDirectory(str(MIGRATIONS))
    return {s.revision for s in script.walk_revisions()}


def _dumps(record: dict[str, Any]) -> str:
    return json.dumps(record, separators=(",", ":"))


def _tell(progress: Progress | None, table: str, done: int, total: int) -> None:
    if progress is not None:
        progress(table, done, total)


def _chunks(items: Iterable[Any], size: int) -> Iterator[list[Any]]:
    it = iter(items)
    while chunk := list(islice(it, size)):
        yield chunk

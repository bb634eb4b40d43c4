"""The stores a backup reads and a restore writes: opening one from its URL (as the server
does), reaching it, its errors in words, its migrations, and its tables as a backup copies
them."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory
from sqlalchemy import Column, Connection, Engine, MetaData, Table, func, select
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, NoSuchModuleError, SQLAlchemyError

from boltforge.control.store.backups.errors import BackupError
from boltforge.control.store.db import MIGRATIONS, make_engine
from boltforge.control.store.models import Base

VERSION_TABLE = "alembic_version"
NOT_DATA = (VERSION_TABLE, "leader")  # the schema's revision; the servers' lease


# -- opening and reaching a store --------------------------------------------------------------


def open_engine(url: str, must_exist: bool) -> Engine:
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
        raise BackupError(f"cannot open {shown_url(url)}: {e}. To fix: check --db") from None


def _parsed_url(url: str) -> URL:
    try:
        return make_url(url)
    except ArgumentError:
        raise BackupError(
            f"{url!r} is not a database URL. To fix: pass --db sqlite:///PATH or "
            "postgresql+psycopg://USER@HOST/DB"
        ) from None


def new_sqlite_file(url: str) -> Path | None:
    """The SQLite file ``url`` names when it does not exist yet (a restore makes it)."""
    parsed = _parsed_url(url)
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return None
    path = Path(parsed.database or "")
    return None if path.exists() else path


def remove_sqlite(path: Path) -> None:
    """Remove a SQLite file a failed restore made (with its WAL files)."""
    for name in (path.name, path.name + "-wal", path.name + "-shm"):
        path.with_name(name).unlink(missing_ok=True)


@contextlib.contextmanager
def connect(engine: Engine) -> Iterator[Connection]:
    """A connection; ``BackupError`` when the database cannot be reached."""
    try:
        conn = engine.connect()
    except SQLAlchemyError as e:
        raise BackupError(
            f"cannot reach the store at {shown_url(engine.url)}: {_reason(e)}. To fix: check "
            "--db and that the database is up and lets you in"
        ) from None
    with conn:
        yield conn


@contextlib.contextmanager
def transaction(engine: Engine) -> Iterator[Connection]:
    """A connection in one transaction, committed when the block ends normally, schema
    changes included (on SQLite too: pysqlite itself would leave those outside it)."""
    with connect(engine) as conn:
        if engine.dialect.name == "sqlite":
            conn.exec_driver_sql("BEGIN")
        try:
            yield conn
        except BaseException:
            conn.rollback()
            raise
        conn.commit()


# -- database errors in words ------------------------------------------------------------------


@contextlib.contextmanager
def database_errors(url: str, doing: str, outcome: str) -> Iterator[None]:
    """Turn a database error into ``BackupError`` saying what was being done to the store
    and what that left (``outcome``)."""
    try:
        yield
    except SQLAlchemyError as e:
        raise BackupError(
            f"could not {doing} {shown_url(url)}: {_reason(e)}. {outcome}. To fix: check the "
            "database, then run the command again"
        ) from None


def _reason(e: SQLAlchemyError) -> str:
    """The first line of what the database said."""
    said = str(e.orig) if isinstance(e, DBAPIError) else str(e)
    return (said.strip().splitlines() or [type(e).__name__])[0]


def shown_url(url: str | URL) -> str:
    """``url`` for messages: its password hidden."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return str(url)


# -- migrations --------------------------------------------------------------------------------


def alembic_config(conn: Connection) -> Config:
    """Alembic's configuration for running this store's migrations on ``conn``."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.attributes["connection"] = conn
    return config


def migrate(conn: Connection, revision: str) -> None:
    command.upgrade(alembic_config(conn), revision)


def known_revisions() -> set[str]:
    script = ScriptDirectory(str(MIGRATIONS))
    return {s.revision for s in script.walk_revisions()}


# -- the store's tables ------------------------------------------------------------------------


def data_tables(conn: Connection) -> list[Table]:
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


def count(conn: Connection, table: Table) -> int:
    return int(conn.scalar(select(func.count()).select_from(table)) or 0)

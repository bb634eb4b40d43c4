"""The store's engine: SQLite (WAL) under the user's data directory by default, PostgreSQL by
URL, with the schema brought up to date by Alembic migrations on open."""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from alembic import command
from alembic.config import Config
from platformdirs import user_data_dir
from sqlalchemy import Engine, create_engine, event, select, text
from sqlalchemy import inspect as sa_inspect
from sqlalchemy.engine import make_url
from sqlalchemy.orm import ORMExecuteState, Session, sessionmaker
from sqlalchemy.orm.interfaces import ORMOption
from sqlalchemy.orm.util import identity_key

from boltforge.control.store.outage import DISK_FULL, READ_ONLY, StoreFault, StoreStatus, fault_of

MIGRATIONS = Path(__file__).with_name("migrations")
M = TypeVar("M")
MIGRATE_LOCK = 0x6B6F6C74  # the advisory lock PostgreSQL replicas migrate under
CONNECT_TIMEOUT_S = 5  # how long a PostgreSQL connection attempt may take (unless the URL says)
MIN_FREE_BYTES = 4 << 20  # free space a SQLite store's disk needs to count as writable again


def default_url() -> str:
    """SQLite in the user's data directory (``~/.local/share/boltforge/boltforge.db``), which
    only its user may enter (mode 0700)."""
    home = Path(user_data_dir("boltforge"))
    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    home.chmod(0o700)
    return f"sqlite:///{home / 'boltforge.db'}"


class Database:
    """An engine and a session factory for one store URL.

    ``session()`` yields a session that commits when the block ends normally and rolls back
    when it raises, so a request either lands whole or not at all. On SQLite, sessions of one
    process take turns (a lock held for the session): SQLite lets one writer in at a time and
    makes the others sleep and retry, which wastes milliseconds per conflict under load.
    """

    def __init__(self, url: str, status: StoreStatus | None = None) -> None:
        self.url = url
        self.status = status or StoreStatus()
        self.engine = make_engine(url)
        self.sessions = sessionmaker(self.engine, expire_on_commit=False)
        self._turns: threading.RLock | None = threading.RLock() if self.is_sqlite else None
        self.fence: Callable[[Session], None] | None = None
        event.listen(self.sessions, "after_flush", _wrote)
        event.listen(self.sessions, "do_orm_execute", _executes)

    @property
    def is_sqlite(self) -> bool:
        return self.engine.dialect.name == "sqlite"

    def migrate(self) -> None:
        """Bring the schema to the newest revision (idempotent)."""
        config = Config()
        config.set_main_option("script_location", str(MIGRATIONS))
        with self.engine.begin() as connection:
            if not self.is_sqlite:  # replicas starting together migrate one at a time
                connection.execute(
                    text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATE_LOCK}
                )
            config.attributes["connection"] = connection
            command.upgrade(config, "head")

    @contextmanager
    def session(self, fenced: bool = True) -> Iterator[Session]:
        """A session that commits at the end of the block (see the class docstring). With a
        ``fence`` set (server replicas, ``leadership.py``), a session that wrote anything
        runs it before committing; it raises to refuse the whole transaction. ``fenced=False``:
        the lease's own reads and writes. A session that fails with an expected store fault
        (``outage.fault_of``) marks the store away; one that wrote and committed marks it
        available again."""
        with self._turns or contextlib.nullcontext(), self.sessions() as s:
            try:
                yield s
                wrote = bool(s.new or s.dirty or s.deleted or s.info.get(WROTE))
                fence = self.fence if fenced else None
                if fence is not None and wrote:
                    s.flush()
                    fence(s)
                s.commit()
            except BaseException as e:
                self._failed(e)
                with contextlib.suppress(Exception):  # a lost connection cannot roll back
                    s.rollback()
                raise
        if wrote:
            self.status.back()

    @contextmanager
    def reading(self) -> Iterator[Session]:
        """A session for reads alone. On SQLite it takes no turn: in WAL mode a reader never
        waits for the writer nor makes it wait, so a long read (a health survey over every
        running job, a long-poll's page) holds no pass back. It never commits; one that
        changed anything raises ``RuntimeError`` and changes nothing. (An in-memory SQLite
        store, which every connection sees afresh, takes its turn as ``session`` does.)"""
        memory = self.is_sqlite and make_url(self.url).database in (None, "", ":memory:")
        turn = self._turns if memory else None
        with turn or contextlib.nullcontext(), self.sessions() as s:
            try:
                yield s
                if s.new or s.dirty or s.deleted or s.info.get(WROTE):
                    raise RuntimeError("a reading session changed the store; use session()")
            except BaseException as e:
                self._failed(e)
                raise
            finally:
                with contextlib.suppress(Exception):  # a lost connection cannot roll back
                    s.rollback()

    def _failed(self, error: BaseException) -> None:
        fault = fault_of(error)
        if fault is not None:
            self.status.failed(fault)

    def probe(self) -> StoreFault | None:
        """Whether the store takes writes now: None (and the status marked available) when
        it does, else the fault found (and the status marked away). PostgreSQL: a server
        that answers and is not read-only (a standby); SQLite: a file that takes a write
        (the schema's version row set to itself, committed), on a disk with
        ``MIN_FREE_BYTES`` free."""
        try:
            fault = self._probe()
        except Exception as e:
            fault = fault_of(e)
            if fault is None:
                raise
        if fault is None:
            self.status.back()
        else:
            self.status.failed(fault)
        return fault

    def _probe(self) -> StoreFault | None:
        with self._turns or contextlib.nullcontext(), self.engine.connect() as connection:
            if not self.is_sqlite:
                read_only = connection.scalar(text("SHOW transaction_read_only"))
                if read_only == "on":
                    return StoreFault(READ_ONLY, "the server is a standby (read-only)")
                return None
            connection.execute(text("UPDATE alembic_version SET version_num = version_num"))
            connection.commit()
        path = make_url(self.url).database
        if path and path != ":memory:":
            free = shutil.disk_usage(Path(path).parent).free
            if free < MIN_FREE_BYTES:
                return StoreFault(DISK_FULL, f"{free} bytes free beside {path}")
        return None

    def close(self) -> None:
        self.engine.dispose()


WROTE = "boltforge.wrote"


def _wrote(s: Session, _context: Any) -> None:
    s.info[WROTE] = True


def _executes(state: ORMExecuteState) -> None:
    if state.is_insert or state.is_update or state.is_delete:
        state.session.info[WROTE] = True


def by_key(s: Session, model: type[M], keys: Iterable[str], *options: ORMOption) -> dict[str, M]:
    """The rows of ``model`` (a table with a one-column primary key) whose keys are
    ``keys``, by key: those the session holds from its identity map (with any change made
    to them in the session), the rest read in one query without flushing first, so what the
    session wrote so far can still be flushed together at commit. Rows added to the session
    and not yet flushed are not found. ``options`` go to that query (``defer`` a column the
    caller will not read)."""
    wanted = set(keys)
    out: dict[str, M] = {}
    for key in wanted:
        row = s.identity_map.get(identity_key(model, key))
        if isinstance(row, model):
            out[key] = row
    rest = wanted - set(out)
    if rest:
        column = sa_inspect(model).primary_key[0]
        with s.no_autoflush:
            for row in s.scalars(select(model).where(column.in_(rest)).options(*options)):
                out[getattr(row, column.key)] = row
    return out


def make_engine(url: str) -> Engine:
    """An engine for ``url``; SQLite files get WAL, a busy timeout and foreign keys."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite":
        timeout = "connect_timeout" in parsed.query
        connect = {} if timeout else {"connect_timeout": CONNECT_TIMEOUT_S}
        return create_engine(
            url, pool_pre_ping=True, pool_size=10, max_overflow=20, connect_args=connect
        )
    if parsed.database and parsed.database != ":memory:":
        private_files(Path(parsed.database))
    engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})
    event.listen(engine, "connect", _sqlite_pragmas)
    return engine


def private_files(path: Path) -> None:
    """Make the SQLite store at ``path`` its user's alone before SQLite opens it: a folder
    made for it is created 0700 (one that exists is left as it is), the file is created (or
    set) 0600, and so are its ``-wal`` and ``-shm`` files where they exist already (SQLite
    creates them with the database file's mode)."""
    if not path.parent.exists():
        path.parent.mkdir(parents=True, mode=0o700)
    with contextlib.suppress(FileExistsError):
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    for file in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        with contextlib.suppress(FileNotFoundError, PermissionError):  # another user's: theirs
            if file.stat().st_mode & 0o077:
                file.chmod(0o600)


def _sqlite_pragmas(connection: Any, _record: Any) -> None:
    cursor = connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA busy_timeout=30000")
    cursor.close()

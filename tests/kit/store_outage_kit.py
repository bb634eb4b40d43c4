"""Store faults injected at the SQLite layer: every statement (``away``) or every write
(``disk_full``) of a server's engine fails as SQLite itself would fail it, until the block
ends. The driver's error goes through SQLAlchemy exactly as a real one would."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator
from typing import Any

from sqlalchemy import Engine, event

WRITES = ("insert", "update", "delete", "replace")


@contextlib.contextmanager
def failing(engine: Engine, message: str, writes_only: bool = False) -> Iterator[None]:
    """Every statement (or every write, ``writes_only``) on ``engine`` fails with SQLite's
    ``message`` inside the block."""

    def fail(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if not writes_only or statement.lstrip().lower().startswith(WRITES):
            raise sqlite3.OperationalError(message)

    event.listen(engine, "before_cursor_execute", fail)
    try:
        yield
    finally:
        event.remove(engine, "before_cursor_execute", fail)


def away(engine: Engine) -> contextlib.AbstractContextManager[None]:
    """The store cannot be opened (its file system went away)."""
    return failing(engine, "unable to open database file")


def disk_full(engine: Engine) -> contextlib.AbstractContextManager[None]:
    """Reads work; every write fails for lack of space."""
    return failing(engine, "database or disk is full", writes_only=True)

"""Rows a group commit reads, read before its changes run, absent ones included.

A group of registrations (``control/store/batch.py``) looks up each node and each node's
claim by primary key. ``Session.get`` finds a row read earlier in the transaction in the
session's identity map, but a row that does not exist is looked up again, one round trip
each: a fleet registering for the first time asks the store once per node and table for a
row that is not there. ``read`` loads the rows for many keys in one statement and remembers
the keys it did not find; ``get`` answers those from memory. A change that adds a row says
so (``added``), and a later ``get`` in the same transaction finds it, flushed or not.

The session's identity map holds rows weakly: a row nothing else refers to is dropped and
read again at the next ``Session.get``. The rows ``read`` and ``get`` return are therefore
kept (``Session.info``) until the transaction ends.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from typing import Any, TypeVar

from sqlalchemy import select
from sqlalchemy.orm import Session

NOTED = "bolt.ahead.noted"  # Session.info key: {table: {key read absent: None, or added}}
KEPT = "bolt.ahead.kept"  # Session.info key: the rows read, kept for the transaction
R = TypeVar("R")


def read(s: Session, model: type[R], column: Any, keys: Iterable[Hashable]) -> list[R]:
    """The rows of ``model`` whose primary key ``column`` is one of ``keys``, read in one
    statement into the session and kept; the keys not found are remembered as absent."""
    wanted = set(keys)
    rows = list(s.scalars(select(model).where(column.in_(wanted))))
    found = {getattr(r, column.key) for r in rows}
    noted = _noted(s, model)
    for key in wanted - found:
        noted.setdefault(key, None)
    return keep(s, rows)


def keep(s: Session, rows: Iterable[R]) -> list[R]:
    """``rows`` (of any query), kept in the session until the transaction ends."""
    kept = list(rows)
    s.info.setdefault(KEPT, []).extend(kept)
    return kept


def get(s: Session, model: type[R], key: Hashable) -> R | None:
    """``s.get(model, key)``, kept, without asking the store for a key ``read`` found
    absent; a row ``added`` in this transaction is found whether flushed or not."""
    noted = _noted(s, model)
    if key in noted:
        found: R | None = noted[key]
        return found
    row = s.get(model, key)
    if row is not None:
        s.info.setdefault(KEPT, []).append(row)
    return row


def added(s: Session, model: type[R], key: Hashable, row: R) -> None:
    """``row``, of ``model`` with primary key ``key``, was added to the session: what
    ``get`` finds from now on."""
    _noted(s, model)[key] = row


def _noted(s: Session, model: type[Any]) -> dict[Hashable, Any]:
    """The keys of ``model`` read and not found (None) or added since (the row)."""
    table: str = model.__tablename__
    noted: dict[str, dict[Hashable, Any]] = s.info.setdefault(NOTED, {})
    return noted.setdefault(table, {})

"""Rows read ahead for a group commit (``store/ahead.py``): the keys read and not found are
answered from memory, rows added since are found before they are flushed, and every row
read stays in the session for the transaction."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event
from store_builders import a_node, migrated

from boltforge.control.store import ahead
from boltforge.control.store.db import Database
from boltforge.control.store.models import NodeRow


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Database]:
    with migrated(tmp_path / "ahead.db") as store:
        with store.session() as s:
            a_node(s, "host-0")
        yield store


class Statements:
    """Counts the statements the store is sent."""

    def __init__(self, db: Database) -> None:
        self.count = 0
        event.listen(db.engine, "before_cursor_execute", self._one)

    def _one(self, *_: Any) -> None:
        self.count += 1


def test_keys_read_and_not_found_are_answered_without_the_store(db: Database) -> None:
    sent = Statements(db)
    with db.session() as s:
        rows = ahead.read(s, NodeRow, NodeRow.name, ["host-0", "host-1", "host-2"])
        assert [r.name for r in rows] == ["host-0"]
        read_at = sent.count
        assert ahead.get(s, NodeRow, "host-1") is None
        assert ahead.get(s, NodeRow, "host-2") is None
        found = ahead.get(s, NodeRow, "host-0")
        assert found is not None and found.name == "host-0"
        assert sent.count == read_at  # all three from memory
        assert ahead.get(s, NodeRow, "host-3") is None  # never read ahead: asked
        assert sent.count == read_at + 1


def test_a_row_added_after_it_was_read_absent_is_found_before_any_flush(db: Database) -> None:
    with db.sessions() as s, s.no_autoflush:  # closed without committing
        ahead.read(s, NodeRow, NodeRow.name, ["host-1"])
        row = NodeRow(name="host-1", registered_at=0.0, desired_version=0, cordoned=False)
        s.add(row)
        ahead.added(s, NodeRow, "host-1", row)
        assert ahead.get(s, NodeRow, "host-1") is row


def test_rows_read_ahead_stay_in_the_session_until_the_transaction_ends(db: Database) -> None:
    """The identity map holds rows weakly; what was read ahead must not be read again."""
    sent = Statements(db)
    with db.session() as s:
        ahead.read(s, NodeRow, NodeRow.name, ["host-0"])  # the list returned is dropped
        read_at = sent.count
        assert s.get(NodeRow, "host-0") is not None
        assert sent.count == read_at


def test_what_was_read_ahead_is_forgotten_with_the_session(db: Database) -> None:
    with db.session() as s:
        ahead.read(s, NodeRow, NodeRow.name, ["host-1"])
    with db.session() as s:
        a_node(s, "host-1")
    with db.session() as s:
        found = ahead.get(s, NodeRow, "host-1")
        assert found is not None and found.name == "host-1"

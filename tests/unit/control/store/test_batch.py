"""Group commit: changes that arrive together share one transaction, and one that fails
leaves nothing behind and takes none of its neighbours down."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from boltforge.control.store.batch import Batcher
from boltforge.control.store.db import Database
from boltforge.control.store.models import CounterRow


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Database]:
    store = Database(f"sqlite:///{tmp_path / 'b.db'}")
    store.migrate()
    yield store
    store.close()


def counter(name: str, value: int) -> Callable[[Session], str]:
    def change(s: Session) -> str:
        s.add(CounterRow(name=name, value=value))
        s.flush()
        if value < 0:
            raise ValueError(f"{name}: a negative value")
        return name

    return change


def queued(writer: Batcher, count: int) -> None:
    """Wait (at most a minute) until ``count`` changes wait in ``writer``'s queue."""
    deadline = time.monotonic() + 60.0
    while writer.waiting() < count:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{count} changes never queued up")
        time.sleep(0.002)


def names(db: Database) -> set[str]:
    with db.session() as s:
        return set(s.scalars(select(CounterRow.name))) - {"job"}


def test_changes_that_arrive_together_share_a_commit(db: Database) -> None:
    gate = threading.Lock()
    writer = Batcher(db, gate, "test-writes")
    try:
        with ThreadPoolExecutor(40) as pool:
            with gate:  # hold the writer while forty changes queue up
                results = [pool.submit(writer.write, counter(f"c{i}", i)) for i in range(40)]
                queued(writer, 40)  # every one queued, or taken and waiting for the gate
            assert sorted(r.result() for r in results) == sorted(f"c{i}" for i in range(40))
        assert writer.changes == 40 and writer.groups <= 3
    finally:
        writer.close()
    assert names(db) == {f"c{i}" for i in range(40)}


def test_a_failing_change_leaves_nothing_and_its_neighbours_land(db: Database) -> None:
    gate = threading.Lock()
    writer = Batcher(db, gate, "test-writes")
    try:
        with ThreadPoolExecutor(4) as pool:
            with gate:
                good = [pool.submit(writer.write, counter(f"g{i}", i)) for i in range(3)]
                bad = pool.submit(writer.write, counter("bad", -1))
                queued(writer, 4)
            assert [f.result() for f in good] == ["g0", "g1", "g2"]
            with pytest.raises(ValueError, match="negative"):
                bad.result()
    finally:
        writer.close()
    assert names(db) == {"g0", "g1", "g2"}


def test_the_rows_a_group_reads_are_read_once_for_the_whole_group(db: Database) -> None:
    gate = threading.Lock()
    warmed: list[set[str]] = []

    def warm(s: Session, keys: set[str]) -> None:
        warmed.append(set(keys))
        s.info["warm"] = keys

    def reader(key: str) -> Callable[[Session], bool]:
        return lambda s: key in s.info["warm"]

    writer = Batcher(db, gate, "test-writes", warm)
    try:
        with ThreadPoolExecutor(3) as pool:
            with gate:
                seen = [
                    pool.submit(writer.write, reader(k), frozenset({k, "shared"})) for k in "abc"
                ]
                queued(writer, 3)
            assert [f.result() for f in seen] == [True, True, True]
    finally:
        writer.close()
    assert set().union(*warmed) == {"a", "b", "c", "shared"}
    assert len(warmed) == writer.groups < 3  # one read per group, not per change
    assert all("shared" in keys for keys in warmed)

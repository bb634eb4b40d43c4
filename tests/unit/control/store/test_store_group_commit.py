"""Group commit (``store/batch.py``) beyond the existing scenarios: how a writer takes its
next group from a queue (and how closing it reaches every taker), the coroutine side of the
writer, and its counters."""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session
from store_builders import migrated

from boltforge.control.store.batch import Batcher, next_group
from boltforge.control.store.db import Database
from boltforge.control.store.models import CounterRow


def filled(*items: str | None) -> queue.Queue[str | None]:
    q: queue.Queue[str | None] = queue.Queue()
    for item in items:
        q.put(item)
    return q


# -- taking groups ---------------------------------------------------------------------------


def test_a_group_is_everything_waiting_up_to_the_most() -> None:
    q = filled("a", "b", "c", "d", "e")
    assert next_group(q, 2) == ["a", "b"]
    assert next_group(q, 2) == ["c", "d"]
    assert next_group(q, 2) == ["e"]
    assert q.empty()


def test_a_closed_queue_gives_none_to_every_taker() -> None:
    q = filled(None)
    assert next_group(q, 10) is None
    assert next_group(q, 10) is None  # the close is left for the next taker
    assert q.qsize() == 1


def test_what_came_before_the_close_is_still_handed_out() -> None:
    q = filled("a", "b", None)
    assert next_group(q, 10) == ["a", "b"]  # the close ends the group
    assert next_group(q, 10) is None
    assert next_group(q, 10) is None


def test_a_taker_waits_for_the_first_item() -> None:
    q: queue.Queue[str | None] = queue.Queue()
    got: list[list[str] | None] = []
    taker = threading.Thread(target=lambda: got.append(next_group(q, 10)))
    taker.start()
    q.put("first")
    taker.join(30)
    assert got and got[0] is not None and got[0][0] == "first"


# -- the writer ------------------------------------------------------------------------------


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Database]:
    with migrated(tmp_path / "batch.db") as store:
        yield store


@pytest.fixture
def writer(db: Database) -> Iterator[Batcher]:
    w = Batcher(db, threading.Lock(), "test-batch")
    yield w
    w.close()


def add(name: str, value: int) -> Callable[[Session], int]:
    def change(s: Session) -> int:
        s.add(CounterRow(name=name, value=value))
        s.flush()
        if value < 0:
            raise ValueError(f"{name} may not be negative")
        return value * 10

    return change


def names(db: Database) -> set[str]:
    with db.session() as s:
        return set(s.scalars(select(CounterRow.name))) - {"job"}


def test_a_coroutine_gets_its_changes_result_after_the_commit(
    db: Database, writer: Batcher
) -> None:
    async def main() -> list[int]:
        return list(await asyncio.gather(*(writer.write_async(add(f"c{i}", i)) for i in range(5))))

    assert asyncio.run(main()) == [0, 10, 20, 30, 40]
    assert names(db) == {f"c{i}" for i in range(5)}
    assert writer.changes == 5 and 1 <= writer.groups <= 5


def test_a_coroutine_gets_its_changes_error_and_nothing_of_it_stays(
    db: Database, writer: Batcher
) -> None:
    async def main() -> None:
        await writer.write_async(add("bad", -1))

    with pytest.raises(ValueError, match="bad may not be negative"):
        asyncio.run(main())
    assert names(db) == set()
    assert (writer.changes, writer.groups) == (0, 0)  # only stored changes count
    assert writer.write(add("good", 1)) == 10
    assert (writer.changes, writer.groups) == (1, 1)


def test_an_idle_writer_has_nothing_waiting(writer: Batcher) -> None:
    assert writer.write(add("x", 1)) == 10
    assert writer.waiting() == 0


def test_a_change_that_reads_nothing_does_not_warm(db: Database) -> None:
    warmed: list[set[str]] = []
    w = Batcher(db, threading.Lock(), "test-batch", lambda s, keys: warmed.append(keys))
    try:
        w.write(add("x", 1))
        w.write(add("y", 2), frozenset({"host-0"}))
    finally:
        w.close()
    assert warmed == [{"host-0"}]


def test_a_change_runs_under_the_writers_lock(db: Database) -> None:
    lock = threading.Lock()
    w = Batcher(db, lock, "test-batch")
    try:
        assert w.write(lambda s: lock.locked()) is True
        assert not lock.locked()
    finally:
        w.close()


def test_a_closed_writer_stops_its_thread(db: Database) -> None:
    def alive() -> int:
        return sum(t.name == "test-closing" and t.is_alive() for t in threading.enumerate())

    w = Batcher(db, threading.Lock(), "test-closing")
    assert alive() == 1
    w.close()
    assert alive() == 0

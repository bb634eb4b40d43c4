"""The store's engine and sessions (``store/db.py``) on real SQLite files: a session lands
whole or not at all, the fence runs for exactly the sessions that wrote (however they
wrote), SQLite gets the settings the server relies on, and ``by_key`` finds rows the way
its docstring promises."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import insert, select, text, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session
from store_builders import a_job, a_node, a_replica, migrated, rows_in, sqlite_url

from boltforge.control.store.db import Database, by_key, default_url, make_engine
from boltforge.control.store.models import CounterRow, JobRow, NodeRow


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Database]:
    with migrated(tmp_path / "store.db") as store:
        yield store


class Fence:
    """A fence that records each call and refuses when told to."""

    def __init__(self, refuse: bool = False) -> None:
        self.calls = 0
        self.refuse = refuse
        self.saw_counters: list[int] = []

    def __call__(self, s: Session) -> None:
        self.calls += 1
        # the session's writes are flushed before the fence runs: it sees them
        self.saw_counters.append(rows_in(s, CounterRow))
        if self.refuse:
            raise PermissionError("deposed")


def counters(db: Database) -> set[str]:
    with db.session() as s:
        return set(s.scalars(select(CounterRow.name)))


# -- a session lands whole or not at all -----------------------------------------------------


def test_a_session_that_ends_normally_commits(db: Database) -> None:
    with db.session() as s:
        s.add(CounterRow(name="a", value=1))
    assert counters(db) == {"job", "a"}


@pytest.mark.parametrize(
    "error", [ValueError("bad input"), KeyboardInterrupt()], ids=["exception", "interrupt"]
)
def test_a_session_that_raises_rolls_back_everything_and_lets_the_error_through(
    db: Database, error: BaseException
) -> None:
    with pytest.raises(type(error)), db.session() as s:
        s.add(CounterRow(name="a", value=1))
        s.flush()  # written to the transaction, not yet committed
        s.execute(update(CounterRow).where(CounterRow.name == "job").values(value=99))
        raise error
    assert counters(db) == {"job"}
    with db.session() as s:
        assert s.scalar(select(CounterRow.value).where(CounterRow.name == "job")) == 0


def test_nested_sessions_in_one_thread_do_not_wait_for_each_other(db: Database) -> None:
    """On SQLite sessions take turns, but a thread that holds the turn may open another
    (a request that calls a helper with its own session)."""
    with db.session() as outer:
        outer.add(CounterRow(name="outer", value=1))
        with db.session() as inner:
            inner.add(CounterRow(name="inner", value=2))
    assert counters(db) == {"job", "outer", "inner"}


def test_sessions_of_many_threads_all_land(db: Database) -> None:
    def write(i: int) -> None:
        with db.session() as s:
            s.add(CounterRow(name=f"t{i}", value=i))

    threads = [threading.Thread(target=write, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert counters(db) == {"job", *(f"t{i}" for i in range(8))}


# -- the fence runs for sessions that wrote, and only for those ------------------------------


def add_row(s: Session) -> None:
    s.add(CounterRow(name="added", value=1))


def change_loaded_row(s: Session) -> None:
    row = s.get_one(CounterRow, "job")
    row.value = 5


def delete_row(s: Session) -> None:
    s.delete(s.get_one(CounterRow, "job"))


def bulk_update(s: Session) -> None:
    s.execute(update(CounterRow).where(CounterRow.name == "job").values(value=7))


def bulk_insert(s: Session) -> None:
    s.execute(insert(CounterRow), [{"name": "x", "value": 1}, {"name": "y", "value": 2}])


def flushed_then_nothing_pending(s: Session) -> None:
    s.add(CounterRow(name="early", value=1))
    s.flush()  # nothing is new or dirty any more, yet the session wrote


WRITES = {
    "add": add_row,
    "change a loaded row": change_loaded_row,
    "delete": delete_row,
    "bulk update": bulk_update,
    "bulk insert": bulk_insert,
    "flushed early": flushed_then_nothing_pending,
}


@pytest.mark.parametrize("write", WRITES.values(), ids=list(WRITES))
def test_every_kind_of_write_runs_the_fence_once_before_the_commit(
    db: Database, write: object
) -> None:
    fence = Fence()
    db.fence = fence
    with db.session() as s:
        write(s)  # type: ignore[operator]
    assert fence.calls == 1


def reads_only(s: Session) -> None:
    s.get(CounterRow, "job")
    list(s.scalars(select(JobRow)))
    s.execute(text("SELECT 1"))


def test_a_session_that_only_reads_skips_the_fence(db: Database) -> None:
    fence = Fence(refuse=True)  # it would refuse, were it asked
    db.fence = fence
    with db.session() as s:
        reads_only(s)
    assert fence.calls == 0


def test_the_fence_sees_the_sessions_writes_flushed(db: Database) -> None:
    fence = Fence()
    db.fence = fence
    with db.session() as s:
        s.add(CounterRow(name="a", value=1))
        s.add(CounterRow(name="b", value=2))
    assert fence.saw_counters == [3]  # job, a, b


def test_a_fence_that_refuses_rolls_the_whole_transaction_back(db: Database) -> None:
    db.fence = Fence(refuse=True)
    with pytest.raises(PermissionError, match="deposed"), db.session() as s:
        s.add(CounterRow(name="late", value=1))
        bulk_update(s)
    db.fence = None
    assert counters(db) == {"job"}
    with db.session() as s:
        assert s.get_one(CounterRow, "job").value == 0


def test_an_unfenced_session_writes_past_a_refusing_fence(db: Database) -> None:
    fence = Fence(refuse=True)
    db.fence = fence
    with db.session(fenced=False) as s:
        s.add(CounterRow(name="lease", value=1))
    assert fence.calls == 0
    assert "lease" in counters(db)


def test_a_write_in_one_session_does_not_fence_the_next_read(db: Database) -> None:
    fence = Fence()
    db.fence = fence
    with db.session() as s:
        add_row(s)
    with db.session() as s:
        reads_only(s)
    assert fence.calls == 1


# -- migrations ------------------------------------------------------------------------------


def test_migrating_twice_changes_nothing_and_seeds_the_job_counter_once(tmp_path: Path) -> None:
    with migrated(tmp_path / "twice.db") as db:
        with db.session() as s:
            s.add(CounterRow(name="mine", value=3))
        db.migrate()
        with db.session() as s:
            assert sorted(s.execute(select(CounterRow.name, CounterRow.value))) == [
                ("job", 0),
                ("mine", 3),
            ]


# -- SQLite as the server needs it -----------------------------------------------------------


def test_a_sqlite_store_is_in_wal_mode_with_foreign_keys_and_a_busy_timeout(db: Database) -> None:
    with db.engine.connect() as c:
        assert c.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert c.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
        assert c.exec_driver_sql("PRAGMA busy_timeout").scalar() == 30000
    assert db.is_sqlite


def test_a_replica_of_an_unknown_job_is_refused_by_the_store(db: Database) -> None:
    with pytest.raises(IntegrityError, match="FOREIGN KEY"), db.session() as s:
        a_node(s, "host-0")
        ghost = JobRow(id="ghost", epoch=1)  # never added: only its id is borrowed
        a_replica(s, ghost, 0, "host-0", "running")
    with db.session() as s:
        assert rows_in(s, NodeRow) == 0  # the node of the same transaction went too


def test_two_jobs_may_not_share_an_idempotency_key(db: Database) -> None:
    with db.session() as s:
        a_job(s, idempotency_key="retry-1")
    with pytest.raises(IntegrityError, match="UNIQUE"), db.session() as s:
        a_job(s, idempotency_key="retry-1")
    with db.session() as s:
        a_job(s, idempotency_key=None)
        a_job(s, idempotency_key=None)  # no key: any number of jobs
        assert rows_in(s, JobRow) == 3


def test_the_folder_of_a_new_sqlite_file_is_made(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "store.db"
    engine = make_engine(sqlite_url(path))
    try:
        with engine.connect() as c:
            c.exec_driver_sql("CREATE TABLE t (x INTEGER)")
    finally:
        engine.dispose()
    assert path.is_file()


def test_an_in_memory_store_makes_no_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    db = Database("sqlite:///:memory:")
    try:
        with db.engine.connect() as c:
            assert c.exec_driver_sql("SELECT 1").scalar() == 1
    finally:
        db.close()
    assert list(tmp_path.iterdir()) == []


def test_the_default_store_lives_in_the_users_data_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    url = default_url()
    assert url == f"sqlite:///{tmp_path / 'data' / 'boltforge' / 'boltforge.db'}"
    assert (tmp_path / "data" / "boltforge").is_dir()  # ready for the file


# -- by_key ----------------------------------------------------------------------------------


@pytest.fixture
def three_nodes(db: Database) -> Database:
    with db.session() as s:
        for name in ("host-0", "host-1", "host-2"):
            a_node(s, name)
    return db


def test_by_key_finds_stored_rows_by_key_and_leaves_out_unknown_keys(three_nodes: Database) -> None:
    with three_nodes.session() as s:
        found = by_key(s, NodeRow, ["host-0", "host-2", "host-9"])
        assert {k: v.name for k, v in found.items()} == {"host-0": "host-0", "host-2": "host-2"}
        assert by_key(s, NodeRow, []) == {}


def test_by_key_returns_the_sessions_own_rows_with_their_unflushed_changes(
    three_nodes: Database,
) -> None:
    with three_nodes.session() as s:
        held = s.get_one(NodeRow, "host-1")
        held.cordoned = True
        found = by_key(s, NodeRow, ["host-1", "host-2"])
        assert found["host-1"] is held and found["host-1"].cordoned
        assert held in s.dirty  # read without flushing: still to be written at commit


def test_by_key_does_not_find_rows_added_but_not_flushed(three_nodes: Database) -> None:
    with three_nodes.session() as s:
        fresh = NodeRow(name="host-new")
        s.add(fresh)
        assert by_key(s, NodeRow, ["host-new", "host-0"]).keys() == {"host-0"}
        assert fresh in s.new  # and it was not flushed to look
        s.expunge(fresh)


def test_a_reading_session_takes_no_turn_and_lands_no_write(db: Database) -> None:
    with db.session() as s:
        a_node(s, "n1")
    holding, release = threading.Event(), threading.Event()

    def writer() -> None:
        with db.session() as s:  # holds the SQLite turn until released
            a_node(s, "n2")
            s.flush()
            holding.set()
            release.wait(30)

    thread = threading.Thread(target=writer)
    thread.start()
    holding.wait(30)
    with db.reading() as s:  # would wait for the writer's turn if it took one
        seen = s.scalars(select(NodeRow.name)).all()
    release.set()
    thread.join(30)
    assert seen == ["n1"]  # the writer's row is not committed yet
    with pytest.raises(RuntimeError, match="use session"), db.reading() as s:
        a_node(s, "n3")
    with db.reading() as s:
        assert sorted(s.scalars(select(NodeRow.name))) == ["n1", "n2"]

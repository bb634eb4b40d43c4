"""Backup files that are not what they claim, and stores a restore must not load into, on
small SQLite stores built row by row (no server): every refusal names the file or store,
the problem and the fix, and leaves the target exactly as it was (a SQLite file the restore
made is removed). Also the values of the file (markers for what JSON cannot carry) and the
progress a backup and a restore report."""

from __future__ import annotations

import gzip
import json
import math
import sqlite3
from collections.abc import Callable
from contextlib import closing
from dataclasses import dataclass
from datetime import UTC, date, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import (
    JSON,
    Column,
    Date,
    DateTime,
    Float,
    Integer,
    LargeBinary,
    MetaData,
    Numeric,
    String,
    Table,
    create_engine,
    select,
    text,
)
from store_builders import a_job, a_node, a_replica, a_run, migrated, sqlite_url

from boltforge.control.store.backups import BackupError, StoreNotEmpty, backup, check_file, restore
from boltforge.control.store.backups.batches import chunks
from boltforge.control.store.backups.engines import shown_url
from boltforge.control.store.backups.fileformat import decoded_row, encoded_row
from boltforge.control.store.db import Database
from boltforge.control.store.models import Base, EventRow, TokenRow

Lines = list[dict[str, Any]]


@dataclass(frozen=True)
class Source:
    """A small store (a running job with its node, replica, run and timeline, a token) and
    a good backup of it."""

    url: str
    backup: Path


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Source:
    home = tmp_path_factory.mktemp("source")
    with migrated(home / "source.db") as db:
        with db.session() as s:
            a_node(s, "host-0")
            job = a_job(s, "running", estimated_start=float("inf"), name="naïve ☃")
            a_replica(s, job, 0, "host-0", "running")
            a_run(s, job, dollars_per_hour=24.0)
            for i in range(3):
                s.add(EventRow(job_id=job.id, at=float(i), kind="note", message=f"e{i}", data={}))
            s.add(TokenRow(name="alice", role="member", team="r", digest="d" * 64, created_at=1.0))
        url = db.url
    path = home / "good.bak.gz"
    backup(url, path)
    return Source(url, path)


def rows_of(url: str) -> dict[str, list[dict[str, Any]]]:
    engine = create_engine(url)
    try:
        with engine.connect() as c:
            return {
                t.name: [dict(r._mapping) for r in c.execute(select(t).order_by(*t.primary_key))]
                for t in Base.metadata.sorted_tables
            }
    finally:
        engine.dispose()


def lines_of(path: Path) -> Lines:
    with gzip.open(path, "rt") as f:
        return [json.loads(line) for line in f]


def write_lines(path: Path, lines: list[Any]) -> Path:
    path.write_bytes(gzip.compress("".join(json.dumps(x) + "\n" for x in lines).encode()))
    return path


TOKENS_0009 = ("nodes", "expires_at", "revoked_at", "last_used_at")
ADDED_SINCE_0006 = {("jobs", "service"), ("runs", "gpu_share")} | {
    ("tokens", c) for c in TOKENS_0009
}
TABLES_SINCE_0006 = ("services", "node_claims")


def at_0006(lines: Lines) -> Lines:
    """A backup as revision 0006 would have written it: 0007 added only the lease, which
    backups leave out; 0008 the services table, the jobs' service and runs' gpu_share; 0009
    the node_claims table and the tokens' bindings, expiry, revocation and last use."""
    header = {**lines[0], "revision": "0006"}
    header["tables"] = {t: n for t, n in header["tables"].items() if t not in TABLES_SINCE_0006}
    header["columns"] = {
        t: [c for c in cols if (t, c) not in ADDED_SINCE_0006]
        for t, cols in header["columns"].items()
        if t not in TABLES_SINCE_0006
    }
    rows = [
        {
            **line,
            "r": {k: v for k, v in line["r"].items() if (line["t"], k) not in ADDED_SINCE_0006},
        }
        for line in lines[1:]
        if line["t"] not in TABLES_SINCE_0006
    ]
    return [header, *rows]


def a_store_with_data(path: Path) -> str:
    """Another team's store: one pending job."""
    with migrated(path) as db:
        with db.session() as s:
            a_job(s, "pending", name="theirs")
        return db.url


# -- files that are not a complete, valid backup ---------------------------------------------

Damage = Callable[[Lines], list[Any]]


def header(**change: Any) -> Damage:
    return lambda lines: [{**lines[0], **change}, *lines[1:]]


def columns_of(table: str, names: Any) -> Damage:
    return lambda lines: [
        {**lines[0], "columns": {**lines[0]["columns"], table: names}},
        *lines[1:],
    ]


def first_row(change: Callable[[dict[str, Any]], Any]) -> Damage:
    return lambda lines: [lines[0], change(lines[1]), *lines[2:]]


def extra_job_row(lines: Lines) -> list[Any]:
    job = next(line for line in lines if line.get("t") == "jobs")
    return [*lines, {"t": "jobs", "r": {**job["r"], "id": "extra"}}]


HEADER_DAMAGE: dict[str, tuple[Damage, str]] = {
    "a header that is a list": (lambda lines: [[1, 2], *lines[1:]], "is not a Boltforge backup"),
    "another format": (header(format="boltforge-dump"), "is not a Boltforge backup"),
    "no version": (header(version=None), "its header is not valid"),
    "a version as text": (header(version="1"), "its header is not valid"),
    "an older version": (header(version=0), "its header is not valid"),
    "a revision as a number": (header(revision=7), "its header is not valid"),
    "no tables": (header(tables=None), "its header is not valid"),
    "a negative count": (header(tables={"jobs": -1}), "its header is not valid"),
    "a count that is true": (header(tables={"jobs": True}), "its header is not valid"),
    "a count with a fraction": (header(tables={"jobs": 1.5}), "its header is not valid"),
    "columns of another table": (
        lambda lines: [{**lines[0], "columns": {"teams": []}}, *lines[1:]],
        "its header is not valid",
    ),
    "columns not a list": (columns_of("jobs", "id,name"), "its header is not valid"),
    "a column that is not a name": (columns_of("jobs", ["id", 2]), "its header is not valid"),
}

ROW_DAMAGE: dict[str, tuple[Damage, str]] = {
    "a line that is a list": (first_row(lambda r: [r]), "a line is not a row of a table it lists"),
    "a row that is not an object": (
        first_row(lambda r: {**r, "r": "id=1"}),
        "a line is not a row of a table it lists",
    ),
    "a row with a column too many": (
        first_row(lambda r: {**r, "r": {**r["r"], "colour": "red"}}),
        r"a row of \w+ has other columns",
    ),
    "a row with a column missing": (
        first_row(lambda r: {**r, "r": dict(list(r["r"].items())[1:])}),
        r"a row of \w+ has other columns",
    ),
    "a row more than the header lists": (extra_job_row, r"holds \d+ rows where its header lists"),
}


@pytest.mark.parametrize("case", [*HEADER_DAMAGE, *ROW_DAMAGE], ids=[*HEADER_DAMAGE, *ROW_DAMAGE])
def test_a_damaged_file_is_refused_naming_it_the_problem_and_the_fix(
    source: Source, tmp_path: Path, case: str
) -> None:
    damage, says = {**HEADER_DAMAGE, **ROW_DAMAGE}[case]
    bad = write_lines(tmp_path / "bad.bak.gz", damage(lines_of(source.backup)))
    with pytest.raises(BackupError, match=says) as refused:
        check_file(bad)
    assert str(bad) in str(refused.value)
    assert "To fix:" in str(refused.value)


def test_the_count_of_rows_found_and_promised_is_told(source: Source, tmp_path: Path) -> None:
    lines = lines_of(source.backup)
    promised = sum(lines[0]["tables"].values())
    bad = write_lines(tmp_path / "short.bak.gz", lines[:-2])
    with pytest.raises(
        BackupError, match=f"holds {promised - 2} rows where its header lists {promised}"
    ):
        check_file(bad)


def test_a_line_that_is_not_json_is_named_by_its_number(source: Source, tmp_path: Path) -> None:
    text_lines = gzip.decompress(source.backup.read_bytes()).decode().splitlines()
    text_lines[2] = text_lines[2][:-5]  # the second row, cut mid-value
    bad = tmp_path / "cut.bak.gz"
    bad.write_bytes(gzip.compress(("\n".join(text_lines) + "\n").encode()))
    with pytest.raises(BackupError, match=r"is damaged: line 3 is not JSON\. To fix: take"):
        check_file(bad)


@pytest.mark.parametrize(
    ("make", "says"),
    [
        (lambda good: gzip.compress(b"format: boltforge-backup\n"), "is not a Boltforge backup"),
        (lambda good: good + b"garbage after the end", "is truncated or damaged"),
        (
            lambda good: good[:40] + bytes(b ^ 0xFF for b in good[40:80]) + good[80:],
            "is truncated or damaged",
        ),
    ],
    ids=["first line not JSON", "bytes after the end", "bytes flipped in the middle"],
)
def test_a_file_damaged_below_the_lines_is_refused(
    source: Source, tmp_path: Path, make: Callable[[bytes], bytes], says: str
) -> None:
    bad = tmp_path / "bad.bak.gz"
    bad.write_bytes(make(source.backup.read_bytes()))
    with pytest.raises(BackupError, match=says) as refused:
        check_file(bad)
    assert "To fix:" in str(refused.value)


def test_a_folder_given_as_the_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(
        BackupError, match=r"cannot read .*: Is a directory\. To fix: pass the file"
    ):
        check_file(tmp_path)


def test_a_good_file_is_checked_whole_and_its_header_returned(source: Source) -> None:
    found = check_file(source.backup)
    lines = lines_of(source.backup)
    assert found.tables == lines[0]["tables"]
    assert set(found.columns["jobs"]) == set(Base.metadata.tables["jobs"].columns.keys())
    assert found.revision == lines[0]["revision"] and found.created_at == lines[0]["created_at"]
    assert (found.tables["jobs"], found.tables["events"], found.tables["replicas"]) == (1, 3, 1)


# -- nothing is half-restored ----------------------------------------------------------------


def test_a_file_damaged_near_its_end_leaves_a_full_store_untouched_even_with_force(
    source: Source, tmp_path: Path
) -> None:
    """The whole file is read before anything is deleted: the last line's damage is found
    before the store's rows are replaced."""
    target = a_store_with_data(tmp_path / "target.db")
    before = rows_of(target)
    lines = lines_of(source.backup)
    bad = write_lines(tmp_path / "bad.bak.gz", [*lines[:-1], {"t": "nowhere", "r": {}}])
    with pytest.raises(BackupError, match="not a row of a table it lists"):
        restore(bad, target, force=True)
    assert rows_of(target) == before


def test_a_row_the_store_refuses_rolls_the_whole_restore_back(
    source: Source, tmp_path: Path
) -> None:
    """Two events with one id pass the file's checks, but not the store's primary key:
    nothing of the backup stays, the store's own rows are back, and the fix is named."""
    target = a_store_with_data(tmp_path / "target.db")
    before = rows_of(target)
    lines = lines_of(source.backup)
    event = next(line for line in lines[1:] if line["t"] == "events")
    lines[0]["tables"]["events"] += 1
    bad = write_lines(tmp_path / "twice.bak.gz", [*lines, event])
    with pytest.raises(BackupError, match=r"could not restore into .*Nothing was changed there"):
        restore(bad, target, force=True)
    assert rows_of(target) == before


def test_a_restore_that_fails_removes_the_sqlite_file_it_made(
    source: Source, tmp_path: Path
) -> None:
    lines = lines_of(source.backup)
    lines[0]["columns"]["jobs"] = [*lines[0]["columns"]["jobs"], "colour"]
    rows = [{**x, "r": {**x["r"], "colour": "red"}} if x.get("t") == "jobs" else x for x in lines]
    bad = write_lines(tmp_path / "colour.bak.gz", rows)
    fresh = tmp_path / "fresh.db"
    with pytest.raises(
        BackupError,
        match=r"the backup's jobs does not match schema revision \d+ \(no colour there\)",
    ):
        restore(bad, sqlite_url(fresh))
    assert not fresh.exists()
    assert not (tmp_path / "fresh.db-wal").exists()


def test_a_table_the_revision_does_not_have_is_named(source: Source, tmp_path: Path) -> None:
    lines = lines_of(source.backup)
    lines[0]["tables"]["teams"] = 0
    lines[0]["columns"]["teams"] = ["name"]
    bad = write_lines(tmp_path / "teams.bak.gz", lines)
    with pytest.raises(
        BackupError, match=r"the backup's teams does not match .*\(no teams there\)"
    ):
        restore(bad, sqlite_url(tmp_path / "fresh.db"))


# -- stores a restore must not load into -----------------------------------------------------


def test_a_database_of_something_else_is_refused_and_kept(source: Source, tmp_path: Path) -> None:
    path = tmp_path / "other.db"
    with closing(sqlite3.connect(path)) as c:
        c.execute("CREATE TABLE invoices (id INTEGER PRIMARY KEY, total REAL)")
        c.execute("INSERT INTO invoices VALUES (1, 9.5)")
        c.commit()
    with pytest.raises(
        BackupError, match=r"holds tables but no Boltforge store\. To fix: restore into an empty"
    ):
        restore(source.backup, sqlite_url(path), force=True)
    with closing(sqlite3.connect(path)) as c:
        assert c.execute("SELECT * FROM invoices").fetchall() == [(1, 9.5)]


def test_a_store_of_a_newer_server_is_refused_and_kept(source: Source, tmp_path: Path) -> None:
    target = a_store_with_data(tmp_path / "newer.db")
    engine = create_engine(target)
    with engine.begin() as c:
        c.execute(text("UPDATE alembic_version SET version_num = '0099'"))
    engine.dispose()
    before = rows_of(target)
    with pytest.raises(
        BackupError, match="is at schema revision 0099, which this bolt does not know"
    ):
        restore(source.backup, target, force=True)
    assert rows_of(target) == before


def test_a_store_with_data_names_what_it_holds(source: Source, tmp_path: Path) -> None:
    target = a_store_with_data(tmp_path / "full.db")
    with pytest.raises(StoreNotEmpty) as refused:
        restore(source.backup, target)
    said = str(refused.value)
    assert "already holds data (1 in jobs). To fix:" in said  # its job counter at 0 is no data
    assert "pass --force" in said


def test_a_moved_job_counter_is_data_too(source: Source, tmp_path: Path) -> None:
    """A store whose counter moved has handed out job numbers: a restore would hand them
    out again, so it is not empty."""
    path = tmp_path / "counted.db"
    with migrated(path) as db, db.engine.begin() as c:
        c.execute(text("UPDATE counters SET value = 12 WHERE name = 'job'"))
    with pytest.raises(StoreNotEmpty, match="1 in counters"):
        restore(source.backup, sqlite_url(path))


def test_an_older_backup_restores_into_a_migrated_empty_store_without_force(
    source: Source, tmp_path: Path
) -> None:
    """A new store at the newest schema counts as empty; it is stepped back to the backup's
    revision, loaded, and brought forward again."""
    older = write_lines(tmp_path / "0006.bak.gz", at_0006(lines_of(source.backup)))
    target = tmp_path / "new.db"
    with migrated(target):
        pass
    summary = restore(older, sqlite_url(target))
    assert (summary.revision, summary.replaced) == ("0006", 0)
    assert summary.schema == lines_of(source.backup)[0]["revision"]
    assert rows_of(sqlite_url(target))["jobs"] == rows_of(source.url)["jobs"]


# -- backups that cannot be taken ------------------------------------------------------------


def test_a_database_with_no_store_in_it_is_not_backed_up(tmp_path: Path) -> None:
    path = tmp_path / "plain.db"
    with closing(sqlite3.connect(path)) as c:
        c.execute("CREATE TABLE t (x INTEGER)")
    out = tmp_path / "out.bak.gz"
    with pytest.raises(BackupError, match=r"holds no Boltforge store \(no schema revision\)"):
        backup(sqlite_url(path), out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plain.db"]


@pytest.mark.parametrize(
    ("where", "says"),
    [
        ("missing/folder/out.bak.gz", "To fix: pass a path in a folder that exists"),
        ("a-folder", "To fix: pass a file path, not a folder"),
    ],
    ids=["no such folder", "a folder"],
)
def test_a_backup_that_cannot_be_written_says_where_and_leaves_nothing(
    source: Source, tmp_path: Path, where: str, says: str
) -> None:
    (tmp_path / "a-folder").mkdir()
    with pytest.raises(BackupError, match=says) as refused:
        backup(source.url, tmp_path / where)
    assert f"cannot write {tmp_path / where}" in str(refused.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-folder"]
    assert list((tmp_path / "a-folder").iterdir()) == []


def test_a_database_kind_this_bolt_cannot_open_is_named(tmp_path: Path) -> None:
    with pytest.raises(BackupError, match=r"cannot open nosuchdb://h/db: .*To fix: check --db"):
        backup("nosuchdb://h/db", tmp_path / "out.bak.gz")


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        (
            "postgresql+psycopg://bob:s3cret@db.example/store",
            "postgresql+psycopg://bob:***@db.example/store",
        ),
        ("sqlite:////var/lib/bolt/store.db", "sqlite:////var/lib/bolt/store.db"),
        ("not a url", "not a url"),
    ],
    ids=["password hidden", "sqlite as it is", "not a URL"],
)
def test_urls_in_messages_never_show_a_password(url: str, shown: str) -> None:
    assert shown_url(url) == shown


# -- the values of the file ------------------------------------------------------------------

TYPED = Table(
    "typed",
    MetaData(),
    Column("id", Integer, primary_key=True),
    Column("f", Float),
    Column("b", LargeBinary),
    Column("dt", DateTime),
    Column("d", Date),
    Column("n", Numeric),
    Column("s", String),
    Column("j", JSON),
)


def through_the_file(row: dict[str, Any]) -> dict[str, Any]:
    """``row`` written as a backup line and read back."""
    line = json.loads(json.dumps(encoded_row(TYPED, row), allow_nan=False))
    return decoded_row(TYPED, line)


ROW = {"id": 1, "f": 0.5, "b": None, "dt": None, "d": None, "n": None, "s": None, "j": None}


@pytest.mark.parametrize(
    ("column", "value", "written"),
    [
        ("f", float("inf"), {"$float": "inf"}),
        ("f", float("-inf"), {"$float": "-inf"}),
        ("b", b"\x00\xff", {"$bytes": "AP8="}),
        ("dt", datetime(2027, 1, 15, 8, 0, tzinfo=UTC), {"$datetime": "2027-01-15T08:00:00+00:00"}),
        ("d", date(2027, 1, 15), {"$date": "2027-01-15"}),
        ("n", Decimal("0.1"), {"$decimal": "0.1"}),
        ("f", 1 / 3, 1 / 3),
        ("s", "naïve ☃", "naïve ☃"),
    ],
    ids=["inf", "-inf", "bytes", "datetime", "date", "decimal", "plain float", "text"],
)
def test_a_value_json_cannot_carry_exactly_is_written_with_a_marker_and_read_back(
    column: str, value: Any, written: Any
) -> None:
    row = {**ROW, column: value}
    assert encoded_row(TYPED, row)[column] == written
    assert through_the_file(row)[column] == value


def test_nan_comes_back_as_nan() -> None:
    back = through_the_file({**ROW, "f": float("nan")})
    assert math.isnan(back["f"])


def test_a_json_column_is_never_read_as_a_marker() -> None:
    """A job spec may hold anything, including what looks like a marker."""
    value = {"$float": "nan"}
    row = {**ROW, "j": value}
    assert encoded_row(TYPED, row)["j"] == value
    assert through_the_file(row)["j"] == value


def test_a_value_of_a_type_the_file_cannot_carry_is_refused_naming_it() -> None:
    with pytest.raises(BackupError, match=r"cannot back up a value of type set\. To fix: report"):
        encoded_row(TYPED, {**ROW, "s": {"a"}})


@settings(max_examples=80, deadline=None)
@given(
    f=st.floats(allow_nan=False),
    b=st.binary(max_size=40),
    n=st.decimals(allow_nan=False, allow_infinity=False, places=4),
    s=st.text(max_size=20),
    j=st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=5),
        lambda kids: (
            st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=5), kids, max_size=3)
        ),
        max_leaves=8,
    ),
)
def test_every_value_comes_back_exactly(f: float, b: bytes, n: Decimal, s: str, j: Any) -> None:
    row = {**ROW, "f": f, "b": b, "n": n, "s": s, "j": j}
    assert through_the_file(row) == row


# -- progress --------------------------------------------------------------------------------


def test_a_backup_and_its_restore_report_each_table_from_zero_to_its_count(
    source: Source, tmp_path: Path
) -> None:
    seen: list[tuple[str, int, int]] = []
    path = tmp_path / "again.bak.gz"
    summary = backup(source.url, path, lambda t, done, total: seen.append((t, done, total)))
    assert summary.bytes == path.stat().st_size
    assert summary.rows == sum(summary.tables.values())
    assert_progress(seen, summary.tables)

    seen.clear()
    restored = restore(
        path, sqlite_url(tmp_path / "restored.db"), progress=lambda *a: seen.append(a)
    )
    assert restored.rows == summary.rows and restored.replaced == 0
    assert_progress(seen, summary.tables)


def assert_progress(seen: list[tuple[str, int, int]], tables: dict[str, int]) -> None:
    by_table: dict[str, list[int]] = {}
    for table, done, total in seen:
        assert total == tables[table]
        by_table.setdefault(table, []).append(done)
    assert set(by_table) == set(tables)
    for table, counts in by_table.items():
        assert counts[0] == 0 and counts[-1] == tables[table], table
        assert counts == sorted(counts), table


@pytest.mark.parametrize(
    ("items", "size", "expected"),
    [(range(5), 2, [[0, 1], [2, 3], [4]]), (range(4), 2, [[0, 1], [2, 3]]), ([], 3, [])],
    ids=["a short last chunk", "even", "nothing"],
)
def test_rows_go_a_batch_at_a_time(items: Any, size: int, expected: list[list[int]]) -> None:
    assert list(chunks(items, size)) == expected


def test_a_restored_store_is_a_working_store(source: Source, tmp_path: Path) -> None:
    url = sqlite_url(tmp_path / "working.db")
    restore(source.backup, url)
    db = Database(url)
    try:
        db.migrate()  # nothing left to do
        with db.session() as s:
            job = a_job(s, "pending")  # new rows get new ids
            s.add(EventRow(job_id=job.id, at=9.0, kind="queued", message="q", data={}))
            s.flush()
            ids = sorted(s.scalars(select(EventRow.id)))
            assert len(ids) == 4 and len(set(ids)) == 4
    finally:
        db.close()

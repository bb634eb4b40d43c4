"""Backing up the store while the server runs, and restoring it into a fresh store a new
server carries on from: the real server app in-process on SQLite and PostgreSQL (the test
plays the agents), the backup file's format, its checks, and what a failure leaves behind."""

from __future__ import annotations

import errno
import gzip
import json
import math
import shutil
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory
from control_kit import ADMIN, Fleet, fresh_database, make_spec, postgres_server, store_url
from sqlalchemy import create_engine, inspect, select
from sqlalchemy.orm import Session

from boltforge.control.store.backups import BackupError, StoreNotEmpty, backup, batches, restore
from boltforge.control.store.db import MIGRATIONS, Database
from boltforge.control.store.models import Base, JobRow, LeaderRow

__all__ = ["postgres_server", "store_url"]  # fixtures used by name

HEAD = ScriptDirectory(str(MIGRATIONS)).get_current_head()
Rows = dict[str, list[dict[str, Any]]]


@dataclass(frozen=True)
class Story:
    """What a store holds after some work: a job that succeeded, one running on two hosts
    (with logs and progress), one waiting for the whole fleet, a member's token, and the
    agents' sessions (which they keep when the control plane moves)."""

    done: str
    train: str
    big: str
    token: str
    sessions: dict[str, str]


def some_work(fleet: Fleet) -> Story:
    done = fleet.submit(make_spec("done", 8))
    fleet.start_everything()
    fleet.finish(done)
    train = fleet.submit(make_spec("train", 16))
    fleet.start_everything()
    for rank, (node, rep) in enumerate(replicas_of(fleet, train)):
        where = {"replica": rep.replica, "job": train, "epoch": rep.epoch}
        node.report(
            logs=[{**where, "seq": 1, "data": f"rank {rank}: step 10\n"}],
            progress=[{**where, "rank": rank, "step": 10, "at": fleet.clock(), "step_time_s": 0.5}],
        )
    big = fleet.submit(make_spec("big", 32))
    alice = {"name": "alice", "role": "member", "team": "research"}
    token = fleet.post("/v1/tokens", alice).json()["token"]
    sessions = {name: node.session for name, node in fleet.nodes.items()}
    return Story(done, train, big, token, sessions)


def replicas_of(fleet: Fleet, job: str) -> list[tuple[Any, Any]]:
    return [(n, r) for n in fleet.nodes.values() for r in n.to_run() if r.job == job]


def rows_of(url: str) -> Rows:
    """Every row of every data table of the store at ``url`` (newest schema), in key order
    (not the servers' lease, which backups leave out)."""
    engine = create_engine(url)
    try:
        with engine.connect() as c:
            return {
                t.name: [dict(r._mapping) for r in c.execute(select(t).order_by(*t.primary_key))]
                for t in Base.metadata.sorted_tables
                if t.name != "leader"
            }
    finally:
        engine.dispose()


def lines_of(path: Path) -> list[dict[str, Any]]:
    with gzip.open(path, "rt") as f:
        return [json.loads(line) for line in f]


def rows_in_file(path: Path) -> Rows:
    header, *rows = lines_of(path)
    out: Rows = {name: [] for name in header["tables"]}
    for line in rows:
        out[line["t"]].append(line["r"])
    return out


def as_written(rows: Rows) -> Rows:
    """``rows`` as the backup file writes them: a column's infinity or NaN as a marker."""

    def value(v: Any) -> Any:
        return {"$float": repr(v)} if isinstance(v, float) and not math.isfinite(v) else v

    return {t: [{k: value(v) for k, v in row.items()} for row in r] for t, r in rows.items()}


def sqlite(path: Path) -> str:
    return f"sqlite:///{path}"


@contextmanager
def carried_on(tmp: Path, url: str, sessions: dict[str, str]) -> Iterator[Fleet]:
    """A new server on the restored store at ``url``, whose agents kept running through the
    move: they heartbeat with the sessions they had (nothing registers again)."""
    fleet = Fleet(tmp, db_url=url)
    with fleet.http:
        for name, node in fleet.nodes.items():
            node.session = sessions[name]
            assert node.heartbeat() == 200, f"{name}'s lease did not carry over"
        fleet.settle()
        yield fleet


@dataclass(frozen=True)
class Made:
    """A store after some work (its server stopped), and a backup of it."""

    url: str
    story: Story
    backup: Path


TRICKY = {
    "name": "naïve ☃ 训练",
    "attained_gpu_s": 1 / 3,
    "last_checkpoint_at": float("inf"),
    "estimated_start": float("-inf"),
    "borrowed": True,
    "waiting": ["capacity", 'a "quoted"\nline'],
    "recovery_hold": {"at": 0.1 + 0.2, "lost": ["host-1"], "grants": [{"gpus": [0, 7]}]},
}


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> Made:
    """The story's store, with values that are hard to carry exactly in one job's row
    (non-ASCII text, 1/3, infinities, nested JSON, big integers), and a backup of it."""
    home = tmp_path_factory.mktemp("made")
    with Fleet(home) as fleet:
        story = some_work(fleet)
    url = fleet.config.db_url
    engine = create_engine(url)
    with Session(engine) as s, s.begin():
        job = s.get_one(JobRow, story.done)
        for name, value in TRICKY.items():
            setattr(job, name, value)
        job.spec = {**job.spec, "lr": 0.1 + 0.2, "seed": 2**62 + 1, "tiny": 5e-324}
    engine.dispose()
    path = home / "store.bak.gz"
    backup(url, path)
    return Made(url, story, path)


# -- a new server carries on ---------------------------------------------------------------------


def test_a_server_on_the_restored_store_carries_on_where_the_backed_up_one_was(
    tmp_path: Path, store_url: str
) -> None:
    path = tmp_path / "store.bak.gz"
    with Fleet(tmp_path / "old") as old:
        story = some_work(old)
        before = {job: old.job(job) for job in (story.done, story.train, story.big)}
        backup(old.config.db_url, path)  # while the server runs
    restore(path, store_url)

    with carried_on(tmp_path / "new", store_url, story.sessions) as new:
        for job, then in before.items():
            now = new.job(job)
            assert (now.state, now.epoch, now.placement) == (then.state, then.epoch, then.placement)
            assert now.events == then.events
        assert [before[j].state for j in before] == ["succeeded", "running", "pending"]
        alice = {"Authorization": f"Bearer {story.token}"}
        assert new.http.get("/v1/whoami", headers=alice).json() == {
            "name": "alice",
            "role": "member",
            "team": "research",
        }
        assert new.http.get("/v1/jobs", headers=ADMIN).status_code == 200

        new.finish(story.train)
        assert new.job(story.train).state == "succeeded"
        new.start_everything()
        big = new.job(story.big)
        assert big.state == "running" and len(big.placement) == 4
        new.no_gpu_held_twice()
        assert new.submit(make_spec("next", 8)) == "4"  # the job counter carried over too


def test_a_backup_is_one_snapshot_while_the_server_writes(tmp_path: Path, store_url: str) -> None:
    path = tmp_path / "store.bak.gz"
    with Fleet(tmp_path, db_url=store_url) as fleet:
        some_work(fleet)
        made_meanwhile: list[str] = []

        def meanwhile(table: str, done: int, total: int) -> None:
            """Once the backup has begun reading, an admin makes a token: a token row and
            its audit row, in one transaction."""
            if not made_meanwhile:
                reply = fleet.post("/v1/tokens", {"name": "late", "role": "viewer"})
                made_meanwhile.append(reply.json()["name"])

        backup(store_url, path, meanwhile)
    assert made_meanwhile == ["late"]
    assert tokens_and_their_audit(rows_of(store_url)) == (
        {"admin", "agents", "alice", "late"},
        {"alice", "late"},
    )
    assert tokens_and_their_audit(rows_in_file(path)) == ({"admin", "agents", "alice"}, {"alice"})


def tokens_and_their_audit(rows: Rows) -> tuple[set[str], set[str]]:
    """The tokens' names, and whom the audit log says tokens were made for."""
    made = {a["target"] for a in rows["audit"] if a["action"] == "create-token"}
    return {t["name"] for t in rows["tokens"]}, made


# -- every row comes back ------------------------------------------------------------------------


def test_every_row_of_every_table_comes_back_exactly(made: Made, tmp_path: Path) -> None:
    target = sqlite(tmp_path / "restored.db")
    summary = restore(made.backup, target)
    source = rows_of(made.url)
    assert rows_of(target) == source
    assert rows_in_file(made.backup) == as_written(source)
    assert summary.tables == {name: len(rows) for name, rows in source.items()}
    held = {name for name, rows in source.items() if rows}
    assert held >= {"jobs", "events", "replicas", "runs", "logs", "rank_progress", "nodes"}
    assert held >= {"tokens", "audit", "counters"}
    [job] = [j for j in rows_of(target)["jobs"] if j["id"] == made.story.done]
    assert {name: job[name] for name in TRICKY} == TRICKY
    assert (job["spec"]["lr"], job["spec"]["seed"]) == (0.1 + 0.2, 2**62 + 1)


def test_a_sqlite_backup_restores_into_postgresql_and_back(
    made: Made, postgres_server: str, tmp_path: Path
) -> None:
    pg = fresh_database(postgres_server)
    restore(made.backup, pg)
    assert rows_of(pg) == rows_of(made.url)

    again = tmp_path / "from-postgresql.bak.gz"
    summary = backup(pg, again)
    assert summary.revision == HEAD and rows_in_file(again) == rows_in_file(made.backup)
    back = sqlite(tmp_path / "back.db")
    restore(again, back)
    assert rows_of(back) == rows_of(made.url)


def test_the_file_is_gzip_json_lines_under_a_header_that_counts_every_table(made: Made) -> None:
    header, *rows = lines_of(made.backup)
    source = rows_of(made.url)
    assert header["format"] == "boltforge-backup" and header["version"] == 1
    assert header["revision"] == HEAD
    assert header["tables"] == {name: len(r) for name, r in source.items()}
    assert "alembic_version" not in header["tables"]
    assert list(header["tables"]).index("jobs") < list(header["tables"]).index("events")
    assert all(set(line) == {"t", "r"} for line in rows)
    [job] = [line["r"] for line in rows if line["r"].get("id") == made.story.done]
    assert job["last_checkpoint_at"] == {"$float": "inf"}  # JSON has no infinity


def test_a_backup_of_an_older_schema_is_restored_at_its_revision_then_upgraded(
    made: Made, tmp_path: Path
) -> None:
    old = tmp_path / "old.db"
    copy_store(made.url, old)
    downgrade(sqlite(old), "0005")
    path = tmp_path / "old.bak.gz"
    assert backup(sqlite(old), path).revision == "0005"
    assert "leader" not in lines_of(path)[0]["tables"]

    fresh = sqlite(tmp_path / "fresh.db")
    assert restore(path, fresh).schema == HEAD
    # what 0006 and later added is at its defaults (0009's nodes claimed: none yet)
    assert rows_of(fresh) == unclaimed(rows_of(made.url))

    newer = sqlite(tmp_path / "newer.db")  # a store ahead of the backup steps back first
    restore(made.backup, newer)
    summary = restore(path, newer, force=True)
    assert summary.schema == HEAD and rows_of(newer) == unclaimed(rows_of(made.url))


def unclaimed(rows: Rows) -> Rows:
    """``rows`` as a store before revision 0009 upgraded would hold them: no node claimed
    by an agent token, and no tokens' change counter."""
    counters = [c for c in rows["counters"] if c["name"] != "tokens"]
    return {**rows, "node_claims": [], "counters": counters}


def copy_store(url: str, to: Path) -> None:
    """Copy the SQLite store at ``url`` to the file ``to``, with what is still in its WAL."""
    source = url.removeprefix("sqlite:///")
    with closing(sqlite3.connect(source)) as live, closing(sqlite3.connect(to)) as copy:
        live.backup(copy)


def downgrade(url: str, revision: str) -> None:
    """Take the store at ``url`` back to ``revision`` with its rows (as an older server's)."""
    engine = create_engine(url)
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.downgrade(config, revision)
    engine.dispose()


# -- the target must be empty ---------------------------------------------------------------------


def test_a_store_that_holds_data_is_refused_and_left_as_it_was(made: Made, tmp_path: Path) -> None:
    with Fleet(tmp_path, hosts=1) as other:
        other.submit(make_spec("theirs", 8))
    target = other.config.db_url
    theirs = rows_of(target)
    with pytest.raises(StoreNotEmpty, match=r"already holds data .*--force"):
        restore(made.backup, target)
    assert rows_of(target) == theirs

    summary = restore(made.backup, target, force=True)
    assert summary.replaced == sum(len(rows) for rows in theirs.values())
    assert rows_of(target) == rows_of(made.url)


def test_a_store_that_only_its_migrations_wrote_to_counts_as_empty(
    made: Made, tmp_path: Path
) -> None:
    target = sqlite(tmp_path / "migrated.db")
    db = Database(target)
    db.migrate()
    db.close()
    assert any(rows_of(target).values())  # the job counter, at 0
    assert restore(made.backup, target).replaced == 0
    assert rows_of(target) == rows_of(made.url)


def power_cut(table: str, done: int, total: int) -> None:
    """The restore is cut off once it has inserted some events."""
    if table == "events" and done:
        raise KeyboardInterrupt


def test_a_restore_cut_off_midway_leaves_the_store_as_it_was(
    made: Made, tmp_path: Path, store_url: str
) -> None:
    with Fleet(tmp_path, hosts=1, db_url=store_url) as other:
        other.submit(make_spec("theirs", 8))
    theirs = rows_of(store_url)
    with pytest.raises(KeyboardInterrupt):
        restore(made.backup, store_url, force=True, progress=power_cut)
    assert rows_of(store_url) == theirs

    fresh = tmp_path / "fresh.db"
    with pytest.raises(KeyboardInterrupt):
        restore(made.backup, sqlite(fresh), progress=power_cut)
    assert not fresh.exists()


def test_a_row_postgresql_cannot_hold_fails_the_whole_restore(
    made: Made, postgres_server: str, tmp_path: Path
) -> None:
    """SQLite keeps a name longer than its column's 63 characters; PostgreSQL does not."""
    long_name = tmp_path / "long-name.db"
    copy_store(made.url, long_name)
    engine = create_engine(sqlite(long_name))
    with Session(engine) as s, s.begin():
        s.get_one(JobRow, made.story.train).name = "x" * 64
    engine.dispose()
    path = tmp_path / "long-name.bak.gz"
    backup(sqlite(long_name), path)

    pg = fresh_database(postgres_server)
    with pytest.raises(BackupError, match=r"value too long .* Nothing was changed there"):
        restore(path, pg)
    engine = create_engine(pg)
    assert inspect(engine).get_table_names() == []  # not even the schema stayed
    engine.dispose()


# -- files that are not a complete backup ------------------------------------------------------


def rewritten(change: Callable[[list[dict[str, Any]]], list[dict[str, Any]]]) -> Any:
    """A bad file made by changing the lines of a good backup."""

    def make(good: bytes) -> bytes:
        lines = [json.loads(line) for line in gzip.decompress(good).splitlines()]
        return gzip.compress("".join(json.dumps(x) + "\n" for x in change(lines)).encode())

    return make


def with_header(**change: Any) -> Any:
    return rewritten(lambda lines: [{**lines[0], **change}, *lines[1:]])


BAD_FILES: dict[str, tuple[Callable[[bytes], bytes], str]] = {
    "empty": (lambda good: b"", "is not a Boltforge backup"),
    "not gzip": (lambda good: b"id,name\n1,train\n", r"is not a Boltforge backup \(not gzip\)"),
    "a gzip of a CSV": (lambda good: gzip.compress(b"id,name\n1,train\n"), "not a Boltforge"),
    "a gzip of other JSON": (lambda good: gzip.compress(b'{"a": 1}\n'), "not a Boltforge backup"),
    "cut short": (lambda good: good[: len(good) // 2], "is truncated or damaged"),
    "a row missing": (rewritten(lambda lines: lines[:-1]), "holds .* rows where its header"),
    "a row of no table": (
        rewritten(lambda lines: [*lines, {"t": "teams", "r": {}}]),
        "not a row of a table it lists",
    ),
    "a newer format": (with_header(version=2), "format version 2, newer than this bolt"),
    "an unknown revision": (with_header(revision="9999"), "revision 9999, which this bolt's"),
}


@pytest.mark.parametrize("case", BAD_FILES, ids=list(BAD_FILES))
def test_a_file_that_is_not_a_complete_backup_is_refused_before_the_store_is_touched(
    made: Made, tmp_path: Path, case: str
) -> None:
    damage, says = BAD_FILES[case]
    bad = tmp_path / "bad.bak.gz"
    bad.write_bytes(damage(made.backup.read_bytes()))
    target = tmp_path / "target.db"
    with pytest.raises(BackupError, match=says) as refused:
        restore(bad, sqlite(target))
    assert "To fix:" in str(refused.value)
    assert not target.exists()


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(BackupError, match=r"no file at .*nothing\.gz\. To fix"):
        restore(tmp_path / "nothing.gz", sqlite(tmp_path / "target.db"))


# -- a failed backup leaves no file that looks complete --------------------------------------------


Failure = Callable[[pytest.MonkeyPatch], tuple[Callable[[str, int, int], None] | None, type]]


def disk_fills_up(monkeypatch: pytest.MonkeyPatch) -> tuple[None, type[BaseException]]:
    """The disk is full from the third write of the backup on."""
    monkeypatch.setattr(batches, "BATCH", 2)
    writes = iter(range(1_000_000))
    real = gzip.GzipFile.write

    def write(self: gzip.GzipFile, data: Any) -> int:
        if next(writes) >= 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, data)

    monkeypatch.setattr(gzip.GzipFile, "write", write)
    return None, BackupError


def interrupted(
    monkeypatch: pytest.MonkeyPatch,
) -> tuple[Callable[[str, int, int], None], type[BaseException]]:
    """The operator presses Ctrl-C once the backup is into the jobs."""

    def progress(table: str, done: int, total: int) -> None:
        if table == "jobs":
            raise KeyboardInterrupt

    return progress, KeyboardInterrupt


@pytest.mark.parametrize("failure", [disk_fills_up, interrupted])
def test_a_failed_backup_leaves_the_previous_one_and_no_partial_file(
    made: Made, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failure: Failure
) -> None:
    path = tmp_path / "nightly.bak.gz"
    shutil.copy(made.backup, path)
    progress, raised = failure(monkeypatch)
    with pytest.raises(raised):
        backup(made.url, path, progress)
    assert path.read_bytes() == made.backup.read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["nightly.bak.gz"]


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("postgresql+psycopg://nobody@127.0.0.1:1/store", "cannot reach the store at"),
        ("sqlite:///{tmp}/no-store-here.db", "no store at"),
        ("not a url", "is not a database URL"),
    ],
    ids=["unreachable", "no such SQLite file", "not a URL"],
)
def test_a_store_that_cannot_be_read_leaves_no_file(tmp_path: Path, url: str, says: str) -> None:
    path = tmp_path / "store.bak.gz"
    with pytest.raises(BackupError, match=says):
        backup(url.format(tmp=tmp_path), path)
    assert list(tmp_path.iterdir()) == []  # no backup, no partial, no empty SQLite store


def test_the_servers_lease_is_neither_backed_up_nor_counted_as_data(
    made: Made, tmp_path: Path
) -> None:
    """The leader lease belongs to the servers running on a store: a backup leaves it out,
    and a fresh store whose replicas already hold a lease still takes a restore."""
    assert "leader" not in rows_in_file(made.backup)
    target = sqlite(tmp_path / "replicated.db")
    db = Database(target)
    db.migrate()
    with db.session() as s:
        s.add(LeaderRow(id=1, holder="r0", url="u", term=4, renewals=9, lease_s=3, acquired_at=0))
    db.close()

    restore(made.backup, target)  # no --force needed
    engine = create_engine(target)
    with engine.connect() as c:
        assert c.execute(select(LeaderRow.holder, LeaderRow.term)).all() == [("r0", 4)]
    engine.dispose()

"""The store's schema migrations on SQLite: a new store gets exactly the tables and columns
``models.py`` declares, a store left by an older server is brought up to date with its rows
kept (and the new columns at their defaults), every step can be taken back, and a store
this software cannot migrate is refused without being touched."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, create_engine, inspect, select, text
from store_builders import T0, sqlite_url

from boltforge.control.auth import Caller, digest, generation, lookup
from boltforge.control.store.db import MIGRATIONS, Database
from boltforge.control.store.models import Base, JobRow, LeaderRow, NodeRow, RunRow, TokenRow

SCRIPT = ScriptDirectory(str(MIGRATIONS))
HEAD = SCRIPT.get_current_head() or "base"
OLDER = [r.revision for r in reversed(list(SCRIPT.walk_revisions())) if r.revision != HEAD]

# What each revision added: (revision, table, column); a column of None: the whole table.
ADDED: list[tuple[str, str, str | None]] = [
    ("0002", "runs", "checkpoint_at"),
    ("0003", "nodes", "reclaim_at"),
    ("0004", "jobs", "recovery_hold"),
    ("0004", "nodes", "degraded_until"),
    ("0005", "jobs", "resized_at"),
    ("0006", "runs", "cpus"),
    ("0007", "leader", None),
    ("0008", "services", None),
    ("0008", "jobs", "service"),
    ("0008", "runs", "gpu_share"),
    ("0009", "tokens", "nodes"),
    ("0009", "tokens", "expires_at"),
    ("0009", "tokens", "revoked_at"),
    ("0009", "tokens", "last_used_at"),
    ("0009", "node_claims", None),
]


def config(conn: Connection) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.attributes["connection"] = conn
    return cfg


@contextmanager
def connection(path: Path) -> Iterator[Connection]:
    engine = create_engine(sqlite_url(path))
    try:
        with engine.begin() as conn:
            yield conn
    finally:
        engine.dispose()


def revision_of(path: Path) -> str | None:
    with connection(path) as conn:
        return MigrationContext.configure(conn).get_current_revision()


def columns(path: Path) -> dict[str, set[str]]:
    engine = create_engine(sqlite_url(path))
    try:
        found = inspect(engine)
        return {t: {c["name"] for c in found.get_columns(t)} for t in found.get_table_names()}
    finally:
        engine.dispose()


def an_old_servers_rows(conn: Connection) -> None:
    """A job, its node, a replica and an open run, written with only the columns the very
    first schema has (as the oldest server wrote them)."""
    conn.execute(
        text(
            "INSERT INTO jobs (id, num, name, team, queue, user, priority, state, spec, gpus,"
            " replicas, submitted_at, epoch, restarts, preemptions, attained_gpu_s, borrowed,"
            " reason, waiting, explanation) VALUES ('7', 7, 'train', 'research', 'research',"
            " 'alice', 2, 'running', '{\"gpus\": 8}', 8, 1, :t, 1, 0, 0, 0.0, 0, '', '[]', '[]')"
        ),
        {"t": T0},
    )
    conn.execute(
        text(
            "INSERT INTO nodes (name, inventory, pool, pod, rack, gpus, state, cordoned,"
            " session, registered_at, desired_version, health) VALUES ('host-0', '{}', 'h100',"
            " 'p0', 'r0', 8, 'ready', 0, 's1', :t, 3, '{}')"
        ),
        {"t": T0},
    )
    conn.execute(
        text(
            "INSERT INTO runs (job_id, epoch, queue, team, gpus, dollars_per_hour, started_at)"
            " VALUES ('7', 1, 'research', 'research', 8, 24.0, :t)"
        ),
        {"t": T0},
    )
    conn.execute(text("UPDATE counters SET value = 7 WHERE name = 'job'"))


def store_at(path: Path, revision: str, rows: bool = True) -> Path:
    """An older server's store at ``revision``, holding ``an_old_servers_rows``."""
    with connection(path) as conn:
        command.upgrade(config(conn), "0001")
        if rows:
            an_old_servers_rows(conn)
        command.upgrade(config(conn), revision)
    return path


# -- a new store -------------------------------------------------------------------------------


def test_a_new_store_has_exactly_the_schema_the_models_declare(tmp_path: Path) -> None:
    db = Database(sqlite_url(tmp_path / "new.db"))
    try:
        db.migrate()
        with db.engine.connect() as conn:
            assert compare_metadata(MigrationContext.configure(conn), Base.metadata) == []
    finally:
        db.close()
    assert revision_of(tmp_path / "new.db") == HEAD
    assert set(columns(tmp_path / "new.db")) == {*Base.metadata.tables, "alembic_version"}


def test_the_revisions_form_one_line_from_the_first_to_the_head() -> None:
    heads = SCRIPT.get_heads()
    assert heads == [HEAD]
    assert [f"{n:04d}" for n in range(1, len(OLDER) + 1)] == OLDER


# -- an older store ----------------------------------------------------------------------------


@pytest.mark.parametrize("revision", OLDER)
def test_an_older_store_is_brought_up_to_date_with_its_rows_kept(
    tmp_path: Path, revision: str
) -> None:
    path = store_at(tmp_path / "old.db", revision)
    db = Database(sqlite_url(path))
    try:
        db.migrate()
        with db.session() as s:
            job = s.get_one(JobRow, "7")
            assert (job.name, job.state, job.spec, job.user) == (
                "train",
                "running",
                {"gpus": 8},
                "alice",
            )
            assert (job.resized_at, job.recovery_hold) == (None, None)
            node = s.get_one(NodeRow, "host-0")
            assert (node.session, node.desired_version) == ("s1", 3)
            assert (node.reclaim_at, node.degraded_until) == (None, None)
            [run] = s.scalars(select(RunRow))
            assert (run.dollars_per_hour, run.ended_at) == (24.0, None)
            assert (run.cpus, run.checkpoint_at) == (0.0, None)  # what later versions added
            assert s.scalars(select(LeaderRow)).all() == []  # nobody leads yet
    finally:
        db.close()
    assert revision_of(path) == HEAD
    assert columns(path)["jobs"] == set(JobRow.__table__.columns.keys())


def test_a_store_part_way_up_continues_from_where_it_stopped(tmp_path: Path) -> None:
    path = store_at(tmp_path / "half.db", "0004")
    assert "resized_at" not in columns(path)["jobs"]
    assert "recovery_hold" in columns(path)["jobs"]
    db = Database(sqlite_url(path))
    try:
        db.migrate()
    finally:
        db.close()
    assert "resized_at" in columns(path)["jobs"]
    assert revision_of(path) == HEAD


# -- every step can be taken back --------------------------------------------------------------


def test_each_revision_can_be_taken_back_removing_only_what_it_added(tmp_path: Path) -> None:
    path = store_at(tmp_path / "down.db", HEAD)
    for revision in sorted([HEAD, *OLDER[1:]], reverse=True):
        before = columns(path)
        with connection(path) as conn:
            command.downgrade(config(conn), "-1")
        after = columns(path)
        whole = {t for r, t, c in ADDED if r == revision and c is None}
        assert set(before) - set(after) == whole  # the tables it made, and no other
        gone = {(t, c) for t in before for c in before[t]} - {
            (t, c) for t in after for c in after[t]
        }
        expected = {(t, c) for r, t, c in ADDED if r == revision and c is not None}
        assert {(t, c) for t, c in gone if t not in whole} == expected
    with connection(path) as conn:
        assert conn.execute(text("SELECT name, value FROM counters")).all() == [("job", 7)]
        assert conn.execute(text("SELECT id, state FROM jobs")).all() == [("7", "running")]
    with connection(path) as conn:
        command.downgrade(config(conn), "base")
    assert set(columns(path)) == {"alembic_version"}


# -- what cannot be migrated -------------------------------------------------------------------


def test_a_store_from_a_newer_server_is_refused_and_left_as_it_was(tmp_path: Path) -> None:
    path = store_at(tmp_path / "newer.db", HEAD)
    with connection(path) as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = '0099'"))
    before = columns(path)
    db = Database(sqlite_url(path))
    try:
        with pytest.raises(Exception, match="0099"):
            db.migrate()
    finally:
        db.close()
    assert revision_of(path) == "0099"
    assert columns(path) == before


def test_migrations_run_only_through_the_store(tmp_path: Path) -> None:
    """Alembic pointed at the migrations by hand (no connection handed over) is told how
    they are meant to run, rather than opening a database of its own."""
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    with pytest.raises(RuntimeError, match=r"Database\.migrate"):
        command.upgrade(cfg, "head")


def test_the_first_revision_seeds_the_job_counter_at_zero(tmp_path: Path) -> None:
    path = store_at(tmp_path / "seed.db", "0001", rows=False)
    with connection(path) as conn:
        rows = list(conn.execute(text("SELECT name, value FROM counters")).all())
    assert rows == [("job", 0)]


def test_tokens_of_an_older_store_keep_working_unbound_and_unexpiring(tmp_path: Path) -> None:
    """0009 adds bindings, expiry and revocation: a token made before works on as it did
    (an agent's claiming the nodes it is the first to act for), and the change counter
    starts at 0."""
    path = store_at(tmp_path / "tokens.db", "0008", rows=False)
    with connection(path) as conn:
        for name, role in (("ops", "admin"), ("agents", "agent")):
            conn.execute(
                text(
                    "INSERT INTO tokens (name, role, digest, created_at)"
                    " VALUES (:name, :role, :digest, :at)"
                ),
                {"name": name, "role": role, "digest": digest(f"{name}-token"), "at": T0},
            )
    db = Database(sqlite_url(path))
    try:
        db.migrate()
        with db.session() as s:
            agent = lookup(s, "agents-token", T0)
            assert lookup(s, "ops-token", T0) == Caller("ops", "admin")
            assert agent is not None and agent.nodes is not None and agent.nodes.claims
            row = s.scalar(select(TokenRow).where(TokenRow.name == "agents"))
            assert row is not None
            assert (row.nodes, row.expires_at, row.revoked_at, row.last_used_at) == (
                *(None, None, None, None),
            )
            assert generation(s) == 0
    finally:
        db.close()

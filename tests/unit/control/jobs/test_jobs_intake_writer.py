"""The submission writer (``jobs/intake.py``) on a real SQLite store, without a server: each
order lands whole (its jobs, their first timeline lines, its audit entry) or not at all;
numbers have no gaps; an idempotency key used twice fails only the second order, however
the orders were grouped; and a failure reaches every waiting request."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session
from store_builders import T0, migrated, rows_in, spec_dict

from boltforge.control.auth import Caller
from boltforge.control.jobs.intake import Intake, Order, Rows
from boltforge.control.jobs.submit import parse_request
from boltforge.control.store.db import Database
from boltforge.control.store.models import AuditRow, CounterRow, EventRow, JobRow
from boltforge.wire.jobs import SubmitRequest

ALICE = Caller("alice", "member", "research", source="10.0.0.7")


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Database]:
    with migrated(tmp_path / "intake.db") as store:
        yield store


@pytest.fixture
def stored() -> list[Rows]:
    return []


@pytest.fixture
def intake(db: Database, stored: list[Rows]) -> Iterator[Intake]:
    writer = Intake(db, stored.append)
    yield writer
    writer.close()


def order(
    name: str = "train",
    key: str | None = None,
    array: str | None = None,
    warnings: tuple[str, ...] = (),
    **spec: Any,
) -> Order:
    job, tasks = parse_request(SubmitRequest(spec=spec_dict(name, **spec), array=array))
    return Order(job, tasks, None, ALICE, T0, key, warnings)


def write(intake: Intake, *orders: Order) -> list[Rows | BaseException]:
    """Hand ``orders`` to the writer at once; each one's rows or error."""

    async def main() -> list[Rows | BaseException]:
        return await asyncio.gather(
            *(intake.write_async(o) for o in orders), return_exceptions=True
        )

    return asyncio.run(main())


def jobs_in(db: Database) -> list[JobRow]:
    with db.session() as s:
        return list(s.scalars(select(JobRow).order_by(JobRow.num, JobRow.id)))


def counter(s: Session) -> int:
    return s.get_one(CounterRow, "job").value


# -- one order -------------------------------------------------------------------------------


def test_an_order_lands_as_a_job_its_first_timeline_line_and_an_audit_entry(
    db: Database, intake: Intake, stored: list[Rows]
) -> None:
    [rows] = write(intake, order("train", key="k-1"))
    assert isinstance(rows, list)
    [row] = rows
    assert (row["id"], row["num"], row["state"], row["idempotency_key"]) == (
        "1",
        1,
        "pending",
        "k-1",
    )
    assert stored == [rows]  # the mirror is told what was committed
    with db.session() as s:
        job = s.get_one(JobRow, "1")
        assert (job.name, job.user, job.team, job.gpus, job.submitted_at) == (
            "train",
            "alice",
            "research",
            8,
            T0,
        )
        [event] = s.scalars(select(EventRow))
        assert (event.job_id, event.kind, event.at) == ("1", "queued", T0)
        assert (
            event.message == "queued: 8 GPU(s) in 1 replica(s) for team research, priority normal"
        )
        [audit] = s.scalars(select(AuditRow))
        assert (audit.who, audit.role, audit.action, audit.target, audit.source) == (
            "alice",
            "member",
            "submit",
            "1",
            "10.0.0.7",
        )
        assert audit.detail == {"name": "train", "team": "research", "tasks": 1}
        assert counter(s) == 1


def test_an_array_order_lands_every_task_under_one_audit_entry(
    db: Database, intake: Intake
) -> None:
    [rows] = write(intake, order("sweep", array="0-2", gpus=1))
    assert isinstance(rows, list)
    assert [r["id"] for r in rows] == ["1_0", "1_1", "1_2"]
    with db.session() as s:
        assert sorted(s.scalars(select(EventRow.job_id).where(EventRow.kind == "queued"))) == [
            "1_0",
            "1_1",
            "1_2",
        ]
        [audit] = s.scalars(select(AuditRow))
        assert (audit.target, audit.detail["tasks"]) == ("1", 3)
        assert counter(s) == 1  # one number for the whole array


def test_budget_warnings_land_on_every_tasks_timeline_after_its_first_line(
    db: Database, intake: Intake
) -> None:
    warnings = ("team research has spent $900.00 of its $1,000.00 budget", "second note")
    write(intake, order("sweep", array="0-1", gpus=1, warnings=warnings))
    with db.session() as s:
        for task in ("1_0", "1_1"):
            timeline = list(
                s.scalars(select(EventRow).where(EventRow.job_id == task).order_by(EventRow.id))
            )
            assert [(e.kind, e.message) for e in timeline][1:] == [
                ("budget", warnings[0]),
                ("budget", warnings[1]),
            ]
            assert timeline[0].kind == "queued"


def test_an_audit_source_is_cut_to_what_its_column_holds(db: Database, intake: Intake) -> None:
    far = Caller("bob", "admin", None, source="x" * 150)
    job, _ = parse_request(SubmitRequest(spec=spec_dict("a")))
    write(intake, Order(job, None, None, far, T0, None))
    with db.session() as s:
        [audit] = s.scalars(select(AuditRow))
        assert audit.source == "x" * 100


# -- many orders -----------------------------------------------------------------------------


def test_orders_that_arrive_together_all_land_numbered_without_gaps(
    db: Database, intake: Intake, stored: list[Rows]
) -> None:
    results = write(intake, *(order(f"job-{i}") for i in range(12)))
    assert all(isinstance(r, list) for r in results)
    nums = sorted(r[0]["num"] for r in results if isinstance(r, list))
    assert nums == list(range(1, 13))
    assert len({r[0]["id"] for r in results if isinstance(r, list)}) == 12
    assert sorted(r["num"] for rows in stored for r in rows) == nums
    with db.session() as s:
        assert rows_in(s, JobRow) == rows_in(s, EventRow) == rows_in(s, AuditRow) == 12
        assert counter(s) == 12


def test_a_key_used_twice_at_once_fails_only_the_second_order(
    db: Database, intake: Intake, stored: list[Rows]
) -> None:
    results = write(
        intake,
        order("a", key="same"),
        order("b", key="other"),
        order("c", key="same"),
        order("d"),
    )
    failed = [i for i, r in enumerate(results) if isinstance(r, BaseException)]
    assert len(failed) == 1 and failed[0] in (0, 2)
    assert isinstance(results[failed[0]], IntegrityError)
    loser = "a" if failed[0] == 0 else "c"
    assert {j.name for j in jobs_in(db)} == {"a", "b", "c", "d"} - {loser}
    with db.session() as s:
        assert rows_in(s, EventRow) == rows_in(s, AuditRow) == 3  # nothing of the failed one
        assert counter(s) == 3  # and its number was not spent
    assert len([r for rows in stored for r in rows]) == 3


def test_a_key_already_stored_fails_the_new_order_and_spends_no_number(
    db: Database, intake: Intake
) -> None:
    write(intake, order("first", key="retry-7"))
    [again] = write(intake, order("second", key="retry-7"))
    assert isinstance(again, IntegrityError)
    [after] = write(intake, order("third"))
    assert isinstance(after, list) and after[0]["id"] == "2"
    assert [j.name for j in jobs_in(db)] == ["first", "third"]


def test_a_failure_other_than_a_key_reaches_every_waiting_order_and_stores_nothing(
    db: Database, intake: Intake, stored: list[Rows]
) -> None:
    def deposed(s: Session) -> None:
        raise PermissionError("this replica no longer leads")

    db.fence = deposed
    results = write(intake, order("a"), order("b"))
    assert all(isinstance(r, PermissionError) for r in results)
    assert jobs_in(db) == [] and stored == []

    db.fence = None  # the writer carries on once the store takes writes again
    [ok] = write(intake, order("c"))
    assert isinstance(ok, list) and ok[0]["num"] == 1


def test_a_request_that_went_away_does_not_stop_its_order_or_the_next(
    db: Database, intake: Intake
) -> None:
    """Its client disconnected while the order was being stored: the job still lands, and
    the writer hands the next order its rows."""
    gate = threading.Event()
    reached = threading.Event()

    def slow(s: Session) -> None:
        reached.set()
        assert gate.wait(30)

    db.fence = slow

    async def main() -> Rows:
        gone = asyncio.create_task(intake.write_async(order("gone")))
        await asyncio.to_thread(reached.wait, 30)  # the writer is storing it
        gone.cancel()
        with pytest.raises(asyncio.CancelledError):
            await gone
        gate.set()
        return await intake.write_async(order("next"))

    rows = asyncio.run(main())
    assert rows[0]["num"] == 2
    assert [j.name for j in jobs_in(db)] == ["gone", "next"]


def intake_threads() -> int:
    return sum(t.name == "intake" and t.is_alive() for t in threading.enumerate())


def test_a_closed_writer_stops_its_thread(db: Database) -> None:
    before = intake_threads()
    writer = Intake(db)
    assert intake_threads() == before + 1
    [rows] = write(writer, order("last"))
    writer.close()
    assert isinstance(rows, list)
    assert intake_threads() == before

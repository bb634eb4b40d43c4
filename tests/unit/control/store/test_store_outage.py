"""Which database errors are the store going away (and which are bugs), and what the store's
status logs: one line when it goes away with the cause, one a minute while it stays away,
one when it is back with how long it was away."""

from __future__ import annotations

import logging
import sqlite3

import psycopg
import pytest
from psycopg import errors as pg
from sqlalchemy import exc as sa_exc

from boltforge.control.store.outage import (
    DISK_FULL,
    LOCKED,
    READ_ONLY,
    UNREACHABLE,
    StoreFault,
    StoreStatus,
    StoreUnavailable,
    fault_of,
)


def wrapped(orig: Exception, invalidated: bool = False) -> sa_exc.DBAPIError:
    """``orig`` as SQLAlchemy hands a driver's error to the server."""
    return sa_exc.OperationalError("SELECT 1", {}, orig, connection_invalidated=invalidated)


def sqlite_error(message: str, code: str) -> sqlite3.OperationalError:
    error = sqlite3.OperationalError(message)
    error.sqlite_errorname = code
    return error


@pytest.mark.parametrize(
    ("orig", "kind"),
    [
        (psycopg.OperationalError("connection to server failed: Connection refused"), UNREACHABLE),
        (pg.AdminShutdown("terminating connection due to administrator command"), UNREACHABLE),
        (pg.ReadOnlySqlTransaction("cannot execute INSERT in a read-only transaction"), READ_ONLY),
        (pg.LockNotAvailable("canceling statement due to lock timeout"), LOCKED),
        (pg.DiskFull("could not extend file: No space left on device"), DISK_FULL),
        (sqlite_error("database or disk is full", "SQLITE_FULL"), DISK_FULL),
        (sqlite_error("database is locked", "SQLITE_BUSY"), LOCKED),
        (sqlite_error("disk I/O error", "SQLITE_IOERR_WRITE"), UNREACHABLE),
        (sqlite3.OperationalError("attempt to write a readonly database"), READ_ONLY),
    ],
)
def test_the_faults_the_server_expects_are_recognised(orig: Exception, kind: str) -> None:
    fault = fault_of(wrapped(orig))
    assert fault is not None
    assert fault.kind == kind
    assert str(orig).split()[0] in fault.detail


@pytest.mark.parametrize(
    "error",
    [
        wrapped(pg.UniqueViolation("duplicate key value violates unique constraint")),
        wrapped(sqlite3.OperationalError("no such table: jobs")),
        wrapped(pg.SyntaxError("syntax error at or near SELEC")),
        ValueError("a bug"),
    ],
)
def test_anything_else_is_not_a_store_fault(error: Exception) -> None:
    assert fault_of(error) is None


def test_a_connection_the_pool_found_dead_is_the_store_unreachable() -> None:
    fault = fault_of(wrapped(psycopg.InterfaceError("the connection is lost"), invalidated=True))
    assert fault == StoreFault(UNREACHABLE, "the connection is lost")


def test_an_empty_pool_and_a_known_outage_are_faults_too() -> None:
    assert fault_of(sa_exc.TimeoutError("QueuePool limit reached")) is not None
    known = StoreFault(DISK_FULL, "full")
    assert fault_of(StoreUnavailable(known)) == known


class Ticks:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def store_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "boltforge.store"]


def test_an_outage_is_logged_once_then_once_a_minute_then_once_back(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    ticks = Ticks()
    status = StoreStatus(clock=lambda: 1_800_000_000.0, monotonic=ticks)
    refused = StoreFault(UNREACHABLE, "Connection refused")
    for _ in range(50):  # many calls fail within the first minute
        status.failed(refused)
        ticks.now += 1.0
    ticks.now += 30.0
    status.failed(refused)  # 80 s in: the minute's reminder
    status.back()
    status.back()  # already back: nothing more to say
    lines = store_lines(caplog)
    assert lines == [
        "store unavailable (unreachable: Connection refused); answering 503 until it is back",
        "store still unavailable after 80 s (unreachable: Connection refused)",
        "store available again after 80.0 s away",
    ]
    assert status.available
    assert status.outages == 1


def test_the_status_says_since_when_and_who_watches_hears_of_each_change() -> None:
    ticks = Ticks()
    status = StoreStatus(clock=lambda: 1_800_000_000.0, monotonic=ticks)
    heard: list[str] = []
    status.watch(lambda: heard.append("back" if status.available else "away"))
    status.failed(StoreFault(READ_ONLY, "standby"))
    status.failed(StoreFault(READ_ONLY, "standby"))
    ticks.now += 12.0
    assert (status.since, status.away_s()) == (1_800_000_000.0, 12.0)
    status.back()
    assert (status.since, status.away_s()) == (None, 0.0)
    status.back()  # already back: nothing changed, nobody told
    status.failed(StoreFault(LOCKED, "lock timeout"))
    assert heard == ["away", "back", "away"]
    assert status.outages == 2

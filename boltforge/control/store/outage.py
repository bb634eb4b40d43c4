"""The store's availability as a state the server is in, not an error each caller hits.

A fault the server expects from its store (it cannot be reached, it is read-only during a
switchover, a lock wait timed out, its disk is full) is recognised by ``fault_of``. The
``StoreStatus`` holds whether the store is away, why and since when; the API answers 503
while a call that needs the store fails with such a fault, ``/healthz`` says ``degraded``
and the scheduling loop pauses until a probe finds the store writable again, or a call's
write commits (whoever ``watch``es the status hears of both changes at once).

Logging contract (``boltforge.store``): one warning when the store goes away, naming the
cause; one per ``REMIND_S`` while it stays away; one line when it is back, saying how long
it was away. Expected faults never log a traceback; anything ``fault_of`` does not
recognise is not the status's business and keeps its traceback where it is caught.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import NamedTuple

from sqlalchemy import exc as sa_exc

log = logging.getLogger("boltforge.store")
REMIND_S = 60.0  # how often a store that stays away is logged again
RETRY_AFTER_S = 1  # what a 503 tells clients to wait before sending again
UNREACHABLE, READ_ONLY, DISK_FULL, LOCKED = "unreachable", "read-only", "disk full", "locked"

# PostgreSQL SQLSTATEs by what they mean for the server (class 08: connection exceptions).
_PG_STATES = {
    "25006": READ_ONLY,  # read_only_sql_transaction: a standby, or a primary being demoted
    "55P03": LOCKED,  # lock_not_available: a lock_timeout ran out
    "57P01": UNREACHABLE,  # admin_shutdown
    "57P02": UNREACHABLE,  # crash_shutdown
    "57P03": UNREACHABLE,  # cannot_connect_now: starting up, or in recovery
    "53100": DISK_FULL,  # disk_full
    "53200": DISK_FULL,  # out_of_memory: resources, like a full disk, that wait on an admin
    "53300": UNREACHABLE,  # too_many_connections
}
# SQLite's primary result codes (``sqlite3.Error.sqlite_errorname``, extended codes
# start with them: SQLITE_IOERR_WRITE, SQLITE_READONLY_DBMOVED, ...).
_SQLITE_CODES = {
    "SQLITE_FULL": DISK_FULL,
    "SQLITE_BUSY": LOCKED,
    "SQLITE_LOCKED": LOCKED,
    "SQLITE_READONLY": READ_ONLY,
    "SQLITE_IOERR": UNREACHABLE,
    "SQLITE_CANTOPEN": UNREACHABLE,
}
_SQLITE_MESSAGES = {  # for a driver error raised without its result code
    "database or disk is full": DISK_FULL,
    "database is locked": LOCKED,
    "attempt to write a readonly database": READ_ONLY,
    "disk i/o error": UNREACHABLE,
    "unable to open database file": UNREACHABLE,
}


class StoreFault(NamedTuple):
    """An expected store fault: ``kind`` (one of ``UNREACHABLE``, ``READ_ONLY``,
    ``DISK_FULL``, ``LOCKED``) and the driver's own words, on one line."""

    kind: str
    detail: str

    def __str__(self) -> str:
        return f"{self.kind}: {self.detail}" if self.detail else self.kind


class StoreUnavailable(Exception):
    """Raised where the server refuses to use a store it knows is away (answered 503)."""

    def __init__(self, fault: StoreFault) -> None:
        super().__init__(str(fault))
        self.fault = fault


def fault_of(error: BaseException) -> StoreFault | None:
    """The expected store fault ``error`` is (or wraps), or None for anything else."""
    if isinstance(error, StoreUnavailable):
        return error.fault
    if isinstance(error, sa_exc.TimeoutError):  # the connection pool stayed empty
        return StoreFault(UNREACHABLE, _line(error))
    if isinstance(error, sa_exc.DBAPIError):
        found = _driver_fault(error.orig)
        if found is None and error.connection_invalidated:
            return StoreFault(UNREACHABLE, _line(error.orig or error))
        return found
    if isinstance(error, OSError) and error.errno == 28:  # ENOSPC, outside the driver
        return StoreFault(DISK_FULL, _line(error))
    return None


def _driver_fault(orig: BaseException | None) -> StoreFault | None:
    """The fault a DB-API error from psycopg or sqlite3 is."""
    if orig is None:
        return None
    state = getattr(orig, "sqlstate", None)
    if isinstance(state, str):
        kind = UNREACHABLE if state.startswith("08") else _PG_STATES.get(state)
        return StoreFault(kind, _line(orig)) if kind else None
    name = getattr(orig, "sqlite_errorname", None)
    if isinstance(name, str):
        kind = next((k for code, k in _SQLITE_CODES.items() if name.startswith(code)), None)
        return StoreFault(kind, _line(orig)) if kind else None
    text = _line(orig)
    kind = next((k for m, k in _SQLITE_MESSAGES.items() if m in text.lower()), None)
    if kind is None and type(orig).__name__ == "OperationalError" and state is None:
        kind = UNREACHABLE if type(orig).__module__.startswith("psycopg") else None
    return StoreFault(kind, text) if kind else None


def _line(error: BaseException) -> str:
    """The error's message on one short line."""
    text = " ".join(str(error).split())
    return text if len(text) <= 200 else text[:197] + "..."


class StoreStatus:
    """Whether the store is away, why, and since when (``clock``: wall time, for replies);
    logs each change once (see the module docstring). Thread-safe."""

    def __init__(
        self,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.clock, self.monotonic = clock, monotonic
        self.fault: StoreFault | None = None
        self.since: float | None = None  # wall time the store went away
        self.outages = 0  # how many times it went away since start
        self._lock = threading.Lock()
        self._away_at = 0.0  # monotonic
        self._watchers: list[Callable[[], None]] = []
        self._said_at = 0.0  # monotonic: the last line logged about this outage

    def watch(self, told: Callable[[], None]) -> None:
        """Call ``told()`` each time the store goes away or comes back (from the thread that
        found out, after the change: ``available`` says which)."""
        self._watchers.append(told)

    @property
    def available(self) -> bool:
        return self.fault is None

    def away_s(self) -> float:
        """Seconds the store has been away (0 while it is available)."""
        with self._lock:
            return self.monotonic() - self._away_at if self.fault is not None else 0.0

    def failed(self, fault: StoreFault) -> None:
        """A call met ``fault``: the store is away (logged at once, then once per
        ``REMIND_S``)."""
        now = self.monotonic()
        with self._lock:
            if self.fault is None:
                self.fault, self.since, self._away_at, self._said_at = fault, self.clock(), now, now
                self.outages += 1
                log.warning("store unavailable (%s); answering 503 until it is back", fault)
                watchers = list(self._watchers)
            else:
                watchers = []
                self.fault = fault
                if now - self._said_at >= REMIND_S:
                    self._said_at = now
                    log.warning(
                        "store still unavailable after %.0f s (%s)", now - self._away_at, fault
                    )
        for told in watchers:
            told()

    def back(self) -> None:
        """A write committed or a probe found the store writable: it is available again."""
        with self._lock:
            if self.fault is None:
                return
            away = self.monotonic() - self._away_at
            self.fault, self.since = None, None
            watchers = list(self._watchers)
        log.warning("store available again after %.1f s away", away)
        for told in watchers:
            told()

    def unavailable(self) -> StoreUnavailable:
        """The error a call that needs the store raises while it is away."""
        return StoreUnavailable(self.fault or StoreFault(UNREACHABLE, ""))

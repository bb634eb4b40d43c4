"""Writing submissions in groups: one transaction, and one commit, for every submission
waiting at that moment.

Request threads validate on their own and hand the writer a finished ``Order``; the writer
numbers the jobs and inserts the jobs, their ``queued`` events and the audit entries of the
whole group at once. Under load this turns many small transactions into a few large ones; a
lone submission is written at once. If a group fails (an idempotency key used twice at the
same moment), each of its orders is written on its own so only the offender fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from sqlalchemy import Table, insert
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from boltforge.control.auth import Caller
from boltforge.control.jobs.submit import job_rows, next_numbers, queued_message
from boltforge.control.store.batch import next_group
from boltforge.control.store.db import Database
from boltforge.control.store.models import AuditRow, EventRow, JobRow
from boltforge.control.store.outage import fault_of
from boltforge.core.model.gang import Gang
from boltforge.spec.job import JobSpec

log = logging.getLogger("boltforge.intake")
MAX_GROUP = 256


Rows = list[dict[str, Any]]


@dataclass
class Order:
    """One validated submission, and where its written rows go. ``warnings`` (a team past
    its soft budget) land on each job's timeline as ``budget`` events. ``service``: the
    service the job is a replica of (its autoscaler submits it)."""

    spec: JobSpec
    tasks: list[int] | None
    gang: Gang | None
    caller: Caller
    at: float
    key: str | None
    warnings: tuple[str, ...] = ()
    service: str | None = None
    done: asyncio.Future[Rows] | None = field(default=None, repr=False)


class Intake:
    """The single writer of new jobs (a thread); ``write_async`` waits until its order is
    stored."""

    def __init__(self, db: Database, stored: Callable[[Rows], None] | None = None) -> None:
        """``stored`` is told every job row written, as column values, once committed."""
        self.db = db
        self._stored = stored
        self._orders: queue.Queue[Order | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="intake", daemon=True)
        self._thread.start()

    async def write_async(self, order: Order) -> Rows:
        """Store ``order``; return its ``jobs`` rows as column values (raises what storing
        it raised). Waits on the event loop, holding no worker thread."""
        order.done = asyncio.get_running_loop().create_future()
        self._orders.put(order)
        return await order.done

    def close(self) -> None:
        self._orders.put(None)
        self._thread.join(10)

    def _run(self) -> None:
        while (group := next_group(self._orders, MAX_GROUP)) is not None:
            self._store(group)

    def _store(self, group: list[Order]) -> None:
        try:
            with self.db.session() as s:
                results = _insert(s, group)
        except IntegrityError:
            if len(group) > 1:
                for order in group:
                    self._store([order])
                return
            _settle(group, [IntegrityError("idempotency key", None, Exception())])
            return
        except Exception as e:  # hand any failure to the waiting request
            if fault_of(e) is None:  # the store's own faults are logged by its status
                log.exception("storing %d submission(s) failed", len(group))
            _settle(group, [e] * len(group))
            return
        if self._stored is not None:
            self._stored([r for rows in results for r in rows])
        _settle(group, results)


def _settle(group: list[Order], outcomes: Sequence[Rows | Exception]) -> None:
    """Hand each order its rows (or its failure), with one wake-up per event loop for the
    whole group rather than one per order."""
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future[Rows], Any]]] = {}
    for order, outcome in zip(group, outcomes, strict=True):
        if order.done is not None:
            by_loop.setdefault(order.done.get_loop(), []).append((order.done, outcome))
    for loop, items in by_loop.items():
        with contextlib.suppress(RuntimeError):  # that loop has closed: nobody waits
            loop.call_soon_threadsafe(_resolve, items)


def _resolve(items: list[tuple[asyncio.Future[Rows], Any]]) -> None:
    for done, outcome in items:
        if done.done():  # the request was cancelled (its client went away)
            continue
        if isinstance(outcome, Exception):
            done.set_exception(outcome)
        else:
            done.set_result(outcome)


def _insert(s: Session, group: list[Order]) -> list[Rows]:
    numbers = next_numbers(s, len(group))
    jobs: list[Rows] = []
    events: list[dict[str, Any]] = []
    audits: list[dict[str, Any]] = []
    for num, o in zip(numbers, group, strict=True):
        rows = job_rows(o.spec, o.tasks, o.gang, o.caller, o.at, o.key, num, o.service)
        jobs.append(rows)
        message = queued_message(rows[0])
        events += [
            {"job_id": r["id"], "at": o.at, "kind": "queued", "message": message, "data": {}}
            for r in rows
        ]
        events += [
            {"job_id": r["id"], "at": o.at, "kind": "budget", "message": w, "data": {}}
            for w in o.warnings
            for r in rows
        ]
        audits.append(
            {
                "at": o.at,
                "who": o.caller.name,
                "role": o.caller.role,
                "action": "submit",
                "target": rows[0]["array_id"] or rows[0]["id"],
                "source": o.caller.source[:100],
                "detail": {"name": o.spec.name, "team": o.spec.team, "tasks": len(rows)},
            }
        )
    connection = s.connection()
    for table, rows in (
        (JobRow.__table__, [r for job in jobs for r in job]),
        (EventRow.__table__, events),
        (AuditRow.__table__, audits),
    ):
        connection.execute(insert(cast(Table, table)), rows)
    return jobs

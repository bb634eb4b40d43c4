"""The leader lease of server replicas that share one store, with fencing tokens.

One row (``LeaderRow``) names the holder, its ``term`` and a ``renewals`` counter. A replica
takes the lease when the row is missing, or when it has watched the row stay the same for
a whole lease on its own clock (as Kubernetes' leader election does, so that the replicas'
clocks need not agree); taking it bumps ``term``. The holder renews it every
``renew_every_s``; it must stop acting once it has not renewed for ``deadline_s``, which is
shorter than the lease, so it stops before anyone may take over.

Fencing: every transaction of the leader that writes runs ``fence`` before it commits: an
update of the lease row that matches only while the row still carries the leader's term.
A deposed leader's late write (it was frozen, or cut off from the store, past its lease)
matches nothing and is refused with ``Deposed``, and its whole transaction rolls back. On
PostgreSQL the update also locks the row until commit, so a takeover waits for a write in
flight rather than slipping under it."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import Update, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from boltforge.control.store.db import Database
from boltforge.control.store.models import LeaderRow

log = logging.getLogger(__name__)
ROW = 1


class Deposed(Exception):
    """This replica no longer holds the leader lease: what it tried to write is refused."""


@dataclass(frozen=True)
class Leader:
    """Who holds the lease, as the store says: the replica's name, its address, its term."""

    holder: str
    url: str
    term: int


@dataclass(frozen=True)
class LeaseTimes:
    """How long a lease lasts, how often its holder renews it, and how long the holder may
    go without renewing before it stops acting (less than ``lease_s``)."""

    lease_s: float = 3.0
    renew_every_s: float = 0.5
    deadline_s: float = 2.0

    def __post_init__(self) -> None:
        if not 0 < self.renew_every_s < self.deadline_s < self.lease_s:
            raise ValueError(
                f"leader lease {self.lease_s:g} s: need 0 < renew every ({self.renew_every_s:g}"
                f" s) < renew deadline ({self.deadline_s:g} s) < lease"
            )


class Leadership:
    """One replica's side of the lease on ``db``. ``holder`` names the replica (unique among
    them) and ``url`` is where the others send clients while it leads."""

    def __init__(
        self,
        db: Database,
        holder: str,
        url: str,
        times: LeaseTimes | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.db, self.holder, self.url = db, holder, url
        self.times = times or LeaseTimes()
        self.clock = clock
        self.term: int | None = None  # the term this replica holds, None while it follows
        self.renewed_at = 0.0  # this replica's clock when it last took or renewed the lease
        self._seen: tuple[str, int, int] | None = None  # (holder, term, renewals) last seen
        self._seen_at = 0.0

    @property
    def leading(self) -> bool:
        """Whether this replica holds the lease and may act: it renewed it within the
        renew deadline (a replica that was frozen past it is not, whatever it believed)."""
        return self.term is not None and self.clock() - self.renewed_at < self.times.deadline_s

    def try_acquire(self) -> bool:
        """Take the lease if it is free or has run out as this replica watched it; renew it
        if this replica holds it. Whether this replica leads afterwards."""
        if self.term is not None:
            return self.renew()
        now = self.clock()
        with self.db.session(fenced=False) as s:
            row = s.get(LeaderRow, ROW, with_for_update=True)
            if row is None:
                return self._first(s, now)
            seen = (row.holder, row.term, row.renewals)
            if seen != self._seen:
                self._seen, self._seen_at = seen, now
                return False
            if now - self._seen_at < row.lease_s:
                return False
            row.holder, row.url, row.term = self.holder, self.url, row.term + 1
            row.renewals, row.lease_s, row.acquired_at = 0, self.times.lease_s, time.time()
            self.term = row.term
        self.renewed_at = now
        log.warning("%s leads the control plane (term %d)", self.holder, self.term)
        return True

    def _first(self, s: Session, now: float) -> bool:
        row = LeaderRow(
            id=ROW,
            holder=self.holder,
            url=self.url,
            term=1,
            renewals=0,
            lease_s=self.times.lease_s,
            acquired_at=time.time(),
        )
        s.add(row)
        try:
            s.flush()
        except IntegrityError:  # another replica created it first
            s.rollback()
            return False
        self.term, self.renewed_at = 1, now
        log.warning("%s leads the control plane (term 1)", self.holder)
        return True

    def renew(self) -> bool:
        """Renew the lease this replica holds; False (and following from now on) when the
        store says another term began."""
        if self.term is None:
            return False
        now = self.clock()
        with self.db.session(fenced=False) as s:
            done = s.execute(self._mine().values(renewals=LeaderRow.renewals + 1))
            renewed = bool(done.rowcount)  # type: ignore[attr-defined]
        if not renewed:
            log.error("%s lost the lead: term %d is over", self.holder, self.term)
            self.term = None
            return False
        self.renewed_at = now
        return True

    def fence(self, s: Session) -> None:
        """Refuse the transaction of ``s`` unless this replica still holds its term (see the
        module docstring); raises ``Deposed``."""
        if self.term is None or not self.leading:
            raise Deposed(f"{self.holder} does not hold the leader lease")
        done = s.execute(self._mine().values(term=LeaderRow.term))
        if not done.rowcount:  # type: ignore[attr-defined]
            self.term = None
            raise Deposed(f"{self.holder}'s term is over: another replica leads")

    def leader(self) -> Leader | None:
        """The current holder as the store says (None: nobody has led yet)."""
        with self.db.session(fenced=False) as s:
            row = s.scalar(select(LeaderRow).where(LeaderRow.id == ROW))
            return Leader(row.holder, row.url, row.term) if row else None

    def release(self) -> None:
        """Give the lease up (a clean shutdown): the others may take it at once."""
        if self.term is None:
            return
        with self.db.session(fenced=False) as s:
            s.execute(self._mine().values(lease_s=0.0, renewals=LeaderRow.renewals + 1))
        self.term = None

    def _mine(self) -> Update:
        """An update of the lease row that matches only while it carries this replica's term."""
        return update(LeaderRow).where(LeaderRow.id == ROW, LeaderRow.term == self.term)

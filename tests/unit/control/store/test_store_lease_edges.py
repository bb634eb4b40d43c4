"""Edges of the leader lease (``store/leadership.py``) on SQLite and a fake clock: lease
times that could let two replicas act at once are refused, a race to create the lease is
lost quietly, a follower's watch restarts whenever the lease moves, and a replica that does
not lead neither renews, releases, nor writes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker
from store_builders import migrated

from boltforge.control.store.db import Database
from boltforge.control.store.leadership import Deposed, Leader, Leadership, LeaseTimes
from boltforge.control.store.models import CounterRow, LeaderRow

TIMES = LeaseTimes(lease_s=3.0, renew_every_s=0.5, deadline_s=2.0)


class Clock:
    def __init__(self) -> None:
        self.now = 500.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Database]:
    with migrated(tmp_path / "lease.db") as store:
        yield store


def replica(db: Database, name: str, clock: Clock) -> Leadership:
    own = Database(db.url)
    lead = Leadership(own, name, f"http://{name}:8080", TIMES, clock)
    own.fence = lead.fence
    return lead


def lease(db: Database) -> LeaderRow | None:
    with db.session() as s:
        return s.scalar(select(LeaderRow))


# -- lease times -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("lease_s", "renew_every_s", "deadline_s"),
    [
        (3.0, 2.0, 2.0),  # renews no more often than its deadline
        (3.0, 0.5, 3.0),  # may act until the moment another may take over
        (3.0, 0.5, 4.0),  # may act after another took over
        (3.0, 0.0, 2.0),  # never renews
        (3.0, -1.0, 2.0),
        (1.0, 2.0, 3.0),  # everything backwards
    ],
    ids=[
        "renew-at-deadline",
        "deadline-at-lease",
        "deadline-past-lease",
        "zero-renew",
        "negative-renew",
        "backwards",
    ],
)
def test_lease_times_that_could_let_two_replicas_act_at_once_are_refused(
    lease_s: float, renew_every_s: float, deadline_s: float
) -> None:
    with pytest.raises(ValueError, match=r"need 0 < renew every .* < renew deadline .* < lease"):
        LeaseTimes(lease_s=lease_s, renew_every_s=renew_every_s, deadline_s=deadline_s)


def test_the_refusal_names_the_times_given() -> None:
    with pytest.raises(ValueError) as refused:
        LeaseTimes(lease_s=5.0, renew_every_s=1.0, deadline_s=6.0)
    assert str(refused.value).startswith("leader lease 5 s: need 0 < renew every (1 s)")
    assert "renew deadline (6 s)" in str(refused.value)


def test_the_default_lease_times_are_valid_and_ordered() -> None:
    t = LeaseTimes()
    assert 0 < t.renew_every_s < t.deadline_s < t.lease_s


# -- taking the lease --------------------------------------------------------------------------


def test_nobody_leads_a_store_nobody_has_led(db: Database) -> None:
    follower = replica(db, "a", Clock())
    assert follower.leader() is None
    assert not follower.leading and follower.term is None


def test_the_first_replica_writes_the_lease_row_with_term_one(db: Database) -> None:
    clock = Clock()
    a = replica(db, "a", clock)
    assert a.try_acquire()
    row = lease(db)
    assert row is not None
    assert (row.holder, row.url, row.term, row.renewals, row.lease_s) == (
        "a",
        "http://a:8080",
        1,
        0,
        TIMES.lease_s,
    )
    assert a.leader() == Leader("a", "http://a:8080", 1)
    assert a.renewed_at == clock.now


class BlindToTheLease(Session):
    """A session that does not see the lease row (as one whose read ran just before
    another replica created it)."""

    def get(self, entity: Any, ident: Any, **kw: Any) -> Any:
        if entity is LeaderRow:
            return None
        return super().get(entity, ident, **kw)


def test_a_replica_that_loses_the_race_to_create_the_lease_follows(db: Database) -> None:
    clock = Clock()
    a, b = replica(db, "a", clock), replica(db, "b", clock)
    assert a.try_acquire()
    b.db.sessions = sessionmaker(b.db.engine, class_=BlindToTheLease, expire_on_commit=False)
    assert not b.try_acquire()  # its insert collides with a's row: no error, no lead
    assert b.term is None and not b.leading
    row = lease(db)
    assert row is not None and (row.holder, row.term) == ("a", 1)


def test_renewing_while_leading_counts_renewals_and_keeps_the_term(db: Database) -> None:
    clock = Clock()
    a = replica(db, "a", clock)
    a.try_acquire()
    for _ in range(3):
        clock.now += 0.5
        assert a.try_acquire()  # a leader's try_acquire renews
    row = lease(db)
    assert row is not None and (row.term, row.renewals) == (1, 3)
    assert a.renewed_at == clock.now


def test_a_follower_restarts_its_watch_whenever_the_lease_moves(db: Database) -> None:
    """A lease renewed even once during the watch is alive: the follower must then see it
    unchanged for a whole lease again, counted from when it saw the change."""
    clock = Clock()
    a, b = replica(db, "a", clock), replica(db, "b", clock)
    a.try_acquire()
    assert not b.try_acquire()  # the watch starts at 500
    clock.now += TIMES.lease_s - 0.5
    a.renew()  # the leader's last sign of life, at 502.5
    assert not b.try_acquire()  # sees the renewal: the watch starts again
    clock.now += TIMES.lease_s - 0.1
    assert not b.try_acquire()  # 2.9 s since: not yet
    clock.now += 0.2
    assert b.try_acquire() and b.term == 2
    row = lease(db)
    assert row is not None and (row.holder, row.renewals) == ("b", 0)


def test_the_lease_length_of_the_holder_decides_not_the_followers(db: Database) -> None:
    """The row carries the holder's lease; a follower configured with a shorter one still
    waits the holder's out."""
    clock = Clock()
    long = Leadership(Database(db.url), "a", "u", LeaseTimes(10.0, 1.0, 5.0), clock)
    assert long.try_acquire()
    b = replica(db, "b", clock)
    assert not b.try_acquire()
    clock.now += TIMES.lease_s + 1  # past b's own lease, inside a's
    assert not b.try_acquire()
    clock.now += 10.0
    assert b.try_acquire()


# -- a replica that does not lead ---------------------------------------------------------------


def test_a_follower_neither_renews_nor_releases(db: Database) -> None:
    clock = Clock()
    a, b = replica(db, "a", clock), replica(db, "b", clock)
    a.try_acquire()
    assert not b.renew()
    b.release()
    row = lease(db)
    assert row is not None and (row.holder, row.renewals, row.lease_s) == ("a", 0, TIMES.lease_s)


def test_a_release_hands_over_and_the_released_replica_stops_fencing_through(
    db: Database,
) -> None:
    clock = Clock()
    a = replica(db, "a", clock)
    a.try_acquire()
    a.release()
    assert a.term is None and not a.leading
    row = lease(db)
    assert row is not None and (row.lease_s, row.renewals) == (0.0, 1)
    with pytest.raises(Deposed, match="does not hold the leader lease"), a.db.session() as s:
        s.add(CounterRow(name="after-release", value=1))


def test_a_leader_past_its_renew_deadline_is_refused_before_touching_the_store(
    db: Database,
) -> None:
    """By its own clock it may no longer act, even though nobody took over: its write is
    refused, and it keeps its term, so a timely renewal puts it back in charge."""
    clock = Clock()
    a = replica(db, "a", clock)
    a.try_acquire()
    clock.now += TIMES.deadline_s
    with pytest.raises(Deposed), a.db.session() as s:
        s.add(CounterRow(name="late", value=1))
    assert a.term == 1
    assert a.renew() and a.leading
    with a.db.session() as s:
        s.add(CounterRow(name="late", value=1))
    with db.session() as s:
        assert s.get(CounterRow, "late") is not None


def test_a_deposed_leader_learns_it_from_its_own_renewal(db: Database) -> None:
    clock = Clock()
    a = replica(db, "a", clock)
    a.try_acquire()
    with db.session() as s:  # another replica took term 2 meanwhile
        row = s.get_one(LeaderRow, 1)
        row.term, row.holder = 2, "b"
    assert not a.try_acquire()  # renews, finds its term over
    assert a.term is None and not a.leading
    assert a.leader() == Leader("b", "http://a:8080", 2)

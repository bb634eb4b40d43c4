"""The leader lease of server replicas on one store, on a fake clock: who takes it and when,
and fencing: a deposed leader's writes are refused whole, whether it was frozen past its
lease, cut off from the store, or simply outlived by a promoted follower."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

import pytest
from control_kit import postgres_server, store_url
from sqlalchemy import create_engine, func, select
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import sessionmaker

from boltforge.control.replicas import follow_then_lead
from boltforge.control.store.db import Database
from boltforge.control.store.leadership import Deposed, Leadership, LeaseTimes
from boltforge.control.store.models import CounterRow, LeaderRow

__all__ = ["postgres_server", "store_url"]  # fixtures used by name
TIMES = LeaseTimes(lease_s=3.0, renew_every_s=0.5, deadline_s=2.0)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def db(store_url: str) -> Iterator[Database]:
    database = Database(store_url)
    database.migrate()
    yield database
    database.close()


def replica(db: Database, name: str, clock: Clock) -> Leadership:
    """A replica's side of the lease, on a database handle of its own (as a process has)."""
    own = Database(db.url)
    lead = Leadership(own, name, f"http://{name}:8080", TIMES, clock)
    own.fence = lead.fence
    return lead


def write_counter(lead: Leadership, value: int) -> None:
    """A write the way the server makes them: through a fenced session."""
    with lead.db.session() as s:
        row = s.get(CounterRow, "probe") or CounterRow(name="probe", value=0)
        row.value = value
        s.add(row)


def counter(db: Database) -> int | None:
    with db.session() as s:
        return s.scalar(select(CounterRow.value).where(CounterRow.name == "probe"))


def test_the_first_replica_leads_and_the_others_follow_while_it_renews(db: Database) -> None:
    clock = Clock()
    a, b = replica(db, "a", clock), replica(db, "b", clock)
    assert a.try_acquire() and a.term == 1
    for _ in range(10):  # well past a lease, with renewals the whole time
        assert not b.try_acquire()
        clock.now += 0.5
        assert a.renew()
    assert a.leading and not b.leading
    assert b.leader() is not None and b.leader() == a.leader()
    assert a.leader().url == "http://a:8080"  # type: ignore[union-attr]


def test_a_silent_leader_is_replaced_after_a_lease_on_the_followers_clock(db: Database) -> None:
    clock = Clock()
    a, b = replica(db, "a", clock), replica(db, "b", clock)
    a.try_acquire()
    assert not b.try_acquire()  # first sight of the lease starts b's watch
    clock.now += TIMES.lease_s - 0.1
    assert not b.try_acquire()
    clock.now += 0.2
    assert b.try_acquire() and b.term == 2
    assert not a.leading  # past its renew deadline on its own clock
    assert not a.renew() and a.term is None  # and the store says term 2 began


def test_a_leader_frozen_past_its_lease_has_its_late_write_refused(db: Database) -> None:
    clock = Clock()
    a, b = replica(db, "a", clock), replica(db, "b", clock)
    a.try_acquire()
    write_counter(a, 1)
    b.try_acquire()
    clock.now += TIMES.lease_s + 0.1  # a is frozen: it neither renews nor writes
    assert b.try_acquire()
    write_counter(b, 2)

    with pytest.raises(Deposed):  # a wakes up and carries on where it was
        write_counter(a, 99)
    assert counter(db) == 2


def test_a_promoted_follower_fences_the_old_leader_even_if_its_clock_says_it_leads(
    db: Database,
) -> None:
    """The old leader's clock did not move (it believes its lease is fresh); the store's
    term decides."""
    a_clock, b_clock = Clock(), Clock()
    a, b = replica(db, "a", a_clock), replica(db, "b", b_clock)
    a.try_acquire()
    b.try_acquire()
    b_clock.now += TIMES.lease_s + 0.1
    assert b.try_acquire()
    assert a.leading  # by its own clock

    with pytest.raises(Deposed):
        write_counter(a, 7)
    assert counter(db) is None
    assert a.term is None and not a.leading  # and it knows it now
    assert not a.renew()


def test_a_leader_cut_off_from_the_store_stops_acting_at_its_deadline(db: Database) -> None:
    clock = Clock()
    a = replica(db, "a", clock)
    a.try_acquire()
    nowhere = create_engine("postgresql+psycopg://nobody@127.0.0.1:1/gone")  # refused
    a.db.sessions = sessionmaker(nowhere)
    for _ in range(int(TIMES.deadline_s / TIMES.renew_every_s)):
        clock.now += TIMES.renew_every_s
        with pytest.raises(OperationalError):
            a.renew()
    assert not a.leading
    with pytest.raises(Deposed):
        a.fence(a.db.sessions())


def test_a_clean_release_hands_the_lease_over_at_once(db: Database) -> None:
    clock = Clock()
    a, b = replica(db, "a", clock), replica(db, "b", clock)
    a.try_acquire()
    assert not b.try_acquire()
    a.release()
    clock.now += 0.01
    assert not b.try_acquire()  # sees the release (a change)
    assert b.try_acquire()  # and a lease of 0 s has run out
    assert b.term == 2


def test_reads_need_no_lease_and_an_unfenced_store_writes_freely(db: Database) -> None:
    clock = Clock()
    a, b = replica(db, "a", clock), replica(db, "b", clock)
    a.try_acquire()
    assert counter(b.db) is None  # a follower reads
    write_counter(a, 3)
    with db.session() as s:  # the test's own handle has no fence
        s.add(CounterRow(name="other", value=1))
        assert s.scalar(select(func.count()).select_from(LeaderRow)) == 1


# -- a replica's life: follow, start leading, keep the lease -----------------------------------

QUICK = LeaseTimes(lease_s=1.2, renew_every_s=0.1, deadline_s=0.8)


def lead(db: Database, start: Callable[[], Coroutine[Any, Any, None]], run_s: float) -> list[str]:
    """Run ``follow_then_lead`` for ``run_s`` on the real clock; why it stopped, if it did."""
    lost: list[str] = []
    leadership = Leadership(Database(db.url), "a", "http://a", QUICK)

    async def main() -> None:
        task = asyncio.create_task(follow_then_lead(leadership, start, lost.append))
        await asyncio.sleep(run_s)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(main())
    return lost


def test_a_recovery_longer_than_the_renew_deadline_keeps_the_lease(db: Database) -> None:
    started: list[bool] = []

    async def slow_start() -> None:  # recovering a big store
        await asyncio.sleep(QUICK.deadline_s * 2)
        started.append(True)

    assert lead(db, slow_start, QUICK.deadline_s * 3) == []
    assert started == [True]


def test_a_replica_whose_recovery_fails_stops_acting(db: Database) -> None:
    async def failing_start() -> None:
        raise RuntimeError("the store's schema is newer than this server")

    [why] = lead(db, failing_start, 1.0)
    assert "could not start leading" in why and "schema is newer" in why


def test_a_replica_whose_term_another_took_stops_acting(db: Database) -> None:
    async def start() -> None:
        with db.session() as s:  # another replica takes the next term meanwhile
            row = s.get(LeaderRow, 1)
            assert row is not None
            row.term, row.holder = row.term + 1, "b"

    [why] = lead(db, start, 1.0)
    assert "term is over" in why


def test_a_follower_that_cannot_reach_the_store_keeps_trying(db: Database) -> None:
    tries: list[int] = []
    leadership = Leadership(Database(db.url), "a", "http://a", QUICK)
    real = leadership.try_acquire

    def flaky() -> bool:
        tries.append(1)
        if len(tries) < 3:
            raise OperationalError("select", {}, Exception("connection refused"))
        return real()

    leadership.try_acquire = flaky  # type: ignore[method-assign]
    started: list[bool] = []

    async def start() -> None:
        started.append(True)

    async def main() -> None:
        task = asyncio.create_task(follow_then_lead(leadership, start, lambda why: None))
        await asyncio.sleep(QUICK.renew_every_s * 6)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(main())
    assert len(tries) >= 3 and started == [True]

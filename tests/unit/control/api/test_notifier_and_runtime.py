"""The wake-ups behind every long-poll (``notify.py``: counters, the change log that
``since`` reads, waiters) and the runtime a server holds (``runtime.py``: the world kept for
replies and when it is read again, tokens remembered, bootstrap tokens, samples)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import func, select

from boltforge.control import notify
from boltforge.control.auth import Caller, create_token
from boltforge.control.notify import ANY, Notifier
from boltforge.control.runtime import VIEW_FRESH_S, Runtime, ServerConfig
from boltforge.control.store.models import TokenRow

# -- the change log: since -------------------------------------------------------------------

KEYS = st.sampled_from(["job:1", "job:2", "node:a", "node:b", "logs:1", "jobs"])
BATCHES = st.lists(st.lists(KEYS, max_size=4), max_size=12)


@settings(max_examples=80, deadline=None)
@given(BATCHES, st.data())
def test_since_names_exactly_the_keys_notified_after_a_sequence_number(
    batches: list[list[str]], data: st.DataObject
) -> None:
    n = Notifier()
    marks = [n.seq]
    for batch in batches:
        n.notify(batch)
        marks.append(n.seq)
    cut = data.draw(st.integers(0, len(batches)), label="batches already seen")
    latest, keys = n.since(marks[cut])
    assert latest == n.seq == sum(len(b) for b in batches)
    assert keys == {k for b in batches[cut:] for k in b}
    assert ANY not in (keys or set())


@settings(max_examples=60, deadline=None)
@given(BATCHES)
def test_every_key_and_any_count_each_notification(batches: list[list[str]]) -> None:
    n = Notifier()
    for batch in batches:
        n.notify(batch)
    for key in {k for b in batches for k in b}:
        assert n.count(key) == sum(b.count(key) for b in batches)
    assert n.count(ANY) == sum(1 for b in batches if b)


def test_a_sequence_number_from_the_future_names_nothing() -> None:
    n = Notifier()
    n.notify(["job:1"])
    assert n.since(99) == (1, set())


def test_the_log_keeps_exactly_its_size(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(notify, "LOG_SIZE", 4)
    n = Notifier()
    n.notify(["a", "b", "c", "d", "e", "f"])
    assert n.since(2) == (6, {"c", "d", "e", "f"})  # the oldest kept is 3: nothing lost
    assert n.since(1) == (6, None)  # key 2 left the log: refresh everything
    assert n.since(0) == (6, None)


# -- waiters ---------------------------------------------------------------------------------


async def waiting(n: Notifier, keys: list[str], timeout: float, then: list[str]) -> list[bool]:
    """Wait on each of ``keys`` at once; ``then`` is notified once every waiter waits."""
    n.bind(asyncio.get_running_loop())
    seen = {k: n.count(k) for k in keys}
    tasks = [asyncio.create_task(n.wait(k, seen[k], timeout)) for k in keys]
    await asyncio.sleep(0)  # let each waiter register
    n.notify(then)
    return list(await asyncio.gather(*tasks))


def test_every_waiter_on_a_key_wakes_and_none_is_left_behind() -> None:
    n = Notifier()
    assert asyncio.run(waiting(n, ["job:1"] * 3, 30.0, ["job:1"])) == [True, True, True]
    assert n._waiters.get("job:1", []) == []


def test_one_notification_wakes_waiters_on_its_key_and_on_any_only() -> None:
    n = Notifier()
    woke = asyncio.run(waiting(n, ["job:1", ANY, "job:2"], 0.3, ["job:1"]))
    assert woke == [True, True, False]


def test_a_waiter_whose_count_is_stale_returns_without_waiting() -> None:
    n = Notifier()
    n.notify(["job:1"])

    async def stale() -> bool:
        return await n.wait("job:1", 0, 3600.0)  # an hour: it must not wait at all

    assert asyncio.run(asyncio.wait_for(stale(), 10.0)) is True


def test_a_cancelled_waiter_takes_itself_off_the_list() -> None:
    n = Notifier()

    async def cancelled() -> None:
        n.bind(asyncio.get_running_loop())
        task = asyncio.create_task(n.wait("job:1", n.count("job:1"), 3600.0))
        await asyncio.sleep(0)
        assert len(n._waiters["job:1"]) == 1
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(cancelled())
    assert n._waiters.get("job:1", []) == []


def test_notifying_before_any_loop_is_bound_only_counts() -> None:
    n = Notifier()
    n.notify(["node:a"])
    assert (n.count("node:a"), n.count(ANY), n.seq) == (1, 1, 1)


# -- the runtime -----------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def runtime(tmp_path: Path) -> Iterator[tuple[Runtime, Clock]]:
    clock = Clock()
    config = ServerConfig(
        db_url=f"sqlite:///{tmp_path / 'rt.db'}",
        checkpoint_root=str(tmp_path / "ckpt"),
        admin_token="adm",
        agent_token="agt",
        sample_every_s=10.0,
    )
    rt = Runtime(config, clock)
    rt.start()
    yield rt, clock
    rt.intake.close()
    rt.agent_writes.close()
    rt.db.close()


def test_the_world_for_replies_is_reused_while_fresh_and_read_again_after(
    runtime: tuple[Runtime, Clock],
) -> None:
    rt, clock = runtime
    first = rt.world(clock())
    assert rt.world(clock() + VIEW_FRESH_S) is first  # nothing changed, still fresh
    later = rt.world(clock() + VIEW_FRESH_S + 0.5)
    assert later is not first and later.now == clock() + VIEW_FRESH_S + 0.5


def test_an_empty_fleet_has_no_fragmentation_and_samples_zero(
    runtime: tuple[Runtime, Clock],
) -> None:
    rt, clock = runtime
    assert rt.fragmentation(clock()) == 0.0
    rt.take_sample()
    clock.now += 10.0
    rt.take_sample()
    points = rt.history.since(0.0)
    assert [p.at for p in points] == [clock.now - 10.0, clock.now]
    assert all((p.gpus, p.allocated, p.fragmentation) == (0, 0, 0.0) for p in points)


def test_a_token_is_looked_up_once_and_an_unknown_one_is_never_remembered(
    runtime: tuple[Runtime, Clock],
) -> None:
    rt, clock = runtime
    with rt.db.session() as s:
        token = create_token(s, "alice", "member", "nlp", clock())
    assert rt.known_caller(token) is None
    assert rt.caller(token) == Caller("alice", "member", "nlp")
    with rt.db.session() as s:  # the token is gone from the store; the server remembers it
        s.query(TokenRow).filter(TokenRow.name == "alice").delete()
    assert rt.caller(token) == Caller("alice", "member", "nlp")
    assert rt.caller("bf_nobody") is None
    assert rt.known_caller("bf_nobody") is None


def test_starting_again_stores_no_second_bootstrap_token(runtime: tuple[Runtime, Clock]) -> None:
    rt, _ = runtime
    rt.start()
    with rt.db.session() as s:
        rows = dict(s.execute(select(TokenRow.name, func.count()).group_by(TokenRow.name)).all())
    assert rows == {"admin": 1, "agents": 1}
    assert rt.caller("adm") == Caller("admin", "admin", None)
    assert rt.caller("agt") == Caller("agents", "agent", None)


def test_the_fleet_for_submissions_is_known_only_once_built(
    runtime: tuple[Runtime, Clock],
) -> None:
    rt, _ = runtime
    assert rt.known_fleet() is None
    built = rt.fleet()
    assert rt.known_fleet() is built
    assert rt.fleet() is built  # no inventory changed: not built again

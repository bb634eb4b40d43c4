"""The loop's own coroutine (``Scheduler.run``): it passes when woken, survives a pass that
raises (announcing what that pass committed before it failed), holds a full pass back
while the last one's gap has not passed, and ends on ``stop``. Passes are replaced by
recorders here: what is under test is when the loop calls them, not what they decide."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sched_builders import Bench, RecordingBackend

from boltforge.control.scheduling import loop
from boltforge.control.scheduling.actuate import Touched
from boltforge.control.scheduling.loop import Scheduler

LIMIT_S = 10.0  # a guard against a loop that never ends, not a timing under test


@pytest.fixture
def sched(tmp_path: Path) -> Iterator[Scheduler]:
    with Bench(tmp_path, hosts=1) as b:
        b.sched.tick_s = 0.01
        yield b.sched


def drive(sched: Scheduler, passes: Callable[[bool], Touched]) -> None:
    """Run the loop with ``passes`` in place of ``pass_once`` until it stops."""
    replace_passes(sched, passes)
    asyncio.run(asyncio.wait_for(sched.run(), LIMIT_S))


def replace_passes(sched: Scheduler, passes: Callable[[bool], Touched]) -> None:
    vars(sched)["pass_once"] = passes  # the loop calls what the instance holds


def test_a_stopped_loop_runs_no_pass(sched: Scheduler) -> None:
    calls: list[bool] = []

    def record(allow_full: bool) -> Touched:
        calls.append(allow_full)
        return Touched()

    sched.stop()
    drive(sched, record)
    assert calls == []


def test_a_pass_that_raises_does_not_end_the_loop_and_what_it_committed_is_announced(
    sched: Scheduler,
) -> None:
    calls: list[bool] = []

    def flaky(allow_full: bool) -> Touched:
        calls.append(allow_full)
        if len(calls) == 1:
            sched._committed = Touched(nodes={"host-0"}, jobs={"41"})
            raise RuntimeError("the store went away for a moment")
        sched.stop()
        return Touched()

    drive(sched, flaky)
    assert len(calls) == 2  # the loop went on after the failure
    assert sched.notifier.count("job:41") == 1  # committed before the failure: announced
    backend = sched.backend
    assert isinstance(backend, RecordingBackend)
    assert backend.converged == [{"host-0"}]


def test_a_wake_from_another_thread_gets_a_pass(sched: Scheduler) -> None:
    sched.tick_s = 3600.0  # only the wake-up can start a pass: no tick, no full pass due
    sched.stats.last_full_end = time.monotonic()
    sched.stats.last_full_ms = 3_600_000.0
    calls: list[bool] = []

    def record(allow_full: bool) -> Touched:
        calls.append(allow_full)
        sched.stop()
        return Touched()

    async def main() -> None:
        task = asyncio.create_task(sched.run())
        await asyncio.sleep(0)  # the loop is waiting now
        await asyncio.to_thread(sched.wake, "7")
        await asyncio.wait_for(task, LIMIT_S)

    replace_passes(sched, record)
    asyncio.run(main())
    assert calls == [False]  # served at once, the full pass still held back


def test_a_full_pass_is_not_allowed_before_the_last_ones_gap_has_passed(
    sched: Scheduler,
) -> None:
    sched.stats.last_full_end = time.monotonic()
    sched.stats.last_full_ms = 3_600_000.0  # the last one took an hour: the next waits as long
    calls: list[bool] = []

    def record(allow_full: bool) -> Touched:
        calls.append(allow_full)
        if len(calls) == 2:
            sched.stop()
        return Touched()

    drive(sched, record)
    assert calls == [False, False]


def test_full_due_in_counts_the_gap_from_the_end_of_the_last_full_pass(
    sched: Scheduler,
) -> None:
    assert sched.full_due_in() < 0  # none ran yet
    sched.stats.last_full_end = time.monotonic()
    sched.stats.last_full_ms = 10.0  # quick: the minimum gap applies
    assert 0 < sched.full_due_in() <= loop.MIN_FULL_GAP_S
    sched.stats.last_full_ms = 120_000.0  # two minutes: the gap is as long
    assert loop.MIN_FULL_GAP_S < sched.full_due_in() <= 120.0


def test_poking_a_scheduler_whose_loop_never_ran_is_harmless(sched: Scheduler) -> None:
    sched.poke()
    sched.wake("3")
    assert sched.wanted() == (1, True)


def test_a_stop_while_the_loop_waits_ends_it_without_a_pass(sched: Scheduler) -> None:
    sched.tick_s = 3600.0
    sched.stats.last_full_end = time.monotonic()
    sched.stats.last_full_ms = 3_600_000.0  # nothing is due: the loop waits for a wake-up
    calls: list[bool] = []

    def record(allow_full: bool) -> Touched:
        calls.append(allow_full)
        return Touched()

    async def main() -> None:
        task = asyncio.create_task(sched.run())
        await asyncio.sleep(0)
        await asyncio.to_thread(sched.stop)
        await asyncio.wait_for(task, LIMIT_S)

    replace_passes(sched, record)
    asyncio.run(main())
    assert calls == []


def test_a_pass_cut_short_by_a_stop_ends_the_loop_announcing_what_it_committed(
    sched: Scheduler,
) -> None:
    calls: list[bool] = []

    def cut_short(allow_full: bool) -> Touched:
        calls.append(allow_full)
        sched._committed = Touched(jobs={"5"})
        sched.stop()
        raise RuntimeError("cannot schedule new futures after shutdown")

    drive(sched, cut_short)
    assert len(calls) == 1
    assert sched.notifier.count("job:5") == 1


def full_pass_ended(sched: Scheduler, ago_s: float) -> None:
    """As if a quick full pass ended ``ago_s`` seconds ago and nothing was asked since."""
    sched.stats.last_full_at = sched.clock() - ago_s
    sched.stats.last_full_end = time.monotonic() - ago_s
    sched.stats.last_full_ms = 10.0
    sched._other = False  # as a pass leaves it


def test_a_loop_with_nothing_to_do_sleeps_until_the_next_tick(sched: Scheduler) -> None:
    sched.tick_s, sched.full_every_s = 2.0, 60.0
    full_pass_ended(sched, 5.0)  # its gap has passed: a full pass may run
    assert sched.idle_wait() == 2.0


def test_a_periodic_full_pass_due_before_the_tick_wakes_the_loop_when_it_is_due(
    sched: Scheduler,
) -> None:
    sched.tick_s, sched.full_every_s = 30.0, 5.0
    full_pass_ended(sched, 1.0)
    assert 3.0 < sched.idle_wait() <= 4.0


def test_a_full_pass_asked_for_wakes_the_loop_once_its_gap_has_passed(sched: Scheduler) -> None:
    sched.tick_s, sched.full_every_s = 30.0, 60.0
    full_pass_ended(sched, 0.0)
    sched.wake()
    assert loop.GATHER_S <= sched.idle_wait() <= loop.MIN_FULL_GAP_S


def test_an_idle_loop_passes_once_a_tick(sched: Scheduler) -> None:
    """Not once every ``GATHER_S``: over three ticks of nothing, a handful of passes."""
    sched.tick_s, sched.full_every_s = 0.1, 3600.0
    calls: list[bool] = []

    def record(allow_full: bool) -> Touched:
        calls.append(allow_full)
        full_pass_ended(sched, 5.0)
        return Touched()

    async def main() -> None:
        task = asyncio.create_task(sched.run())
        await asyncio.sleep(0.3)
        sched.stop()
        await asyncio.wait_for(task, LIMIT_S)

    replace_passes(sched, record)
    asyncio.run(main())
    assert 1 <= len(calls) <= 5  # every GATHER_S would be about 15

"""When the loop runs which pass (``control/scheduling/loop.py``), driven one pass at a time
on a fake clock: wake-ups that come together are served by one pass, arrivals get
incremental passes on the world the last pass left, and a full pass runs only when
something asked for one, upkeep changed the plan, too many arrivals came at once, or
``full_every_s`` passed."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sched_builders import Bench, event

from boltforge.control.scheduling import loop
from boltforge.control.scheduling.actuate import Touched
from boltforge.core.cycle import schedule_arrival
from boltforge.core.decisions import CycleResult


@pytest.fixture
def bench(tmp_path: Path) -> Iterator[Bench]:
    """Two 8-GPU hosts, after the first (full) pass."""
    with Bench(tmp_path, hosts=2, full_every_s=1000.0) as b:
        b.settle()
        yield b


def counts(b: Bench) -> tuple[int, int]:
    """(full passes, passes of any kind) so far."""
    return b.sched.stats.full_cycles, b.sched.stats.cycles


# -- what a pass is asked to do ---------------------------------------------------------------


def test_a_new_scheduler_wants_a_full_pass_before_anything_happened(tmp_path: Path) -> None:
    with Bench(tmp_path, hosts=1) as b:
        assert b.sched.wanted() == (0, True)
        b.sched.pass_once()
        assert b.sched.wanted() == (0, False)
        assert b.sched.stats.full_cycles == 1


def test_arrivals_that_come_together_are_counted_and_served_by_one_pass(bench: Bench) -> None:
    jobs = [bench.submit(f"j{i}", 4) for i in range(3)]
    assert bench.sched.wanted() == (3, False)
    full, cycles = counts(bench)
    touched = bench.sched.pass_once()
    assert set(jobs) <= touched.jobs
    assert bench.sched.wanted() == (0, False)
    assert [bench.job(j).state for j in jobs] == ["scheduled"] * 3
    assert counts(bench) == (full, cycles + 3)  # one incremental cycle per arrival, no full


def test_arrivals_reuse_the_world_the_last_pass_left(bench: Bench) -> None:
    stats = bench.sched.stats
    first = bench.submit("a", 4)
    bench.sched.pass_once()
    reads = stats.world_reads  # read whole at most once, then kept current
    bench.submit("b", 4)
    bench.submit("c", 4)
    bench.sched.pass_once()
    bench.start_all()  # starts change no holdings
    bench.submit("d", 4)
    refreshed = len(stats.refresh_ms)
    bench.sched.pass_once(allow_full=False)
    assert len(stats.refresh_ms) == refreshed  # their own binds are counted in
    for rep in bench.replicas(first):  # GPUs freed by someone else: only that is read
        bench.report(rep.node, [event(rep, "exited", bench.clock(), exit_code=0)])
    last = bench.submit("e", 4)
    bench.sched.pass_once(allow_full=False)
    assert stats.world_reads == reads and len(stats.refresh_ms) == refreshed + 1
    assert bench.job(last).state == "scheduled"


def test_a_wake_without_an_arrival_asks_for_a_full_pass(bench: Bench) -> None:
    full, _ = counts(bench)
    bench.sched.wake()
    assert bench.sched.wanted() == (0, True)
    bench.sched.pass_once()
    assert counts(bench)[0] == full + 1
    assert bench.sched.wanted() == (0, False)


def test_many_wakes_are_served_by_a_single_full_pass(bench: Bench) -> None:
    full, _ = counts(bench)
    for _ in range(5):
        bench.sched.wake()
    bench.sched.pass_once()
    bench.sched.pass_once()
    assert counts(bench)[0] == full + 1


def test_a_full_pass_held_back_stays_wanted_while_arrivals_are_served(bench: Bench) -> None:
    full, _ = counts(bench)
    bench.sched.wake()
    job = bench.submit("a", 8)
    touched = bench.sched.pass_once(allow_full=False)
    assert counts(bench)[0] == full
    assert job in touched.jobs and bench.job(job).state == "scheduled"
    assert bench.sched.wanted() == (0, True)
    bench.sched.pass_once(allow_full=True)
    assert counts(bench)[0] == full + 1
    assert bench.sched.wanted() == (0, False)


@pytest.mark.parametrize(
    ("after", "full"),
    [(999.0, False), (1000.0, True), (5000.0, True)],
    ids=["before-the-period", "at-the-period", "long-after"],
)
def test_a_full_pass_runs_every_full_every_s_without_being_asked(
    bench: Bench, after: float, full: bool
) -> None:
    before, _ = counts(bench)
    bench.clock.advance(after)
    bench.beat_all()  # nobody went silent: upkeep has nothing to do
    bench.sched.pass_once()
    assert counts(bench)[0] == before + int(full)


def test_more_arrivals_than_an_incremental_pass_takes_make_a_full_pass(
    bench: Bench, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(loop, "MAX_INCREMENTAL", 2)
    full, cycles = counts(bench)
    jobs = [bench.submit(f"j{i}", 2) for i in range(3)]
    bench.sched.pass_once()
    assert counts(bench) == (full + 1, cycles + 1)  # one full pass, not three arrivals
    assert {bench.job(j).state for j in jobs} == {"scheduled"}


def test_as_many_arrivals_as_an_incremental_pass_takes_stay_incremental(
    bench: Bench, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(loop, "MAX_INCREMENTAL", 2)
    full, cycles = counts(bench)
    for i in range(2):
        bench.submit(f"j{i}", 2)
    bench.sched.pass_once()
    assert counts(bench) == (full, cycles + 2)


# -- upkeep that changes the plan -------------------------------------------------------------


def test_a_node_whose_lease_ran_out_makes_a_full_pass_that_moves_its_work(bench: Bench) -> None:
    job = bench.place("train", 8)
    bench.start_all()
    [home] = bench.held_nodes(job)
    full, _ = counts(bench)
    bench.clock.advance(bench.terms.lease_s + 1)
    bench.beat_all(but=[home])
    touched = bench.sched.pass_once()
    assert counts(bench)[0] == full + 1  # nobody woke it: the upkeep's change did
    assert home in touched.nodes and job in touched.jobs
    assert bench.node(home).state == "dead"
    moved = bench.job(job)
    assert (moved.state, moved.epoch, moved.restarts) == ("scheduled", 2, 1)
    assert bench.held_nodes(job) - {home} == bench.held_nodes(job) != set()


def test_a_node_turning_suspect_makes_a_full_pass(bench: Bench) -> None:
    full, _ = counts(bench)
    bench.clock.advance(bench.terms.suspect_s + 0.5)
    bench.beat_all(but=["host-1"])
    touched = bench.sched.pass_once()
    assert touched.nodes == {"host-1"}
    assert bench.node("host-1").state == "suspect"
    assert counts(bench)[0] == full + 1


def test_upkeep_that_changes_the_plan_while_a_full_pass_is_held_back_asks_for_one(
    bench: Bench,
) -> None:
    bench.clock.advance(bench.terms.suspect_s + 0.5)
    bench.beat_all(but=["host-0"])
    full, _ = counts(bench)
    bench.sched.pass_once(allow_full=False)
    assert bench.node("host-0").state == "suspect"
    assert counts(bench)[0] == full
    assert bench.sched.wanted() == (0, True)


def test_a_quiet_fleet_makes_no_upkeep_and_no_full_pass(bench: Bench) -> None:
    full, _ = counts(bench)
    bench.clock.advance(bench.terms.suspect_s - 1)
    touched = bench.sched.pass_once()
    assert touched == Touched()
    assert counts(bench)[0] == full
    assert {bench.node(n).state for n in ("host-0", "host-1")} == {"ready"}


# -- what arrivals do to the passes after them ------------------------------------------------


def fill(bench: Bench, priority: str = "low", **extra: Any) -> str:
    """A 16-GPU job of ``priority`` running on both hosts."""
    job = bench.place("filler", 16, priority=priority, **extra)
    bench.start_all()
    assert bench.job(job).state == "running"
    return job


def test_an_arrival_that_evicts_ends_the_pass_and_the_next_arrivals_wait_for_another(
    bench: Bench,
) -> None:
    victim = fill(bench)
    urgent = bench.submit("urgent", 8, team="nlp", priority="high")
    later = bench.submit("later", 8, team="nlp")
    bench.sched.pass_once(allow_full=False)
    assert bench.job(victim).state == "preempting"
    assert bench.job(urgent).state == "scheduled"
    assert bench.job(later).state == "pending"
    assert bench.sched.wanted()[0] == 1  # put back for the next pass
    bench.sched.pass_once(allow_full=False)
    assert bench.sched.wanted()[0] == 0
    assert bench.job(later).reason != ""  # it waits, with a reason, for the victim to leave


@pytest.mark.parametrize(
    ("policy", "asks"), [("default", True), ("greedy", False)], ids=["backfill", "no-backfill"]
)
def test_a_blocked_arrival_asks_for_a_full_pass_only_where_starts_are_reserved(
    tmp_path: Path, policy: str, asks: bool
) -> None:
    with Bench(tmp_path, hosts=2, full_every_s=1000.0, policy=policy) as b:
        b.settle()
        fill(b, priority="normal")
        blocked = b.submit("blocked", 8)
        b.sched.pass_once(allow_full=False)
        assert b.job(blocked).state == "pending"
        assert b.sched.wanted() == (0, asks)


def test_once_a_start_is_reserved_later_blocked_arrivals_ask_for_nothing(bench: Bench) -> None:
    fill(bench, priority="normal", time_limit="1h")  # its end is known: a start can be
    first = bench.submit("first", 8)
    bench.sched.pass_once()  # it waits, and asks for a full pass
    bench.sched.pass_once()  # which reserves its start
    assert bench.job(first).reason == "reserved"
    assert [r.job for r in bench.sched.reservations] == [first]
    bench.submit("second", 8)
    bench.sched.pass_once(allow_full=False)
    assert bench.sched.wanted() == (0, False)


def test_an_arrival_like_one_that_just_had_to_wait_gets_the_same_verdict_without_the_core(
    bench: Bench, monkeypatch: pytest.MonkeyPatch
) -> None:
    fill(bench, priority="normal")
    asked: list[str] = []
    real = schedule_arrival

    def counted(snap: Any, job: Any, *rest: Any) -> CycleResult:
        asked.append(job.id)
        return real(snap, job, *rest)

    monkeypatch.setattr(loop, "schedule_arrival", counted)
    first = bench.submit("first", 8)
    bench.sched.pass_once(allow_full=False)
    twin = bench.submit("twin", 8)
    bench.sched.pass_once(allow_full=False)
    assert asked == [first]  # the twin was answered from the verdict
    assert bench.job(twin).reason == bench.job(first).reason != ""
    assert bench.job(twin).waiting == bench.job(first).waiting

    bench.clock.advance(loop.VERDICT_S)
    late = bench.submit("late", 8)  # the verdict is too old now: the core is asked
    bench.sched.pass_once(allow_full=False)
    other = bench.submit("other", 4)  # another shape: the core is asked
    bench.sched.pass_once(allow_full=False)
    assert asked == [first, late, other]


# -- waking the nodes and the watchers --------------------------------------------------------


def test_announce_converges_the_touched_nodes_and_wakes_the_touched_jobs(bench: Bench) -> None:
    before = bench.notifier.count("jobs")
    bench.sched.announce(Touched(nodes={"host-0"}, jobs={"7", "8"}))
    assert bench.backend.converged[-1] == {"host-0"}
    assert bench.notifier.count("job:7") == bench.notifier.count("job:8") == 1
    assert bench.notifier.count("jobs") == before + 1


def test_announcing_nothing_wakes_nobody(bench: Bench) -> None:
    converged, seq = len(bench.backend.converged), bench.notifier.seq
    bench.sched.announce(Touched())
    assert len(bench.backend.converged) == converged
    assert bench.notifier.seq == seq


def test_a_pass_wakes_the_nodes_it_dispatched_to_and_returns_them(bench: Bench) -> None:
    job = bench.submit("wide", 16)
    watchers = bench.notifier.count(f"job:{job}")
    touched = bench.sched.pass_once()
    assert touched.nodes == {"host-0", "host-1"}
    assert job in touched.jobs
    assert {r.state for r in bench.replicas(job)} == {"starting"}
    assert bench.backend.converged[-1] == {"host-0", "host-1"}  # converged by the pass itself
    assert bench.notifier.count(f"job:{job}") > watchers


def test_a_victims_node_is_woken_by_the_pass_that_evicts_it(bench: Bench) -> None:
    victim = fill(bench)
    bench.backend.converged.clear()
    bench.submit("urgent", 8, team="nlp", priority="high")
    bench.sched.pass_once(allow_full=False)
    assert bench.job(victim).state == "preempting"
    woken = set().union(*bench.backend.converged)
    assert woken == {"host-0", "host-1"}  # both hosts of the gang get the checkpoint signal
    assert {r.state for r in bench.replicas(victim)} == {"stopping"}

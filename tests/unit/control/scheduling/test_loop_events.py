"""The loop is driven by events and does only the work each asks for: a start wakes no
pass, an exit asks for dispatch and a full pass, arrivals reuse the world the last pass
left, and full passes never run back to back."""

from __future__ import annotations

import asyncio
import logging
import re
import threading
from pathlib import Path

import pytest
from control_kit import Fleet, make_spec

from boltforge.control.scheduling import loop
from boltforge.control.scheduling.actuate import Touched
from boltforge.control.scheduling.loop import Scheduler
from boltforge.control.scheduling.world import Caches, load_world
from boltforge.core.cycle import holdings_of


def test_a_start_report_asks_for_no_pass(tmp_path: Path) -> None:
    with Fleet(tmp_path, hosts=2) as fleet:
        job = fleet.submit(make_spec("train", 16))
        assert fleet.rt.scheduler.wanted() == (0, False)
        for node in fleet.nodes.values():
            for rep in node.to_run():
                node.start(rep)
        assert fleet.rt.scheduler.wanted() == (0, False)
        assert fleet.job(job).state == "running"


def test_an_exit_asks_for_a_full_pass(tmp_path: Path) -> None:
    with Fleet(tmp_path, hosts=2) as fleet:
        job = fleet.submit(make_spec("train", 8))
        fleet.start_everything()
        node = next(n for n in fleet.nodes.values() if n.to_run())
        [rep] = node.to_run()
        node.exit(rep, 0)
        assert fleet.rt.scheduler.wanted() == (0, True)
        fleet.settle()
        assert fleet.job(job).state == "succeeded"


def test_arrivals_keep_one_world_current_by_the_mirrors_changes(tmp_path: Path) -> None:
    with Fleet(tmp_path, hosts=4) as fleet:
        stats = fleet.rt.scheduler.stats
        first = fleet.submit(make_spec("a", 8))
        reads = stats.world_reads
        fleet.submit(make_spec("b", 8, team="vision"))
        fleet.submit(make_spec("c", 8))
        assert stats.world_reads == reads  # their own binds were counted in, not re-read
        world = fleet.rt.scheduler._world
        assert world is not None and len(world.running) == 3
        assert world.holdings() == holdings_of(world.fleet.tree, world.running)  # kept up
        refreshed = len(stats.refresh_ms)
        fleet.start_everything()
        fleet.finish(first)  # an exit frees GPUs: the world follows the mirror's changes
        fleet.submit(make_spec("d", 16))
        assert stats.world_reads == reads and len(stats.refresh_ms) > refreshed
        assert fleet.rt.scheduler._world is world
        placed = [fleet.job(j).state for j in fleet.rt.mirror.jobs]
        assert placed.count("scheduled") + placed.count("running") == 3


def test_replies_see_the_world_kept_current_and_never_one_changed_under_them(
    tmp_path: Path,
) -> None:
    with Fleet(tmp_path, hosts=2) as fleet:
        rt = fleet.rt
        first = fleet.submit(make_spec("a", 8))
        fleet.submit(make_spec("b", 4))
        fleet.start_everything()
        before = rt.world(rt.clock())
        free = before.state.free.copy()
        fleet.finish(first)
        after = rt.world(rt.clock())
        assert after is not before and (before.state.free == free).all()  # handed out: kept
        assert int(after.state.free.sum()) == int(free.sum()) + 8
        whole = load_world(rt.mirror, rt.clock(), Caches(), waiting=())
        assert sorted(after.state.allocations) == sorted(whole.state.allocations)
        assert (after.state.free == whole.state.free).all()


def test_a_full_pass_held_back_leaves_arrivals_and_dispatch_going(tmp_path: Path) -> None:
    with Fleet(tmp_path, hosts=2) as fleet:
        sched = fleet.rt.scheduler
        sched.stop()  # only this test's passes from here on
        with sched.lock:
            pass  # a pass the background loop had begun has ended
        sched.wake()  # something asked for a full pass
        r = fleet.post("/v1/jobs", {"spec": make_spec("a", 8)})
        job = r.json()["job"]["id"]
        before = sched.stats.full_cycles
        touched = sched.pass_once(allow_full=False)
        assert sched.stats.full_cycles == before  # held back
        assert sched.wanted() == (0, True)  # and still wanted
        assert job in touched.jobs
        assert fleet.job(job).state == "scheduled"
        assert any(n.to_run() for n in fleet.nodes.values())  # dispatched meanwhile


def test_the_next_full_pass_waits_at_least_as_long_as_the_last_took(tmp_path: Path) -> None:
    with Fleet(tmp_path, hosts=2) as fleet:
        sched = fleet.rt.scheduler
        sched.wake()
        sched.pass_once()
        took = sched.stats.last_full_ms / 1000.0
        assert sched.full_due_in() > max(took, 0.4)  # at least MIN_FULL_GAP_S, less a moment


def test_a_pass_cut_short_by_stopping_ends_the_loop_without_waiting_a_tick(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Stopping shuts the planner down under a running pass, which then fails; the loop
    must end at once rather than log the failure and sleep a whole tick first."""
    with Fleet(tmp_path, hosts=1) as fleet:
        live = fleet.rt.scheduler
        sched = Scheduler(
            fleet.rt.db, live.policy, live.notifier, live.settings, live.terms, tick_s=600.0
        )

        def stopped_mid_pass(allow_full: bool = True) -> Touched:
            sched.stop()
            raise RuntimeError("cannot schedule new futures after shutdown")

        sched.pass_once = stopped_mid_pass  # type: ignore[method-assign]
        asyncio.run(asyncio.wait_for(sched.run(), 30.0))  # a tick would be 600 s
        assert "scheduling pass failed" not in caplog.text


def test_a_slow_full_pass_is_logged_with_where_its_time_went(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The server's own loop may pass in the background at any time, so the pass here is
    made full (``full_every_s`` 0) and only its own thread's record is read."""
    monkeypatch.setattr(loop, "SLOW_FULL_MS", 0.0)  # every full pass counts as slow
    with Fleet(tmp_path, hosts=2) as fleet:
        fleet.submit(make_spec("whole-fleet", 16))
        fleet.submit(make_spec("next", 8))  # waits for it
        monkeypatch.setattr(fleet.rt.scheduler, "full_every_s", 0.0)
        caplog.clear()
        with caplog.at_level(logging.WARNING, "boltforge.loop"):
            fleet.rt.scheduler.pass_once()
    here = threading.get_ident()
    [said] = [
        r.getMessage()
        for r in caplog.records
        if r.thread == here and "slow full pass" in r.getMessage()
    ]
    assert re.fullmatch(
        r"slow full pass: \d+ ms \(read \d+, decide \d+ of which \d+ on the CPU, apply \d+\); "
        r"1 waiting, 1 running; 0 binds, 0 evictions",
        said,
    ), said

"""Full passes planned beside the arrivals keep only the decisions that still hold when they
are applied: the world may have moved while the core was deciding."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from control_kit import Fleet, make_spec, wait_for
from sqlalchemy.orm import Session

from boltforge.control.scheduling import loop
from boltforge.control.scheduling.actuate import record_waits
from boltforge.control.scheduling.planning import Plan
from boltforge.control.scheduling.world import World
from boltforge.control.store.invariants import double_allocations
from boltforge.core.cycle import Snapshot
from boltforge.core.decisions import Waiting

Held = tuple[Fleet, threading.Event]


@pytest.fixture
def held_planner(tmp_path: Path) -> Iterator[Held]:
    """A fleet whose full passes are planned in the background, with the planner held at a
    gate while the test keeps it closed (it starts open)."""
    fleet = Fleet(tmp_path, hosts=2, overlap=True)
    gate = threading.Event()
    gate.set()
    with fleet:
        sched = fleet.rt.scheduler
        decide = sched._decide

        def held(plan: Plan, snap: Snapshot) -> Plan:
            gate.wait(30)
            return decide(plan, snap)

        sched._decide = held  # type: ignore[method-assign]
        yield fleet, gate
        gate.set()


def placed_on(fleet: Fleet, job: str) -> set[str]:
    return {r.node for r in fleet.replicas() if r.job_id == job and r.state != "exited"}


def planned_and_held(fleet: Fleet, gate: threading.Event) -> str:
    """A 16-GPU job that waits for a 16-GPU job to finish on both hosts; once it finished,
    the full pass planned for the waiting one (on both hosts) is held at the closed gate.
    Returns the waiting job. The waiting job's arrival is settled, and the plans made while
    it could not fit are applied, before the gate closes: otherwise the pass that sees the
    finish could place it as an arrival, with no plan to hold."""
    sched = fleet.rt.scheduler
    big = fleet.submit(make_spec("big", 16))
    fleet.start_everything()
    waiting = fleet.submit(make_spec("next", 16))
    wait_for(lambda: sched._planning is None, 10)
    fleet.settle()
    assert fleet.job(waiting).state == "pending"
    gate.clear()
    fleet.finish(big)  # frees both hosts
    wait_for(lambda: fleet.rt.scheduler._planning is not None, 10)
    return waiting


def test_a_bind_onto_a_host_cordoned_meanwhile_is_dropped(held_planner: Held) -> None:
    fleet, gate = held_planner
    sched = fleet.rt.scheduler
    waiting = planned_and_held(fleet, gate)
    r = fleet.post("/v1/nodes/host-0/cordon", {})
    assert r.status_code == 200, r.text
    gate.set()
    wait_for(lambda: sched._planning is None or sched._planning.done(), 30)
    fleet.settle()
    assert fleet.job(waiting).state == "pending"  # its plan named host-0: not applied
    assert placed_on(fleet, waiting) == set()
    with fleet.rt.db.session() as s:
        assert double_allocations(s) == []


def test_a_plan_applies_whole_when_nothing_changed(held_planner: Held) -> None:
    fleet, gate = held_planner
    waiting = planned_and_held(fleet, gate)
    gate.set()
    wait_for(lambda: fleet.job(waiting).state == "scheduled", 30)
    assert placed_on(fleet, waiting) == {"host-0", "host-1"}


def test_a_plans_waiting_reasons_are_written_a_share_per_pass(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(loop, "WAITS_PER_PASS", 2)
    shares: list[list[str]] = []

    def spy(s: Session, world: World, waits: list[Waiting]) -> None:
        shares.append([w.job for w in waits])
        record_waits(s, world, waits)

    monkeypatch.setattr("boltforge.control.scheduling.loop.record_waits", spy)
    with Fleet(tmp_path, hosts=2, overlap=True) as fleet:
        fleet.submit(make_spec("big", 16))
        queue = [fleet.submit(make_spec(f"w{i}", 8)) for i in range(5)]
        fleet.rt.scheduler.wake()  # a full pass places them in line
        wait_for(lambda: all(fleet.job(j).position is not None for j in queue), 30)
        # each plan writes the head of its line at once, the rest after, a share per pass
        assert {j for share in shares for j in share} == set(queue[2:])
        assert all(1 <= len(share) <= 2 for share in shares)

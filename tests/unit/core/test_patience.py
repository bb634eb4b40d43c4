"""Start now across racks, or soon inside one: a gang waits for the tight placement only when
it finishes sooner there, holds a reservation for it, and never waits without a runtime."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from boltforge.core.cycle import Snapshot, run_cycle, schedule_arrival
from boltforge.core.decisions import CycleResult, WaitReason
from boltforge.core.model.gang import Gang, TopologyRule
from boltforge.core.model.levels import Level
from boltforge.core.model.state import Allocation, FleetState, Grant
from boltforge.core.model.workload import Job, Running
from boltforge.core.placement.patience import (
    STEP_FACTOR,
    ideal_widest,
    tighter,
    widest,
    worth_waiting,
)
from boltforge.core.placement.place import place_gang
from boltforge.core.policy import (
    CONSERVATIVE_BACKFILL,
    FAIR_SHARE,
    POLICIES,
    TOPOLOGY_LOOKAHEAD,
)
from boltforge.testing.builders import make_fleet, make_gang

HOUR = 3600.0
LAB = make_fleet(racks=2, hosts=2)  # rack 0: h0, h1; rack 1: h0, h1
H = [h.name for h in LAB.hosts]
# no size rule: jobs of one team go in arrival order, so each scenario reads in order
PATIENT = POLICIES["default"].with_(order=FAIR_SHARE)


def pair(limit: float | None, name: str = "pair", required: Level | None = None) -> Job:
    """A 16-GPU gang of two 8-GPU replicas: one rack holds it on an empty fleet."""
    base = make_gang(name, gpus=16, per_node=8)
    gang = Gang(name, base.roles, TopologyRule(required=required), "team", 3)
    return Job(name, gang, "team", 0.0, time_limit=limit)


@dataclass(frozen=True)
class Lab:
    """``LAB`` with one host of each rack busy: rack 0's until ``rack0_free_at``, rack 1's for
    100 h, so a 16-GPU gang fits now only across the two racks."""

    rack0_free_at: float
    pending: tuple[Job, ...]

    def snapshot(self) -> Snapshot:
        state = FleetState(LAB)
        running = []
        for name, host, end in (("a", H[0], self.rack0_free_at), ("b", H[3], 100 * HOUR)):
            grant = Grant("w", 0, LAB.host_index[host], tuple(range(8)))
            state.allocate(Allocation(name, (grant,), end))
            job = Job(name, make_gang(name, gpus=8), "team", -1.0, time_limit=end)
            running.append(Running(job, state.allocations[name], 0.0))
        return Snapshot(state, self.pending, tuple(running), 0.0)


def racks_of(result: CycleResult, job: str) -> set[int]:
    [bind] = [b for b in result.binds if b.job == job]
    return {LAB.hosts[g.host].rack for g in bind.placement.grants}


def test_a_gang_waits_for_one_rack_that_frees_soon_and_holds_it() -> None:
    result = run_cycle(Lab(600.0, (pair(4 * HOUR),)).snapshot(), PATIENT)
    assert result.binds == ()
    [reserve] = result.reservations
    assert reserve.job == "pair" and reserve.start == 600.0
    assert {LAB.hosts[h].rack for h in reserve.hosts} == {LAB.hosts[0].rack}
    [waiting] = result.waiting
    assert waiting.reason == WaitReason.RESERVED
    assert "waits for one rack" in waiting.detail[0] and "1.5x slower" in waiting.detail[0]


@pytest.mark.parametrize(
    ("rack0_free_at", "limit", "why"),
    [
        (3 * HOUR, 4 * HOUR, "the rack frees too late: 3 h + 4 h is after 4 h x 1.5"),
        (600.0, None, "no runtime is known: nothing to weigh"),
        (-60.0, 4 * HOUR, "the rack's job runs past its expected end: when it ends is unknown"),
    ],
)
def test_a_gang_starts_across_racks_now_when_waiting_does_not_pay(
    rack0_free_at: float, limit: float | None, why: str
) -> None:
    result = run_cycle(Lab(rack0_free_at, (pair(limit),)).snapshot(), PATIENT)
    assert len(racks_of(result, "pair")) == 2, why


def test_policies_without_patience_start_across_racks_at_once() -> None:
    for name in ("fifo", "slurm-like", "greedy", "tiresias"):
        result = run_cycle(Lab(600.0, (pair(4 * HOUR),)).snapshot(), POLICIES[name])
        assert len(racks_of(result, "pair")) == 2, name
    impatient = run_cycle(
        Lab(600.0, (pair(4 * HOUR),)).snapshot(), PATIENT.with_(placement=TOPOLOGY_LOOKAHEAD)
    )
    assert len(racks_of(impatient, "pair")) == 2


def test_a_gang_that_requires_a_domain_is_left_to_its_rule() -> None:
    """Its placement is already inside the domain it asked for; patience adds nothing."""
    job = pair(4 * HOUR, required=Level.POD)
    placement, _ = place_gang(Lab(600.0, ()).snapshot().state, job.gang)
    assert placement is not None and tighter(LAB, job.gang, placement) is None
    result = run_cycle(Lab(600.0, (job,)).snapshot(), PATIENT)
    assert len(racks_of(result, "pair")) == 2


def test_an_arrival_waits_without_a_reservation_for_the_next_full_pass() -> None:
    snap = Lab(600.0, ()).snapshot()
    result = schedule_arrival(snap, pair(4 * HOUR), PATIENT, ())
    assert result.binds == () and result.reservations == ()
    [waiting] = result.waiting
    assert waiting.reason == WaitReason.TOPOLOGY and waiting.estimated_start == 600.0


def test_with_no_reservation_left_the_gang_starts_across_racks() -> None:
    """Waiting unprotected could be waiting for ever; without a reservation it starts now."""
    result = run_cycle(
        Lab(600.0, (pair(4 * HOUR),)).snapshot(),
        PATIENT.with_(backfill=CONSERVATIVE_BACKFILL.with_(reservations=0)),
    )
    assert len(racks_of(result, "pair")) == 2


@settings(max_examples=60, deadline=None)
@given(
    free_at=st.floats(min_value=1.0, max_value=20 * HOUR),
    limit=st.floats(min_value=60.0, max_value=40 * HOUR),
)
def test_a_gang_waits_exactly_when_the_tight_start_finishes_sooner(
    free_at: float, limit: float
) -> None:
    result = run_cycle(Lab(free_at, (pair(limit),)).snapshot(), PATIENT)
    waits = not result.binds
    assert waits == (free_at + limit < limit * STEP_FACTOR["pod"])
    if waits:  # never longer than the slowdown it saves
        [reserve] = result.reservations
        assert reserve.start - 0.0 < limit * (STEP_FACTOR["pod"] - 1.0)


def test_widest_level_and_the_empty_fleets_placement() -> None:
    assert widest({"host": 1, "rack": 0, "pod": 0, "spine": 0}) == "host"
    assert widest({"rack": 3, "pod": 1}) == "pod"
    assert ideal_widest(LAB, pair(None).gang) == "rack"  # two hosts of one rack
    assert ideal_widest(LAB, make_gang("one", gpus=8)) == "host"
    assert ideal_widest(LAB, make_gang("all", gpus=32, per_node=8)) == "pod"


def test_worth_waiting_compares_finish_times() -> None:
    assert worth_waiting(runtime=4 * HOUR, factor=1.5, start=HOUR, now=0.0)  # 5 h < 6 h
    assert not worth_waiting(runtime=4 * HOUR, factor=1.5, start=2 * HOUR, now=0.0)  # 6 h
    assert not worth_waiting(runtime=4 * HOUR, factor=1.0, start=1.0, now=0.0)

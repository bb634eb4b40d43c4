"""Restart one host, not the whole job (core/placement/recovery.py), and degraded hosts
(no gangs)."""

from __future__ import annotations

from dataclasses import replace

from boltforge.core.cycle import Snapshot, run_cycle
from boltforge.core.decisions import CycleResult, Reserve
from boltforge.core.model.gang import Gang
from boltforge.core.model.state import Allocation, FleetState, Grant
from boltforge.core.model.topology import TopologyTree
from boltforge.core.model.workload import Hold, Job, Running
from boltforge.core.placement.place import place_gang
from boltforge.core.placement.recovery import span
from boltforge.core.policy import POLICIES
from boltforge.testing.builders import make_fleet, make_gang, occupy

ALL = tuple(range(8))
POLICY = POLICIES["default"]
FLEET = make_fleet(pods=1, racks=2, hosts=4)  # h100-p0-r0-h0 .. h100-p0-r1-h3


def h(rack: int, host: int) -> int:
    return FLEET.host_index[f"h100-p0-r{rack}-h{host}"]


def name(host: int) -> str:
    return FLEET.hosts[host].name


def job(name: str, hosts: int, submit: float = 0.0, held: Hold | None = None) -> Job:
    gang = make_gang(name, gpus=8 * hosts, per_node=8)
    gang = Gang(gang.name, gang.roles, gang.topology, "team", 3)
    return Job(name, gang, "team", submit, held=held)


def hold_of(name: str, kept: dict[int, int], lost: tuple[int, ...]) -> Hold:
    """A hold of whole hosts: replica -> host."""
    grants = tuple(Grant("worker", r, host, ALL) for r, host in sorted(kept.items()))
    return Hold(Allocation(f"held:{name}", grants, 60.0), lost)


def busy(state: FleetState, name: str, hosts: list[int], end: float = 3600.0) -> Running:
    grants = tuple(Grant("worker", i, host, ALL) for i, host in enumerate(hosts))
    state.allocate(Allocation(name, grants, end))
    return Running(job(name, len(hosts)), state.allocations[name], 0.0)


def cycle(state: FleetState, pending: list[Job], running: tuple[Running, ...] = ()) -> CycleResult:
    for j in pending:
        if j.held is not None:
            state.allocate(j.held.allocation)
    return run_cycle(Snapshot(state, tuple(pending), tuple(running), 0.0), POLICY)


def hosts_of(result: CycleResult, job_id: str) -> dict[int, int]:
    bind = next(b for b in result.binds if b.job == job_id)
    return {g.replica: g.host for g in bind.placement.grants}


def test_a_gang_that_lost_a_host_keeps_the_rest_and_replaces_it_in_its_rack() -> None:
    state = FleetState(FLEET)
    state.cordoned[h(0, 2)] = True  # the dead host
    gang = job("g", 3, held=hold_of("g", {0: h(0, 0), 1: h(0, 1)}, (h(0, 2),)))
    result = cycle(state, [gang])
    assert hosts_of(result, "g") == {0: h(0, 0), 1: h(0, 1), 2: h(0, 3)}
    note = result.binds[0].note
    assert note == (
        "replaced h100-p0-r0-h2 by h100-p0-r0-h3 (same rack), kept h100-p0-r0-h0, h100-p0-r0-h1"
    )


def test_ranks_keep_their_numbers_and_the_replacement_takes_the_lost_rank() -> None:
    state = FleetState(FLEET)
    state.cordoned[h(0, 1)] = True
    gang = job("g", 3, held=hold_of("g", {0: h(0, 0), 2: h(0, 2)}, (h(0, 1),)))
    result = cycle(state, [gang])
    assert hosts_of(result, "g") == {0: h(0, 0), 1: h(0, 3), 2: h(0, 2)}


def test_the_replacement_goes_to_the_pod_when_the_rack_is_full() -> None:
    state = FleetState(FLEET)
    state.cordoned[h(0, 2)] = True
    running = [busy(state, "bg", [h(0, 3)])]
    gang = job("g", 3, held=hold_of("g", {0: h(0, 0), 1: h(0, 1)}, (h(0, 2),)))
    result = cycle(state, [gang], tuple(running))
    placed = hosts_of(result, "g")
    assert placed[0] == h(0, 0) and placed[1] == h(0, 1)
    assert FLEET.host_rack[placed[2]] == FLEET.host_rack[h(1, 0)]
    assert "(same pod)" in result.binds[0].note


def test_held_gpus_are_not_given_to_another_job_while_the_gang_cannot_restart() -> None:
    state = FleetState(FLEET)
    state.cordoned[h(0, 2)] = True
    running = [busy(state, "bg", [h(0, 3), *(h(1, i) for i in range(4))])]
    rival = job("rival", 2, submit=-10.0)  # ahead in line, and it would fit on h0, h1
    gang = job("g", 3, held=hold_of("g", {0: h(0, 0), 1: h(0, 1)}, (h(0, 2),)))
    result = cycle(state, [rival, gang], tuple(running))
    assert not result.binds
    assert {w.job for w in result.waiting} == {"rival", "g"}


def test_a_reservation_made_on_held_hosts_does_not_keep_the_gang_from_restarting() -> None:
    """A rival ahead in line reserved the held hosts for when the hold runs out; once a
    replacement host frees up, the gang still restarts on what it held."""
    state = FleetState(FLEET)
    state.cordoned[h(0, 2)] = True
    running = (busy(state, "bg", [*(h(1, i) for i in range(4))]),)
    rival = job("rival", 2, submit=-10.0)
    promised = place_gang(FleetState(FLEET), rival.gang)[0]
    assert promised is not None
    reserved = Reserve("rival", 60.0, promised, frozenset({h(0, 0), h(0, 1)}))
    gang = job("g", 3, held=hold_of("g", {0: h(0, 0), 1: h(0, 1)}, (h(0, 2),)))
    state.allocate(gang.held.allocation)  # type: ignore[union-attr]
    snap = Snapshot(state, (rival, gang), running, 0.0)
    result = run_cycle(snap, POLICY, reservations=(reserved,))
    assert hosts_of(result, "g") == {0: h(0, 0), 1: h(0, 1), 2: h(0, 3)}


def test_without_its_hold_the_gpus_go_to_the_next_job() -> None:
    state = FleetState(FLEET)
    state.cordoned[h(0, 2)] = True
    running = [busy(state, "bg", [h(0, 3), *(h(1, i) for i in range(4))])]
    result = cycle(state, [job("rival", 2, submit=-10.0), job("g", 3)], tuple(running))
    assert set(hosts_of(result, "rival").values()) == {h(0, 0), h(0, 1)}


def test_a_hold_on_a_host_gone_bad_is_not_kept() -> None:
    state = FleetState(FLEET)
    state.cordoned[[h(0, 1), h(0, 2)]] = True
    gang = job("g", 3, held=hold_of("g", {0: h(0, 0), 1: h(0, 1)}, (h(0, 2),)))
    placed = hosts_of(cycle(state, [gang]), "g")
    assert placed[0] == h(0, 0)
    assert h(0, 1) not in placed.values() and h(0, 2) not in placed.values()


def test_a_hold_that_does_not_match_the_gang_falls_back_to_a_fresh_placement() -> None:
    state = FleetState(FLEET)
    hold = Hold(Allocation("held:g", (Grant("worker", 5, h(0, 0), ALL),), 60.0), ())
    result = cycle(state, [job("g", 2, held=hold)])
    assert len(result.binds) == 1 and not result.binds[0].note


def test_span_folds_runs_of_three_or_more() -> None:
    assert span(["host-0", "host-1", "host-2"]) == "host-0..2"
    assert span(["host-0", "host-1", "host-5"]) == "host-0, host-1, host-5"
    assert span(["a", "host-3", "host-4", "host-5", "host-7"]) == "a, host-3..5, host-7"


# -- degraded hosts ------------------------------------------------------------------------

SMALL: TopologyTree = make_fleet(pods=1, racks=1, hosts=2)


def test_a_degraded_host_still_takes_a_single_host_job() -> None:
    state = FleetState(SMALL)
    state.degraded[0] = True
    state.allocate(Allocation("bg", (Grant("worker", 0, 1, ALL),), 3600.0))
    placement, _ = place_gang(state, make_gang("one", gpus=8, per_node=8))
    assert placement is not None and placement.grants[0].host == 0


def test_a_degraded_host_takes_no_multi_host_gang_and_says_so() -> None:
    state = FleetState(SMALL)
    state.degraded[0] = True
    placement, _ = place_gang(state, make_gang("two", gpus=16, per_node=8))
    assert placement is None
    result = run_cycle(Snapshot(state, (job("two", 2),), (), 0.0), POLICY)
    waiting = result.why("two")
    assert waiting is not None
    assert any("degraded" in line and SMALL.hosts[0].name in line for line in waiting.detail)
    state.degraded[0] = False
    assert place_gang(state, make_gang("two", gpus=16, per_node=8))[0] is not None


def test_a_degraded_host_takes_no_tensor_parallel_replica() -> None:
    state = FleetState(SMALL)
    state.degraded[:] = True
    assert place_gang(state, make_gang("tp", gpus=8, per_node=8, tp=8))[0] is None
    assert place_gang(state, make_gang("plain", gpus=8, per_node=8))[0] is not None


def test_a_replacement_avoids_degraded_hosts() -> None:
    state = FleetState(FLEET)
    state.cordoned[h(0, 2)] = True
    state.degraded[h(0, 3)] = True
    gang = job("g", 3, held=hold_of("g", {0: h(0, 0), 1: h(0, 1)}, (h(0, 2),)))
    placed = hosts_of(cycle(state, [gang]), "g")
    assert placed[2] != h(0, 3) and FLEET.host_rack[placed[2]] == FLEET.host_rack[h(1, 0)]


def test_jobs_without_holds_decide_as_before() -> None:
    state = FleetState(FLEET)
    pending = [job("a", 3), job("b", 2, submit=1.0)]
    plain = cycle(state.copy(), pending)
    again = cycle(state.copy(), [replace(j, held=None) for j in pending])
    assert [(b.job, b.placement.grants) for b in plain.binds] == [
        (b.job, b.placement.grants) for b in again.binds
    ]


def test_recovery_on_busy_fleets_never_double_assigns_and_keeps_what_it_can() -> None:
    """Random busy fleets: a gang placed fresh loses one host; whatever the cycle then binds
    (the gang and the jobs behind it) fits the state together, off the dead host, and the
    gang, when it recovers, keeps every replica it held."""
    fleet = make_fleet(pods=2, racks=2, hosts=4)
    recovered = 0
    for seed in range(40):
        state = occupy(fleet, 0.5, seed=seed)
        size = 2 + seed % 3
        placement, _ = place_gang(state, make_gang("g", gpus=8 * size, per_node=8))
        if placement is None:
            continue
        grants = placement.grants
        dead = grants[seed % len(grants)].host
        kept = tuple(g for g in grants if g.host != dead)
        state.cordoned[dead] = True
        hold = Hold(Allocation("held:g", kept, 60.0), (dead,))
        pending = [job("g", size, held=hold), job("x", 1, submit=1.0), job("y", 2, submit=2.0)]
        result = cycle(state.copy(), pending)
        check = state.copy()
        for b in result.binds:
            assert all(g.host != dead for g in b.placement.grants)
            check.allocate(Allocation(b.job, b.placement.grants))  # raises on a clash
        bind = next((b for b in result.binds if b.job == "g"), None)
        if bind is not None and bind.note:
            recovered += 1
            assert set(kept) <= set(bind.placement.grants)
    assert recovered >= 20

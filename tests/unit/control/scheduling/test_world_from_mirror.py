"""What one pass sees (``control/scheduling/world.py``), built from mirrors written by hand:
which hosts take no new work, who holds which GPUs (holding jobs, leaving replicas, GPUs
held for a restart), which jobs wait and which can never run here, and the reuse of the
fleet and the interruption rates between passes."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from sched_builders import live_job, live_node, live_replica, mirror_of

from boltforge.control.scheduling.world import (
    ROUTING_REFRESH_S,
    Caches,
    add_waiting,
    degraded_by,
    fleet_of,
    job_of,
    load_world,
    routing_stale,
)
from boltforge.core.queueing.runtimes import MIN_RUNS, Finished

NOW = 1_800_000_000.0


TWO = [live_node("host-0"), live_node("host-1")]


def free_on(world: Any, name: str) -> int:
    return int(world.state.host_free[world.fleet.index[name]])


# -- hosts that take no new work ------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "cordoned"),
    [
        ({}, False),
        ({"cordoned": True}, True),
        ({"state": "suspect"}, True),
        ({"state": "dead"}, True),
        ({"state": "suspect", "cordoned": True}, True),
    ],
    ids=["ready", "cordoned", "suspect", "dead", "suspect-and-cordoned"],
)
def test_only_ready_uncordoned_hosts_take_new_work(values: dict[str, Any], cordoned: bool) -> None:
    world = load_world(mirror_of([live_node("host-0", **values)]), NOW, Caches())
    assert bool(world.state.cordoned[world.fleet.index["host-0"]]) is cordoned


@pytest.mark.parametrize(
    ("until", "flag", "degraded"),
    [
        (None, None, False),
        (None, "", False),
        (None, "0", False),
        (None, "false", False),
        (None, " No ", False),
        (None, "FALSE", False),
        (None, "yes", True),
        (None, "ecc errors on gpu 3", True),
        (None, 1, True),
        (None, False, False),
        (NOW + 1, None, True),
        (NOW, None, False),  # the straggler evidence ends this instant
        (NOW - 60, "1", True),
    ],
)
def test_degraded_by_its_straggler_evidence_or_its_agents_flag(
    until: float | None, flag: object, degraded: bool
) -> None:
    assert degraded_by(until, flag, NOW) is degraded


def test_a_degraded_host_is_flagged_for_the_core_but_still_takes_work() -> None:
    nodes = [live_node("host-0", health={"degraded": "nccl timeouts"}), live_node("host-1")]
    world = load_world(mirror_of(nodes), NOW, Caches())
    index = world.fleet.index
    assert bool(world.state.degraded[index["host-0"]]) is True
    assert bool(world.state.degraded[index["host-1"]]) is False
    assert bool(world.state.cordoned[index["host-0"]]) is False


# -- who holds which GPUs -------------------------------------------------------------------


def test_a_holding_job_holds_its_replicas_gpus_until_its_time_limit() -> None:
    job = live_job("1", state="running", bound_at=NOW - 50, spec={"time_limit": 600})
    reps = [live_replica("1", "host-0", list(range(8)))]
    world = load_world(mirror_of(TWO, [job], reps), NOW, Caches())
    held = world.state.allocations["1"]
    assert held.expected_end == NOW - 50 + 600
    assert [g.gpus for g in held.grants] == [tuple(range(8))]
    assert [r.job.id for r in world.running] == ["1"]
    assert (free_on(world, "host-0"), free_on(world, "host-1")) == (0, 8)
    assert world.pending == []


def test_a_preempted_jobs_leaving_replicas_hold_their_gpus_until_the_grace_ends() -> None:
    job = live_job("1", state="preempting", bound_at=NOW - 500)
    reps = [
        live_replica("1", "host-0", [0, 1], stop_requested_at=NOW - 10, state="stopping"),
        live_replica(
            "1", "host-1", [0], rank=1, stop_requested_at=NOW - 5, state="stopping",
            spec={"grace_s": 120.0},
        ),
    ]  # fmt: skip
    world = load_world(mirror_of(TWO, [job], reps), NOW, Caches())
    assert "1" not in world.state.allocations
    leaving = world.state.allocations["draining:1"]
    assert leaving.expected_end == NOW - 5 + 120.0  # the latest end of a grace
    assert (free_on(world, "host-0"), free_on(world, "host-1")) == (6, 7)
    assert world.running == []


def test_a_job_resized_in_place_holds_its_new_epoch_and_the_old_one_drains() -> None:
    job = live_job("1", state="scheduled", epoch=2, bound_at=NOW)
    reps = [
        live_replica("1", "host-0", [0, 1, 2, 3], epoch=1, state="stopping",
                     stop_requested_at=NOW),
        live_replica("1", "host-0", [4, 5, 6, 7], epoch=2, state="waiting"),
    ]  # fmt: skip
    world = load_world(mirror_of(TWO, [job], reps), NOW, Caches())
    assert [g.gpus for g in world.state.allocations["1"].grants] == [(4, 5, 6, 7)]
    assert [g.gpus for g in world.state.allocations["draining:1"].grants] == [(0, 1, 2, 3)]
    assert free_on(world, "host-0") == 0


def test_the_rendezvous_ports_in_use_are_collected_by_master_address_from_the_holders() -> None:
    def env(addr: str, port: str) -> dict[str, object]:
        return {"env": {"MASTER_ADDR": addr, "MASTER_PORT": port}}

    reps = [
        live_replica("1", "host-0", [0], spec=env("10.0.0.1", "29500")),
        live_replica("2", "host-1", [0], spec=env("10.0.0.2", "29503")),
        live_replica("3", "host-1", [1], spec={"env": {}}),
        live_replica("4", "host-1", [2], spec=env("10.0.0.2", "29500")),
    ]
    jobs = [live_job(j, state="running", bound_at=NOW) for j in ("1", "2", "3", "4")]
    world = load_world(mirror_of(TWO, jobs, reps), NOW, Caches())
    assert world.ports == {"10.0.0.1": {29500}, "10.0.0.2": {29500, 29503}}


# -- GPUs held for a restart ----------------------------------------------------------------


def hold(at: float, grants: list[tuple[str, list[int]]], lost: list[str]) -> dict[str, Any]:
    return {
        "at": at,
        "lost": lost,
        "grants": [
            {"role": "worker", "replica": i, "node": node, "gpus": gpus}
            for i, (node, gpus) in enumerate(grants)
        ],
    }


def test_a_requeued_job_keeps_its_healthy_hosts_gpus_for_the_hold() -> None:
    nodes = [*TWO, live_node("host-2", rack="r1")]
    job = live_job(
        "1", state="requeued", gpus=16,
        recovery_hold=hold(NOW - 10, [("host-0", list(range(8)))], ["host-2"]),
    )  # fmt: skip
    world = load_world(mirror_of(nodes, [job]), NOW, Caches(), hold_s=60.0)
    held = world.state.allocations["held:1"]
    assert held.expected_end == NOW - 10 + 60.0
    assert free_on(world, "host-0") == 0
    assert world.holds["1"].lost == (world.fleet.index["host-2"],)
    [pending] = world.pending
    assert pending.id == "1" and pending.held == world.holds["1"]


def test_a_hold_that_ran_out_keeps_nothing() -> None:
    job = live_job(
        "1", state="requeued", recovery_hold=hold(NOW - 61, [("host-0", [0, 1])], ["host-1"])
    )
    world = load_world(mirror_of(TWO, [job]), NOW, Caches(), hold_s=60.0)
    assert "held:1" not in world.state.allocations and world.holds == {}
    assert free_on(world, "host-0") == 8
    assert [j.held for j in world.pending] == [None]


def test_held_gpus_another_job_holds_now_are_not_held_twice() -> None:
    holder = live_job("2", state="running", bound_at=NOW)
    reps = [live_replica("2", "host-0", [0, 1])]
    waiting = live_job(
        "1", state="requeued",
        recovery_hold=hold(NOW, [("host-0", [0, 1]), ("host-1", [0, 1])], ["host-2"]),
    )  # fmt: skip
    world = load_world(mirror_of(TWO, [holder, waiting], reps), NOW, Caches())
    held = world.state.allocations["held:1"]
    assert [(g.host, g.gpus) for g in held.grants] == [(world.fleet.index["host-1"], (0, 1))]
    assert [g.gpus for g in world.state.allocations["2"].grants] == [(0, 1)]


# -- the jobs that wait ---------------------------------------------------------------------


def test_a_job_whose_spec_names_hardware_the_fleet_lacks_is_set_aside_with_the_reason() -> None:
    jobs = [live_job("1", spec={"gpus": "8xA100"}), live_job("2")]
    world = load_world(mirror_of(TWO, jobs), NOW, Caches())
    assert world.unresolved == {"1": "its spec names GPUs this fleet does not have"}
    assert [j.id for j in world.pending] == ["2"]


def test_an_incremental_world_waits_only_for_the_named_jobs_but_counts_every_holder() -> None:
    jobs = [
        live_job("1", state="running", bound_at=NOW),
        live_job("2"),
        live_job("3"),
        live_job("4", state="requeued"),
    ]
    reps = [live_replica("1", "host-0", list(range(8)))]
    world = load_world(mirror_of(TWO, jobs, reps), NOW, Caches(), waiting=["3", "9"])
    assert [j.id for j in world.pending] == ["3"]
    assert set(world.rows) == {"1", "3"}
    assert free_on(world, "host-0") == 0


def test_add_waiting_makes_pending_exactly_the_named_jobs_that_still_wait() -> None:
    jobs = [live_job("1"), live_job("2", state="scheduled"), live_job("3")]
    m = mirror_of(TWO, jobs)
    world = load_world(m, NOW, Caches(), waiting=["1"])
    add_waiting(world, m, ["3", "2", "3", "nope"], Caches())
    assert [j.id for j in world.pending] == ["3"]
    assert {"2", "3"} <= set(world.rows)


def test_a_full_world_waits_for_every_waiting_job_in_id_order() -> None:
    jobs = [live_job("3"), live_job("1", state="requeued"), live_job("2", state="preempting")]
    world = load_world(mirror_of(TWO, jobs), NOW, Caches())
    assert [j.id for j in world.pending] == ["1", "3"]


def test_attained_service_follows_the_row_while_the_built_job_is_reused() -> None:
    caches = Caches()
    m = mirror_of(TWO, [live_job("1", attained_gpu_s=10.0)])
    first = load_world(m, NOW, caches).pending[0]
    m.jobs["1"].attained_gpu_s = 250.0
    again = load_world(m, NOW, caches).pending[0]
    assert (first.attained_gpu_seconds, again.attained_gpu_seconds) == (10.0, 250.0)
    assert again.gang is first.gang  # built once per fleet


def test_jobs_without_a_time_limit_expect_what_jobs_like_them_took() -> None:
    """Runtimes learned from jobs that succeeded give a job sent without a time limit an
    expected end, held on its allocation as a limit's would be; a limit is kept as given."""
    jobs = [
        live_job("1", state="running", bound_at=NOW - 50),
        live_job("2", spec={"name": "j1"}),
        live_job("3", spec={"name": "j1", "time_limit": 7200}),
    ]
    m = mirror_of(TWO, jobs, [live_replica("1", "host-0", list(range(8)))])
    caches = Caches()
    before = load_world(m, NOW, caches)
    assert before.state.allocations["1"].expected_end is None
    m.runtimes.learn_all(Finished("research", "j1", 8, 600.0) for _ in range(MIN_RUNS))
    world = load_world(m, NOW, caches)
    assert world.state.allocations["1"].expected_end == NOW - 50 + 600
    assert [(j.id, j.expected_runtime()) for j in world.pending] == [("2", 600.0), ("3", 7200.0)]


# -- the core's job from a stored spec ------------------------------------------------------


def test_job_of_reads_the_limits_and_promises_a_spec_makes() -> None:
    fleet = fleet_of(mirror_of(TWO), Caches())
    deadline = "2027-01-15T12:00:00+00:00"
    row = live_job(
        "5",
        gpus=16,
        attained_gpu_s=42.0,
        spec={
            "time_limit": 7200,
            "deadline": deadline,
            "preemptible": False,
            "elastic": {"min": 1, "max": 4},
            "checkpoint": {"interval": 900},
        },
    )
    job = job_of(row, fleet)
    assert job is not None
    assert job.time_limit == 7200.0
    assert job.deadline == datetime(2027, 1, 15, 12, tzinfo=UTC).timestamp()
    assert job.preemptible is False
    assert job.elastic == (1, 4)
    assert job.checkpoint_interval == 900
    assert job.attained_gpu_seconds == 42.0
    assert (job.queue, job.submit_time) == ("research", NOW - 100)
    assert job.gang.total_gpus == 16


def test_job_of_defaults_to_a_preemptible_rigid_job_without_limits() -> None:
    fleet = fleet_of(mirror_of(TWO), Caches())
    job = job_of(live_job("5"), fleet)
    assert job is not None
    assert (job.time_limit, job.deadline, job.elastic, job.preemptible) == (
        None,
        None,
        None,
        True,
    )


def test_job_of_is_none_for_hardware_the_fleet_lacks() -> None:
    fleet = fleet_of(mirror_of(TWO), Caches())
    assert job_of(live_job("5", spec={"gpus": "4xMI300"}), fleet) is None


# -- what passes reuse ----------------------------------------------------------------------


def test_the_fleet_is_rebuilt_only_when_an_inventory_changed() -> None:
    caches = Caches()
    m = mirror_of(TWO, [live_job("1")])
    first = fleet_of(m, caches)
    load_world(m, NOW, caches)
    assert "1" in caches.jobs
    assert fleet_of(m, caches) is first
    m.nodes["host-2"] = live_node("host-2", rack="r1")
    m.fleet_version += 1
    again = fleet_of(m, caches)
    assert again is not first and again.names == ("host-0", "host-1", "host-2")
    assert caches.jobs == {}  # jobs are built again on the new fleet
    assert list(caches.fleets) == [("mirror", m.fleet_version)]


def test_jobs_that_ended_leave_the_cache_at_the_next_full_world() -> None:
    caches = Caches()
    m = mirror_of(TWO, [live_job("1"), live_job("2")])
    load_world(m, NOW, caches)
    del m.jobs["1"]
    load_world(m, NOW, caches, waiting=["2"])
    assert set(caches.jobs) == {"1", "2"}  # incremental worlds drop nothing
    load_world(m, NOW, caches)
    assert set(caches.jobs) == {"2"}


@pytest.mark.parametrize(
    ("read_at", "stale"),
    [(None, True), (NOW - ROUTING_REFRESH_S, True), (NOW - ROUTING_REFRESH_S + 1, False)],
    ids=["never-read", "a-minute-old", "fresh"],
)
def test_interruption_rates_are_read_again_once_a_minute(
    read_at: float | None, stale: bool
) -> None:
    caches = Caches()
    if read_at is not None:
        caches.routing = (read_at, None)
    assert routing_stale(caches, NOW) is stale


def test_a_fleet_without_a_priced_choice_routes_by_nothing() -> None:
    caches = Caches()
    caches.routing = (NOW, None)
    world = load_world(mirror_of(TWO), NOW, caches)
    assert world.routing is None

"""The scheduling cycle: ordering, backfill around reservations, strict FIFO, determinism."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from boltforge.core.cycle import Snapshot, run_cycle, schedule_arrival
from boltforge.core.decisions import CycleResult, WaitReason
from boltforge.core.model.gang import Gang
from boltforge.core.model.levels import Level
from boltforge.core.model.state import Allocation, FleetState, Grant
from boltforge.core.model.topology import TopologyTree
from boltforge.core.model.workload import Job, Running
from boltforge.core.policy import (
    EASY_BACKFILL,
    FAIR_SHARE,
    NO_RESIZING,
    POLICIES,
    PRIORITY_THEN_ARRIVAL,
    TOPOLOGY_AWARE,
    Policy,
)
from boltforge.core.preempt.victims import PreemptRules
from boltforge.core.queueing.columns import QueueColumns
from boltforge.testing.builders import make_fleet, make_gang

ALL = tuple(range(8))
# The default's backfill and reservations with arrival order inside a class (no size rule),
# so each scenario's jobs are considered in the order it lists them.
CONSERVATIVE = POLICIES["default"].with_(order=FAIR_SHARE)
EASY = CONSERVATIVE.with_(backfill=EASY_BACKFILL)


def job(
    name: str, gpus: int, submit: float = 0.0, limit: float | None = None, priority: int = 3
) -> Job:
    gang = make_gang(name, gpus=gpus, per_node=min(8, gpus))
    gang = Gang(gang.name, gang.roles, gang.topology, "team", priority)
    return Job(name, gang, "team", submit, time_limit=limit)


@dataclass(frozen=True)
class Busy:
    """A running job on whole hosts, ending at ``end`` (None: unknown)."""

    name: str
    hosts: tuple[str, ...]
    end: float | None


@dataclass(frozen=True)
class World:
    fleet: TopologyTree
    busy: tuple[Busy, ...] = ()
    pending: tuple[Job, ...] = ()
    now: float = 0.0
    extra: dict[str, object] = field(default_factory=dict)


def snapshot(w: World) -> Snapshot:
    state = FleetState(w.fleet)
    running = []
    for b in w.busy:
        grants = tuple(Grant("w", i, w.fleet.host_index[h], ALL) for i, h in enumerate(b.hosts))
        state.allocate(Allocation(b.name, grants, b.end))
        j = Job(
            b.name,
            make_gang(b.name, gpus=8 * len(b.hosts)),
            "team",
            -1.0,
            time_limit=None if b.end is None else b.end,
        )
        running.append(Running(j, state.allocations[b.name], 0.0))
    return Snapshot(state, w.pending, tuple(running), w.now)


LAB = make_fleet(racks=2, hosts=2)  # h100-p0-r0-h0 .. h100-p0-r1-h1
H = [h.name for h in LAB.hosts]


def binds(result: CycleResult) -> list[str]:
    return [b.job for b in result.binds]


SCENARIOS = [
    pytest.param(
        World(
            LAB,
            (Busy("a", (H[0], H[1]), 3600.0), Busy("b", (H[2],), 7200.0)),
            (job("big", 32, 0.0), job("short", 8, 1.0, limit=1800.0)),
        ),
        CONSERVATIVE,
        ["short"],
        {"big": WaitReason.RESERVED},
        id="a short job backfills into a gap that closes before the big job's reservation",
    ),
    pytest.param(
        World(
            LAB,
            (Busy("a", (H[0], H[1]), 3600.0), Busy("b", (H[2],), 7200.0)),
            (job("big", 32, 0.0), job("long", 8, 1.0, limit=10_000.0)),
        ),
        CONSERVATIVE,
        [],
        {"big": WaitReason.RESERVED, "long": WaitReason.RESERVATION},
        id="a long job may not take hosts reserved for the big job ahead of it",
    ),
    pytest.param(
        World(
            LAB,
            (Busy("a", (H[0], H[1]), 3600.0), Busy("b", (H[2],), 7200.0)),
            (job("big", 32, 0.0), job("unknown", 8, 1.0)),
        ),
        CONSERVATIVE,
        [],
        {"unknown": WaitReason.RESERVATION},
        id="a job without a time limit never backfills onto reserved hosts",
    ),
    pytest.param(
        World(
            LAB,
            (Busy("a", (H[0], H[1]), 3600.0), Busy("b", (H[2],), 7200.0)),
            (job("big", 32, 0.0), job("short", 8, 1.0, limit=1800.0)),
        ),
        POLICIES["fifo"],
        [],
        {"big": WaitReason.CAPACITY, "short": WaitReason.BEHIND},
        id="strict FIFO keeps a short job behind the blocked head of the queue",
    ),
    pytest.param(
        World(
            LAB,
            (Busy("a", (H[0], H[1]), 3600.0), Busy("b", (H[2],), 7200.0)),
            (job("big", 32, 0.0), job("mid", 16, 1.0), job("short", 8, 2.0, limit=600.0)),
        ),
        EASY,
        ["short"],
        {"big": WaitReason.RESERVED, "mid": WaitReason.CAPACITY},
        id="EASY backfill reserves only for the first blocked job",
    ),
    pytest.param(
        World(LAB, (), (job("low", 8, 0.0, priority=3), job("high", 32, 5.0, priority=1))),
        POLICIES["slurm-like"],
        ["high"],
        {"low": WaitReason.CAPACITY},
        id="a higher class goes first even when it arrived later",
    ),
    pytest.param(
        World(LAB, (), (job("x", 64, 0.0),)),
        CONSERVATIVE,
        [],
        {"x": WaitReason.NEVER},
        id="a job bigger than the fleet is never-fits, not waiting forever",
    ),
]


@pytest.mark.parametrize(("world", "policy", "started", "reasons"), SCENARIOS)
def test_cycle_scenario(
    world: World, policy: Policy, started: list[str], reasons: dict[str, WaitReason]
) -> None:
    result = run_cycle(snapshot(world), policy)
    assert binds(result) == started
    for name, reason in reasons.items():
        why = result.why(name)
        assert why is not None and why.reason == reason, (name, why)


def test_reserved_job_is_told_when_it_starts() -> None:
    world = World(
        LAB, (Busy("a", (H[0], H[1]), 3600.0), Busy("b", (H[2],), 7200.0)), (job("big", 32),)
    )
    why = run_cycle(snapshot(world), CONSERVATIVE).why("big")
    assert why is not None and why.estimated_start == 7200.0


def test_waiting_jobs_keep_their_queue_position() -> None:
    world = World(LAB, (Busy("a", tuple(H), None),), tuple(job(f"j{i}", 8, i) for i in range(5)))
    result = run_cycle(snapshot(world), POLICIES["slurm-like"])
    assert [w.position for w in result.waiting] == [0, 1, 2, 3, 4]


def test_arrival_pass_respects_existing_reservations() -> None:
    world = World(
        LAB, (Busy("a", (H[0], H[1]), 3600.0), Busy("b", (H[2],), 7200.0)), (job("big", 32, 0.0),)
    )
    full = run_cycle(snapshot(world), CONSERVATIVE)
    late = job("late", 8, 10.0, limit=20_000.0)
    result = schedule_arrival(snapshot(world), late, CONSERVATIVE, full.reservations)
    assert binds(result) == []
    assert result.why("late") is not None
    quick = job("quick", 8, 10.0, limit=600.0)
    assert binds(schedule_arrival(snapshot(world), quick, CONSERVATIVE, full.reservations)) == [
        "quick"
    ]


# --- properties -------------------------------------------------------------------------------

SIZES = st.sampled_from([8, 8, 8, 16, 32])


@st.composite
def worlds(draw: st.DrawFn) -> World:
    fleet = make_fleet(racks=2, hosts=3)
    names = [h.name for h in fleet.hosts]
    busy = []
    taken = draw(st.lists(st.sampled_from(names), unique=True, max_size=5))
    for i, host in enumerate(taken):
        busy.append(Busy(f"r{i}", (host,), draw(st.sampled_from([600.0, 3600.0, 7200.0, None]))))
    pending = tuple(
        job(
            f"p{i}",
            draw(SIZES),
            float(i),
            draw(st.sampled_from([None, 300.0, 5000.0])),
            draw(st.sampled_from([1, 2, 3])),
        )
        for i in range(draw(st.integers(1, 8)))
    )
    return World(fleet, tuple(busy), pending)


@settings(max_examples=150, deadline=None)
@given(worlds(), st.sampled_from(list(POLICIES)))
def test_backfill_never_delays_a_reservation(world: World, name: str) -> None:
    snap = snapshot(world)
    result = run_cycle(snap, POLICIES[name])
    after = snap.state.copy()
    for b in result.binds:
        runtime = next(j for j in world.pending if j.id == b.job).expected_runtime()
        after.allocate(Allocation(b.job, b.placement.grants, None if runtime is None else runtime))
    for res in result.reservations:
        at_start = after.copy()
        for a in list(at_start.allocations.values()):
            if a.expected_end is not None and a.expected_end <= res.start:
                at_start.release(a.job)
        at_start.allocate(res.placement.allocation())  # raises if anything delayed it


@settings(max_examples=100, deadline=None)
@given(worlds(), st.sampled_from(list(POLICIES)))
def test_cycle_is_deterministic_and_never_double_books(world: World, name: str) -> None:
    first = run_cycle(snapshot(world), POLICIES[name])
    second = run_cycle(snapshot(world), POLICIES[name])
    assert first == second
    state = snapshot(world).state
    for b in first.binds:
        state.allocate(b.placement.allocation())  # raises on any GPU given twice
    decided = {b.job for b in first.binds} | {w.job for w in first.waiting}
    assert decided == {j.id for j in world.pending}


@settings(max_examples=100, deadline=None)
@given(worlds(), st.sampled_from(list(POLICIES)))
def test_a_pass_without_explanations_decides_the_same(world: World, name: str) -> None:
    """``explain=False`` (the simulator's passes) drops reasons and estimates, skips jobs
    that cannot start and stops once none left can; it never changes a decision."""
    full = run_cycle(snapshot(world), POLICIES[name])
    bare = run_cycle(snapshot(world), POLICIES[name], explain=False)
    assert (bare.binds, bare.evictions, bare.reservations, bare.resizes) == (
        full.binds,
        full.evictions,
        full.reservations,
        full.resizes,
    )
    looked_at = [(w.job, w.position) for w in bare.waiting]
    assert looked_at == [(w.job, w.position) for w in full.waiting][: len(looked_at)]


@settings(max_examples=100, deadline=None)
@given(worlds(), st.sampled_from(list(POLICIES)), st.booleans())
def test_a_pass_that_reads_the_queues_columns_decides_the_same(
    world: World, name: str, explain: bool
) -> None:
    """A caller that keeps its queue in arrival order with its columns (the simulator) gets
    the same pass, to the last reason, as one that hands over the jobs alone."""
    plain = snapshot(world)
    pending = tuple(sorted(plain.pending, key=lambda j: (j.submit_time, j.id)))
    kept = replace(plain, pending=pending, in_arrival_order=True, columns=QueueColumns.of(pending))
    policy = POLICIES[name]
    assert run_cycle(kept, policy, explain=explain) == run_cycle(plain, policy, explain=explain)


# --- elastic starts and deadlines -------------------------------------------------------------


def elastic(name: str, replicas: int, low: int, limit: float | None) -> Job:
    base = job(name, 8 * replicas, 0.0, limit)
    return Job(base.id, base.gang, "team", 0.0, time_limit=limit, elastic=(low, replicas))


def test_elastic_job_starts_small_when_that_finishes_first() -> None:
    # 2 of 4 hosts are busy for 10 hours; a 4-host elastic job with a 1-hour runtime starts
    # on the 2 free hosts now (done in 2 h) rather than waiting 10 h for all 4.
    world = World(LAB, (Busy("a", (H[0], H[1]), 36_000.0),), (elastic("e", 4, 2, 3600.0),))
    result = run_cycle(snapshot(world), CONSERVATIVE)
    (bind,) = result.binds
    assert bind.replicas == 2 and "elastic start at 2 of 4" in bind.note


def test_elastic_job_waits_when_the_full_size_is_near() -> None:
    # The busy hosts free in 10 minutes: waiting for all 4 finishes before 2 replicas would.
    world = World(LAB, (Busy("a", (H[0], H[1]), 600.0),), (elastic("e", 4, 2, 3600.0),))
    result = run_cycle(snapshot(world), CONSERVATIVE)
    assert result.binds == ()
    assert result.why("e") is not None


def test_rigid_policy_never_starts_an_elastic_job_small() -> None:
    world = World(LAB, (Busy("a", (H[0], H[1]), 36_000.0),), (elastic("e", 4, 2, 3600.0),))
    assert run_cycle(snapshot(world), CONSERVATIVE.with_(elastic=NO_RESIZING)).binds == ()


def test_deadline_outlook_says_late_when_the_fleet_is_busy_past_it() -> None:
    from boltforge.core.queueing.deadlines import deadline_outlook

    world = World(LAB, (Busy("a", tuple(H), 7200.0),))
    late = Job("d", job("d", 32).gang, "team", 0.0, time_limit=3600.0, deadline=9000.0)
    outlook = deadline_outlook(snapshot(world).state, late, 0.0)
    assert outlook.reachable is False and outlook.finish == 10_800.0
    assert "not reachable" in outlook.message and "30 min late" in outlook.message
    on_time = Job("d", late.gang, "team", 0.0, time_limit=3600.0, deadline=12_000.0)
    assert deadline_outlook(snapshot(world).state, on_time, 0.0).reachable is True


# --- quotas and fair share --------------------------------------------------------------------


def team_job(name: str, queue: str, gpus: int, submit: float) -> Job:
    gang = make_gang(name, gpus=gpus, per_node=min(8, gpus))
    return Job(name, Gang(gang.name, gang.roles, gang.topology, queue, 3), queue, submit)


def test_a_queue_over_its_burst_waits_with_the_limit_named() -> None:
    from boltforge.core.queueing.quota import QueueSpec, QuotaTree

    quota = QuotaTree.build([QueueSpec("org/nlp", {"*": 8}, {"*": 16})])
    pending = (team_job("a", "org/nlp", 16, 0.0), team_job("b", "org/nlp", 8, 1.0))
    snap = Snapshot(FleetState(LAB), pending, (), 0.0, quota=quota)
    result = run_cycle(snap, CONSERVATIVE)
    assert binds(result) == ["a"]
    assert result.binds[0].borrowed_gpus == 8  # 16 held against a guarantee of 8
    why = result.why("b")
    assert why is not None and why.reason == WaitReason.QUOTA
    assert "burst" in why.detail[0] and "org/nlp" in why.detail[0]


def test_a_queue_that_used_more_waits_behind_one_that_used_less() -> None:
    from boltforge.core.model.workload import Usage
    from boltforge.core.queueing.quota import QueueSpec, QuotaTree

    quota = QuotaTree.build([QueueSpec("org/nlp"), QueueSpec("org/cv")])
    usage = Usage({"org/nlp": 9e6, "org": 1e7, "org/cv": 1e6, "": 1e7}, as_of=0.0)
    pending = (team_job("nlp-1", "org/nlp", 32, 0.0), team_job("cv-1", "org/cv", 32, 5.0))
    snap = Snapshot(FleetState(LAB), pending, (), 0.0, quota=quota, usage=usage)
    result = run_cycle(snap, CONSERVATIVE)
    assert binds(result) == ["cv-1"]
    assert POLICIES["fifo"].name == "fifo" and binds(run_cycle(snap, POLICIES["fifo"])) == ["nlp-1"]


# --- preemption -------------------------------------------------------------------------------


LAB_PREEMPT = CONSERVATIVE.with_preempt_rules(PreemptRules(churn_fraction=1.0))


def running_job(
    name: str, hosts: tuple[str, ...], priority: int, started: float, state: FleetState
) -> Running:
    grants = tuple(Grant("w", i, LAB.host_index[h], ALL) for i, h in enumerate(hosts))
    gang = make_gang(name, gpus=8 * len(hosts))
    j = Job(name, Gang(name, gang.roles, gang.topology, "team", priority), "team", 0.0)
    state.allocate(Allocation(name, grants, None, priority))
    return Running(j, state.allocations[name], started, last_checkpoint=started)


def team_running(
    name: str, queue: str, hosts: tuple[str, ...], priority: int, state: FleetState
) -> Running:
    r = running_job(name, hosts, priority, 0.0, state)
    return replace(r, job=replace(r.job, queue=queue, gang=replace(r.job.gang, team=queue)))


def urgent_gang(name: str) -> Gang:
    gang = make_gang(name, gpus=8)
    return Gang(gang.name, gang.roles, gang.topology, "team", 1)


def test_one_queues_refusal_is_not_anothers() -> None:
    """Two urgent jobs of one shape and class, full fleet: the first's queue is at its burst,
    so bumping for it is refused; the second's queue has room, and it bumps and starts."""
    from boltforge.core.queueing.quota import QueueSpec, QuotaTree

    quota = QuotaTree.build([QueueSpec("org/capped", {}, {"*": 8}), QueueSpec("org/open")])
    state = FleetState(LAB)
    serving = team_running("serving", "org/capped", (H[0],), 0, state)
    batch = tuple(team_running(f"b{i}", "org/batch", (h,), 3, state) for i, h in enumerate(H[1:]))
    pending = (
        replace(team_job("capped", "org/capped", 8, 100.0), gang=urgent_gang("capped")),
        replace(team_job("open", "org/open", 8, 200.0), gang=urgent_gang("open")),
    )
    snap = Snapshot(state, pending, (serving, *batch), 5000.0, quota=quota)
    result = run_cycle(snap, LAB_PREEMPT.with_(order=PRIORITY_THEN_ARRIVAL))  # capped first
    assert binds(result) == ["open"]
    assert len(result.evictions) == 1 and result.evictions[0].for_job == "open"
    why = result.why("capped")
    assert why is not None and any("org/capped" in d for d in why.detail), why


def test_a_production_job_bumps_batch_work_in_one_rack() -> None:
    state = FleetState(LAB)
    running = (
        running_job("batch-a", (H[0],), 3, 0.0, state),
        running_job("batch-b", (H[1],), 3, 0.0, state),
        running_job("batch-c", (H[2],), 3, 0.0, state),
        running_job("serving", (H[3],), 0, 0.0, state),
    )
    urgent = job("train", 16, 5000.0, priority=1)
    snap = Snapshot(state, (urgent,), running, 5000.0)
    # On a 32-GPU lab the default churn budget (5% of GPUs per 10 min) allows no preemption.
    capped = run_cycle(snap, CONSERVATIVE).why("train")
    assert capped is not None and any("churn budget" in d for d in capped.detail)
    result = run_cycle(snap, LAB_PREEMPT)
    assert binds(result) == ["train"]
    bumped = {e.job for e in result.evictions}
    assert bumped in ({"batch-a", "batch-b"},), bumped  # one rack: h0 and h1 share rack 0
    assert all(e.for_job == "train" for e in result.evictions)
    state_after = state.copy()
    for e in result.evictions:
        state_after.release(e.job)
    state_after.allocate(result.binds[0].placement.allocation())


def test_batch_work_never_preempts_and_serving_is_never_bumped() -> None:
    state = FleetState(LAB)
    running = tuple(running_job(f"s{i}", (h,), 0, 0.0, state) for i, h in enumerate(H))
    for priority in (1, 2, 3):
        result = run_cycle(
            Snapshot(state, (job("x", 8, 5000.0, priority=priority),), running, 5000.0),
            LAB_PREEMPT,
        )
        assert result.evictions == () and result.binds == ()


def test_fresh_jobs_are_protected_by_the_minimum_runtime() -> None:
    state = FleetState(LAB)
    running = tuple(running_job(f"b{i}", (h,), 3, 4900.0, state) for i, h in enumerate(H))
    result = run_cycle(
        Snapshot(state, (job("x", 8, 5000.0, priority=1),), running, 5000.0), LAB_PREEMPT
    )
    assert result.evictions == ()
    why = result.why("x")
    assert why is not None
    assert any("first 10 min" in d for d in why.detail), why.detail


def test_an_idle_fleet_grows_a_running_elastic_job() -> None:
    state = FleetState(LAB)
    grown = elastic("e", 4, 2, 36_000.0)
    grants = tuple(Grant("worker", i, LAB.host_index[h], ALL) for i, h in enumerate(H[:2]))
    state.allocate(Allocation("e", grants, 36_000.0))
    running = (Running(grown, state.allocations["e"], 0.0),)
    result = run_cycle(Snapshot(state, (), running, 100.0), CONSERVATIVE)
    (resize,) = result.resizes
    assert resize.job == "e" and resize.replicas == 4 and "grow 2->4" in resize.note
    state.copy().allocate(Allocation("e+grow", resize.added.grants))  # on free GPUs only
    waiting = (job("w", 24, limit=600.0),)  # needs 3 hosts: waits, so nothing grows
    busy = run_cycle(Snapshot(state, waiting, running, 100.0), CONSERVATIVE)
    assert busy.resizes == () and busy.why("w") is not None


# --- lookahead --------------------------------------------------------------------------------


def test_lookahead_keeps_the_first_job_from_stranding_the_second() -> None:
    # Rack r0 has two half-free hosts whose free GPUs sit off each other's rails, rack r1 is
    # empty. Job 1 (two 4-GPU replicas) is cheapest in r1, but then job 2 (four whole hosts in
    # one rack) has nowhere to go. Lookahead puts job 1 in r0 so both start in this pass.
    fleet = make_fleet(racks=2, hosts=4)
    state = FleetState(fleet)
    held = {
        "h100-p0-r0-h0": (4, 5, 6, 7),
        "h100-p0-r0-h1": (0, 1, 2, 3),
        "h100-p0-r0-h2": ALL,
        "h100-p0-r0-h3": ALL,
    }
    for i, (host, gpus) in enumerate(held.items()):
        state.allocate(Allocation(f"busy-{i}", (Grant("w", 0, fleet.host_index[host], gpus),)))
    first = Job("job-1", make_gang("job-1", gpus=8, per_node=4), "team", 0.0)
    second = Job("job-2", make_gang("job-2", gpus=32, required=Level.RACK), "team", 1.0)
    snap = Snapshot(state, (first, second), (), 0.0)
    assert binds(run_cycle(snap, POLICIES["slurm-like"].with_(placement=TOPOLOGY_AWARE))) == [
        "job-1"
    ]
    assert binds(run_cycle(snap, CONSERVATIVE)) == ["job-1", "job-2"]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from([1, 1, 1, 2, 4, 8]), st.sampled_from([None, 600.0])),
        min_size=1,
        max_size=40,
    ),
    st.floats(0.0, 0.8),
    st.sampled_from(list(POLICIES)),
)
def test_repeating_the_last_host_changes_no_decision(
    sizes: list[tuple[int, float | None]], busy: float, name: str
) -> None:
    import boltforge.core.cycle.run as cycle_module
    from boltforge.testing.builders import occupy

    fleet = make_fleet(racks=2, hosts=4, island=4)
    state = occupy(fleet, busy, seed=len(sizes))
    pending = tuple(job(f"j{i}", g, float(i), limit) for i, (g, limit) in enumerate(sizes))
    snap = Snapshot(state, pending, (), 0.0)
    fast = run_cycle(snap, POLICIES[name])
    names = vars(cycle_module)  # where the pass looks ``repeat`` up
    original = names["repeat"]
    names["repeat"] = lambda p, job, shape: None
    try:
        slow = run_cycle(snap, POLICIES[name])
    finally:
        names["repeat"] = original
    assert [(b.job, b.placement.grants) for b in fast.binds] == [
        (b.job, b.placement.grants) for b in slow.binds
    ]
    assert [(w.job, w.reason) for w in fast.waiting] == [(w.job, w.reason) for w in slow.waiting]


def test_every_waiting_job_gets_a_start_estimate_when_running_jobs_have_ends() -> None:
    pending = (*(job(f"j{i}", 8, float(i)) for i in range(5)), job("huge", 64, 9.0))
    world = World(LAB, (Busy("a", (H[0], H[1]), 3600.0), Busy("b", (H[2], H[3]), 7200.0)), pending)
    policy = POLICIES["slurm-like"].with_(backfill=EASY_BACKFILL.with_(estimate_waits=1))
    by_job = {w.job: w for w in run_cycle(snapshot(world), policy).waiting}
    assert by_job["huge"].reason == WaitReason.NEVER and by_job["huge"].estimated_start is None
    starts = [by_job[f"j{i}"].estimated_start for i in range(4)]
    assert starts == [3600.0, 3600.0, 7200.0, 7200.0]
    bases = [by_job[f"j{i}"].estimate_basis for i in range(4)]
    assert bases == ["reservation", "when-and-where", "capacity", "capacity"]
    # The 5th job needs more than the known ends free (the 4 ahead have no time limit).
    assert by_job["j4"].estimated_start is None

"""Tiresias: least attained service first, starvation promotion, and preemption by queue."""

from __future__ import annotations

from boltforge.core.cycle import Snapshot, run_cycle
from boltforge.core.model.gang import Gang
from boltforge.core.model.state import Allocation, FleetState, Grant
from boltforge.core.model.workload import Job, Running
from boltforge.core.policy import POLICIES
from boltforge.core.preempt.victims import PreemptRules
from boltforge.core.queueing.ordering import las_queue, order_jobs
from boltforge.testing.builders import make_fleet, make_gang

RULES = PreemptRules(churn_fraction=1.0)  # no churn budget in the way
TIRESIAS = POLICIES["tiresias"].with_preempt_rules(RULES)
HOUR = 3600.0
LAB = make_fleet(racks=2, hosts=2)
H = [h.name for h in LAB.hosts]


def job(name: str, gpus: int, submit: float = 0.0, attained: float = 0.0, cls: int = 3) -> Job:
    gang = make_gang(name, gpus=gpus, per_node=min(8, gpus))
    gang = Gang(gang.name, gang.roles, gang.topology, "team", cls)
    return Job(name, gang, "team", submit, attained_gpu_seconds=attained)


def running(
    name: str, hosts: list[str], started: float, state: FleetState, cls: int = 3
) -> Running:
    grants = tuple(Grant("w", i, LAB.host_index[h], tuple(range(8))) for i, h in enumerate(hosts))
    state.allocate(Allocation(name, grants, None, cls))
    return Running(job(name, 8 * len(hosts), cls=cls), state.allocations[name], started, started)


def test_jobs_that_attained_less_service_go_first() -> None:
    fresh, used, heavy = (
        job("fresh", 8, 30.0),
        job("used", 8, 10.0, 9 * 8 * HOUR),
        job("heavy", 8, 0.0, 30 * 8 * HOUR * 24),
    )
    assert [j.id for j in order_jobs([heavy, used, fresh], TIRESIAS, 100.0, None)] == [
        "fresh",
        "used",
        "heavy",
    ]


def test_a_job_starved_past_the_limit_is_promoted_to_the_first_queue() -> None:
    heavy = job("heavy", 8, 0.0, 30 * 8 * HOUR * 24)
    assert las_queue(heavy, TIRESIAS, 100.0) == 2
    assert las_queue(heavy, TIRESIAS, TIRESIAS.order.starvation_s) == 0


def test_a_running_job_attains_its_gpus_times_its_time_running() -> None:
    j = job("r", 8)
    threshold = TIRESIAS.order.las_thresholds[0]  # 8 GPU-hours
    assert las_queue(j, TIRESIAS, HOUR - 1, started=0.0) == 0
    assert las_queue(j, TIRESIAS, threshold / 8, started=0.0) == 1


def test_a_fresh_job_preempts_a_long_runner_of_its_class_in_a_later_queue() -> None:
    state = FleetState(LAB)
    now = 2 * HOUR
    jobs = (
        running("long", [H[0]], 0.0, state),  # 16 GPU-hours attained: queue 1
        running("short-a", [H[1]], now - 900.0, state),  # 2 GPU-hours: queue 0
        running("short-b", [H[2]], now - 900.0, state),
        running("short-c", [H[3]], now - 900.0, state),
    )
    result = run_cycle(Snapshot(state, (job("fresh", 8, now),), jobs, now), TIRESIAS)
    assert [b.job for b in result.binds] == ["fresh"]
    assert [e.job for e in result.evictions] == ["long"]


def test_jobs_in_the_same_queue_never_preempt_each_other() -> None:
    state = FleetState(LAB)
    now = 2 * HOUR
    jobs = tuple(running(f"r{i}", [h], now - 900.0, state) for i, h in enumerate(H))
    result = run_cycle(Snapshot(state, (job("fresh", 8, now),), jobs, now), TIRESIAS)
    assert result.evictions == () and result.binds == ()


def test_attained_service_never_lets_batch_work_displace_a_more_important_class() -> None:
    state = FleetState(LAB)
    now = 2 * HOUR
    jobs = tuple(running(f"p{i}", [h], 0.0, state, cls=2) for i, h in enumerate(H))
    result = run_cycle(Snapshot(state, (job("fresh", 8, now, cls=3),), jobs, now), TIRESIAS)
    assert result.evictions == () and result.binds == ()


def test_default_policy_does_not_rank_by_attained_service() -> None:
    state = FleetState(LAB)
    now = 2 * HOUR
    short = [running(f"s{i}", [h], now - 900.0, state) for i, h in enumerate(H[1:])]
    jobs = (running("long", [H[0]], 0.0, state), *short)
    policy = POLICIES["default"].with_preempt_rules(RULES)
    result = run_cycle(Snapshot(state, (job("fresh", 8, now),), jobs, now), policy)
    assert result.evictions == ()

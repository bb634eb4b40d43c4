"""The simulator: deterministic replays, conserved GPU-time, and the direction of known results."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from boltforge.core.model.topology import TopologyTree
from boltforge.core.policy import ARRIVAL_ORDER, FAIR_SHARE, named
from boltforge.sim.engine import SimConfig, Simulation, simulate
from boltforge.sim.execution import Segment, interrupted
from boltforge.sim.metrics import compute
from boltforge.sim.records import SimResult, TraceJob
from boltforge.sim.traces import scale_load
from boltforge.testing.builders import make_fleet

HOUR = 3600.0
FLEET = make_fleet(racks=4, hosts=4, pods=2)  # 32 hosts, 256 GPUs in 2 pods of 2 racks


def heavy_tailed(
    n: int, seed: int, mean_gap_s: float, sizes: tuple[int, ...] = (1, 1, 1, 2, 4, 8)
) -> list[TraceJob]:
    """Poisson arrivals, log-normal runtimes (median 1 h, long tail), mostly small jobs."""
    rng = np.random.default_rng(seed)
    t, out = 0.0, []
    for i in range(n):
        t += float(rng.exponential(mean_gap_s))
        duration = float(np.clip(rng.lognormal(np.log(HOUR), 1.6), 60.0, 30 * 24 * HOUR))
        out.append(TraceJob(f"j{i:05d}", t, duration, int(rng.choice(sizes)), f"team{i % 4}"))
    return out


def run(
    trace: list[TraceJob], policy: str, fleet: TopologyTree = FLEET, **config: float
) -> SimResult:
    return simulate(fleet, trace, SimConfig(named(policy), **config))  # type: ignore[arg-type]


def avg_jct(result: SimResult) -> float:
    done = [j.finish_s - j.submit_s for j in result.jobs if j.finish_s is not None]
    return float(np.mean(done))


def outcome(result: SimResult) -> list[tuple[float | None, float | None, float]]:
    return [(j.start_s, j.finish_s, j.lost_gpu_s) for j in result.jobs]


def test_a_seed_gives_the_same_numbers_twice() -> None:
    trace = heavy_tailed(300, 1, 400.0)
    first, second, other = (
        run(trace, "default", failures_per_1000_gpu_day=100.0, seed=seed) for seed in (7, 7, 8)
    )
    assert sum(j.failures for j in first.jobs) > 0  # the seed has something to decide
    assert outcome(first) == outcome(second)
    assert first.samples == second.samples
    assert outcome(first) != outcome(other)


def test_every_job_finishes_and_useful_work_equals_what_the_trace_asked_for() -> None:
    trace = heavy_tailed(300, 2, 300.0)
    result = run(trace, "default", failures_per_1000_gpu_day=0.0)
    assert all(j.finish_s is not None for j in result.jobs)
    for record, job in zip(result.jobs, trace, strict=True):
        assert record.productive_gpu_s == pytest.approx(job.gpus * job.duration_s)
        assert record.allocated_gpu_s >= record.productive_gpu_s - 1e-6


def test_failures_lose_work_but_never_lose_a_job() -> None:
    trace = heavy_tailed(200, 3, 300.0)
    result = run(trace, "default", failures_per_1000_gpu_day=400.0, repair_s=HOUR)
    assert sum(j.failures for j in result.jobs) > 0
    assert sum(j.lost_gpu_s for j in result.jobs) > 0
    assert all(j.finish_s is not None for j in result.jobs)
    for record, job in zip(result.jobs, trace, strict=True):
        assert record.productive_gpu_s == pytest.approx(job.gpus * job.duration_s)
        held = record.productive_gpu_s + record.lost_gpu_s
        assert record.allocated_gpu_s >= held - 1e-6


def test_a_job_too_big_for_the_fleet_is_dropped_not_left_hanging() -> None:
    trace = [TraceJob("huge", 0.0, HOUR, 512, "t"), TraceJob("small", 1.0, HOUR, 1, "t")]
    result = run(trace, "default")
    by_id = {j.id: j for j in result.jobs}
    assert by_id["huge"].start_s is None and by_id["small"].finish_s is not None


def test_least_attained_service_beats_fifo_on_average_jct_for_heavy_tails() -> None:
    """Same policy but for the order (Tiresias' queues and preemption vs arrival order), on 32
    GPUs kept near capacity: serving the least attained service first shortens the average."""
    small = make_fleet(racks=1, hosts=4, pods=1)
    las_policy = named("tiresias")
    fifo_policy = las_policy.with_(order=ARRIVAL_ORDER)  # no LAS standing: no preemption
    las = fifo = 0.0
    for seed in (4, 5):
        trace = heavy_tailed(300, seed, 1100.0)
        las += avg_jct(simulate(small, trace, SimConfig(las_policy)))
        fifo += avg_jct(simulate(small, trace, SimConfig(fifo_policy)))
    assert las < fifo


def test_topology_aware_placement_beats_first_fit_on_productive_utilization() -> None:
    trace = heavy_tailed(150, 5, 400.0, sizes=(1, 4, 16, 32))  # multi-host jobs, racks of 32
    aware = compute(run(trace, "default", failures_per_1000_gpu_day=0.0))
    default = named("default")
    blind_policy = default.with_(placement=default.placement.with_(topology_aware=False))
    blind = compute(simulate(FLEET, trace, SimConfig(blind_policy, failures_per_1000_gpu_day=0.0)))
    assert aware.gpu_hours_slowed < blind.gpu_hours_slowed
    assert aware.util_productive_contended > blind.util_productive_contended
    assert aware.avg_jct_s is not None and blind.avg_jct_s is not None
    assert aware.avg_jct_s < blind.avg_jct_s


def test_backfill_beats_strict_fifo_on_queueing_delay_and_utilization() -> None:
    trace = heavy_tailed(300, 8, 120.0, sizes=(1, 1, 2, 8, 32, 64))
    fifo = compute(run(trace, "fifo", failures_per_1000_gpu_day=0.0))
    easy = compute(run(trace, "slurm-like", failures_per_1000_gpu_day=0.0))  # FIFO + EASY
    assert easy.avg_queue_s is not None and fifo.avg_queue_s is not None
    assert easy.avg_queue_s < fifo.avg_queue_s
    assert easy.util_productive_contended > fifo.util_productive_contended


def test_fair_share_serves_the_team_that_used_less_first() -> None:
    """Team a used the host for 10 h; when a and b queue together, b goes first although a
    asked first. Without team queues every team has the same factor and a goes first."""
    host = make_fleet(racks=1, hosts=1, pods=1)
    trace = [
        TraceJob("a0", 0.0, 10 * HOUR, 8, "a"),
        TraceJob("c0", 11 * HOUR, 2 * HOUR, 8, "c"),
        TraceJob("a1", 12 * HOUR, HOUR, 8, "a"),
        TraceJob("b1", 12 * HOUR + 1, HOUR, 8, "b"),
    ]

    def starts(team_queues: bool) -> dict[str, float | None]:
        config = SimConfig(named("default"), failures_per_1000_gpu_day=0.0, team_queues=team_queues)
        return {j.id: j.start_s for j in simulate(host, trace, config).jobs}

    fair, flat = starts(True), starts(False)
    assert fair["b1"] == 13 * HOUR and fair["a1"] == 14 * HOUR
    assert flat["a1"] == 13 * HOUR and flat["b1"] == 14 * HOUR


def test_more_load_means_longer_queues() -> None:
    trace = heavy_tailed(200, 10, 300.0, sizes=(1, 2, 8, 16, 32))
    light = compute(run(trace, "default", failures_per_1000_gpu_day=0.0))
    heavy = compute(run(scale_load(trace, 3.0), "default", failures_per_1000_gpu_day=0.0))
    assert light.avg_queue_s is not None and heavy.avg_queue_s is not None
    assert heavy.avg_queue_s > light.avg_queue_s


def test_an_interrupted_run_keeps_progress_up_to_its_last_checkpoint() -> None:
    seg = Segment(start=0.0, gpus=8, slowdown=2.0, warmup=120.0)
    out = interrupted(seg, end=4000.0, checkpoint_interval=1800.0)
    assert out.work_s == pytest.approx((3600.0 - 120.0) / 2.0)
    assert out.lost_gpu_s == pytest.approx(8 * (120.0 + 400.0))
    assert out.allocated_gpu_s == pytest.approx(8 * 4000.0)


def test_shortest_work_first_beats_arrival_order_on_average_jct_for_heavy_tails() -> None:
    """The default's order (least work left first, aged) against the same policy in arrival
    order inside each team: serving short work first shortens the average wait."""
    small = make_fleet(racks=1, hosts=4, pods=1)
    arrival = named("default").with_(order=FAIR_SHARE)
    shortest = compare = 0.0
    for seed in (4, 5):
        trace = heavy_tailed(300, seed, 1100.0)
        shortest += avg_jct(simulate(small, trace, SimConfig(named("default"))))
        compare += avg_jct(simulate(small, trace, SimConfig(arrival)))
    assert shortest < compare


def test_without_time_limits_every_job_still_finishes_and_the_order_changes() -> None:
    """No time limits: the scheduler knows only the runtimes it learns from jobs that
    finished, so the order changes, yet nothing is lost."""
    small = make_fleet(racks=1, hosts=4, pods=1)
    trace = heavy_tailed(200, 6, 900.0)
    config = SimConfig(named("default"), failures_per_1000_gpu_day=0.0)
    blind = simulate(small, trace, replace(config, time_limits=False))
    told = simulate(small, trace, config)
    assert all(j.finish_s is not None for j in blind.jobs)
    assert sum(j.productive_gpu_s for j in blind.jobs) == pytest.approx(
        sum(j.productive_gpu_s for j in told.jobs)
    )
    assert outcome(blind) != outcome(told)


def test_without_time_limits_the_scheduler_learns_runtimes_from_jobs_that_finished() -> None:
    """A team's jobs of one size that take about as long each time teach the estimate later
    ones get: the 90th percentile of the GPU-seconds per GPU they held, as a live server
    learns it; a size whose runs disagree teaches nothing."""
    small = make_fleet(racks=1, hosts=4, pods=1)
    alike = [TraceJob(f"a{i}", 60.0 * i, 1000.0 + 10 * i, 8, "vision") for i in range(20)]
    mixed = [TraceJob(f"m{i}", 60.0 * i, 10.0 ** (1 + i % 4), 1, "vision") for i in range(20)]
    config = SimConfig(named("default"), failures_per_1000_gpu_day=0.0, time_limits=False)
    sim = Simulation(small, alike + mixed, config)
    result = sim.run()
    held = sorted(j.allocated_gpu_s / j.gpus for j in result.jobs if j.id.startswith("a"))
    assert sim.runtimes.estimate("vision", "", 8) == held[17]  # nearest rank 90% of 20
    assert sim.runtimes.estimate("vision", "", 1) is None

"""The simulator: deterministic replays, conserved GPU-time, and the direction of known results."""

from __future__ import annotations

import numpy as np
import pytest

from boltforge.core.policy import named
from boltforge.core.topology import TopologyTree
from boltforge.sim.engine import SimConfig, simulate
from boltforge.sim.execution import Segment, interrupted
from boltforge.sim.records import SimResult, TraceJob
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


def test_a_seed_gives_the_same_numbers_twice() -> None:
    trace = heavy_tailed(300, 1, 400.0)
    first, second = run(trace, "default"), run(trace, "default")
    assert [(j.start_s, j.finish_s, j.lost_gpu_s) for j in first.jobs] == [
        (j.start_s, j.finish_s, j.lost_gpu_s) for j in second.jobs
    ]
    assert first.samples == second.samples


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
    trace = heavy_tailed(600, 4, 90.0)  # offered load near the fleet's capacity
    assert avg_jct(run(trace, "tiresias")) < avg_jct(run(trace, "fifo"))


def test_topology_aware_placement_beats_first_fit_on_productive_utilization() -> None:
    trace = heavy_tailed(400, 5, 200.0, sizes=(1, 3, 5, 16, 32, 64))
    aware = run(trace, "default", failures_per_1000_gpu_day=0.0)
    blind_policy = named("default").with_(topology_aware=False)
    blind = simulate(FLEET, trace, SimConfig(blind_policy, failures_per_1000_gpu_day=0.0))

    def slowed(r: SimResult) -> float:
        return sum(j.allocated_gpu_s - j.productive_gpu_s for j in r.jobs)

    assert slowed(aware) < slowed(blind)
    assert avg_jct(aware) < avg_jct(blind)


def test_an_interrupted_run_keeps_progress_up_to_its_last_checkpoint() -> None:
    seg = Segment(start=0.0, gpus=8, slowdown=2.0, warmup=120.0)
    out = interrupted(seg, end=4000.0, checkpoint_interval=1800.0)
    assert out.work_s == pytest.approx((3600.0 - 120.0) / 2.0)
    assert out.lost_gpu_s == pytest.approx(8 * (120.0 + 400.0))
    assert out.allocated_gpu_s == pytest.approx(8 * 4000.0)

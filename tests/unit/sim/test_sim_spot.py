"""Spot reclaims and deadlines in the simulator: rates, lost work, determinism, hit rates."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from boltforge.cli.main import app
from boltforge.core.policy import named
from boltforge.sim.engine import SimConfig, simulate
from boltforge.sim.jobs import with_deadlines
from boltforge.sim.metrics import Metrics, compute, to_json
from boltforge.sim.records import JobRecord, SimResult, TraceJob
from boltforge.sim.spot import Reclaim, ReclaimClock, reclaims_of
from boltforge.spec.errors import SpecError
from boltforge.spec.fleet import FleetSpec, parse_fleet

DAY = 86400.0
HOUR = 3600.0


def pool(name: str, hosts: int, tier: str = "on-demand", **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "gpu": "H100-80GB",
        "gpu_memory_gb": 80,
        "tier": tier,
        "price_per_gpu_hour": 4.0 if tier != "spot" else 1.8,
        "layout": {"hosts": hosts, "hosts_per_rack": 8},
        **extra,
    }


def fleet(*pools: dict[str, Any]) -> FleetSpec:
    return parse_fleet({"name": "t", "pools": list(pools)})


def spot_fleet(hosts: int, rate: float, notice: str, back_after: str = "10m") -> FleetSpec:
    reclaim = {"rate_per_host_day": rate, "notice": notice, "back_after": back_after}
    return fleet(pool("spot", hosts, "spot", reclaim=reclaim))


def run(spec: FleetSpec, trace: list[TraceJob], seed: int = 0, **config: Any) -> SimResult:
    cfg = SimConfig(
        named("default"),
        seed=seed,
        failures_per_1000_gpu_day=0.0,
        reclaims=reclaims_of(spec),
        **config,
    )
    return simulate(spec.to_tree(), trace, cfg)


def first_reclaim(spec: FleetSpec, seed: int, after: float = 0.0) -> float:
    """When the simulation's first reclaim falls (the engine draws the same sequence)."""
    return ReclaimClock(spec.to_tree(), reclaims_of(spec), seed).next_after("spot", after)


def test_reclaims_happen_at_the_configured_rate_per_host() -> None:
    spec = spot_fleet(20, 1.0, "120s", back_after="60s")
    long_job = [TraceJob("long", 0.0, 40 * DAY, 1, "a")]
    result = run(spec, long_job, seed=3)
    m = compute(result)
    expected = 20 * 1.0 * m.makespan_s / DAY
    assert abs(m.reclaims - expected) < 4 * math.sqrt(expected)
    assert m.jobs_reclaimed >= 1 and m.finished == 1


def test_the_clock_draws_poisson_gaps_of_the_pools_total_rate() -> None:
    spec = spot_fleet(10, 2.0, "120s")
    clock = ReclaimClock(spec.to_tree(), reclaims_of(spec), 5)
    t, gaps = 0.0, []
    for _ in range(4000):
        nxt = clock.next_after("spot", t)
        gaps.append(nxt - t)
        t = nxt
    assert np.mean(gaps) == pytest.approx(DAY / 20, rel=0.05)
    assert {clock.pick("spot") for _ in range(500)} == set(range(10))


def test_notice_covering_the_checkpoint_loses_no_work() -> None:
    spec = spot_fleet(1, 1.0, "120s")
    t1 = first_reclaim(spec, seed=1)
    job = TraceJob("j", 0.0, t1 + 10.0, 8, "a")
    result = run(spec, [job], seed=1, checkpoint_write_s=60.0)
    (record,) = result.jobs
    assert record.reclaims == 1
    assert record.reclaim_lost_gpu_s == 0.0
    assert record.productive_gpu_s == pytest.approx(8 * job.duration_s)
    back = t1 + 120.0 + 600.0  # host gone after the notice, back 10 min later
    assert record.finish_s == pytest.approx(back + 120.0 + 10.0)  # restart overhead, then 10 s


def test_no_notice_loses_the_work_since_the_last_checkpoint() -> None:
    spec = spot_fleet(1, 1.0, "0s")
    t1 = first_reclaim(spec, seed=1)
    job = TraceJob("j", 0.0, t1 + 10.0, 8, "a")
    result = run(spec, [job], seed=1, checkpoint_interval_s=1800.0)
    (record,) = result.jobs
    assert record.reclaims == 1
    since_checkpoint = t1 - 1800.0 * math.floor(t1 / 1800.0)
    assert record.reclaim_lost_gpu_s == pytest.approx(8 * since_checkpoint)
    assert compute(result).gpu_hours_lost_reclaim == pytest.approx(8 * since_checkpoint / HOUR)


def test_a_notice_shorter_than_the_checkpoint_also_falls_back_to_the_last_one() -> None:
    spec = spot_fleet(1, 1.0, "30s")
    t1 = first_reclaim(spec, seed=1)
    job = TraceJob("j", 0.0, t1 + 100.0, 8, "a")
    result = run(spec, [job], seed=1, checkpoint_write_s=60.0, checkpoint_interval_s=1800.0)
    (record,) = result.jobs
    gone = t1 + 30.0  # it ran on through the notice; all of it since the checkpoint is lost
    since_checkpoint = gone - 1800.0 * math.floor(gone / 1800.0)
    assert record.reclaims == 1
    assert record.reclaim_lost_gpu_s == pytest.approx(8 * since_checkpoint)


def small_trace(n: int = 200, seed: int = 2) -> list[TraceJob]:
    rng = np.random.default_rng(seed)
    t, out = 0.0, []
    for i in range(n):
        t += float(rng.exponential(600.0))
        duration = float(np.clip(rng.lognormal(np.log(HOUR), 1.2), 60.0, 5 * DAY))
        out.append(TraceJob(f"j{i:04d}", t, duration, int(rng.choice((1, 2, 4, 8))), "a"))
    return out


def mixed() -> FleetSpec:
    reclaim = {"rate_per_host_day": 2.0, "notice": "30s", "back_after": "1h"}
    return fleet(pool("ondemand", 6), pool("spot", 4, "spot", reclaim=reclaim))


def test_the_same_seed_gives_the_same_numbers() -> None:
    trace = with_deadlines(small_trace(), 2.0, 0.3, seed=4)
    first, second, other = (to_json(compute(run(mixed(), trace, seed=s))) for s in (9, 9, 10))
    assert first["reclaims"] and first["gpu_hours_lost_reclaim"]  # the seed decides something
    assert first == second
    assert first != other


def test_an_all_on_demand_fleet_has_no_reclaims() -> None:
    m = compute(run(fleet(pool("ondemand", 10)), small_trace()))
    assert (m.reclaims, m.jobs_reclaimed, m.gpu_hours_lost_reclaim) == (0, 0, 0.0)
    assert m.deadline_hit_rate is None and m.deadline_jobs == 0


def test_spot_hosts_are_charged_at_the_spot_price() -> None:
    m = compute(run(mixed(), small_trace()))
    assert set(m.dollars_by_pool) <= {"ondemand", "spot"}
    assert m.dollars == pytest.approx(sum(m.dollars_by_pool.values()))


def record(finish: float | None, deadline: float | None) -> JobRecord:
    return JobRecord("j", "a", 1, 0.0, 10.0, start_s=0.0, finish_s=finish, deadline_s=deadline)


def test_deadline_hit_rate_counts_met_over_jobs_with_a_deadline() -> None:
    result = SimResult("default", "t", 8)
    result.jobs = [
        record(10.0, 10.0),  # met exactly
        record(10.0, 20.0),  # met
        record(30.0, 20.0),  # late
        record(None, 20.0),  # never finished: missed
        record(10.0, None),  # no deadline: not counted
    ]
    m: Metrics = compute(result)
    assert (m.deadline_jobs, m.deadlines_met) == (4, 2)
    assert m.deadline_hit_rate == 0.5


def test_deadlines_reach_the_simulated_jobs_and_are_judged_at_finish() -> None:
    trace = [
        TraceJob("a", 0.0, HOUR, 8, "a", deadline_s=1.5 * HOUR),
        TraceJob("b", 0.0, HOUR, 8, "a", deadline_s=1.5 * HOUR),
        TraceJob("c", 0.0, HOUR, 8, "a"),
    ]
    m = compute(run(fleet(pool("ondemand", 1)), trace, restart_overhead_s=0.0))
    assert m.finished == 3
    assert (m.deadline_jobs, m.deadlines_met, m.deadline_hit_rate) == (2, 1, 0.5)


def test_with_deadlines_picks_a_seeded_share_at_submit_plus_slack_times_runtime() -> None:
    trace = small_trace(2000)
    picked = with_deadlines(trace, 2.0, 0.3, seed=1)
    due = [t for t in picked if t.deadline_s is not None]
    assert len(due) / len(trace) == pytest.approx(0.3, abs=0.03)
    assert all(t.deadline_s == t.submit_s + 2.0 * t.duration_s for t in due)
    assert with_deadlines(trace, 3.0, 0.3, seed=1)[5].id == picked[5].id
    assert [t.deadline_s is None for t in with_deadlines(trace, 3.0, 0.3, seed=1)] == [
        t.deadline_s is None for t in picked
    ]
    with pytest.raises(ValueError, match="share"):
        with_deadlines(trace, 2.0, 1.5, seed=1)


@pytest.mark.parametrize(
    ("reclaim", "field", "text"),
    [
        ({"rate_per_host_day": -1}, "reclaim.rate_per_host_day", "greater than or equal"),
        ({"rate_per_host_day": 1, "notice": "soon"}, "reclaim.notice", "duration"),
        ({"rate_per_host_day": 1, "back_after": "2x"}, "reclaim.back_after", "duration"),
        ({"notice": "2m"}, "reclaim.rate_per_host_day", "required"),
        ({"rate_per_host_day": 1, "grace": 3}, "reclaim.grace", "not a known field"),
    ],
)
def test_reclaim_spec_errors_name_the_field(reclaim: dict[str, Any], field: str, text: str) -> None:
    with pytest.raises(SpecError) as err:
        fleet(pool("spot", 2, "spot", reclaim=reclaim))
    assert f"fleet.pools[0].{field}" in str(err.value)
    assert text in str(err.value)


def test_reclaim_on_a_pool_that_is_not_spot_is_refused_with_the_fix() -> None:
    with pytest.raises(SpecError, match=r"`reclaim` is only for spot pools.*tier: spot"):
        fleet(pool("od", 2, reclaim={"rate_per_host_day": 1}))


def test_reclaims_of_reads_durations_and_skips_pools_without_one() -> None:
    spec = fleet(
        pool("od", 2),
        pool("spot", 2, "spot", reclaim={"rate_per_host_day": 0.5, "back_after": "2h"}),
    )
    assert reclaims_of(spec) == {"spot": Reclaim(0.5, 120.0, 7200.0)}


def write_fleet(path: Path, spec: FleetSpec) -> Path:
    path.write_text(json.dumps(spec.model_dump(mode="json")), encoding="utf-8")
    return path


def test_the_cli_compares_fleets_side_by_side(tmp_path: Path) -> None:
    a = write_fleet(tmp_path / "a.yaml", fleet(pool("ondemand", 10)))
    b = write_fleet(tmp_path / "b.yaml", mixed().model_copy(update={"name": "mix"}))
    args = ["simulate", "--fleet", str(a), "--fleet", str(b), "--trace", "synthetic:150"]
    args += ["--policy", "default", "--deadline-share", "0.3", "--workers", "1", "--seed", "2"]
    out = CliRunner().invoke(app, [*args, "--json"])
    assert out.exit_code == 0, out.output
    runs = json.loads(out.stdout)["runs"]
    assert set(runs) == {"t", "mix"}
    assert runs["t"]["reclaims"] == 0 and runs["mix"]["policy"] == "default"
    assert runs["t"]["deadline_jobs"] == runs["mix"]["deadline_jobs"] > 0
    report = tmp_path / "report"
    table = CliRunner().invoke(app, [*args, "--markdown", "--report", str(report)])
    assert table.exit_code == 0, table.output
    assert "| Run | Dollars | Dollars by pool |" in table.stdout
    assert (report / "cost_jct.png").is_file()
    assert "Cost, spot reclaims and deadlines" in (report / "index.html").read_text()


def test_cost_routing_sends_a_job_to_the_cheaper_spot_pool() -> None:
    reclaim = {"rate_per_host_day": 0.01, "notice": "120s"}
    spec = fleet(pool("ondemand", 4), pool("spot", 4, "spot", reclaim=reclaim))
    job = [TraceJob("j", 0.0, HOUR, 8, "a")]
    routed = compute(run(spec, job, cost_routing=True))
    assert set(routed.dollars_by_pool) == {"spot"}
    assert routed.dollars == pytest.approx(8 * 1.8)

"""The serving study: services autoscaled or statically provisioned beside training jobs, on
scenarios written as data (a rate per 60 s step), and the loaders' errors."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pytest
from rich.console import Console

from boltforge.cli.serving_sim import comparison_table
from boltforge.core.model.topology import TopologyTree
from boltforge.core.policy import named
from boltforge.core.preempt.victims import PreemptRules
from boltforge.sim.engine import SimConfig, Simulation
from boltforge.sim.records import TraceJob
from boltforge.sim.serving import Mode, ModeOutcome, ServiceControl, common_jct_h, run_mode
from boltforge.sim.serving_inputs import (
    RequestTrace,
    ServicesSpec,
    StudyService,
    check_match,
    parse_requests,
    parse_services,
)
from boltforge.sim.serving_model import serve_step, within_slo
from boltforge.spec.errors import SpecError
from boltforge.testing.builders import make_fleet

STEP = 60.0
ONE_HOST = make_fleet(pods=1, racks=1, hosts=1)  # 8 GPUs
TWO_HOSTS = make_fleet(pods=1, racks=1, hosts=2)  # 16 GPUs
# Preemption allowed at any size on these tiny fleets (the default's churn budget is 5% of
# the fleet: no GPU at all on 8 or 16 GPUs).
POLICY = named("default").with_preempt_rules(PreemptRules(churn_fraction=1.0))
CONFIG = SimConfig(POLICY, failures_per_1000_gpu_day=0.0)


@dataclass(frozen=True)
class Scenario:
    """A service's load as (steps, rate) pieces, the service, and the training jobs."""

    pieces: tuple[tuple[int, float], ...]
    service: StudyService
    training: tuple[TraceJob, ...] = ()
    fleet: TopologyTree = TWO_HOSTS

    def requests(self) -> RequestTrace:
        rates = np.concatenate([np.full(n, rate) for n, rate in self.pieces])
        return RequestTrace(STEP, {self.service.name: rates.astype(np.float64)})

    def run(self, mode: Mode) -> ModeOutcome:
        services = ServicesSpec(services=[self.service])
        return run_mode(self.fleet, list(self.training), self.requests(), services, mode, CONFIG)


def web(**changes: object) -> StudyService:
    """A 1-GPU service serving 10 requests/s per replica (7 at the 0.7 target)."""
    fields: dict[str, object] = {
        "name": "web",
        "gpus_per_replica": 1,
        "rps_per_replica": 10.0,
        "latency_slo_ms": 1000.0,
        "base_latency_ms": 10.0,
        "min_replicas": 1,
        "max_replicas": 8,
        "cold_start_s": 60.0,
        "scale_down_window_s": 120.0,
        "predictive": False,
    }
    return StudyService.model_validate(fields | changes)


RISE_AND_FALL = Scenario(((10, 5.0), (20, 50.0), (30, 5.0)), web())


def test_autoscaling_scales_up_with_the_load_and_back_down_after_it() -> None:
    out = RISE_AND_FALL.run(Mode.AUTOSCALED).services[0]
    counts = [n for _, n in out.counts]
    assert counts[0] == 1  # 5 requests/s: one replica
    assert max(counts) == math.ceil(50.0 / 7.0)  # 8 at the 0.7 target
    assert counts[-1] == 1  # and back
    peak_at = next(t for t, n in out.counts if n == max(counts))
    assert 10 * STEP < peak_at < 30 * STEP
    assert out.scale_events == len(out.counts) - 1 >= 2
    assert out.cold_starts >= max(counts) - 1


def test_static_provision_holds_the_peak_count_for_the_whole_run() -> None:
    out = RISE_AND_FALL.run(Mode.STATIC)
    service = out.services[0]
    assert service.counts == ((0.0, 8),)
    assert service.scale_events == 0 and out.scale_events == 0
    assert service.cold_starts == 0  # started at time 0: warm
    horizon_h = 60 * STEP / 3600.0
    assert service.gpu_hours == pytest.approx(8 * horizon_h)
    assert service.mean_ready == pytest.approx(8.0)


def test_attainment_is_one_when_capacity_always_exceeds_the_load() -> None:
    steady = Scenario(((30, 5.0), (30, 20.0)), web(min_replicas=4))
    for mode in Mode:
        out = steady.run(mode)
        assert out.slo_attainment == pytest.approx(1.0, abs=1e-12), mode


def test_a_burst_faster_than_the_cold_start_misses_the_slo() -> None:
    burst = Scenario(((20, 5.0), (5, 60.0), (20, 5.0)), web(cold_start_s=300.0))
    autoscaled, static = burst.run(Mode.AUTOSCALED), burst.run(Mode.STATIC)
    assert autoscaled.slo_attainment < 0.9  # one warm replica serves 10 of 60 requests/s
    assert autoscaled.services[0].cold_starts > 0
    assert static.slo_attainment > 0.99  # 8 warm replicas: 60 of 80 requests/s


def test_a_training_job_is_preempted_for_serving_and_resumes_after_it() -> None:
    service = web(gpus_per_replica=2, rps_per_replica=10.0, max_replicas=3)
    job = TraceJob("train", 0.0, 3600.0, 6, "team-a")
    scenario = Scenario(((20, 5.0), (10, 20.0), (120, 5.0)), service, (job,), ONE_HOST)
    requests = scenario.requests()
    control = ServiceControl(requests, ServicesSpec(services=[service]), Mode.AUTOSCALED)
    sim = Simulation(ONE_HOST, [job], CONFIG, None, control)
    result = sim.run()
    record = next(r for r in result.jobs if r.id == "train")
    counts = control.services[0].counts
    up = next(t for t, n in counts if n == 3)
    down = next(t for t, n in counts if t > up and n == 1)
    assert record.preemptions == 1
    assert record.start_s == 0.0
    assert record.finish_s is not None and record.finish_s > down
    assert record.productive_gpu_s == pytest.approx(6 * 3600.0)
    outcome = scenario.run(Mode.AUTOSCALED)
    assert outcome.training_preemptions == 1 and outcome.training_finished == 1


def test_training_figures_leave_the_replicas_out() -> None:
    job = TraceJob("train", 0.0, 600.0, 4, "team-a")
    out = Scenario(((30, 5.0),), web(), (job,)).run(Mode.STATIC)
    assert out.training_submitted == 1 and out.training_finished == 1
    assert out.training_productive_gpu_hours == pytest.approx(4 * 600.0 / 3600.0)
    assert out.training_avg_jct_h == pytest.approx(600.0 / 3600.0)


def test_jct_is_compared_on_the_jobs_both_modes_finished_and_the_table_fits() -> None:
    late = TraceJob("late", 1200.0, 600.0, 16, "team-b")  # needs the whole fleet
    early = TraceJob("early", 0.0, 600.0, 4, "team-a")
    scenario = Scenario(((40, 5.0),), web(), (early, late))
    outcomes = [scenario.run(Mode.AUTOSCALED), scenario.run(Mode.STATIC)]
    assert [o.training_finished for o in outcomes] == [1, 1]  # "late" never fits beside a replica
    both, hours = common_jct_h(outcomes)
    assert both == 1 and hours == [pytest.approx(600.0 / 3600.0)] * 2
    console = Console(width=100, record=True)
    console.print(comparison_table(outcomes))
    lines = console.export_text().splitlines()
    assert max(len(line) for line in lines) <= 100
    assert any("JCT of the 1 done in both" in line for line in lines)


# -- the fluid queue ----------------------------------------------------------------------------


def test_the_queue_serves_new_requests_first_and_carries_the_excess() -> None:
    over = serve_step(
        rate=20.0,
        ready=1.0,
        backlog=0.0,
        dt=60.0,
        rps_per_replica=10.0,
        base_ms=10.0,
        slo_ms=1000.0,
    )
    assert over.served == 600.0 and over.backlog == 600.0 and over.in_slo == 0.0
    drain = serve_step(
        rate=5.0,
        ready=2.0,
        backlog=1200.0,
        dt=60.0,
        rps_per_replica=10.0,
        base_ms=10.0,
        slo_ms=1000.0,
    )
    assert drain.served == 1200.0 and drain.backlog == 300.0 and drain.in_slo == 0.0
    spare = serve_step(
        rate=5.0,
        ready=2.0,
        backlog=600.0,
        dt=60.0,
        rps_per_replica=10.0,
        base_ms=10.0,
        slo_ms=1000.0,
    )
    assert spare.served == 900.0 and spare.backlog == 0.0
    assert spare.in_slo == pytest.approx(300.0 * within_slo(0.75, 10.0, 1000.0))
    cold = serve_step(5.0, 0.0, 0.0, 60.0, 10.0, 10.0, 1000.0)
    assert cold.served == 0.0 and cold.backlog == 300.0
    assert within_slo(0.5, 100.0, 200.0) == pytest.approx(0.99)  # p99 exactly the SLO


# -- loaders --------------------------------------------------------------------------------


GOOD_CSV = "time_s,service,requests_per_s\n0,chat,1\n0,embed,2\n60,chat,3\n60,embed,4\n"
LATE_START = "time_s,service,requests_per_s\n30,chat,1\n30,embed,2\n90,chat,3\n90,embed,4\n"


def test_a_good_request_trace_loads() -> None:
    trace = parse_requests(GOOD_CSV)
    assert trace.step_s == 60.0 and trace.steps == 2 and trace.horizon_s == 120.0
    assert trace.rate("embed", 1) == 4.0 and trace.peak("chat") == 3.0


@pytest.mark.parametrize(
    ("text", "where", "says"),
    [
        ("time,service,rps\n0,chat,1\n", "line 1", "header"),
        ("time_s,service,requests_per_s\n0,chat,1\n", "line 2", "two time steps"),
        (GOOD_CSV.replace("60,chat,3", "60,chat,fast"), "line 4, column requests_per_s", "number"),
        (GOOD_CSV.replace("60,chat,3", "60,chat,-3"), "line 4, column requests_per_s", ">= 0"),
        (LATE_START, "line 2, column time_s", "first time_s"),
        (GOOD_CSV + "180,chat,1\n180,embed,1\n", "line 6, column time_s", "step is 60"),
        (GOOD_CSV + "120,chat,1\n", "line 6, column service", "no row for embed"),
        (GOOD_CSV + "120,chat,1\n120,chat,2\n", "line 7, column service", "second row"),
        (GOOD_CSV + "30,chat,1\n", "line 6, column time_s", "sort the rows"),
        (GOOD_CSV.replace("60,chat,3", "60,Chat!,3"), "line 4, column service", "lowercase"),
        (GOOD_CSV.replace("60,chat,3", "60,chat"), "line 4", "not 3"),
    ],
)
def test_a_bad_request_trace_names_the_line_and_the_fix(text: str, where: str, says: str) -> None:
    with pytest.raises(SpecError) as caught:
        parse_requests(text, "r.csv")
    problem = caught.value.problems[0]
    assert problem.field == where
    assert says in problem.message and "To fix" in problem.message


SERVICE = {
    "name": "chat",
    "gpus_per_replica": 2,
    "rps_per_replica": 5,
    "latency_slo_ms": 2000,
    "base_latency_ms": 500,
    "min_replicas": 1,
    "max_replicas": 4,
    "cold_start_s": 300,
}


@pytest.mark.parametrize(
    ("entry", "field", "says"),
    [
        (
            {k: v for k, v in SERVICE.items() if k != "rps_per_replica"},
            "rps_per_replica",
            "required",
        ),
        (SERVICE | {"replicas": 3}, "replicas", "not a known field"),
        (SERVICE | {"gpus_per_replica": "2"}, "gpus_per_replica", "whole number"),
        (SERVICE | {"min_replicas": 5}, "services[0]", "above max_replicas"),
        (SERVICE | {"base_latency_ms": 2500}, "services[0]", "not below latency_slo_ms"),
        (SERVICE | {"name": "Chat Bot"}, "name", "lowercase"),
    ],
)
def test_a_bad_services_file_names_the_field_and_the_fix(
    entry: dict[str, object], field: str, says: str
) -> None:
    with pytest.raises(SpecError) as caught:
        parse_services({"services": [entry]}, "s.yaml")
    problem = caught.value.problems[0]
    assert problem.field.endswith(field)
    assert says in problem.message


def test_services_must_be_distinct_and_match_the_trace() -> None:
    with pytest.raises(SpecError, match="appears more than once"):
        parse_services({"services": [SERVICE, SERVICE]})
    with pytest.raises(SpecError, match="lists no service"):
        parse_services({"services": []})
    with pytest.raises(SpecError, match="must be a mapping"):
        parse_services([SERVICE])
    services = parse_services({"services": [SERVICE]})
    with pytest.raises(SpecError) as caught:
        check_match(parse_requests(GOOD_CSV), services, "both")
    assert [p.field for p in caught.value.problems] == ["service embed"]

"""Elastic jobs in the simulator: started smaller, shrunk instead of preempted, grown back.

A resize is an in-place restart: the job checkpoints, keeps all its progress, pays the restart
overhead on its new GPUs and runs at the speed of its new size, without ever going back to the
queue. Every resize closes one run segment and opens another; what a job holds, does and pays
is the sum over its segments.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from boltforge.core.model.topology import TopologyTree
from boltforge.core.model.workload import PRODUCTION
from boltforge.core.policy import NO_RESIZING, named
from boltforge.core.preempt.victims import PreemptRules
from boltforge.sim.engine import SimConfig, Simulation, simulate
from boltforge.sim.jobs import with_elastic
from boltforge.sim.records import JobRecord, SimResult, TraceJob
from boltforge.testing.builders import make_fleet

HOUR = 3600.0
RESTART = 120.0  # SimConfig's default restart overhead, paid by every resumed segment
PRICE = 2.5  # dollars per GPU-hour of the builders' pool
ROOT = Path(__file__).resolve().parents[3]

# Four hosts of 8 GPUs in one rack. On so small a fleet the default churn budget (5% of the
# GPUs per 10 minutes) would not let even one host be preempted, so these runs allow half.
RACK = make_fleet(racks=1, hosts=4)
ROOMY = named("default").with_preempt_rules(PreemptRules(churn_fraction=0.5))


def replay(fleet: TopologyTree, trace: list[TraceJob], **config: object) -> SimResult:
    settings: dict[str, object] = {"policy": ROOMY, "failures_per_1000_gpu_day": 0.0} | config
    return simulate(fleet, trace, SimConfig(**settings))  # type: ignore[arg-type]


def by_id(result: SimResult) -> dict[str, JobRecord]:
    return {j.id: j for j in result.jobs}


def samples_between(result: SimResult, lo: float, hi: float) -> list[tuple[int, int]]:
    """(allocated GPUs, queued jobs) of the samples taken in ``[lo, hi)``."""
    return [(s.allocated_gpus, s.queued) for s in result.samples if lo <= s.t < hi]


# -- shrunk for an urgent job, grown back when it leaves ------------------------------------


@pytest.fixture(scope="module")
def squeezed() -> SimResult:
    """A 10-hour elastic job (4 replicas of 8 GPUs, may run on 2 to 4) fills the rack; an
    hour in, a production job of one host arrives and runs for 2 hours."""
    trace = [
        TraceJob("train", 0.0, 10 * HOUR, 32, "research", elastic=(2, 4)),
        TraceJob("urgent", HOUR, 2 * HOUR, 8, "prod", priority=PRODUCTION),
    ]
    return replay(RACK, trace)


def test_an_urgent_job_shrinks_an_elastic_one_instead_of_waiting_or_evicting_it(
    squeezed: SimResult,
) -> None:
    jobs = by_id(squeezed)
    assert jobs["urgent"].start_s == HOUR and jobs["urgent"].finish_s == 3 * HOUR
    train = jobs["train"]
    assert train.shrinks == 1 and train.preemptions == 0 and train.start_s == 0.0
    # while the urgent job runs, the rack is full (24 GPUs of training, 8 urgent) and nothing
    # waits: the shrunk job never went back to the queue
    assert samples_between(squeezed, HOUR, 3 * HOUR) == [(32, 0)]


def test_the_shrunk_job_grows_back_when_the_urgent_job_leaves(squeezed: SimResult) -> None:
    train = by_id(squeezed)["train"]
    assert train.grows == 1
    assert samples_between(squeezed, 3 * HOUR, 4 * HOUR) == [(32, 0)]


def test_the_elastic_job_finishes_later_than_at_full_size_by_its_slower_hours_and_restarts(
    squeezed: SimResult,
) -> None:
    """It kept its progress at each resize: 1 h at full size, then 2 h of which 2 minutes of
    restart at three quarters of the speed, then the rest at full size after a restart."""
    left = 10 * HOUR - HOUR - 0.75 * (2 * HOUR - RESTART)
    finish = by_id(squeezed)["train"].finish_s
    assert finish == pytest.approx(3 * HOUR + RESTART + left)
    assert finish is not None and finish > 10 * HOUR


def test_gpu_seconds_and_dollars_are_the_sum_over_the_segments(squeezed: SimResult) -> None:
    train = by_id(squeezed)["train"]
    assert train.finish_s is not None
    segments = [(32, 0.0, HOUR), (24, HOUR, 3 * HOUR), (32, 3 * HOUR, train.finish_s)]
    held = sum(gpus * (end - start) for gpus, start, end in segments)
    assert train.allocated_gpu_s == pytest.approx(held)
    assert train.dollars == pytest.approx(held * PRICE / HOUR)
    assert train.lost_gpu_s == pytest.approx((24 + 32) * RESTART)  # the two restarts only
    assert train.productive_gpu_s == pytest.approx(32 * 10 * HOUR)  # all the work, once


# -- started smaller ---------------------------------------------------------------------


def test_a_job_started_smaller_runs_at_that_size_and_pays_for_that_size() -> None:
    """Two hosts are busy for 10 hours; waiting for all four would finish the 2-hour elastic
    job after 14 hours or more, so it starts at once on two and takes twice as long."""
    trace = [
        TraceJob("long", 0.0, 10 * HOUR, 16, "a"),
        TraceJob("flex", 60.0, 2 * HOUR, 32, "b", elastic=(2, 4)),
    ]
    flex = by_id(replay(RACK, trace))["flex"]
    assert flex.elastic_starts == 1 and flex.start_s == 60.0
    assert flex.finish_s == pytest.approx(60.0 + 4 * HOUR)
    assert flex.allocated_gpu_s == pytest.approx(16 * 4 * HOUR)
    assert flex.productive_gpu_s == pytest.approx(32 * 2 * HOUR)


def test_a_rigid_job_of_the_same_shape_waits_for_its_full_size() -> None:
    trace = [
        TraceJob("long", 0.0, 10 * HOUR, 16, "a"),
        TraceJob("flex", 60.0, 2 * HOUR, 32, "b"),
    ]
    flex = by_id(replay(RACK, trace))["flex"]
    assert flex.elastic_starts == 0 and flex.start_s == 10 * HOUR


# -- a busy fleet: conservation and consistency -------------------------------------------

FLEET = make_fleet(racks=4, hosts=4, pods=2)  # 256 GPUs in 2 pods of 2 racks


def busy_trace(n: int, seed: int) -> list[TraceJob]:
    """Poisson arrivals of mostly multi-host jobs, log-normal runtimes, one in ten urgent."""
    rng = np.random.default_rng(seed)
    t, out = 0.0, []
    for i in range(n):
        t += float(rng.exponential(900.0))
        duration = float(np.clip(rng.lognormal(np.log(2 * HOUR), 1.0), 300.0, 40 * HOUR))
        gpus = int(rng.choice((1, 8, 16, 24, 32)))
        priority = PRODUCTION if rng.random() < 0.1 else 3
        out.append(TraceJob(f"j{i:04d}", t, duration, gpus, f"team{i % 3}", priority=priority))
    return with_elastic(out, 1.0, seed, host_gpus=8, fleet_gpus=FLEET.total_gpus)


class AuditedSimulation(Simulation):
    """A simulation that checks the fleet after every instant: no GPU held twice, the free
    map agrees with the allocations, and every running job holds exactly its segment's GPUs."""

    audits = 0  # instants checked

    def _step(self) -> None:
        super()._step()
        self.audit()

    def audit(self) -> None:
        state = self.state
        holders = np.zeros(state.free.shape, dtype=np.int64)
        for allocation in state.allocations.values():
            for g in allocation.grants:
                holders[g.host, list(g.gpus)] += 1
        real = self.tree.gpu_island >= 0
        assert holders.max(initial=0) <= 1, "a GPU is held twice"
        assert np.array_equal(state.free[real], holders[real] == 0)
        assert int(state.host_free.sum()) == int(state.free.sum())
        assert set(state.allocations) == set(self.live)
        for key, live in self.live.items():
            assert live.run.allocation is state.allocations[key]
            assert live.segment.gpus == state.allocations[key].gpus
        self.audits += 1


@pytest.fixture(scope="module")
def audited() -> AuditedSimulation:
    config = SimConfig(named("default"), failures_per_1000_gpu_day=40.0, seed=5)
    sim = AuditedSimulation(FLEET, busy_trace(160, seed=3), config)
    sim.run()
    return sim


@pytest.fixture(scope="module")
def busy(audited: AuditedSimulation) -> tuple[list[TraceJob], SimResult]:
    return audited.trace, audited.result


def test_a_busy_fleet_with_elastic_jobs_grows_shrinks_and_starts_jobs_smaller(
    busy: tuple[list[TraceJob], SimResult],
) -> None:
    _, result = busy
    assert sum(j.grows for j in result.jobs) > 0
    assert sum(j.shrinks for j in result.jobs) > 0
    assert sum(j.elastic_starts for j in result.jobs) > 0
    assert sum(j.failures for j in result.jobs) > 0  # resizes mix with failed runs


def test_no_gpu_is_ever_held_twice(audited: AuditedSimulation) -> None:
    """The audit raises on the first inconsistency; it ran after every instant (one sample
    each) of a replay that resized jobs."""
    assert audited.audits == len(audited.result.samples) > 0
    assert sum(j.grows + j.shrinks for j in audited.result.jobs) > 0


def test_every_job_does_exactly_its_work_however_often_it_was_resized(
    busy: tuple[list[TraceJob], SimResult],
) -> None:
    trace, result = busy
    assert all(j.finish_s is not None for j in result.jobs)
    for record, job in zip(result.jobs, trace, strict=True):
        assert record.productive_gpu_s == pytest.approx(job.gpus * job.duration_s)
        assert record.allocated_gpu_s >= record.productive_gpu_s + record.lost_gpu_s - 1e-6


def test_the_fleet_s_allocated_gpu_time_is_the_sum_of_the_jobs_segments(
    busy: tuple[list[TraceJob], SimResult],
) -> None:
    """The samples read the fleet state; the records sum what each segment held: they agree."""
    _, result = busy
    samples = result.samples
    sampled = sum(a.allocated_gpus * (b.t - a.t) for a, b in itertools.pairwise(samples))
    charged = sum(j.allocated_gpu_s for j in result.jobs)
    assert sampled == pytest.approx(charged)
    assert sum(j.dollars for j in result.jobs) == pytest.approx(charged * PRICE / HOUR)
    assert sum(result.dollars_by_pool.values()) == pytest.approx(charged * PRICE / HOUR)


def test_the_same_seed_gives_the_same_replay_and_another_seed_a_different_one() -> None:
    trace = busy_trace(120, seed=4)

    def outcome(seed: int) -> list[tuple[object, ...]]:
        config = SimConfig(named("default"), failures_per_1000_gpu_day=40.0, seed=seed)
        result = simulate(FLEET, trace, config)
        return [(j.finish_s, j.allocated_gpu_s, j.grows, j.shrinks) for j in result.jobs]

    first = outcome(7)
    assert any(grows or shrinks for *_, grows, shrinks in first)
    assert outcome(7) == first
    assert outcome(8) != first


def test_a_policy_with_elastic_off_never_starts_a_job_smaller_nor_grows_one() -> None:
    trace = busy_trace(80, seed=6)
    on = simulate(FLEET, trace, SimConfig(named("default"), failures_per_1000_gpu_day=0.0))
    policy = named("default").with_(elastic=NO_RESIZING)
    off = simulate(FLEET, trace, SimConfig(policy, failures_per_1000_gpu_day=0.0))
    assert sum(j.elastic_starts + j.grows for j in on.jobs) > 0
    assert sum(j.elastic_starts + j.grows for j in off.jobs) == 0


# -- choosing the elastic jobs --------------------------------------------------------------


def sized_trace(n: int) -> list[TraceJob]:
    sizes = (1, 4, 8, 12, 16, 64, 256)
    return [TraceJob(f"j{i}", float(i), HOUR, sizes[i % len(sizes)], "t") for i in range(n)]


def test_with_elastic_picks_exactly_the_requested_share_of_multi_replica_jobs() -> None:
    trace = sized_trace(700)  # 400 jobs need more than one 8-GPU host
    multi = [t.id for t in trace if t.gpus > 8]
    for share in (0.0, 0.3, 0.55, 1.0):
        picked = [t.id for t in with_elastic(trace, share, seed=1, host_gpus=8) if t.elastic]
        assert len(picked) == round(share * len(multi))
        assert set(picked) <= set(multi)


def test_with_elastic_gives_half_to_twice_the_replicas_within_the_fleet() -> None:
    trace = sized_trace(7)
    ranges = {t.gpus: t.elastic for t in with_elastic(trace, 1.0, 0, 8, fleet_gpus=256)}
    assert ranges[1] is None and ranges[8] is None  # one host: not multi-replica
    assert ranges[12] == (1, 4)  # 2 replicas of 6 GPUs
    assert ranges[16] == (1, 4)
    assert ranges[64] == (4, 16)
    assert ranges[256] == (16, 32)  # twice would not fit the 256-GPU fleet


def test_with_elastic_is_seeded_and_a_larger_share_picks_a_superset() -> None:
    trace = sized_trace(700)

    def picked(share: float, seed: int) -> set[str]:
        return {t.id for t in with_elastic(trace, share, seed, 8) if t.elastic}

    assert picked(0.3, 1) == picked(0.3, 1)
    assert picked(0.3, 1) != picked(0.3, 2)
    assert picked(0.3, 1) < picked(0.6, 1)


def test_with_elastic_refuses_a_share_outside_zero_to_one() -> None:
    with pytest.raises(ValueError, match="share"):
        with_elastic(sized_trace(7), 1.5, 0, 8)


# -- bolt simulate -----------------------------------------------------------------------------


def bolt(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "boltforge.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_bolt_simulate_names_the_option_and_the_fix_for_a_bad_elastic_share() -> None:
    fleet = str(ROOT / "examples" / "fleets" / "eval" / "itp-03.yaml")
    run = bolt("simulate", "--fleet", fleet, "--trace", "synthetic:10", "--elastic-share", "1.5")
    assert run.returncode == 2
    said = " ".join(run.stderr.split())
    assert "--elastic-share: 1.5 is not between 0 and 1" in said
    assert "--elastic-share 0.3" in said
    assert "Traceback" not in run.stderr


def test_bolt_simulate_json_counts_elastic_starts_grows_and_shrinks() -> None:
    fleet = str(ROOT / "examples" / "fleets" / "eval" / "itp-03.yaml")
    run = bolt(
        *("simulate", "--fleet", fleet, "--trace", "synthetic:400", "--policy", "default"),
        *("--elastic-share", "1", "--workers", "1", "--json"),
    )
    assert run.returncode == 0, run.stderr
    figures = json.loads(run.stdout)["policies"]["default"]
    assert {"elastic_starts", "grows", "shrinks"} <= set(figures)
    assert figures["elastic_starts"] + figures["grows"] > 0

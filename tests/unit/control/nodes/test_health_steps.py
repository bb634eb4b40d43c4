"""The loop's health step (``control/nodes/health.py``) called directly on a store: when a
check runs, what a straggler finding does under each policy (recorded, host degraded,
cordoned within the allowance, job moved off unless it may not be), and what a zombie's
failure records. GPU activity kept from heartbeats (``activity.py``) is covered as data."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sched_builders import Bench, activity
from sqlalchemy import select

from boltforge.control.nodes import health
from boltforge.control.nodes.activity import HELD_MEMORY_MIB, IDLE_UTIL_PCT, idle_since, merge
from boltforge.control.nodes.health import DEGRADED_S, HealthCheck
from boltforge.control.nodes.quarantine import cordon
from boltforge.control.nodes.reports import apply_progress
from boltforge.control.scheduling.actuate import Touched
from boltforge.control.store.models import AuditRow, NodeRow
from boltforge.core.health import HealthRules, StragglerAction
from boltforge.wire.agent import Progress

REPORT = HealthRules(straggler_action=StragglerAction.REPORT, progress_timeout_s=60.0)
CORDON = HealthRules(straggler_action=StragglerAction.CORDON, progress_timeout_s=60.0)


@pytest.fixture
def bench(tmp_path: Path) -> Iterator[Bench]:
    with Bench(tmp_path, hosts=3) as b:
        b.settle()
        yield b


def running_gang(bench: Bench, **extra: Any) -> str:
    job = bench.place("train", 16, **extra)
    bench.start_all()
    assert bench.job(job).state == "running"
    return job


def steps(bench: Bench, job: str, times: dict[int, float], count: int = 12) -> None:
    """Each rank of ``job`` reports ``count`` steps of its step time, now."""
    for rep in bench.replicas(job):
        items = [
            Progress(
                replica=rep.id,
                job=job,
                epoch=rep.epoch,
                rank=rep.rank,
                step=i + 1,
                at=bench.clock(),
                step_time_s=times[rep.rank],
            )
            for i in range(count)
        ]
        write_progress(bench, rep.node, items)


def write_progress(bench: Bench, node: str, items: list[Progress]) -> None:
    refused = bench.write(lambda s: apply_progress(s, node, items))
    assert refused == []


def check(bench: Bench, rules: HealthRules) -> Touched:
    now = bench.clock()
    return bench.write(lambda s: health.check(s, rules, now))


def audits(bench: Bench) -> list[tuple[str, str, str]]:
    with bench.db.session() as s:
        return [(a.who, a.action, a.target) for a in s.scalars(select(AuditRow))]


# -- when a check runs ------------------------------------------------------------------------


def test_a_check_runs_at_once_then_not_again_until_its_interval_passed(bench: Bench) -> None:
    step = HealthCheck(REPORT, every_s=100.0)
    t0 = bench.clock()
    assert step.due(t0)
    bench.write(lambda s: step.run(s, t0))
    assert not step.due(t0 + 99.0)
    assert bench.write(lambda s: step.run(s, t0 + 99.0)) == Touched()
    assert step.due(t0 + 100.0)


def test_a_check_over_no_running_job_changes_nothing(bench: Bench) -> None:
    bench.place("waiting", 8)  # bound, never started
    assert check(bench, CORDON) == Touched()


# -- stragglers -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Finding:
    """Rank 1 of a running two-host gang straggles (3x its peer) under ``rules``."""

    name: str
    rules: HealthRules
    preemptible: bool
    cordoned_before: list[str]  # hosts an operator cordoned first ("slow": rank 1's host)
    outcome: str
    state: str
    slow_host_cordoned: bool


FINDINGS = [
    Finding("report-only", REPORT, True, [], "reported only", "running", False),
    Finding(
        "cordon-and-move", CORDON, True, [],
        "host cordoned; the job moves off at its checkpoint", "preempting", True,
    ),
    Finding(
        "cordon-but-stay", CORDON, False, [],
        "host cordoned; the job stays (it is not preemptible)", "running", True,
    ),
    Finding(
        "over-the-allowance", CORDON, True, ["spare"],
        "host not cordoned: 10% of the fleet is cordoned already", "running", False,
    ),
    Finding(
        "already-cordoned-by-an-operator", CORDON, True, ["slow"],
        "host cordoned; the job moves off at its checkpoint", "preempting", True,
    ),
]  # fmt: skip


def operator_cordons(bench: Bench, node: str) -> None:
    bench.write(lambda s: cordon(s, node))


@pytest.mark.parametrize("case", FINDINGS, ids=[c.name for c in FINDINGS])
def test_what_a_straggler_finding_does_under_each_policy(bench: Bench, case: Finding) -> None:
    job = running_gang(bench, preemptible=case.preemptible)
    slow = next(r.node for r in bench.replicas(job) if r.rank == 1)
    spare = next(n for n in ("host-0", "host-1", "host-2") if n not in bench.held_nodes(job))
    for name in case.cordoned_before:
        target = slow if name == "slow" else spare
        operator_cordons(bench, target)
    steps(bench, job, {0: 0.05, 1: 0.15})
    touched = check(bench, case.rules)
    assert job in touched.jobs
    [found] = bench.events(job, "straggler")
    assert found.message.endswith(f"; {case.outcome}")
    assert found.message.startswith(f"straggler: rank 1 on {slow}: median step 0.150 s")
    assert (found.data["rank"], found.data["node"], found.data["epoch"]) == (1, slow, 1)
    assert found.data["action"] == case.outcome
    assert bench.job(job).state == case.state
    assert bench.node(slow).cordoned is case.slow_host_cordoned
    assert bench.node(slow).degraded_until == bench.clock() + DEGRADED_S
    system_cordons = [a for a in audits(bench) if a[:2] == ("system", "cordon")]
    cordoned_now = case.slow_host_cordoned and "slow" not in case.cordoned_before
    assert system_cordons == ([("system", "cordon", slow)] if cordoned_now else [])


def test_a_straggler_is_recorded_once_per_allocation_however_often_checked(
    bench: Bench,
) -> None:
    job = running_gang(bench)
    steps(bench, job, {0: 0.15, 1: 0.05})
    check(bench, REPORT)
    bench.clock.advance(5.0)
    steps(bench, job, {0: 0.15, 1: 0.05})
    assert check(bench, REPORT).jobs == set()
    assert len(bench.events(job, "straggler")) == 1


def test_even_ranks_are_no_stragglers(bench: Bench) -> None:
    job = running_gang(bench)
    steps(bench, job, {0: 0.1, 1: 0.11})
    assert check(bench, CORDON) == Touched()
    assert bench.events(job, "straggler") == []


def test_too_few_samples_are_no_evidence(bench: Bench) -> None:
    job = running_gang(bench)
    steps(bench, job, {0: 0.05, 1: 0.5}, count=REPORT.min_samples - 1)
    check(bench, REPORT)
    assert bench.events(job, "straggler") == []


# -- zombies ----------------------------------------------------------------------------------


def test_a_job_silent_past_its_timeout_is_failed_with_the_evidence(bench: Bench) -> None:
    job = running_gang(bench)
    steps(bench, job, {0: 0.1, 1: 0.1}, count=3)
    last = bench.clock()
    bench.clock.advance(60.0)
    assert check(bench, REPORT) == Touched()  # exactly the timeout: not yet
    bench.clock.advance(1.5)
    touched = check(bench, REPORT)
    assert touched.jobs == {job} and touched.nodes == bench.held_nodes(job)
    row = bench.job(job)
    assert row.state == "failed" and row.finished_at == bench.clock()
    [failed] = bench.events(job, "failed")
    assert failed.message == (
        "failed: no progress for 62 s since its last step report; timeout 60 s"
    )
    assert failed.data == {
        "reason": "no-progress",
        "idle_s": 61.5,
        "timeout_s": 60.0,
        "since": last,
        "last_step": 3,
        "epoch": 1,
    }
    assert {r.state for r in bench.replicas(job)} == {"stopping"}


def test_a_job_with_its_own_timeout_is_judged_before_its_first_report(bench: Bench) -> None:
    job = running_gang(bench, health={"progress_timeout": "30s"})
    bench.clock.advance(31.0)
    check(bench, REPORT)
    [failed] = bench.events(job, "failed")
    assert "since its replicas started (no report); timeout 30 s" in failed.message


def test_a_silent_job_whose_gpus_still_compute_is_not_a_zombie(bench: Bench) -> None:
    job = running_gang(bench)
    steps(bench, job, {0: 0.1, 1: 0.1}, count=3)
    bench.clock.advance(61.0)
    for node in bench.held_nodes(job):
        busy = [activity(g, 80.0, 4096.0).model_dump() for g in range(8)]
        bench.beat(node, gpus=busy)
    assert check(bench, REPORT) == Touched()
    assert bench.job(job).state == "running"


# -- GPU activity as data ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("util", "memory", "before", "since"),
    [
        (0.0, HELD_MEMORY_MIB, None, 100.0),  # idle with memory held: from now
        (IDLE_UTIL_PCT, 1024.0, 40.0, 40.0),  # still idle: since it began
        (IDLE_UTIL_PCT + 0.1, 1024.0, 40.0, None),  # computes
        (0.0, HELD_MEMORY_MIB - 1, 40.0, None),  # holds no memory: not a hung job's GPU
    ],
    ids=["begins-idle", "stays-idle", "computes", "empty"],
)
def test_when_a_gpu_began_to_sit_idle_with_memory_held(
    util: float, memory: float, before: float | None, since: float | None
) -> None:
    previous = {"0": {"idle_since": before}} if before is not None else None
    out = merge(previous, [activity(0, util, memory)], 100.0)
    assert out == {"0": {"util_pct": util, "memory_used_mib": memory, "at": 100.0,
                         "idle_since": since}}  # fmt: skip


def test_a_gpu_not_sampled_this_time_keeps_no_record() -> None:
    previous = {"0": {"idle_since": 5.0}, "1": {"idle_since": 5.0}}
    assert set(merge(previous, [activity(1, 0.0, 4096.0)], 9.0)) == {"1"}


@pytest.mark.parametrize(
    ("records", "gpus", "expected"),
    [
        ({"0": {"idle_since": 3.0}, "1": {"idle_since": None}}, [0, 1], [3.0, None]),
        ({"0": {"idle_since": 3.0}}, [0, 1], None),  # GPU 1 is not sampled
        ({}, [], []),
    ],
    ids=["each-gpu", "one-unsampled", "no-gpus"],
)
def test_idle_since_reads_each_gpus_record_or_none_when_one_is_missing(
    records: dict[str, Any], gpus: list[int], expected: list[float | None] | None
) -> None:
    node = NodeRow(name="n", health={"gpus": records})
    assert idle_since(node, gpus) == expected


def test_idle_since_of_an_unknown_node_is_unsampled() -> None:
    assert idle_since(None, [0]) is None

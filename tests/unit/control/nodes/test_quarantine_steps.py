"""Taking nodes out of service step by step (``control/nodes/quarantine.py``) and a node that
fails its own preflight (``control/nodes/preflight.py``), as scenarios: which jobs a drain
moves, how each leaves, what its timeline says, and what an unfit node's drain records."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sched_builders import Bench, event
from sqlalchemy import select

from boltforge.control.nodes import quarantine
from boltforge.control.nodes.quarantine import UnknownNode
from boltforge.control.scheduling.actuate import Touched
from boltforge.control.store.models import AuditRow


@pytest.fixture
def bench(tmp_path: Path) -> Iterator[Bench]:
    with Bench(tmp_path, hosts=3) as b:
        b.settle()
        yield b


def drain(bench: Bench, node: str) -> Touched:
    now = bench.clock()
    return bench.write(lambda s: quarantine.drain(s, node, now))


def holders(bench: Bench, node: str) -> list[str]:
    return bench.write(lambda s: [j.id for j in quarantine.holders(s, node)])


@pytest.mark.parametrize("action", ["cordon", "uncordon", "drain"])
def test_every_action_on_a_node_never_registered_names_it(bench: Bench, action: str) -> None:
    now = bench.clock()
    act = {
        "cordon": lambda s: quarantine.cordon(s, "host-9"),
        "uncordon": lambda s: quarantine.uncordon(s, "host-9"),
        "drain": lambda s: quarantine.drain(s, "host-9", now),
    }[action]
    with pytest.raises(UnknownNode) as missing:
        bench.write(act)
    assert str(missing.value) == "host-9"


def test_cordon_keeps_what_runs_and_uncordon_returns_the_node(bench: Bench) -> None:
    job = bench.place("train", 8)
    bench.start_all()
    [rep] = bench.replicas(job)
    touched = bench.write(lambda s: quarantine.cordon(s, rep.node))
    assert touched.nodes == {rep.node} and touched.jobs == set()
    assert bench.node(rep.node).cordoned is True
    assert bench.replicas(job)[0].state == "running"
    bench.write(lambda s: quarantine.uncordon(s, rep.node))
    assert bench.node(rep.node).cordoned is False


def test_holders_are_the_jobs_holding_gpus_there_that_are_not_already_leaving(
    bench: Bench,
) -> None:
    a = bench.place("a", 4)
    b = bench.place("b", 4)
    bench.start_all()
    [node] = {r.node for r in bench.replicas(a)} | {r.node for r in bench.replicas(b)}
    assert holders(bench, node) == sorted([a, b])
    drain(bench, node)
    assert holders(bench, node) == []  # both are preempting now
    assert holders(bench, "host-2") == []


def test_a_drain_moves_every_holder_off_at_its_checkpoint(bench: Bench) -> None:
    job = bench.place("wide", 16)
    bench.start_all()
    reps = bench.replicas(job)
    touched = drain(bench, reps[0].node)
    assert touched.jobs == {job}
    assert touched.nodes == {r.node for r in reps}  # every node of the gang is told
    assert {r.state for r in bench.replicas(job)} == {"stopping"}
    row = bench.job(job)
    assert (row.state, row.preemptions, row.restarts) == ("preempting", 1, 0)
    [entry] = bench.events(job, "drained")
    assert entry.message == (
        f"node {reps[0].node} is draining: checkpointing (grace 120 s), then requeued"
    )
    assert entry.data == {"node": reps[0].node}
    assert bench.node(reps[0].node).cordoned is True


def test_a_drained_job_that_had_not_started_requeues_at_once(bench: Bench) -> None:
    victim = bench.place("victim", 24, priority="low")
    bench.start_all()
    urgent = bench.place("urgent", 8, team="nlp", priority="high")
    waiting = bench.replicas(urgent)
    assert {r.state for r in waiting} == {"waiting"}  # its GPUs are still being vacated
    assert bench.job(victim).state == "preempting"
    drain(bench, waiting[0].node)
    assert {r.state for r in bench.replicas(urgent)} == {"exited"}
    row = bench.job(urgent)
    assert row.state == "requeued"
    [requeued] = bench.events(urgent, "requeued")
    assert requeued.message == "requeued (it had not started)"


def test_a_drain_of_an_idle_node_only_cordons_it(bench: Bench) -> None:
    touched = drain(bench, "host-2")
    assert touched.nodes == {"host-2"} and touched.jobs == set()
    assert bench.node("host-2").cordoned is True


def test_a_drained_job_resumes_elsewhere_and_never_on_the_drained_node(bench: Bench) -> None:
    job = bench.place("train", 8)
    bench.start_all()
    [rep] = bench.replicas(job)
    drain(bench, rep.node)
    bench.report(rep.node, [event(bench.replicas(job)[0], "exited", bench.clock(), exit_code=0)])
    bench.settle()
    bench.start_all()
    row = bench.job(job)
    assert (row.state, row.epoch) == ("running", 2)
    assert bench.held_nodes(job) and rep.node not in bench.held_nodes(job)


# -- a node that fails its own preflight ------------------------------------------------------


def preflight_failure(bench: Bench, job: str, detail: str = "nvidia-smi: ECC errors") -> str:
    """The first replica of ``job`` fails its node's preflight; returns that node."""
    rep = bench.replicas(job)[0]
    refused, _ = bench.report(
        rep.node, [event(rep, "failed", bench.clock(), preflight=True, detail=detail)]
    )
    assert refused == []
    return rep.node


def test_a_failed_preflight_requeues_the_job_free_of_its_budget_and_stops_its_gang(
    bench: Bench,
) -> None:
    job = bench.place("wide", 16, max_restarts=0)
    reps = bench.replicas(job)
    unfit = preflight_failure(bench, job)
    states = {r.node: r.state for r in bench.replicas(job)}
    assert states == {unfit: "exited", reps[1].node: "stopping"}
    row = bench.job(job)
    assert (row.state, row.restarts) == ("requeued", 0)
    [entry] = bench.events(job, "preflight_failed")
    assert entry.message == (
        f"requeued: node {unfit} failed its preflight (nvidia-smi: ECC errors); placed elsewhere"
    )
    assert entry.data == {
        "node": unfit,
        "replica": reps[0].id,
        "epoch": 1,
        "evidence": "nvidia-smi: ECC errors",
    }


def test_a_failed_preflight_drains_the_node_audited_as_the_system(bench: Bench) -> None:
    other = bench.place("other", 4)
    bench.start_all()
    [home] = bench.held_nodes(other)
    job = bench.place("next", 4)
    assert bench.held_nodes(job) == {home}  # packed beside the first
    unfit = preflight_failure(bench, job, "gpu 3 missing")
    assert unfit == home
    assert bench.node(unfit).cordoned is True
    assert bench.job(other).state == "preempting"  # the node's other job moves off
    [moved] = bench.events(other, "drained")
    assert moved.data == {"node": unfit}
    with bench.db.session() as s:
        [entry] = s.scalars(select(AuditRow).where(AuditRow.action == "drain"))
        assert (entry.who, entry.target) == ("system", unfit)
        assert entry.detail == {
            "reason": "preflight",
            "job": job,
            "replica": f"{job}.1.0",
            "evidence": "gpu 3 missing",
        }


def test_a_job_refused_by_a_preflight_is_placed_on_another_node(bench: Bench) -> None:
    job = bench.place("train", 8)
    unfit = preflight_failure(bench, job)
    bench.settle()
    row = bench.job(job)
    assert (row.state, row.epoch) == ("scheduled", 2)
    assert unfit not in bench.held_nodes(job)

"""Leases running out (``agents.expire``, ``agents.extend_leases``, ``agents.lose``) on a
fake clock: a silent node turns suspect, then dead; a dead node's replicas are lost and
their jobs requeue from their checkpoint within their restart budget, keeping their
healthy hosts' GPUs for the restart; a server that starts gives every live node a full
lease before judging silence."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sched_builders import Bench

from boltforge.control.nodes.agents import expire, extend_leases
from boltforge.control.store.models import NodeRow

SUSPECT_S, LEASE_S = 6.0, 15.0


@pytest.fixture
def bench(tmp_path: Path) -> Iterator[Bench]:
    with Bench(tmp_path, hosts=3) as b:
        b.settle()
        yield b


def set_node(bench: Bench, name: str, **values: Any) -> None:
    def change(s: Any) -> None:
        row = s.get(NodeRow, name)
        for k, v in values.items():
            setattr(row, k, v)

    bench.write(change)


@dataclass(frozen=True)
class Silence:
    """A node heard from ``quiet`` seconds ago, whose lease ends ``lease_left`` from now."""

    name: str
    state: str
    quiet: float
    lease_left: float
    after: str
    touched: bool


SILENCES = [
    Silence("heard-lately", "ready", 1.0, 14.0, "ready", False),
    Silence("quiet-exactly-suspect-s", "ready", SUSPECT_S, 9.0, "ready", False),
    Silence("quiet-past-suspect-s", "ready", SUSPECT_S + 0.1, 8.9, "suspect", True),
    Silence("already-suspect", "suspect", 10.0, 5.0, "suspect", False),
    Silence("lease-ends-now", "suspect", LEASE_S, 0.0, "suspect", False),
    Silence("lease-over", "suspect", LEASE_S + 0.1, -0.1, "dead", True),
    Silence("lease-over-while-ready", "ready", 2.0, -1.0, "dead", True),
    Silence("dead-stays-dead", "dead", 100.0, -85.0, "dead", False),
]


@pytest.mark.parametrize("case", SILENCES, ids=[c.name for c in SILENCES])
def test_silence_moves_a_node_along_its_lease(bench: Bench, case: Silence) -> None:
    now = bench.clock()
    set_node(
        bench,
        "host-0",
        state=case.state,
        last_heartbeat=now - case.quiet,
        lease_expires_at=now + case.lease_left,
    )
    touched = bench.write(lambda s: expire(s, bench.terms, now))
    assert bench.node("host-0").state == case.after
    assert ("host-0" in touched.nodes) is case.touched
    assert touched.nodes <= {"host-0"}


def test_only_the_named_nodes_are_judged(bench: Bench) -> None:
    now = bench.clock() + LEASE_S + 1  # every lease ran out
    touched = bench.write(lambda s: expire(s, bench.terms, now, ["host-1"]))
    assert touched.nodes == {"host-1"}
    assert [bench.node(n).state for n in ("host-0", "host-1", "host-2")] == [
        "ready",
        "dead",
        "ready",
    ]


def test_a_dead_nodes_replicas_are_lost_and_the_gang_stops_and_requeues(bench: Bench) -> None:
    job = bench.place("wide", 16)
    bench.start_all()
    reps = bench.replicas(job)
    dying, healthy = reps[0].node, reps[1].node
    now = bench.clock() + LEASE_S + 1
    touched = bench.write(lambda s: expire(s, bench.terms, now, [dying]))
    assert touched.nodes == {dying, healthy}  # the dead one, and the one told to stop
    assert touched.jobs == {job}
    states = {r.node: r.state for r in bench.replicas(job)}
    assert states == {dying: "lost", healthy: "stopping"}
    row = bench.job(job)
    assert (row.state, row.restarts) == ("requeued", 1)
    [lost] = bench.events(job, "lost")
    assert lost.message == (
        f"requeued: node {dying} stopped answering; resumes from its last checkpoint"
    )
    assert lost.data == {"restarts": 1, "max_restarts": 3}


def test_a_requeued_gang_keeps_its_healthy_hosts_gpus_for_its_restart(bench: Bench) -> None:
    job = bench.place("wide", 16)
    bench.start_all()
    reps = bench.replicas(job)
    dying, healthy = reps[0], reps[1]
    now = bench.clock() + LEASE_S + 1
    bench.write(lambda s: expire(s, bench.terms, now, [dying.node]))
    held = bench.job(job).recovery_hold
    assert held is not None
    assert held["lost"] == [dying.node]
    assert [(g["node"], g["gpus"]) for g in held["grants"]] == [(healthy.node, healthy.gpus)]
    assert held["at"] == now


def test_a_job_whose_restart_budget_is_spent_fails_when_its_node_dies(bench: Bench) -> None:
    job = bench.place("fragile", 8, max_restarts=0)
    bench.start_all()
    [rep] = bench.replicas(job)
    now = bench.clock() + LEASE_S + 1
    bench.write(lambda s: expire(s, bench.terms, now, [rep.node]))
    row = bench.job(job)
    assert row.state == "failed" and row.finished_at == now
    [failed] = bench.events(job, "failed")
    assert failed.message == (
        f"failed: restart budget of 0 exhausted; last: node {rep.node} stopped answering"
    )


def test_a_job_being_preempted_whose_node_dies_requeues_uncharged(bench: Bench) -> None:
    from boltforge.control.nodes.quarantine import drain

    job = bench.place("train", 8)
    bench.start_all()
    [rep] = bench.replicas(job)
    now = bench.clock()
    bench.write(lambda s: drain(s, rep.node, now))
    assert bench.job(job).state == "preempting"
    later = now + LEASE_S + 1
    bench.write(lambda s: expire(s, bench.terms, later, [rep.node]))
    row = bench.job(job)
    assert (row.state, row.restarts) == ("requeued", 0)
    assert row.recovery_hold is None


def test_a_bound_gang_not_yet_started_on_a_dead_node_ends_its_waiting_replicas(
    bench: Bench,
) -> None:
    job = bench.submit("wide", 16)
    bench.sched.pass_once()
    reps = bench.replicas(job)
    assert {r.state for r in reps} == {"starting"}
    now = bench.clock() + LEASE_S + 1
    bench.write(lambda s: expire(s, bench.terms, now, [reps[0].node]))
    assert {r.id: r.state for r in bench.replicas(job)} == {
        reps[0].id: "lost",
        reps[1].id: "stopping",
    }
    assert bench.job(job).state == "requeued"


# -- a server that starts ---------------------------------------------------------------------


def test_a_starting_server_gives_every_live_node_a_full_lease(bench: Bench) -> None:
    job = bench.place("train", 8)
    bench.start_all()
    now = bench.clock() + 3600.0  # the server was down an hour
    set_node(bench, "host-1", state="suspect")
    set_node(bench, "host-2", state="dead", lease_expires_at=bench.clock() - 5)
    bench.write(lambda s: extend_leases(s, bench.terms, now))
    assert bench.node("host-0").lease_expires_at == now + LEASE_S
    assert bench.node("host-1").lease_expires_at == now + LEASE_S
    assert bench.node("host-2").lease_expires_at == bench.clock() - 5  # the dead stay dead
    bench.write(lambda s: expire(s, bench.terms, now))
    assert bench.node("host-0").state != "dead"  # its silence while the server was down
    assert [r.state for r in bench.replicas(job)] == ["running"]  # is not held against it
    assert bench.job(job).state == "running"


def test_a_lease_longer_than_a_fresh_one_is_kept(bench: Bench) -> None:
    far = bench.clock() + 10 * LEASE_S
    set_node(bench, "host-0", lease_expires_at=far)
    bench.write(lambda s: extend_leases(s, bench.terms, bench.clock()))
    assert bench.node("host-0").lease_expires_at == far


def test_a_node_with_no_lease_yet_gets_one(bench: Bench) -> None:
    set_node(bench, "host-0", lease_expires_at=None)
    bench.write(lambda s: extend_leases(s, bench.terms, bench.clock()))
    assert bench.node("host-0").lease_expires_at == bench.clock() + LEASE_S


def test_silence_after_the_fresh_lease_still_kills(bench: Bench) -> None:
    now = bench.clock() + 3600.0
    bench.write(lambda s: extend_leases(s, bench.terms, now))
    later = now + LEASE_S + 0.5
    touched = bench.write(lambda s: expire(s, bench.terms, later))
    assert touched.nodes == {"host-0", "host-1", "host-2"}
    assert {bench.node(n).state for n in touched.nodes} == {"dead"}

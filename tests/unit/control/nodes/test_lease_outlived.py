"""Nodes whose replicas outlive their lease (``Inventory.replicas_outlive_lease``: Slurm
runs them, not the bridge that speaks for the node): a lease that runs out marks the node
dead and writes nothing off; the next registration takes back the replicas it lists, at
their epoch and with no restart, and loses only those it no longer lists. An agent's node
still loses its replicas with its lease."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sched_builders import Bench, running

from boltforge.control.nodes.agents import expire

LEASE_S = 15.0


@pytest.fixture
def bench(tmp_path: Path) -> Iterator[Bench]:
    with Bench(tmp_path, hosts=0) as b:
        for i in range(2):
            b.register(f"slurm-{i}", rack="r0", replicas_outlive_lease=True)
        b.settle()
        yield b


def away(bench: Bench, seconds: float) -> None:
    """The nodes' speaker is silent for ``seconds``: every lease judged at the end."""
    bench.clock.advance(seconds)
    bench.write(lambda s: expire(s, bench.terms, bench.clock()))
    bench.settle()


def test_a_lease_that_runs_out_marks_the_node_dead_and_writes_nothing_off(bench: Bench) -> None:
    job = bench.place("wide", 16)
    bench.start_all()
    away(bench, 3 * LEASE_S)
    assert {bench.node(n).state for n in ("slurm-0", "slurm-1")} == {"dead"}
    assert {r.state for r in bench.replicas(job)} == {"running"}
    row = bench.job(job)
    assert (row.state, row.epoch, row.restarts) == ("running", 1, 0)


def test_registering_again_with_its_replicas_takes_them_back_as_they_were(bench: Bench) -> None:
    job = bench.place("wide", 16)
    bench.start_all()
    away(bench, 3 * LEASE_S)
    for rep in bench.replicas(job):
        lease, _ = bench.register(rep.node, [running(rep)], rack="r0", replicas_outlive_lease=True)
        assert lease.stop == []
    bench.settle()
    assert {bench.node(n).state for n in ("slurm-0", "slurm-1")} == {"ready"}
    assert {r.state for r in bench.replicas(job)} == {"running"}
    row = bench.job(job)
    assert (row.state, row.epoch, row.restarts) == ("running", 1, 0)


def test_a_replica_the_registration_no_longer_lists_is_lost_and_its_job_requeues(
    bench: Bench,
) -> None:
    job = bench.place("wide", 16)
    bench.start_all()
    away(bench, 3 * LEASE_S)
    gone = bench.replicas(job)[0]
    bench.register(gone.node, [], rack="r0", replicas_outlive_lease=True)
    assert bench.job(job).state == "requeued"
    assert {r.id: r.state for r in bench.replicas(job)}[gone.id] == "lost"


def test_an_agents_node_still_loses_its_replicas_with_its_lease(tmp_path: Path) -> None:
    with Bench(tmp_path, hosts=1) as b:
        b.settle()
        job = b.place("train", 8)
        b.start_all()
        away(b, 3 * LEASE_S)
        assert [r.state for r in b.replicas(job)] == ["lost"]
        assert b.job(job).restarts == 1

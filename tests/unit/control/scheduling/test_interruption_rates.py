"""Observed interruption rates for cost-aware routing (``scheduling/interruptions.py``), as
data: reclaim notices and replicas lost with their node, counted once per node and moment,
per host-hour each pool's nodes were registered in the window; and each job's spot
interruptions."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sched_builders import Bench
from sqlalchemy import select

from boltforge.control.scheduling.interruptions import DAYS, SAME_EVENT_S, routing_facts
from boltforge.control.scheduling.world import Caches, fleet_of
from boltforge.control.store.models import EventRow, NodeRow, ReplicaRow
from boltforge.core.placement.routing import RoutingFacts

HOUR = 3600.0
SPOT: dict[str, Any] = {"pool": "spot", "tier": "spot", "price_per_gpu_hour": 1.0}
ON_DEMAND: dict[str, Any] = {"pool": "od", "tier": "on-demand", "price_per_gpu_hour": 3.0}


@pytest.fixture
def bench(tmp_path: Path) -> Iterator[Bench]:
    """Two spot nodes and one on-demand node, registered ten hours before the test looks."""
    with Bench(tmp_path, hosts=0) as b:
        b.register("spot-0", **SPOT)
        b.register("spot-1", **SPOT)
        b.register("od-0", rack="r1", **ON_DEMAND)
        b.clock.advance(10 * HOUR)
        yield b


def jobs(bench: Bench, count: int) -> list[str]:
    return [bench.submit(f"j{i}", 8) for i in range(count)]


def noticed(bench: Bench, job: str, node: str, at: float, reclaim_at: float | None = None) -> None:
    data: dict[str, Any] = {"node": node}
    if reclaim_at is not None:
        data["reclaim_at"] = reclaim_at
    bench.write(
        lambda s: s.add(EventRow(job_id=job, at=at, kind="reclaim", message="notice", data=data))
    )


def lost(bench: Bench, job: str, node: str, at: float, rank: int = 0) -> None:
    rep = ReplicaRow(
        id=f"{job}.1.{rank}", job_id=job, epoch=1, role="worker", rank=rank, node=node,
        gpus=[rank], state="lost", spec={}, exited_at=at,
    )  # fmt: skip
    bench.write(lambda s: s.add(rep))


def facts(bench: Bench, **kw: Any) -> RoutingFacts:
    tree = fleet_of(bench.mirror, Caches()).tree
    with bench.db.session() as s:
        nodes = {n.name: n for n in s.scalars(select(NodeRow))}
        return routing_facts(s, tree, nodes, bench.clock(), **kw)


def test_a_quiet_fleet_has_no_rates_and_no_spot_interruptions(bench: Bench) -> None:
    out = facts(bench)
    assert (dict(out.interruptions), dict(out.spot_interruptions)) == ({}, {})
    assert out.max_spot_interruptions == 3


def test_one_notice_to_several_jobs_of_a_node_is_one_interruption(bench: Bench) -> None:
    a, b = jobs(bench, 2)
    at = bench.clock() - HOUR
    noticed(bench, a, "spot-0", at, reclaim_at=at + 120)
    noticed(bench, b, "spot-0", at + 1, reclaim_at=at + 120)
    out = facts(bench)
    assert out.interruptions == {"spot": pytest.approx(1 / 20.0)}  # 2 nodes x 10 h
    assert out.spot_interruptions == {a: 1, b: 1}


def test_replicas_lost_near_a_notice_of_their_node_are_that_notice(bench: Bench) -> None:
    [job] = jobs(bench, 1)
    reclaim = bench.clock() - HOUR
    noticed(bench, job, "spot-0", reclaim - 60, reclaim_at=reclaim)
    lost(bench, job, "spot-0", reclaim + SAME_EVENT_S)  # the node went at its time
    lost(bench, job, "spot-1", reclaim + 5, rank=1)  # another node: its own interruption
    out = facts(bench)
    assert out.interruptions == {"spot": pytest.approx(2 / 20.0)}
    assert out.spot_interruptions == {job: 2}


def test_a_loss_long_after_a_notice_is_an_interruption_of_its_own(bench: Bench) -> None:
    [job] = jobs(bench, 1)
    reclaim = bench.clock() - 2 * HOUR
    noticed(bench, job, "spot-0", reclaim - 60, reclaim_at=reclaim)
    lost(bench, job, "spot-0", reclaim + SAME_EVENT_S + 1)
    assert facts(bench).interruptions == {"spot": pytest.approx(2 / 20.0)}


def test_a_notice_without_its_time_counts_at_when_it_came(bench: Bench) -> None:
    [job] = jobs(bench, 1)
    at = bench.clock() - HOUR
    noticed(bench, job, "spot-1", at)
    lost(bench, job, "spot-1", at + 30)
    assert facts(bench).spot_interruptions == {job: 1}


def test_interruptions_on_demand_count_for_the_pool_but_not_as_spot(bench: Bench) -> None:
    [job] = jobs(bench, 1)
    lost(bench, job, "od-0", bench.clock() - HOUR)
    out = facts(bench)
    assert out.interruptions == {"od": pytest.approx(1 / 10.0)}
    assert out.spot_interruptions == {}


def test_what_happened_before_the_window_or_on_unknown_nodes_is_not_counted(
    bench: Bench,
) -> None:
    a, b = jobs(bench, 2)
    long_ago = bench.clock() - DAYS * 86400.0 - 1
    noticed(bench, a, "spot-0", long_ago, reclaim_at=long_ago + 60)
    lost(bench, a, "spot-1", long_ago)
    noticed(bench, b, "gone-node", bench.clock() - HOUR)
    assert facts(bench).interruptions == {}
    assert facts(bench, days=DAYS * 2).interruptions == {"spot": pytest.approx(2 / 20.0)}


def test_a_pool_registered_under_an_hour_is_counted_over_at_least_an_hour(
    tmp_path: Path,
) -> None:
    with Bench(tmp_path, hosts=0) as b:
        b.register("spot-0", **SPOT)
        b.register("od-0", rack="r1", **ON_DEMAND)
        b.clock.advance(600.0)  # ten minutes
        [job] = jobs(b, 1)
        lost(b, job, "spot-0", b.clock() - 60)
        assert facts(b).interruptions == {"spot": pytest.approx(1.0)}


def test_the_count_past_which_a_job_leaves_spot_is_passed_through(bench: Bench) -> None:
    assert facts(bench, max_spot_interruptions=None).max_spot_interruptions is None
    assert facts(bench, max_spot_interruptions=7).max_spot_interruptions == 7

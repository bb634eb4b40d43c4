"""Registering a node (``agents.register``): the lease it gets, what a second registration
changes, inventories refused with the field and the fix, spot-reclaimed nodes coming back
as new instances, and what the node says it runs reconciled with the store. Every case
holds alone and with the group's rows read ahead (``agents.read_ahead``), as the agents'
group commit registers; registrations in one group check their pool against each other."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sched_builders import Bench, event, inventory, running
from sqlalchemy.orm import Session

from boltforge.control.nodes import agents, spot
from boltforge.control.nodes.agents import SessionMismatch
from boltforge.control.store.models import NodeRow
from boltforge.spec.errors import SpecError
from boltforge.wire.agent import Heartbeat, Registration


@pytest.fixture(params=[False, True], ids=["alone", "read-ahead"])
def bench(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Bench]:
    with Bench(tmp_path, hosts=2, grouped=request.param) as b:
        b.settle()
        yield b


def test_a_first_registration_gives_a_ready_node_and_a_full_lease(bench: Bench) -> None:
    bench.clock.advance(3.0)
    lease, touched = bench.register("host-9", rack="r4")
    now = bench.clock()
    node = bench.node("host-9")
    assert (node.state, node.cordoned, node.pool, node.rack, node.gpus) == (
        "ready",
        False,
        "h100",
        "r4",
        8,
    )
    assert (node.registered_at, node.last_heartbeat) == (now, now)
    assert node.lease_expires_at == now + bench.terms.lease_s
    assert len(lease.session) == 32 and lease.session == node.session
    assert (lease.node, lease.lease_s, lease.heartbeat_s) == (
        "host-9",
        bench.terms.lease_s,
        bench.terms.heartbeat_s,
    )
    assert lease.stop == []
    assert lease.desired_version == node.desired_version == 1  # told what to run afresh
    assert touched.nodes == {"host-9"} and touched.jobs == set()
    assert "host-9" in bench.mirror.nodes


def test_registering_again_opens_a_new_session_and_ends_the_old_one(bench: Bench) -> None:
    old = bench.sessions["host-0"]
    version = bench.node("host-0").desired_version
    bench.clock.advance(5.0)
    lease, _ = bench.register("host-0")
    assert lease.session != old
    node = bench.node("host-0")
    assert node.registered_at == bench.clock()
    assert node.desired_version == version + 1
    stale = Heartbeat(session=old)
    with pytest.raises(SessionMismatch):
        bench.write(lambda s: agents.heartbeat(s, "host-0", stale, bench.terms, bench.clock()))


def test_a_dead_node_that_registers_again_is_ready(bench: Bench) -> None:
    bench.clock.advance(bench.terms.lease_s + 1)
    bench.beat_all(but=["host-1"])
    bench.settle()
    assert bench.node("host-1").state == "dead"
    bench.register("host-1", rack="r0")
    assert bench.node("host-1").state == "ready"


def test_a_node_may_change_its_hardware_while_no_other_node_shares_its_pool(
    bench: Bench,
) -> None:
    bench.register("solo", pool="a100", gpu="A100-40GB", gpus=8)
    fleet_version = bench.mirror.fleet_version
    bench.register("solo", pool="a100", gpu="A100-40GB", gpus=4, nvlink_island=4)
    assert bench.node("solo").gpus == 4
    assert bench.mirror.fleet_version > fleet_version  # passes build the fleet again


def test_different_hardware_is_welcome_in_a_pool_of_its_own(bench: Bench) -> None:
    bench.register("small", pool="l4", gpu="L4", gpus=4, nvlink_island=4, gpu_memory_gb=24.0)
    assert bench.node("small").pool == "l4"


@dataclass(frozen=True)
class Refused:
    """An inventory refused at registration: the fields named, and the words of one."""

    name: str
    inventory: dict[str, Any]
    fields: list[str]
    says: str


REFUSED = [
    Refused(
        "gpus-without-a-model",
        {"pool": "new", "gpu": "none"},
        ["inventory.gpu"],
        "names no GPU model. To fix: e.g. H100",
    ),
    Refused(
        "island-not-dividing-the-gpus",
        {"pool": "new", "nvlink_island": 3},
        ["inventory.nvlink_island"],
        "must divide the node's 8 GPUs. To fix: use a divisor of 8",
    ),
    Refused(
        "no-model-and-a-bad-island",
        {"pool": "new", "gpu": "", "nvlink_island": 5},
        ["inventory.gpu", "inventory.nvlink_island"],
        "must divide the node's 8 GPUs",
    ),
    Refused(
        "fewer-gpus-than-its-pool",
        {"gpus": 4, "nvlink_island": 4},
        ["inventory.gpus", "inventory.nvlink_island"],
        "differs from node host-0 of pool h100 (8). To fix: put different hardware in its own pool",
    ),
    Refused(
        "another-gpu-model-and-memory",
        {"gpu": "A100-80GB", "memory_gb": 1024.0},
        ["inventory.gpu", "inventory.memory_gb"],
        "differs from node host-0 of pool h100 (H100-80GB)",
    ),
    Refused(
        "a-model-its-pool-lacks-named-none",
        {"gpu": "none"},
        ["inventory.gpu", "inventory.gpu"],  # no model, and not its pool's model
        "names no GPU model",
    ),
]


@pytest.mark.parametrize("case", REFUSED, ids=[c.name for c in REFUSED])
def test_an_inventory_that_contradicts_itself_or_its_pool_is_refused_and_nothing_is_stored(
    bench: Bench, case: Refused
) -> None:
    with pytest.raises(SpecError) as refused:
        bench.register("host-7", **case.inventory)
    error = refused.value
    assert error.source == "node host-7"
    assert sorted(p.field for p in error.problems) == sorted(case.fields)
    assert any(case.says in p.message for p in error.problems)
    assert bench.write(lambda s: s.get(NodeRow, "host-7")) is None
    assert "host-7" not in bench.mirror.nodes


def test_a_cpu_node_needs_no_gpu_model(bench: Bench) -> None:
    bench.register("cpu-0", pool="cpu", gpu="none", gpus=0, nvlink_island=None)
    assert bench.node("cpu-0").gpus == 0


# -- spot-reclaimed nodes coming back ---------------------------------------------------------


@pytest.mark.parametrize(
    ("back_after", "reclaim_pending", "cordoned"),
    [(29.0, True, True), (30.0, False, False), (400.0, False, False)],
    ids=["before-its-time", "at-its-time", "long-after"],
)
def test_a_node_registering_at_or_after_its_reclaim_time_is_a_new_instance(
    bench: Bench, back_after: float, reclaim_pending: bool, cordoned: bool
) -> None:
    now = bench.clock()
    bench.write(lambda s: spot.notice(s, "host-1", 30.0, now))
    bench.clock.advance(back_after)
    bench.register("host-1")
    node = bench.node("host-1")
    assert (node.reclaim_at is not None, node.cordoned) == (reclaim_pending, cordoned)
    assert node.state == "ready"


def test_an_operators_cordon_survives_a_registration(bench: Bench) -> None:
    from boltforge.control.nodes.quarantine import cordon

    bench.write(lambda s: cordon(s, "host-0"))
    bench.register("host-0")
    assert bench.node("host-0").cordoned is True


# -- what the node says it runs ---------------------------------------------------------------


def placed(bench: Bench, gpus: int = 8) -> str:
    job = bench.place("train", gpus)
    assert bench.job(job).state == "scheduled"
    return job


def test_a_replica_reported_for_another_epoch_is_to_be_stopped(bench: Bench) -> None:
    job = placed(bench)
    [rep] = bench.replicas(job)
    lease, touched = bench.register(rep.node, [running(rep, epoch=rep.epoch + 1)])
    assert lease.stop == [rep.id]
    assert bench.replicas(job)[0].state == "starting"  # not taken for this epoch's start
    assert touched.jobs == set()


def test_a_heartbeat_does_not_adopt_a_replica_it_reports_for_another_epoch(bench: Bench) -> None:
    job = placed(bench)
    [rep] = bench.replicas(job)
    lease, _ = bench.beat(rep.node, running=[running(rep, epoch=rep.epoch - 1).model_dump()])
    assert lease.stop == [rep.id]
    assert bench.replicas(job)[0].state == "starting"


def test_a_replica_the_node_says_is_stopping_is_kept_and_not_adopted(bench: Bench) -> None:
    job = placed(bench)
    [rep] = bench.replicas(job)
    lease, touched = bench.register(rep.node, [running(rep, state="stopping")])
    assert lease.stop == []
    assert bench.replicas(job)[0].state == "starting"
    assert touched.jobs == set()


def test_a_gang_adopted_whole_at_registration_is_running_and_keeps_its_pids(
    bench: Bench,
) -> None:
    job = placed(bench, 16)
    reps = bench.replicas(job)
    for i, rep in enumerate(reps):
        bench.register(rep.node, [running(rep, pid=100 + i)])
    after = bench.replicas(job)
    assert [(r.state, r.pid) for r in after] == [("running", 100), ("running", 101)]
    assert bench.job(job).state == "running"
    assert [e.message for e in bench.events(job, "running")] == [
        "running: 2 replica(s) started on 2 node(s)"
    ]


def test_a_gang_half_adopted_at_registration_is_still_scheduled(bench: Bench) -> None:
    job = placed(bench, 16)
    first, _ = bench.replicas(job)
    bench.register(first.node, [running(first)])
    assert bench.job(job).state == "scheduled"


def test_a_replica_the_restarted_node_lost_requeues_its_job_and_stops_the_rest_of_the_gang(
    bench: Bench,
) -> None:
    job = placed(bench, 16)
    bench.start_all()
    lost, kept = bench.replicas(job)
    _, touched = bench.register(lost.node, [])
    assert job in touched.jobs and kept.node in touched.nodes
    states = {r.id: r.state for r in bench.replicas(job)}
    assert states == {lost.id: "lost", kept.id: "stopping"}
    row = bench.job(job)
    assert (row.state, row.restarts) == ("requeued", 1)
    [why] = bench.events(job, "lost")
    assert why.message == (
        f"requeued: node {lost.node} restarted without them; resumes from its last checkpoint"
    )


def test_a_registration_whose_running_list_has_an_exited_replica_of_the_past_stops_it(
    bench: Bench,
) -> None:
    job = placed(bench)
    bench.start_all()
    bench.exit_all(job)
    [rep] = bench.replicas(job)
    lease, _ = bench.register(rep.node, [running(rep, state="exited")])
    assert lease.stop == [rep.id]  # the store expects nothing of it any more
    assert bench.job(job).state == "succeeded"


def test_a_registration_reads_the_lost_replicas_job_once_per_job(bench: Bench) -> None:
    """Two replicas of one gang lost on one node requeue their job once, charging one
    restart."""
    job = bench.place("pair", 8, per_node=4)
    bench.start_all()
    reps = bench.replicas(job)
    assert len(reps) == 2 and len({r.node for r in reps}) == 1
    bench.register(reps[0].node, [])
    row = bench.job(job)
    assert (row.state, row.restarts) == ("requeued", 1)
    assert len(bench.events(job, "lost")) == 1


def test_an_unknown_registration_field_is_refused_by_the_wire_model() -> None:
    with pytest.raises(ValueError, match="extra"):
        Registration.model_validate(
            {"inventory": inventory("x").model_dump(mode="json"), "extra": 1}
        )


def test_a_report_on_the_new_sessions_node_is_accepted_after_registration(bench: Bench) -> None:
    job = placed(bench)
    [rep] = bench.replicas(job)
    bench.register(rep.node, [running(rep, pid=9)])
    refused, _ = bench.report(rep.node, [event(rep, "exited", bench.clock(), exit_code=0)])
    assert refused == []
    assert bench.job(job).state == "succeeded"


def test_registrations_in_one_group_check_their_pool_against_each_other(bench: Bench) -> None:
    """Two nodes of a pool nobody stored yet register in one transaction: the second is
    checked against the first, and the store is asked for neither node, only read ahead."""
    first = Registration(inventory=inventory("a-0", pool="a100", gpu="A100-80GB"))
    second = Registration(inventory=inventory("a-1", pool="a100", gpu="H100-80GB"))

    def group(s: Session) -> None:
        agents.read_ahead(s, [agents.registering(r.inventory) for r in (first, second)])
        agents.register(s, first, bench.terms, bench.clock())
        with pytest.raises(SpecError) as refused:
            agents.register(s, second, bench.terms, bench.clock())
        assert any(
            "differs from node a-0 of pool a100" in p.message for p in refused.value.problems
        )

    bench.write(group)
    assert bench.node("a-0").gpus == 8
    assert bench.write(lambda s: s.get(NodeRow, "a-1")) is None


def test_a_group_registering_a_node_it_read_ahead_as_absent_stores_it_once(bench: Bench) -> None:
    reg = Registration(inventory=inventory("host-9"))

    def twice(s: Session) -> str:
        agents.read_ahead(s, [agents.registering(reg.inventory)])
        agents.register(s, reg, bench.terms, bench.clock())  # its row is not flushed yet
        lease, _ = agents.register(s, reg, bench.terms, bench.clock())
        return lease.session

    session = bench.write(twice)
    assert bench.node("host-9").session == session

"""Heartbeats (``agents.heartbeat``, ``agents.heartbeats``): a lease renewed only in the
current session, a suspect node back in service, a leaving one kept out of it, the health
and GPU activity a beat carries, and a bridge's batch of beats answered node by node as
single beats would be, with the nodes that must register again listed rather than raised."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sched_builders import Bench, activity, running

from boltforge.control.nodes import agents
from boltforge.control.nodes.agents import SessionMismatch, current_in, desired
from boltforge.control.store.models import NodeRow
from boltforge.wire.agent import Heartbeat


@pytest.fixture
def bench(tmp_path: Path) -> Iterator[Bench]:
    with Bench(tmp_path, hosts=3) as b:
        b.settle()
        yield b


def batch(bench: Bench, beats: dict[str, dict[str, Any]]) -> agents.Renewed:
    body = {name: Heartbeat.model_validate(hb) for name, hb in beats.items()}
    return bench.write(lambda s: agents.heartbeats(s, body, bench.terms, bench.clock()))


def set_node(bench: Bench, name: str, **values: Any) -> None:
    def change(s: Any) -> None:
        row = s.get(NodeRow, name)
        for k, v in values.items():
            setattr(row, k, v)

    bench.write(change)


# -- one heartbeat ---------------------------------------------------------------------------


def test_a_heartbeat_renews_the_lease_from_now(bench: Bench) -> None:
    bench.clock.advance(4.0)
    lease, touched = bench.beat("host-0")
    node = bench.node("host-0")
    assert node.last_heartbeat == bench.clock()
    assert node.lease_expires_at == bench.clock() + bench.terms.lease_s
    assert lease.session == bench.sessions["host-0"]
    assert touched.nodes == set()  # it was ready and stays ready: nothing to converge


@pytest.mark.parametrize(
    ("name", "session", "state"),
    [
        ("host-0", "not-the-session", "ready"),
        ("nobody", "whatever", None),
        ("host-0", None, "dead"),  # the right session, but the lease already ran out
    ],
    ids=["wrong-session", "unknown-node", "dead-node"],
)
def test_a_heartbeat_outside_the_current_lease_must_register_again(
    bench: Bench, name: str, session: str | None, state: str | None
) -> None:
    if state is not None:
        set_node(bench, name, state=state)
    hb = Heartbeat(session=session or bench.sessions[name])
    with pytest.raises(SessionMismatch) as refused:
        bench.write(lambda s: agents.heartbeat(s, name, hb, bench.terms, bench.clock()))
    assert str(refused.value) == name
    with pytest.raises(SessionMismatch):
        current_in(bench.mirror, name, hb.session)


def test_the_current_session_is_accepted_from_the_mirror(bench: Bench) -> None:
    current_in(bench.mirror, "host-1", bench.sessions["host-1"])


def test_a_suspect_node_is_back_in_service_with_its_next_heartbeat(bench: Bench) -> None:
    set_node(bench, "host-2", state="suspect")
    _, touched = bench.beat("host-2")
    assert bench.node("host-2").state == "ready"
    assert touched.nodes == {"host-2"}  # passes may place work there again


def test_a_leaving_node_is_suspect_and_stays_so_while_it_says_it_leaves(bench: Bench) -> None:
    bench.beat("host-0", leaving=True)
    assert bench.node("host-0").state == "suspect"
    bench.clock.advance(1.0)
    _, touched = bench.beat("host-0", leaving=True)
    assert bench.node("host-0").state == "suspect"
    assert touched.nodes == {"host-0"}
    assert bench.node("host-0").lease_expires_at == bench.clock() + bench.terms.lease_s


def test_the_health_a_heartbeat_carries_replaces_the_last(bench: Bench) -> None:
    bench.beat("host-0", health={"preflight": "nccl ok", "degraded": "ecc"})
    assert bench.node("host-0").health == {"preflight": "nccl ok", "degraded": "ecc"}
    bench.beat("host-0", health={})
    assert bench.node("host-0").health == {}


def test_gpu_activity_is_kept_with_when_each_gpu_began_to_sit_idle(bench: Bench) -> None:
    t0 = bench.clock()
    bench.beat(
        "host-0",
        gpus=[activity(0, 2.0, 4096.0).model_dump(), activity(1, 90.0, 4096.0).model_dump()],
    )
    bench.clock.advance(10.0)
    bench.beat(
        "host-0",
        gpus=[activity(0, 1.0, 4096.0).model_dump(), activity(1, 3.0, 4096.0).model_dump()],
    )
    gpus = bench.node("host-0").health["gpus"]
    assert gpus["0"]["idle_since"] == t0  # idle since the first sample
    assert gpus["1"]["idle_since"] == t0 + 10.0  # idle only from now
    assert gpus["0"]["at"] == t0 + 10.0 and gpus["0"]["util_pct"] == 1.0
    bench.beat("host-0", health={"note": "x"})
    assert bench.node("host-0").health == {"note": "x"}  # no samples: no GPU records kept


def test_a_heartbeat_adopts_a_started_replica_and_stops_one_it_should_not_run(
    bench: Bench,
) -> None:
    job = bench.place("train", 8)
    [rep] = bench.replicas(job)
    ghost = {"replica": "ghost.1.0", "job": "ghost", "epoch": 1, "state": "running"}
    lease, _ = bench.beat(rep.node, running=[running(rep, pid=5).model_dump(), ghost])
    assert lease.stop == ["ghost.1.0"]
    [after] = bench.replicas(job)
    assert (after.state, after.pid, after.started_at) == ("running", 5, bench.clock())
    assert bench.job(job).state == "scheduled"  # the start report, on its way, moves the job


def test_a_heartbeat_never_loses_a_replica_it_does_not_mention(bench: Bench) -> None:
    job = bench.place("train", 8)
    bench.start_all()
    [rep] = bench.replicas(job)
    lease, touched = bench.beat(rep.node, running=[])
    assert lease.stop == [] and touched.jobs == set()
    assert bench.replicas(job)[0].state == "running"


# -- many heartbeats at once ------------------------------------------------------------------


def test_a_batch_renews_the_current_nodes_and_lists_the_rest_as_lost(bench: Bench) -> None:
    set_node(bench, "host-2", state="dead")
    bench.clock.advance(2.0)
    renewed = batch(
        bench,
        {
            "host-0": {"session": bench.sessions["host-0"]},
            "host-1": {"session": "stale"},
            "host-2": {"session": bench.sessions["host-2"]},
            "nobody": {"session": "s"},
        },
    )
    assert list(renewed.leases) == ["host-0"]
    assert renewed.lost == ["host-1", "host-2", "nobody"]  # in the order they came
    assert bench.node("host-0").lease_expires_at == bench.clock() + bench.terms.lease_s
    assert bench.node("host-1").last_heartbeat != bench.clock()  # not renewed
    assert bench.node("host-2").state == "dead"


def test_a_batch_brings_suspect_nodes_back_and_names_them_to_converge(bench: Bench) -> None:
    set_node(bench, "host-1", state="suspect")
    beats = {n: {"session": bench.sessions[n]} for n in ("host-0", "host-1")}
    renewed = batch(bench, beats)
    assert renewed.touched.nodes == {"host-1"}
    assert {bench.node(n).state for n in ("host-0", "host-1")} == {"ready"}


def test_a_batch_adopts_and_stops_replicas_node_by_node(bench: Bench) -> None:
    job = bench.place("wide", 16)
    reps = bench.replicas(job)
    beats = {
        r.node: {
            "session": bench.sessions[r.node],
            "running": [
                running(r, pid=7).model_dump(),
                {**running(r).model_dump(), "replica": f"x{i}"},
            ],
        }
        for i, r in enumerate(reps)
    }
    renewed = batch(bench, beats)
    assert {n: lease.stop for n, lease in renewed.leases.items()} == {
        reps[0].node: ["x0"],
        reps[1].node: ["x1"],
    }
    assert {(r.state, r.pid) for r in bench.replicas(job)} == {("running", 7)}
    assert renewed.lost == [] and renewed.touched.jobs == set()


def test_a_batch_leaves_the_replicas_of_nodes_that_list_none_as_they_are(bench: Bench) -> None:
    job = bench.place("wide", 16)
    listed, silent = bench.replicas(job)
    inventory = bench.node(silent.node).inventory
    beats: dict[str, dict[str, Any]] = {
        listed.node: {
            "session": bench.sessions[listed.node],
            "running": [running(listed, pid=7).model_dump()],
        },
        silent.node: {"session": bench.sessions[silent.node]},
    }
    renewed = batch(bench, beats)
    assert sorted(renewed.leases) == sorted([listed.node, silent.node])
    states = {r.node: (r.state, r.pid) for r in bench.replicas(job)}
    assert states == {listed.node: ("running", 7), silent.node: ("starting", None)}
    assert bench.node(silent.node).inventory == inventory  # left unread, and kept
    bench.mirror_agrees()


def test_an_empty_batch_changes_nothing(bench: Bench) -> None:
    renewed = batch(bench, {})
    assert (renewed.leases, renewed.lost) == ({}, [])


# -- what a node is told to run ---------------------------------------------------------------


def test_desired_state_lists_what_to_run_and_what_to_stop_with_their_specs(bench: Bench) -> None:
    first = bench.place("first", 8, priority="low", env={"SEED": "1"})
    bench.start_all()
    [rep] = bench.replicas(first)
    node = rep.node
    assert bench.node(node).desired_version >= 2
    [run] = desired(bench.mirror, node).replicas  # type: ignore[union-attr]
    assert (run.replica, run.job, run.epoch, run.action) == (rep.id, first, 1, "run")
    assert run.command == ["python", "train.py"] and run.env["SEED"] == "1"
    assert run.gpus == rep.gpus and run.grace_s == 120.0  # the default checkpoint grace
    assert run.checkpoint_dir is not None and run.checkpoint_dir.endswith(f"/{first}")

    from boltforge.control.nodes.quarantine import drain

    now = bench.clock()
    bench.write(lambda s: drain(s, node, now))
    state = desired(bench.mirror, node)
    assert state is not None
    assert [(r.replica, r.action) for r in state.replicas] == [(rep.id, "stop")]
    assert state.version == bench.node(node).desired_version


def test_an_unknown_node_has_no_desired_state(bench: Bench) -> None:
    assert desired(bench.mirror, "nobody") is None


def test_a_node_running_nothing_is_told_so_with_its_version(bench: Bench) -> None:
    state = desired(bench.mirror, "host-2")
    assert state is not None
    assert state.replicas == [] and state.version == bench.node("host-2").desired_version

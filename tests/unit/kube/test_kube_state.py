"""What the scheduler keeps between passes: replicas adopted from the annotations their
bindings wrote (how a new leader finds every running pod's place), the statuses a node
reports, and the gang-to-job links."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kube_unit_kit import kpod
from pydantic import ValidationError

from boltforge.kube.gangs import GangKey
from boltforge.kube.state import Placed, SchedulerState, adopted, replica_event


def test_a_bound_pod_with_its_bindings_annotations_is_adopted_with_its_epoch() -> None:
    pod = kpod("w0", node="n1", phase="Pending", replica="j-7.3.0", job="j-7")
    placed = adopted(pod)
    assert placed is not None
    assert (placed.replica, placed.job, placed.epoch, placed.node) == ("j-7.3.0", "j-7", 3, "n1")
    assert placed.pod is pod and not placed.started and not placed.exited
    assert placed.evicted_at is None


def test_an_adopted_running_pod_is_already_started() -> None:
    placed = adopted(kpod("w0", node="n1", phase="Running", replica="j.1.2", job="j"))
    assert placed is not None and placed.started and placed.epoch == 1


def test_a_job_id_with_dots_keeps_the_epoch_before_the_rank() -> None:
    placed = adopted(kpod("w0", node="n1", replica="a.b.12.4", job="a.b"))
    assert placed is not None and placed.epoch == 12


@pytest.mark.parametrize(
    "kw",
    [
        {"node": "", "replica": "j.1.0", "job": "j"},
        {"node": "n1", "replica": None, "job": "j"},
        {"node": "n1", "replica": "j.1.0", "job": None},
        {"node": "n1", "replica": "", "job": "j"},
        {"node": "n1", "replica": "j.1", "job": "j"},
        {"node": "n1", "replica": "j.1.0", "job": "j", "phase": "Succeeded"},
        {"node": "n1", "replica": "j.1.0", "job": "j", "phase": "Failed"},
    ],
    ids=["unbound", "no-replica", "no-job", "empty-replica", "short-id", "succeeded", "failed"],
)
def test_pods_that_run_no_replica_are_not_adopted(kw: dict[str, object]) -> None:
    assert adopted(kpod("w0", **kw)) is None


def placed(replica: str, node: str, **kw: object) -> Placed:
    job, epoch, _ = replica.split(".")
    p = Placed(replica, job, int(epoch), kpod(replica.replace(".", "-"), node=node), node)
    for k, v in kw.items():
        setattr(p, k, v)
    return p


def test_a_placed_replica_runs_until_it_is_evicted_then_stops() -> None:
    p = placed("j.2.0", "n1")
    assert p.status().model_dump(exclude_none=True) == {
        "replica": "j.2.0",
        "job": "j",
        "epoch": 2,
        "state": "running",
    }
    p.evicted_at = 12.5
    assert p.status().state == "stopping"


def test_a_placed_replicas_event_carries_its_identity_and_extras() -> None:
    e = placed("j.2.1", "n1").event("exited", exit_code=3, signal=None)
    assert (e.replica, e.job, e.epoch, e.kind, e.exit_code) == ("j.2.1", "j", 2, "exited", 3)
    assert e.at > 0


def test_a_replica_event_rejects_a_kind_the_protocol_does_not_know() -> None:
    with pytest.raises(ValidationError):
        replica_event("j.1.0", "j", 1, "vanished")
    e = replica_event("j.1.0", "j", 1, "failed", detail="why")
    assert (e.kind, e.detail, e.by_node) == ("failed", "why", False)


def test_taken_is_every_pod_that_runs_or_ran_a_replica() -> None:
    s = SchedulerState()
    a, b = placed("j.1.0", "n1"), placed("j.1.1", "n2", exited=True)
    s.placed = {a.replica: a, b.replica: b}
    assert s.taken() == {a.pod.uid, b.pod.uid}


def test_a_nodes_statuses_leave_out_exited_replicas_and_other_nodes() -> None:
    s = SchedulerState()
    for p in [
        placed("j.1.0", "n1"),
        placed("j.1.1", "n1", evicted_at=1.0),
        placed("j.1.2", "n1", exited=True),
        placed("k.1.0", "n2"),
    ]:
        s.place(p)
    assert [(st.replica, st.state) for st in s.statuses("n1")] == [
        ("j.1.0", "running"),
        ("j.1.1", "stopping"),
    ]
    assert s.statuses("n3") == []


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["n1", "n2", "n3"]), st.booleans(), st.booleans()),
        max_size=12,
    )
)
def test_statuses_are_what_each_node_runs_as_placing_and_unplacing_leave_it(
    rows: list[tuple[str, bool, bool]],
) -> None:
    s = SchedulerState()
    for i, (node, exited, evicted) in enumerate(rows):
        p = placed(f"j.1.{i}", node, exited=exited, evicted_at=1.0 if evicted else None)
        s.place(p)
    for replica in list(s.placed)[::2]:
        s.unplace(replica)
    for node in ("n1", "n2", "n3"):
        expected = [
            p.status()
            for p in sorted(s.placed.values(), key=lambda p: p.replica)
            if p.node == node and not p.exited
        ]
        assert s.statuses(node) == expected
    assert s.moved == {node for node, _, _ in rows}


def test_link_finds_the_job_of_a_gang_and_the_gang_of_a_job() -> None:
    s = SchedulerState()
    key = GangKey("research", "podgroup", "llm")
    s.link(key, "j-9")
    assert s.job_of[key] == "j-9" and s.gang_of["j-9"] == key


def test_a_fresh_state_has_an_empty_outbox_for_any_node() -> None:
    s = SchedulerState()
    assert s.outbox["n1"] == [] and s.taken() == set() and s.statuses("n1") == []
    s.outbox["n1"].append(replica_event("j.1.0", "j", 1, "started"))
    assert SchedulerState().outbox["n1"] == []  # no outbox is shared between states


def test_placing_and_unplacing_keeps_the_replicas_of_each_pod() -> None:
    s = SchedulerState()
    first, second = placed("j.1.0", "n1"), placed("j.2.0", "n1")
    second.pod = first.pod  # the same pod path runs the next epoch
    s.place(first)
    s.place(second)
    assert s.on_pod == {first.pod.path: {"j.1.0", "j.2.0"}}
    s.unplace("j.1.0")
    assert s.on_pod == {first.pod.path: {"j.2.0"}} and list(s.placed) == ["j.2.0"]
    s.unplace("j.2.0")
    assert s.on_pod == {} and s.placed == {}

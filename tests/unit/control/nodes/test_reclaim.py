"""Spot reclaim notices through the real API in-process, on a fake clock: the node is
cordoned and its jobs checkpoint at once within the notice; a job out in time lost (almost)
no work; one still there when the node goes is requeued from its last checkpoint; neither
is charged a restart."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from control_kit import ADMIN, Fleet, Node, make_spec, postgres_server, store_url
from typer.testing import CliRunner

from boltforge.cli.main import app
from boltforge.cli.nodes import reclaim_lines, state_text
from boltforge.control.store.invariants import double_allocations
from boltforge.wire.jobs import EventOut, JobDetail, NodeOut
from boltforge.wire.reclaim import ReclaimedJob, ReclaimReply

__all__ = ["postgres_server", "store_url"]  # fixtures used by name


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    with Fleet(tmp_path, hosts=2) as f:
        yield f


def reclaim(fleet: Fleet, node: str, body: Any, headers: dict[str, str] = ADMIN) -> Any:
    r = fleet.http.post(f"/v1/nodes/{node}/reclaim", json=body, headers=headers)
    fleet.settle()
    return r


def running(fleet: Fleet, name: str, **extra: Any) -> tuple[str, Node]:
    """A job of 8 GPUs started on one host; the job and its host."""
    job = fleet.submit(make_spec(name, 8, **extra))
    fleet.start_everything()
    [where] = [r.node for r in fleet.job(job).placement]
    return job, fleet.nodes[where]


def checkpoint(node: Node, job: str, step: int, events: list[dict[str, Any]] | None = None) -> None:
    """``node`` reports rank 0 of ``job`` wrote a checkpoint at ``step`` now (with
    ``events`` in the same report)."""
    [rep] = [r for r in node.desired().replicas if r.job == job]
    at = node.fleet.clock()
    mark = {"replica": rep.replica, "job": job, "epoch": rep.epoch, "rank": 0, "step": step}
    node.report(events=events or [], progress=[{**mark, "at": at, "checkpoint": True}])


def tick(fleet: Fleet, seconds: float) -> None:
    """Time passes; every node heartbeats at its end (none goes silent)."""
    fleet.clock.advance(seconds)
    for node in fleet.nodes.values():
        assert node.heartbeat() == 200


def requeue_event(job: JobDetail) -> EventOut:
    return next(e for e in reversed(job.events) if e.kind in ("checkpointed", "lost"))


def test_a_notice_cordons_the_node_and_asks_its_jobs_to_checkpoint_within_it(
    fleet: Fleet,
) -> None:
    job, node = running(fleet, "train")
    r = reclaim(fleet, node.name, {"in_s": 20})
    assert r.status_code == 200, r.text
    reply = ReclaimReply.model_validate(r.json())
    assert reply.reclaim_at == fleet.clock() + 20
    assert reply.jobs == [ReclaimedJob(job=job, grace_s=20.0)]  # its 30 s grace, cut to 20
    assert reply.node.state == "draining" and reply.node.reclaim_at == reply.reclaim_at
    [stop] = node.to_stop()
    assert stop.job == job and stop.grace_s == 20.0
    leaving = fleet.job(job)
    assert leaving.state == "preempting"
    notice = leaving.events[-1]
    assert notice.kind == "reclaim"
    assert notice.message.startswith(
        f"reclaim notice: node {node.name} reclaimed in 20 s; checkpoint requested"
    )
    other = fleet.submit(make_spec("later", 8))
    assert [p.node for p in fleet.job(other).placement] != [node.name]


def test_a_short_grace_is_kept_and_a_second_notice_only_brings_the_time_forward(
    fleet: Fleet,
) -> None:
    job, node = running(fleet, "quick", checkpoint={"grace": "5s"})
    first = ReclaimReply.model_validate(reclaim(fleet, node.name, {"in_s": 120}).json())
    assert first.jobs == [ReclaimedJob(job=job, grace_s=5.0)]
    later = ReclaimReply.model_validate(reclaim(fleet, node.name, {"in_s": 300}).json())
    assert later.reclaim_at == first.reclaim_at and later.jobs == []


def test_a_job_that_checkpoints_within_the_notice_loses_almost_nothing_and_no_restart(
    fleet: Fleet,
) -> None:
    job, node = running(fleet, "train", max_restarts=0)
    tick(fleet, 300)  # five minutes of work since it started
    reclaim(fleet, node.name, {"in_s": 120})
    tick(fleet, 4)
    [stop] = node.to_stop()
    exited = {
        "replica": stop.replica,
        "job": job,
        "epoch": stop.epoch,
        "kind": "exited",
        "at": fleet.clock(),
        "exit_code": 0,
        "checkpoint_s": 4.0,
    }
    checkpoint(node, job, 250, [exited])  # the checkpoint and the exit in one report
    fleet.settle()
    requeued = fleet.job(job)
    event = requeue_event(requeued)
    assert event.kind == "checkpointed" and event.data["lost_s"] == 0.0
    assert requeued.restarts == 0
    fleet.start_everything()
    moved = fleet.job(job)
    assert moved.state == "running" and moved.epoch == 2
    assert [r.node for r in moved.placement] != [node.name]
    assert requeue_event(moved).data["lost_s"] == 0.0  # fixed once it was placed again


def test_a_job_still_there_when_the_node_goes_requeues_from_its_checkpoint_uncharged(
    tmp_path: Path, store_url: str
) -> None:
    with Fleet(tmp_path, hosts=2, db_url=store_url) as fleet:
        job, node = running(fleet, "stuck", max_restarts=0)
        tick(fleet, 100)
        checkpoint(node, job, 100)
        tick(fleet, 30)
        reclaim(fleet, node.name, {"in_s": 10})
        tick(fleet, 11)  # it never stopped
        fleet.settle()
        lost = fleet.job(job)
        event = requeue_event(lost)
        assert event.kind == "lost" and event.data["lost_s"] == 41.0  # since its checkpoint
        assert f"node {node.name} was reclaimed" in event.message
        assert lost.restarts == 0 and lost.state in ("requeued", "scheduled")
        assert state_of(fleet, node.name) == ("dead", True)
        fleet.start_everything()
        assert [r.node for r in fleet.job(job).placement] != [node.name]
        with fleet.rt.db.session() as s:
            assert double_allocations(s) == []
        assert node.heartbeat() == 409  # the instance is gone
        node.register()  # a new instance under the same name
        fleet.settle()
        assert state_of(fleet, node.name) == ("ready", False)


def state_of(fleet: Fleet, name: str) -> tuple[str, bool]:
    """The node's state and whether a reclaim is still pending."""
    nodes = fleet.http.get("/v1/nodes", headers=ADMIN).json()["nodes"]
    n = next(NodeOut.model_validate(n) for n in nodes if n["name"] == name)
    return n.state, n.reclaim_at is not None


def test_a_notice_registered_again_before_its_time_stays_pending(fleet: Fleet) -> None:
    reclaim(fleet, "host-1", {"in_s": 60})
    fleet.nodes["host-1"].register()
    fleet.settle()
    assert state_of(fleet, "host-1") == ("cordoned", True)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"in_s": "soon"}, "in_s"),
        ({"in_s": 0}, "in_s"),
        ({"in_s": -5}, "in_s"),
        ({"in_s": 100_000}, "in_s"),
        ({}, "in_s"),
        ({"in_s": 30, "when": 1}, "when"),
    ],
)
def test_bad_notices_are_refused_naming_the_field(
    fleet: Fleet, body: dict[str, Any], field: str
) -> None:
    r = reclaim(fleet, "host-0", body)
    assert r.status_code == 422
    assert [p["field"] for p in r.json()["problems"]] == [field]


def test_reclaim_is_for_admins_audited_and_names_unknown_nodes(fleet: Fleet) -> None:
    made = fleet.post("/v1/tokens", {"name": "ann", "role": "member", "team": "research"})
    member = {"Authorization": f"Bearer {made.json()['token']}"}
    assert reclaim(fleet, "host-0", {"in_s": 30}, member).status_code == 403
    missing = reclaim(fleet, "host-9", {"in_s": 30})
    assert missing.status_code == 404
    assert "no node host-9. To fix: check the name with `bolt nodes`" in missing.json()["error"]
    assert reclaim(fleet, "host-1", {"in_s": 30}).status_code == 200
    log = fleet.http.get("/v1/audit", headers=ADMIN).json()
    entries = [(e["action"], e["target"], e["detail"]) for e in log if e["action"] == "reclaim"]
    assert entries == [("reclaim", "host-1", {"in_s": 30.0})]


def test_the_cli_says_when_the_node_goes_and_which_jobs_checkpoint() -> None:
    node = NodeOut(
        name="host-0",
        pool="h100",
        gpu="H100",
        gpus=8,
        gpus_used=8,
        pod="p0",
        rack="r0",
        state="draining",
        reclaim_at=1000.0,
    )
    reply = ReclaimReply(node=node, reclaim_at=1000.0, jobs=[ReclaimedJob(job="j1", grace_s=30)])
    lines = reclaim_lines(reply, 880.0)
    assert lines[0].startswith("node host-0 is reclaimed in 2 min (at ")
    assert lines[0].endswith("cordoned; 1 job(s) asked to checkpoint now and move off")
    assert lines[1] == "  j1  checkpoint within 30 s"
    assert state_text(node, 940.0) == "reclaim in 60 s"
    assert state_text(node, 1001.0) == "reclaimed"
    assert state_text(node.model_copy(update={"reclaim_at": None}), 905.0) == "draining"


def test_the_cli_refuses_a_notice_that_is_not_a_duration() -> None:
    run = CliRunner().invoke(app, ["nodes", "reclaim", "host-0", "--in", "soon", "--token", "t"])
    assert run.exit_code == 2
    assert "--in 'soon' must be a duration" in run.output

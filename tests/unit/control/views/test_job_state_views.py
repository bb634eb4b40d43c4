"""What ``GET /v1/jobs/{id}`` and ``GET /v1/jobs`` show of a job in each state (pending,
scheduled, running, preempting, requeued, succeeded, failed, cancelled): where it runs or
ran, the placement explanation, the waiting diagnosis, its timeline; and the lines
``bolt explain`` prints from that reply for a waiting, running or finished job.

One story on three 8-GPU hosts, told once for the module: ``ok`` and ``bad`` run and exit 0
and 3; ``mover`` runs until its host is drained, checkpoints and is requeued (snapshots
taken then); ``big`` (16 GPUs, high, not preemptible, 2 h limit) holds the two other hosts;
``w1`` (1 h limit) and ``w2`` wait behind it; the drained host returns and ``mover`` is
placed there again; ``gone`` is cancelled while it waits."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from api_builders import get_json
from control_kit import Fleet, make_spec

from boltforge.cli.jobs import explanation
from boltforge.core.decisions import WaitReason
from boltforge.wire.jobs import JobDetail

HOUR = 3600.0
FIRST_WAIT_LINE = "role worker needs 1 replica(s) of 8 GPU(s)"
LAST_FIT_LINE = "fleet: 0 of 1 replica(s) fit across the fleet"


@dataclass
class Story:
    fleet: Fleet
    ids: dict[str, str]
    then: dict[str, JobDetail]  # details captured mid-story
    drained: str  # the host that was drained and returned
    t0: float

    def now(self, name: str) -> JobDetail:
        return self.fleet.job(self.ids[name])


def host_of(fleet: Fleet, job: str) -> str:
    [node] = [n for n, s in fleet.nodes.items() if any(r.job == job for r in s.to_run())]
    return node


@pytest.fixture(scope="module")
def story(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Story]:
    with Fleet(tmp_path_factory.mktemp("states"), hosts=3) as fleet:
        t0 = fleet.clock()
        ids = {name: fleet.submit(make_spec(name, 8)) for name in ("ok", "bad")}
        ids["mover"] = fleet.submit(make_spec("mover", 8, team="vision"))
        fleet.start_everything()
        fleet.finish(ids["ok"])
        fleet.finish(ids["bad"], 3)
        big = make_spec("big", 16, priority="high", preemptible=False, time_limit="2h")
        ids["big"] = fleet.submit(big)
        fleet.start_everything()
        drained = host_of(fleet, ids["mover"])
        assert fleet.post(f"/v1/nodes/{drained}/drain", {}).status_code == 200
        then = {"preempting": fleet.job(ids["mover"])}
        fleet.stop_everything()
        then["requeued"] = fleet.job(ids["mover"])
        ids["w1"] = fleet.submit(make_spec("w1", 8, time_limit="1h"))
        ids["w2"] = fleet.submit(make_spec("w2", 8))
        ids["gone"] = fleet.submit(make_spec("gone", 8))
        fleet.post(f"/v1/jobs/{ids['gone']}/cancel", {})
        fleet.post(f"/v1/nodes/{drained}/uncordon", {})
        fleet.settle()
        yield Story(fleet, ids, then, drained, t0)


# -- holding GPUs ----------------------------------------------------------------------------


def test_a_running_job_shows_its_hosts_processes_and_placement_explanation(story: Story) -> None:
    d = story.now("big")
    assert d.state == "running" and d.started_at == story.t0 and d.finished_at is None
    hosts = sorted(r.node for r in d.placement)
    assert len(hosts) == 2 and story.drained not in hosts
    compact = {
        ("host-0", "host-1"): "host-[0-1]",
        ("host-0", "host-2"): "host-[0,2]",
        ("host-1", "host-2"): "host-[1-2]",
    }
    assert d.nodes == compact[(hosts[0], hosts[1])]
    assert [(r.rank, r.state, r.pid, len(r.gpus)) for r in d.placement] == [
        (0, "running", 4242, 8),
        (1, "running", 4242, 8),
    ]
    assert d.explanation[0].startswith("16 x H100-80GB on 2 host(s)")
    assert (d.reason, d.waiting, d.position, d.estimated_start) == ("", [], None, None)
    assert [e.kind for e in d.events] == ["queued", "placed", "running"]
    assert d.priority_name == "high" and d.epoch == 1


def test_a_scheduled_job_waits_for_its_processes_on_the_host_it_was_given(story: Story) -> None:
    d = story.now("mover")
    assert d.state == "scheduled" and d.epoch == 2
    assert d.nodes == story.drained
    [rep] = d.placement
    assert (rep.node, rep.state, rep.pid, rep.exit_code) == (story.drained, "starting", None, None)
    assert rep.replica.endswith(".2.0")  # the second epoch's replica
    assert (
        d.explanation[0]
        == f"8 x H100-80GB on 1 host(s) inside host {story.drained} ({story.drained})"
    )
    assert (d.reason, d.waiting, d.position, d.estimated_start) == ("", [], None, None)
    assert d.preemptions == 1 and d.restarts == 0


def test_a_preempting_job_still_shows_the_host_it_is_leaving(story: Story) -> None:
    d = story.then["preempting"]
    assert d.state == "preempting"
    assert d.nodes == story.drained
    [rep] = d.placement
    assert rep.node == story.drained and rep.state in ("stopping", "running")
    assert d.events[-1].kind == "drained"
    assert d.events[-1].message == (
        f"node {story.drained} is draining: checkpointing (grace 120 s), then requeued"
    )


# -- waiting ---------------------------------------------------------------------------------


def test_a_requeued_job_keeps_its_last_placement_and_says_why_it_waits(story: Story) -> None:
    d = story.then["requeued"]
    assert d.state == "requeued" and d.preemptions == 1
    assert d.nodes == ""  # it holds nothing now
    [rep] = d.placement  # its last allocation, exited
    assert (rep.node, rep.state, rep.exit_code) == (story.drained, "exited", 0)
    assert d.explanation[0].startswith("8 x H100-80GB on 1 host(s)")
    assert d.reason == WaitReason.RESERVED.value
    assert d.estimated_start == story.t0 + 2 * HOUR  # when big's time limit frees its hosts
    assert d.waiting[0] == FIRST_WAIT_LINE
    assert d.waiting[-1] == "reserved: starts in 2.0 h (as of this pass) on 1 host(s)"
    assert [e.kind for e in d.events][-2:] == ["drained", "checkpointed"]
    assert d.events[-1].message == "checkpointed in 2.0 s and stopped; requeued"


@pytest.mark.parametrize("name", ["w1", "w2"])
def test_a_pending_job_says_why_it_waits_and_when_it_should_start(story: Story, name: str) -> None:
    d = story.now(name)
    assert d.state == "pending"
    assert d.reason in {r.value for r in WaitReason}
    assert (d.nodes, d.placement, d.explanation, d.epoch) == ("", [], [], 0)
    assert d.waiting[0] == FIRST_WAIT_LINE
    assert LAST_FIT_LINE in d.waiting
    assert any(line.startswith("host: the best matching host") for line in d.waiting)
    assert d.estimated_start == story.t0 + 2 * HOUR
    assert [e.kind for e in d.events] == ["queued"]
    assert d.started_at is None and d.finished_at is None


def test_only_a_waiting_job_with_a_time_limit_gets_an_expected_finish(story: Story) -> None:
    timed, plain = story.now("w1"), story.now("w2")
    assert timed.outlook is not None
    assert timed.outlook.expected_start == story.t0 + 2 * HOUR
    assert timed.outlook.expected_finish == story.t0 + 3 * HOUR
    assert timed.outlook.verdict is None and timed.outlook.deadline is None
    assert plain.outlook is None


def test_the_queue_lists_waiting_jobs_with_their_reason_and_no_hosts(story: Story) -> None:
    rows = {j["id"]: j for j in get_json(story.fleet, "/v1/jobs")["jobs"]}
    for name in ("w1", "w2"):
        row = rows[story.ids[name]]
        assert row["state"] == "pending" and row["nodes"] == ""
        assert row["reason"] == story.now(name).reason
    assert rows[story.ids["big"]]["nodes"] == story.now("big").nodes
    assert story.ids["ok"] not in rows and story.ids["gone"] not in rows  # finished: not live


# -- finished --------------------------------------------------------------------------------


def test_a_succeeded_job_shows_its_exit_and_where_it_ran(story: Story) -> None:
    d = story.now("ok")
    assert (d.state, d.exit_code, d.finished_at, d.nodes) == ("succeeded", 0, story.t0, "")
    [rep] = d.placement
    assert (rep.state, rep.exit_code) == ("exited", 0)
    assert d.explanation  # the last placement is kept
    assert d.events[-1].message == "succeeded: every replica exited 0"


def test_a_failed_job_names_the_replica_and_its_exit_code(story: Story) -> None:
    d = story.now("bad")
    assert (d.state, d.exit_code, d.nodes) == ("failed", 3, "")
    assert [(r.state, r.exit_code) for r in d.placement] == [("exited", 3)]
    assert d.events[-1].kind == "failed"
    assert d.events[-1].message == "failed: replica 0 exited with code 3"


def test_a_job_cancelled_while_waiting_never_held_anything(story: Story) -> None:
    d = story.now("gone")
    assert (d.state, d.epoch, d.placement, d.nodes) == ("cancelled", 0, [], "")
    assert d.finished_at == story.t0 and d.started_at is None
    assert [e.kind for e in d.events] == ["queued", "cancelled"]
    assert d.events[-1].message == "cancelled by admin"
    assert d.outlook is None  # finished: nothing left to judge


def test_a_finished_jobs_meter_counts_nothing_on_a_clock_that_did_not_move(story: Story) -> None:
    for name in ("ok", "bad", "gone"):
        d = story.now(name)
        assert (d.gpu_hours, d.dollars, d.productive_gpu_hours) == (0.0, 0.0, 0.0)


# -- what bolt explain prints ----------------------------------------------------------------


def test_explain_for_a_waiting_job_gives_reason_place_then_the_diagnosis(story: Story) -> None:
    d = story.now("w2")
    lines = explanation(d)
    assert lines[0] == f"waiting: {d.reason}"
    place = "?" if d.position is None else str(d.position + 1)
    assert lines[1].startswith(f"position {place} in line; estimated start ~")
    assert lines[2:] == d.waiting


def test_explain_puts_the_outlook_between_the_place_and_the_diagnosis(story: Story) -> None:
    d = story.now("w1")
    lines = explanation(d)
    assert lines[0] == f"waiting: {d.reason}"
    assert lines[2].startswith("expected start") and "finish" in lines[2]
    assert lines[3:] == d.waiting


def test_explain_for_a_requeued_job_reads_the_same_way(story: Story) -> None:
    d = story.then["requeued"]
    lines = explanation(d)
    assert lines[0] == "waiting: reserved"
    assert lines[-1] == "reserved: starts in 2.0 h (as of this pass) on 1 host(s)"


def test_explain_for_a_job_not_yet_considered_says_so() -> None:
    d = JobDetail(
        id="9", name="fresh", team="t", user="u", priority=2, priority_name="normal",
        state="pending", gpus=8, replicas=1, submitted_at=0.0, spec={},
    )  # fmt: skip
    assert explanation(d) == [
        "waiting: not yet considered",
        "position ? in line; estimated start unknown",
    ]


def test_explain_for_a_running_job_gives_its_placement(story: Story) -> None:
    d = story.now("big")
    assert explanation(d)[: len(d.explanation)] == d.explanation


@pytest.mark.parametrize(
    ("name", "first"),
    [("ok", "succeeded: every replica exited 0"), ("bad", "failed: replica 0 exited with code 3")],
)
def test_explain_for_a_finished_job_gives_its_end_and_last_placement(
    story: Story, name: str, first: str
) -> None:
    d = story.now(name)
    assert explanation(d) == [first, f"last placement: {d.explanation[0]}"]


def test_explain_for_a_job_cancelled_before_placement_has_no_placement_line(
    story: Story,
) -> None:
    assert explanation(story.now("gone")) == ["cancelled by admin"]

"""The agent protocol's routes and the node routes on the real app: stale sessions and
unknown nodes, the desired-state long-polls (``since``/``wait``, one node or every node),
stale reports, bulk heartbeats; cordon, drain, uncordon and reclaim (their replies, their
audit records, their refusals), the node list as a member sees it, and ``/v1/fleet``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from api_builders import Background, audit_rows, get_json, make_token, problem_of, refusal
from control_kit import ADMIN, AGENT, Fleet, make_spec

from boltforge.control.api.nodes import spread
from boltforge.wire.jobs import Spread


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    with Fleet(tmp_path_factory.mktemp("agents"), hosts=2) as f:
        yield f


@pytest.fixture
def small(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """Two idle 8-GPU hosts of their own, for tests that change a node for good."""
    with Fleet(tmp_path_factory.mktemp("nodes"), hosts=2) as f:
        yield f


def desired(fleet: Fleet, node: str, query: str = "") -> dict[str, Any]:
    r = fleet.http.get(f"/v1/agents/{node}/desired{query}", headers=AGENT)
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


def placed_on(fleet: Fleet, job: str) -> str:
    """The one node ``job`` was placed on."""
    [node] = [n for n, s in fleet.nodes.items() if any(r.job == job for r in s.to_run())]
    return node


# -- sessions --------------------------------------------------------------------------------


def test_a_heartbeat_with_an_old_session_is_told_to_register_again(fleet: Fleet) -> None:
    node = fleet.nodes["host-1"]
    old = node.session
    lease = node.register()
    assert lease["session"] != old and lease["node"] == "host-1"
    assert lease["lease_s"] > lease["heartbeat_s"] > 0
    r = fleet.http.post("/v1/agents/host-1/heartbeat", json={"session": old}, headers=AGENT)
    refusal(r, 409, "session is not current", "To fix: register again")
    assert node.heartbeat() == 200


def test_a_heartbeat_from_a_node_never_registered_is_told_to_register(fleet: Fleet) -> None:
    r = fleet.http.post("/v1/agents/ghost/heartbeat", json={"session": "s"}, headers=AGENT)
    refusal(r, 409, "To fix: register again")


def test_bulk_heartbeats_renew_the_current_and_list_the_lost(fleet: Fleet) -> None:
    current = fleet.nodes["host-0"].session
    beats = {
        "host-0": {"session": current},
        "host-1": {"session": "old"},
        "ghost": {"session": "x"},
    }
    r = fleet.http.post("/v1/agents/heartbeats", json={"beats": beats}, headers=AGENT)
    assert r.status_code == 200, r.text
    reply = r.json()
    assert list(reply["leases"]) == ["host-0"]
    assert reply["leases"]["host-0"]["session"] == current
    assert sorted(reply["lost"]) == ["ghost", "host-1"]
    assert fleet.nodes["host-1"].heartbeat() == 200  # its own current session still works


def test_a_report_with_an_old_session_is_refused_whole(fleet: Fleet) -> None:
    r = fleet.http.post("/v1/agents/host-0/report", json={"session": "old"}, headers=AGENT)
    refusal(r, 409, "To fix: register again")


@pytest.mark.parametrize(
    ("path", "field"),
    [
        ("/v1/agents/host-0/desired?since=-2", "query.since"),
        ("/v1/agents/host-0/desired?wait=61", "query.wait"),
        ("/v1/agents/desired?since=-2", "query.since"),
        ("/v1/agents/desired?wait=60.5", "query.wait"),
        ("/v1/agents/desired?since=soon", "query.since"),
    ],
)
def test_a_desired_query_out_of_range_is_refused_naming_it(
    fleet: Fleet, path: str, field: str
) -> None:
    assert problem_of(fleet.http.get(path, headers=AGENT))["field"] == field


def test_an_unknown_nodes_desired_state_is_a_404_saying_register_first(fleet: Fleet) -> None:
    r = fleet.http.get("/v1/agents/ghost/desired", headers=AGENT)
    refusal(r, 404, "no node ghost", "To fix: register it first")


# -- desired state: one node -----------------------------------------------------------------


def test_a_nodes_desired_state_is_answered_at_once_unless_already_seen(fleet: Fleet) -> None:
    now = desired(fleet, "host-0")
    assert now["node"] == "host-0"
    assert desired(fleet, "host-0", f"?since={now['version'] - 1}&wait=50") == now
    assert desired(fleet, "host-0", f"?since={now['version']}&wait=0") == now


def test_a_waiting_desired_read_returns_when_the_nodes_orders_change(fleet: Fleet) -> None:
    job = fleet.submit(make_spec("ordered", 8))
    node = placed_on(fleet, job)
    before = desired(fleet, node)
    [rep] = [r for r in before["replicas"] if r["job"] == job]
    assert rep["action"] == "run"
    poll = Background(
        lambda: fleet.http.get(
            f"/v1/agents/{node}/desired?since={before['version']}&wait=50", headers=AGENT
        )
    )
    fleet.post(f"/v1/jobs/{job}/cancel", {})
    after = poll.result().json()
    assert after["version"] > before["version"]
    assert [r["action"] for r in after["replicas"] if r["job"] == job] == ["stop"]
    fleet.nodes[node].exit(fleet.nodes[node].to_stop()[0], 0)
    fleet.settle()


# -- desired state: every node ---------------------------------------------------------------


def test_changes_since_minus_one_are_every_node_in_full(fleet: Fleet) -> None:
    r = fleet.http.get("/v1/agents/desired", headers=AGENT).json()
    assert r["full"] is True
    assert sorted(n["node"] for n in r["nodes"]) == ["host-0", "host-1"]
    assert r["seq"] == fleet.rt.notifier.seq


def test_changes_since_the_latest_sequence_are_none_without_waiting(fleet: Fleet) -> None:
    seq = fleet.http.get("/v1/agents/desired", headers=AGENT).json()["seq"]
    r = fleet.http.get(f"/v1/agents/desired?since={seq}&wait=0", headers=AGENT).json()
    assert r == {"seq": seq, "full": False, "nodes": []}


def test_a_follower_of_every_node_wakes_for_the_node_given_work(fleet: Fleet) -> None:
    seq = fleet.http.get("/v1/agents/desired", headers=AGENT).json()["seq"]
    poll = Background(
        lambda: fleet.http.get(f"/v1/agents/desired?since={seq}&wait=50", headers=AGENT)
    )
    job = fleet.submit(make_spec("fanned", 8))
    changes = poll.result().json()
    assert changes["full"] is False and changes["seq"] > seq
    node = placed_on(fleet, job)
    named = {n["node"]: n for n in changes["nodes"]}
    assert node in named
    assert [r["job"] for r in named[node]["replicas"] if r["action"] == "run"].count(job) == 1
    fleet.post(f"/v1/jobs/{job}/cancel", {})
    fleet.nodes[node].exit(fleet.nodes[node].to_stop()[0], 0)
    fleet.settle()


# -- reports ---------------------------------------------------------------------------------


def test_a_report_for_an_old_epoch_is_refused_and_changes_nothing(fleet: Fleet) -> None:
    job = fleet.submit(make_spec("epochs", 8))
    name = placed_on(fleet, job)
    node = fleet.nodes[name]
    [rep] = [r for r in node.to_run() if r.job == job]
    stale = {
        "replica": rep.replica,
        "job": job,
        "epoch": rep.epoch + 7,
        "kind": "started",
        "at": fleet.clock(),
        "pid": 1,
    }
    assert node.report(events=[stale]) == {"refused": [rep.replica]}
    assert fleet.job(job).state == "scheduled"
    node.start(rep)
    assert fleet.job(job).state == "running"
    fleet.finish(job)
    assert fleet.job(job).state == "succeeded"


# -- cordon, drain, uncordon, reclaim --------------------------------------------------------


def node_row(fleet: Fleet, name: str, headers: dict[str, str] = ADMIN) -> dict[str, Any]:
    [row] = [n for n in get_json(fleet, "/v1/nodes", headers)["nodes"] if n["name"] == name]
    return dict(row)


def test_a_cordoned_node_drains_then_shows_cordoned_and_uncordons_to_ready(small: Fleet) -> None:
    job = small.submit(make_spec("held", 8))
    small.start_everything()
    busy = placed_on(small, job)
    idle = next(n for n in small.nodes if n != busy)
    assert small.post(f"/v1/nodes/{busy}/cordon", {}).json()["state"] == "draining"
    assert small.post(f"/v1/nodes/{idle}/cordon", {}).json()["state"] == "cordoned"
    assert small.job(job).state == "running"  # a cordon moves nothing
    again = small.post(f"/v1/nodes/{busy}/uncordon", {}).json()
    assert (again["state"], again["gpus_used"], again["jobs"]) == ("ready", 8, [job])
    actions = [(a.action, a.target) for a in audit_rows(small) if a.action != "register"]
    assert actions[-3:] == [("cordon", busy), ("cordon", idle), ("uncordon", busy)]


def test_draining_asks_the_nodes_jobs_to_checkpoint_and_move(small: Fleet) -> None:
    job = small.submit(make_spec("moving", 8))
    small.start_everything()
    busy = placed_on(small, job)
    out = small.post(f"/v1/nodes/{busy}/drain", {})
    assert out.status_code == 200, out.text
    assert out.json()["state"] == "draining"
    [stop] = small.nodes[busy].to_stop()
    assert stop.job == job
    [entry] = [a for a in audit_rows(small, "drain")]
    assert (entry.target, entry.who, entry.detail) == (busy, "admin", {})


def test_a_reclaim_notice_cuts_each_jobs_grace_to_the_time_left(small: Fleet) -> None:
    job = small.submit(make_spec("spot", 8))
    small.start_everything()
    busy = placed_on(small, job)
    r = small.post(f"/v1/nodes/{busy}/reclaim", {"in_s": 30})
    assert r.status_code == 200, r.text
    reply = r.json()
    assert reply["reclaim_at"] == small.clock() + 30
    assert reply["node"]["reclaim_at"] == reply["reclaim_at"]
    assert reply["node"]["state"] == "draining"
    assert reply["jobs"] == [{"job": job, "grace_s": 30.0}]
    [entry] = audit_rows(small, "reclaim")
    assert (entry.target, entry.detail) == (busy, {"in_s": 30})


def test_a_reclaim_notice_for_an_idle_node_moves_no_job(small: Fleet) -> None:
    reply = small.post("/v1/nodes/host-1/reclaim", {"in_s": 600}).json()
    assert reply["jobs"] == [] and reply["node"]["state"] == "cordoned"


@pytest.mark.parametrize("action", ["cordon", "drain", "uncordon", "reclaim"])
def test_an_unknown_node_is_a_404_and_nothing_is_audited(fleet: Fleet, action: str) -> None:
    body = {"in_s": 60} if action == "reclaim" else {}
    r = fleet.post(f"/v1/nodes/ghost/{action}", body)
    refusal(r, 404, "no node ghost", "To fix: check the name with `bolt nodes`")
    assert audit_rows(fleet, action) == []


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"in_s": 0}, "in_s"),
        ({"in_s": -5}, "in_s"),
        ({"in_s": 86401}, "in_s"),
        ({"in_s": "60"}, "in_s"),
        ({}, "in_s"),
        ({"in_s": 60, "why": "spot"}, "why"),
    ],
    ids=["zero", "negative", "over-a-day", "string", "missing", "extra"],
)
def test_a_bad_reclaim_notice_names_its_field_and_changes_nothing(
    fleet: Fleet, body: dict[str, Any], field: str
) -> None:
    problem = problem_of(fleet.post("/v1/nodes/host-0/reclaim", body))
    assert problem["field"] == field
    assert node_row(fleet, "host-0")["reclaim_at"] is None
    assert audit_rows(fleet, "reclaim") == []


# -- reading the fleet -----------------------------------------------------------------------


def test_a_member_sees_every_nodes_use_but_only_their_teams_jobs(small: Fleet) -> None:
    nlp = make_token(small, "alice", "member", "nlp")
    theirs = small.submit(make_spec("theirs", 8, team="vision"))
    mine = small.submit(make_spec("mine", 8, team="nlp"), nlp)
    rows = {n["name"]: n for n in get_json(small, "/v1/nodes", nlp)["nodes"]}
    by_job = {placed_on(small, theirs): theirs, placed_on(small, mine): mine}
    for name, row in rows.items():
        assert row["gpus_used"] == 8
        assert row["jobs"] == ([mine] if by_job[name] == mine else [])
    admin_rows = {n["name"]: n["jobs"] for n in get_json(small, "/v1/nodes")["nodes"]}
    assert admin_rows == {name: [job] for name, job in by_job.items()}


def test_the_fleet_reply_counts_capacity_use_and_the_queue(small: Fleet) -> None:
    running = small.submit(make_spec("run", 8, team="a"))
    small.start_everything()
    small.submit(make_spec("held", 8, team="b"))
    small.submit(make_spec("waits", 16, team="c"))
    small.post(f"/v1/nodes/{placed_on(small, running)}/cordon", {})
    out = get_json(small, "/v1/fleet")
    assert (out["nodes"], out["nodes_ready"], out["gpus"], out["gpus_used"]) == (2, 1, 16, 16)
    assert (out["jobs_running"], out["jobs_pending"]) == (2, 1)
    assert out["by_team"] == {"a": 8, "b": 8}
    assert out["by_state"] == {"running": 1, "scheduled": 1, "pending": 1}
    assert 0.0 <= out["fragmentation"] <= 1.0
    assert out["cycles"] >= out["loop"]["full_passes"] >= 1
    assert out["loop"]["binds"] == 2
    assert out["loop"]["pass_ms"]["count"] == out["cycles"]


def test_spread_of_no_samples_is_empty() -> None:
    assert spread([]) == Spread()
    assert spread([]).count == 0


def test_spread_gives_the_median_and_99th_percentile_rounded_to_microseconds() -> None:
    out = spread([1.0, 2.0, 3.0, 4.0, 100.0004444])
    assert (out.p50, out.count) == (3.0, 5)
    assert out.p99 is not None
    assert 4.0 < out.p99 <= 100.0 and out.p99 == round(out.p99, 3)
    assert spread([7.12345]) == Spread(p50=7.123, p99=7.123, count=1)

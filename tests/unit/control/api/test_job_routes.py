"""``/v1/jobs`` on the real app: every bad submission is refused naming its field and fix with
nothing stored, idempotency keys (body or header, plain or array jobs, another team's),
listing filters, array ids, cancelling (roles, arrays, the audit record), and the events and
logs long-polls (``after``/``wait``: held open until there is something, answered at once
for a finished job)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from api_builders import (
    ALL_STATES,
    Background,
    audit_rows,
    get_json,
    job_ids,
    make_token,
    problem_of,
    refusal,
)
from control_kit import ADMIN, AGENT, Fleet, make_spec

TAGGED = "queued: 1 GPU(s) in 1 replica(s) for team {team}, priority normal"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    with Fleet(tmp_path_factory.mktemp("job-routes"), hosts=4) as f:
        yield f


@pytest.fixture(scope="module")
def people(fleet: Fleet) -> dict[str, dict[str, str]]:
    """Tokens of each kind of person: members of ``nlp`` and ``vision``, and a viewer."""
    return {
        "nlp": make_token(fleet, "alice", "member", "nlp"),
        "vision": make_token(fleet, "victor", "member", "vision"),
        "viewer": make_token(fleet, "vera", "viewer"),
    }


def one_gpu(name: str, team: str, **extra: Any) -> dict[str, Any]:
    return make_spec(name, 1, team=team, **extra)


# -- bad submissions -------------------------------------------------------------------------

BAD = [
    pytest.param({}, "spec", "send the job spec as `spec` or `yaml`", id="no-spec"),
    pytest.param({"spec": "name: x"}, "spec", "valid dictionary", id="spec-not-object"),
    pytest.param(
        {"spec": one_gpu("x", "t"), "specs": 1}, "specs", "not permitted", id="unknown-field"
    ),
    pytest.param(
        {"spec": one_gpu("x", "t"), "priority": "urgent"},
        "job.priority",
        "`priority: high`",
        id="priority-word",
    ),
    pytest.param(
        {"spec": one_gpu("x", "t"), "gpus": "many"}, "job.gpus", "COUNTxTYPE", id="gpus-word"
    ),
    pytest.param({"spec": make_spec("x", 0)}, "job.gpus", "at least 1", id="zero-gpus"),
    pytest.param(
        {"spec": one_gpu("x", "t"), "team": "Bad Team"}, "job.team", "lowercase", id="team-case"
    ),
    pytest.param(
        {"spec": make_spec("x", 17)}, "job.gpus", "ask for 24 GPUs", id="gpus-do-not-split"
    ),
    pytest.param(
        {"spec": one_gpu("x", "t"), "array": "a-b"}, "array", "e.g. 0-9", id="array-words"
    ),
    pytest.param(
        {"spec": one_gpu("x", "t"), "array": "0-20000"}, "array", "split it", id="array-huge"
    ),
    pytest.param(
        {"spec": one_gpu("x", "t"), "source": 7}, "source", "valid string", id="source-number"
    ),
]


@pytest.mark.parametrize(("body", "field", "fix"), BAD)
def test_a_bad_submission_names_the_field_and_its_fix_and_stores_nothing(
    fleet: Fleet, body: dict[str, Any], field: str, fix: str
) -> None:
    before = job_ids(fleet)
    problem = problem_of(fleet.post("/v1/jobs", body))
    assert problem["field"] == field
    assert fix in problem["message"]
    assert job_ids(fleet) == before


def test_a_spec_sent_twice_is_refused_naming_both_ways(fleet: Fleet) -> None:
    before = job_ids(fleet)
    body = {"spec": one_gpu("x", "t"), "yaml": "name: x\n"}
    r = fleet.post("/v1/jobs", body)
    [problem] = refusal(r, 422, "1 problem(s)")["problems"]
    assert problem["field"] == "spec"
    assert "`spec` (JSON) or as `yaml` (text)" in problem["message"]
    assert job_ids(fleet) == before


def test_a_yaml_source_name_is_the_errors_subject(fleet: Fleet) -> None:
    r = fleet.post("/v1/jobs", {"yaml": "name: x\nteam: t\ngpus: 0\n", "source": "train.yaml"})
    body = refusal(r, 422, "train.yaml: 1 problem(s)")
    assert body["problems"][0]["field"] == "job.gpus"


# -- who may submit --------------------------------------------------------------------------


def test_a_member_is_told_which_team_to_set(
    fleet: Fleet, people: dict[str, dict[str, str]]
) -> None:
    before = job_ids(fleet)
    r = fleet.post("/v1/jobs", {"spec": one_gpu("x", "vision")}, people["nlp"])
    refusal(r, 403, "only for team nlp, not vision", "To fix: set `team: nlp`")
    assert job_ids(fleet) == before


def test_a_members_team_override_is_checked_after_it_applies(
    fleet: Fleet, people: dict[str, dict[str, str]]
) -> None:
    """The command line's ``--team`` replaces the spec's team before the check."""
    r = fleet.post("/v1/jobs", {"spec": one_gpu("x", "vision"), "team": "nlp"}, people["nlp"])
    assert r.status_code == 201, r.text
    assert r.json()["job"]["team"] == "nlp" and r.json()["job"]["user"] == "alice"


@pytest.mark.parametrize(("who", "role"), [("viewer", "viewer"), ("agent", "agent")])
def test_viewers_and_agents_may_not_submit(
    fleet: Fleet, people: dict[str, dict[str, str]], who: str, role: str
) -> None:
    headers = AGENT if who == "agent" else people[who]
    before = job_ids(fleet)
    r = fleet.post("/v1/jobs", {"spec": one_gpu("x", "nlp")}, headers)
    refusal(r, 403, f"role {role} may not do this (needs admin or member)", "To fix")
    assert job_ids(fleet) == before


# -- idempotency keys ------------------------------------------------------------------------


def test_a_key_in_the_body_returns_the_first_job_with_200(fleet: Fleet) -> None:
    body = {"spec": one_gpu("keyed", "idem"), "idempotency_key": "body-key-1"}
    first = fleet.post("/v1/jobs", body)
    again = fleet.post("/v1/jobs", {**body, "spec": one_gpu("other-name", "idem")})
    assert (first.status_code, again.status_code) == (201, 200)
    assert first.json()["created"] is True and again.json()["created"] is False
    assert again.json()["job"]["id"] == first.json()["job"]["id"]
    assert again.json()["job"]["name"] == "keyed"  # the first job, not the retry's spec
    listed = get_json(fleet, f"/v1/jobs?team=idem&state={ALL_STATES}")["jobs"]
    assert [j["id"] for j in listed] == [first.json()["job"]["id"]]


def test_the_body_key_wins_over_the_header(fleet: Fleet) -> None:
    spec = one_gpu("both", "idem2")
    first = fleet.post("/v1/jobs", {"spec": spec, "idempotency_key": "body-wins"})
    header = {**ADMIN, "Idempotency-Key": "header-loses"}
    again = fleet.http.post(
        "/v1/jobs", json={"spec": spec, "idempotency_key": "body-wins"}, headers=header
    )
    assert again.status_code == 200 and again.json()["job"]["id"] == first.json()["job"]["id"]
    fresh = fleet.http.post("/v1/jobs", json={"spec": spec}, headers=header)
    assert fresh.status_code == 201 and fresh.json()["job"]["id"] != first.json()["job"]["id"]


def test_a_repeated_array_submission_returns_every_task(fleet: Fleet) -> None:
    body = {"spec": one_gpu("sweep", "idem3"), "array": "0-2", "idempotency_key": "sweep-1"}
    first = fleet.post("/v1/jobs", body).json()
    again = fleet.post("/v1/jobs", body)
    assert again.status_code == 200
    assert again.json()["tasks"] == first["tasks"] and len(first["tasks"]) == 3
    assert again.json()["job"]["array"] == "0-2"


def test_another_teams_key_is_a_conflict_not_their_job(
    fleet: Fleet, people: dict[str, dict[str, str]]
) -> None:
    theirs = fleet.post("/v1/jobs", {"spec": one_gpu("v", "vision"), "idempotency_key": "shared"})
    assert theirs.status_code == 201
    mine = {"spec": one_gpu("n", "nlp"), "idempotency_key": "shared"}
    r = fleet.post("/v1/jobs", mine, people["nlp"])
    refusal(r, 409, "another team's job", "To fix: use a fresh key")
    assert "vision" not in r.text and theirs.json()["job"]["id"] not in r.text


# -- listing and reading ---------------------------------------------------------------------


def test_listing_filters_by_state_and_team_in_queue_order(fleet: Fleet) -> None:
    priorities = ("low", "high", "normal")
    ids = [fleet.submit(one_gpu(f"l{i}", "listing", priority=p)) for i, p in enumerate(priorities)]
    low, high, normal = ids
    fleet.post(f"/v1/jobs/{normal}/cancel", {})
    live = get_json(fleet, "/v1/jobs?team=listing")["jobs"]
    assert [j["id"] for j in live] == [high, low]  # priority order; the cancelled one left out
    done = get_json(fleet, "/v1/jobs?team=listing&state=cancelled")["jobs"]
    assert [(j["id"], j["state"]) for j in done] == [(normal, "cancelled")]
    every = get_json(fleet, f"/v1/jobs?team=listing&state={ALL_STATES}")["jobs"]
    assert [j["id"] for j in every] == [high, normal, low]
    assert [j["id"] for j in get_json(fleet, "/v1/jobs?team=listing&limit=1")["jobs"]] == [high]


def test_empty_parts_of_the_state_filter_mean_live_jobs(fleet: Fleet) -> None:
    job = fleet.submit(one_gpu("commas", "commas"))
    assert [j["id"] for j in get_json(fleet, "/v1/jobs?team=commas&state=,,")["jobs"]] == [job]
    assert get_json(fleet, "/v1/jobs?team=commas&state=succeeded")["jobs"] == []


def test_a_member_lists_another_teams_work_only_as_counts(
    fleet: Fleet, people: dict[str, dict[str, str]]
) -> None:
    fleet.submit(one_gpu("hidden", "vision"))
    listed = get_json(fleet, "/v1/jobs?team=vision", people["nlp"])
    assert listed["jobs"] == []
    [others] = listed["others"]
    assert others["team"] == "vision" and others["pending"] + others["running"] >= 1
    assert "hidden" not in str(listed)


def test_an_array_id_is_not_a_job_and_the_404_names_a_task(fleet: Fleet) -> None:
    reply = fleet.post("/v1/jobs", {"spec": one_gpu("arr", "arrays"), "array": "3-4"}).json()
    array_id = reply["tasks"][0].rsplit("_", 1)[0]
    r = fleet.http.get(f"/v1/jobs/{array_id}", headers=ADMIN)
    refusal(r, 404, f"no job {array_id}", f"(array job: name a task, e.g. {reply['tasks'][0]})")
    assert reply["tasks"] == [f"{array_id}_3", f"{array_id}_4"]


def test_an_unknown_job_is_a_404_with_how_to_find_ids(fleet: Fleet) -> None:
    for path in ("/v1/jobs/nope", "/v1/jobs/nope/events", "/v1/jobs/nope/logs"):
        refusal(fleet.http.get(path, headers=ADMIN), 404, "no job nope", "`bolt queue`")


def test_a_member_may_not_follow_another_teams_job(
    fleet: Fleet, people: dict[str, dict[str, str]]
) -> None:
    job = fleet.submit(one_gpu("private", "vision"))
    for tail in ("", "/events", "/logs", "/artifacts"):
        r = fleet.http.get(f"/v1/jobs/{job}{tail}", headers=people["nlp"])
        refusal(r, 403, "belongs to team vision", "aggregate")
    assert fleet.http.get(f"/v1/jobs/{job}/events", headers=people["viewer"]).status_code == 200


# -- cancelling ------------------------------------------------------------------------------


def test_cancelling_an_array_cancels_every_task_and_audits_once(fleet: Fleet) -> None:
    reply = fleet.post("/v1/jobs", {"spec": one_gpu("arr", "cancels"), "array": "0-2"}).json()
    array_id = reply["tasks"][0].rsplit("_", 1)[0]
    r = fleet.post(f"/v1/jobs/{array_id}/cancel", {})
    assert r.status_code == 200, r.text
    assert sorted(j["id"] for j in r.json()["jobs"]) == reply["tasks"]
    assert {j["state"] for j in r.json()["jobs"]} == {"cancelled"}
    [entry] = [a for a in audit_rows(fleet, "cancel") if a.target == array_id]
    assert (entry.who, entry.role, entry.source, entry.detail) == (
        "admin",
        "admin",
        "testclient",
        {"jobs": 3},
    )


def test_cancelling_a_finished_job_again_changes_nothing(fleet: Fleet) -> None:
    job = fleet.submit(one_gpu("twice", "cancels2"))
    first = fleet.post(f"/v1/jobs/{job}/cancel", {}).json()["jobs"][0]
    again = fleet.post(f"/v1/jobs/{job}/cancel", {})
    assert again.status_code == 200
    assert again.json()["jobs"][0]["finished_at"] == first["finished_at"]
    kinds = [e["kind"] for e in get_json(fleet, f"/v1/jobs/{job}/events")["events"]]
    assert kinds.count("cancelled") == 1


def test_a_member_cancels_only_their_teams_jobs(
    fleet: Fleet, people: dict[str, dict[str, str]]
) -> None:
    theirs = fleet.submit(one_gpu("t", "vision"))
    mine = fleet.submit(one_gpu("m", "nlp"), people["nlp"])
    r = fleet.post(f"/v1/jobs/{theirs}/cancel", {}, people["nlp"])
    refusal(r, 403, f"job {theirs} belongs to team vision", "only your team's jobs")
    assert fleet.job(theirs).state != "cancelled"
    assert all(a.target != theirs for a in audit_rows(fleet, "cancel"))
    ok = fleet.post(f"/v1/jobs/{mine}/cancel", {}, people["nlp"])
    assert ok.status_code == 200 and ok.json()["jobs"][0]["state"] == "cancelled"
    [entry] = [a for a in audit_rows(fleet, "cancel") if a.target == mine]
    assert (entry.who, entry.role) == ("alice", "member")
    assert fleet.job(mine).events[-1].message == "cancelled by alice"


def test_cancelling_needs_an_acting_role(fleet: Fleet, people: dict[str, dict[str, str]]) -> None:
    job = fleet.submit(one_gpu("v", "viewers"))
    refusal(fleet.post(f"/v1/jobs/{job}/cancel", {}, people["viewer"]), 403, "role viewer")
    refusal(fleet.post(f"/v1/jobs/{job}/cancel", {}, {}), 401, "no API token")
    refusal(fleet.post("/v1/jobs/nope/cancel", {}), 404, "no job nope", "`bolt queue`")


# -- following a job: events and logs --------------------------------------------------------


def last_seq(fleet: Fleet, job: str) -> int:
    events = get_json(fleet, f"/v1/jobs/{job}/events")["events"]
    return int(events[-1]["seq"])


def test_events_after_a_sequence_number_leave_out_what_was_seen(fleet: Fleet) -> None:
    job = fleet.submit(one_gpu("timeline", "timeline"))
    page = get_json(fleet, f"/v1/jobs/{job}/events")
    assert page["events"][0]["kind"] == "queued"
    assert page["events"][0]["message"] == TAGGED.format(team="timeline")
    seqs = [e["seq"] for e in page["events"]]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    later = get_json(fleet, f"/v1/jobs/{job}/events?after={seqs[0]}")["events"]
    assert [e["seq"] for e in later] == seqs[1:]
    assert get_json(fleet, f"/v1/jobs/{job}/events?after={seqs[-1]}&wait=0")["events"] == []


def test_a_waiting_events_call_returns_as_soon_as_the_job_changes(fleet: Fleet) -> None:
    job = fleet.submit(one_gpu("watched", "watch"))
    seen = last_seq(fleet, job)
    poll = Background(
        lambda: fleet.http.get(f"/v1/jobs/{job}/events?after={seen}&wait=50", headers=ADMIN)
    )
    fleet.post(f"/v1/jobs/{job}/cancel", {})
    page = poll.result().json()
    assert page["state"] == "cancelled"
    assert [e["kind"] for e in page["events"]] == ["cancelled"]
    assert all(e["seq"] > seen for e in page["events"])


def test_a_finished_jobs_events_are_answered_at_once_even_when_asked_to_wait(
    fleet: Fleet,
) -> None:
    job = fleet.submit(one_gpu("over", "over"))
    fleet.post(f"/v1/jobs/{job}/cancel", {})
    seen = last_seq(fleet, job)
    poll = Background(
        lambda: fleet.http.get(f"/v1/jobs/{job}/events?after={seen}&wait=60", headers=ADMIN)
    )
    page = poll.result(timeout=20).json()  # a 60 s wait would outlast this
    assert (page["state"], page["events"]) == ("cancelled", [])


@pytest.mark.parametrize("tail", ["events", "logs"])
@pytest.mark.parametrize(
    ("query", "field"),
    [("wait=61", "query.wait"), ("wait=-1", "query.wait"), ("after=-1", "query.after")],
)
def test_a_follow_query_out_of_range_is_refused_naming_it(
    fleet: Fleet, tail: str, query: str, field: str
) -> None:
    job = fleet.submit(one_gpu("q", "queries")) if tail == "events" else "any"
    problem = problem_of(fleet.http.get(f"/v1/jobs/{job}/{tail}?{query}", headers=ADMIN))
    assert problem["field"] == field


def running_one_gpu(fleet: Fleet, name: str, team: str) -> tuple[str, Any, Any]:
    """A 1-GPU job started on its node: its id, the node and its replica."""
    job = fleet.submit(one_gpu(name, team))
    fleet.start_everything()
    for node in fleet.nodes.values():
        for rep in node.to_run():
            if rep.job == job:
                return job, node, rep
    raise AssertionError(f"job {job} was not placed")


def chunk(rep: Any, seq: int, data: str) -> dict[str, Any]:
    return {"replica": rep.replica, "job": rep.job, "epoch": rep.epoch, "seq": seq, "data": data}


def test_a_waiting_logs_call_returns_the_lines_a_node_reports_meanwhile(fleet: Fleet) -> None:
    job, node, rep = running_one_gpu(fleet, "chatty", "logs")
    empty = get_json(fleet, f"/v1/jobs/{job}/logs")
    assert (empty["lines"], empty["next"], empty["state"]) == ([], 0, "running")
    poll = Background(lambda: fleet.http.get(f"/v1/jobs/{job}/logs?after=0&wait=50", headers=ADMIN))
    node.report(logs=[chunk(rep, 0, "step 1 loss 2.5\nstep 2 loss 2.1\n")])
    page = poll.result().json()
    assert page["lines"] == ["step 1 loss 2.5", "step 2 loss 2.1"]
    assert page["next"] > 0
    node.report(logs=[chunk(rep, 1, "step 3 loss 1.9\n")])
    after = get_json(fleet, f"/v1/jobs/{job}/logs?after={page['next']}")
    assert after["lines"] == ["step 3 loss 1.9"] and after["next"] > page["next"]
    fleet.finish(job)


def test_a_finished_jobs_logs_are_answered_at_once_even_when_asked_to_wait(
    fleet: Fleet,
) -> None:
    job, node, rep = running_one_gpu(fleet, "quiet", "logs2")
    node.exit(rep, 0)
    fleet.settle()
    poll = Background(lambda: fleet.http.get(f"/v1/jobs/{job}/logs?after=0&wait=60", headers=ADMIN))
    page = poll.result(timeout=20).json()
    assert (page["state"], page["lines"], page["next"]) == ("succeeded", [], 0)

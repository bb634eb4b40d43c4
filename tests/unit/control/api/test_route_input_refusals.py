"""Bad input on the routes not about submitting jobs: the agent protocol's bodies, the
console's and cost's query parameters, reads of things that are not there. Each refusal
names the field (or the thing) and the fix, and the store is left as it was: no node
registered, no lease renewed, no event recorded."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from api_builders import audit_rows, get_json, problem_of, refusal
from control_kit import ADMIN, AGENT, Fleet, make_spec
from sqlalchemy import func, select

from boltforge.control.nodes.agents import LeaseTerms
from boltforge.control.store.models import EventRow, NodeRow

DAY = 86400.0


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    lasting = LeaseTerms(2.0, DAY, DAY)  # the clock moves; the nodes stay ready
    with Fleet(tmp_path_factory.mktemp("refusals"), hosts=2, terms=lasting) as f:
        yield f


def counts(fleet: Fleet) -> tuple[int, int, int, float | None]:
    """Nodes, timeline events and audit entries stored, and host-0's last heartbeat."""
    with fleet.rt.db.session() as s:
        nodes = s.scalar(select(func.count()).select_from(NodeRow)) or 0
        events = s.scalar(select(func.count()).select_from(EventRow)) or 0
        beat = s.scalar(select(NodeRow.last_heartbeat).where(NodeRow.name == "host-0"))
    return nodes, events, len(audit_rows(fleet)), beat


def inventory(fleet: Fleet, **extra: Any) -> dict[str, Any]:
    return {**fleet.nodes["host-0"].inventory(), "name": "host-new", **extra}


# (path, body or a function of the fleet giving it, the problem's field, words of its message)
AGENT_BODIES = [
    pytest.param(
        "/v1/agents/register",
        lambda f: {"inventory": inventory(f, gpus=-1)},
        "inventory.gpus",
        "greater than or equal to 0",
        id="register-negative-gpus",
    ),
    pytest.param(
        "/v1/agents/register",
        lambda f: {"inventory": inventory(f, name="bad name!")},
        "inventory.name",
        "pattern",
        id="register-bad-name",
    ),
    pytest.param(
        "/v1/agents/register", lambda f: {}, "inventory", "Field required", id="register-empty"
    ),
    pytest.param(
        "/v1/agents/host-0/heartbeat",
        lambda f: {},
        "session",
        "Field required",
        id="heartbeat-no-session",
    ),
    pytest.param(
        "/v1/agents/host-0/heartbeat",
        lambda f: {
            "session": f.nodes["host-0"].session,
            "gpus": [{"index": 0, "util_pct": 101, "memory_used_mib": 0}],
        },
        "gpus.0.util_pct",
        "less than or equal to 100",
        id="heartbeat-util-over-100",
    ),
    pytest.param(
        "/v1/agents/host-0/report",
        lambda f: {
            "session": f.nodes["host-0"].session,
            "events": [{"replica": "r", "job": "j", "epoch": 1, "kind": "exploded", "at": 1.0}],
        },
        "events.0.kind",
        "'started', 'exited' or 'failed'",
        id="report-unknown-event",
    ),
    pytest.param(
        "/v1/agents/host-0/report",
        lambda f: {
            "session": f.nodes["host-0"].session,
            "logs": [{"replica": "r", "job": "j", "epoch": 1, "seq": -1, "data": "x"}],
        },
        "logs.0.seq",
        "greater than or equal to 0",
        id="report-negative-log-seq",
    ),
    pytest.param(
        "/v1/agents/heartbeats",
        lambda f: {"beats": []},
        "beats",
        "valid dictionary",
        id="heartbeats-not-by-node",
    ),
]


@pytest.mark.parametrize(("path", "body", "field", "words"), AGENT_BODIES)
def test_a_bad_agent_body_names_its_field_and_changes_nothing(
    fleet: Fleet, path: str, body: Any, field: str, words: str
) -> None:
    fleet.clock.advance(1.0)  # a renewed lease would show a new heartbeat time
    before = counts(fleet)
    r = fleet.http.post(path, json=body(fleet), headers=AGENT)
    problem = problem_of(r)
    assert problem["field"] == field and words in problem["message"]
    assert counts(fleet) == before


# (path, the problem's field, words of its message)
QUERIES = [
    ("/v1/console/map?hosts=a/b", "query.hosts", "pattern"),
    ("/v1/console/map?hosts=" + "h" * 8001, "query.hosts", "at most 8000"),
    ("/v1/console/utilization?window_s=0", "query.window_s", "greater than 0"),
    ("/v1/console/utilization?window_s=604801", "query.window_s", "less than or equal to 604800"),
    ("/v1/console/utilization?window_s=abc", "query.window_s", "valid number"),
    ("/v1/cost?by=rack", "query.by", "'team', 'project' or 'job'"),
    ("/v1/jobs?limit=many", "query.limit", "valid integer"),
]


@pytest.mark.parametrize(
    ("path", "field", "words"), QUERIES, ids=[q[1] + q[0][-6:] for q in QUERIES]
)
def test_a_bad_query_parameter_is_named_with_what_it_should_be(
    fleet: Fleet, path: str, field: str, words: str
) -> None:
    problem = problem_of(fleet.http.get(path, headers=ADMIN))
    assert problem["field"] == field and words in problem["message"]


@pytest.mark.parametrize("since", ["yesterday", "30x", "-5"])
def test_a_bad_cost_window_says_what_a_window_looks_like(fleet: Fleet, since: str) -> None:
    problem = problem_of(fleet.http.get(f"/v1/cost?since={since}", headers=ADMIN))
    assert problem["field"].endswith("since") and problem["value"] == since
    assert "To fix: e.g. since=30d or since=3600" in problem["message"]


@pytest.mark.parametrize(
    ("since", "seconds"), [("3600", 3600.0), ("2h", 7200.0), ("30d", 30 * 86400.0)]
)
def test_a_cost_window_counts_back_from_now(fleet: Fleet, since: str, seconds: float) -> None:
    reply = get_json(fleet, f"/v1/cost?since={since}")
    assert reply["until"] == fleet.clock()
    assert reply["since"] == fleet.clock() - seconds


# -- things that are not there ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "words"),
    [
        ("/v1/jobs/nope/ranks", ["no job nope", "To fix: check the id with `bolt queue`"]),
        ("/v1/console/hosts/ghost", ["no node ghost", "To fix: check the name with `bolt nodes`"]),
        ("/v1/jobs/nope/artifacts", ["no job nope"]),
        ("/v1/jobs/nope/artifacts/0/x.txt", ["no job nope"]),
    ],
)
def test_reading_what_is_not_there_is_a_404_naming_it(
    fleet: Fleet, path: str, words: list[str]
) -> None:
    refusal(fleet.http.get(path, headers=ADMIN), 404, *words)


def test_a_missing_artifact_of_a_real_job_says_how_to_list_them(fleet: Fleet) -> None:
    job = fleet.submit(make_spec("empty-handed", 1))
    r = fleet.http.get(f"/v1/jobs/{job}/artifacts/0/model.bin", headers=ADMIN)
    refusal(r, 404, f"job {job} has no artifact 0/model.bin", f"`bolt artifacts {job}`")
    assert get_json(fleet, f"/v1/jobs/{job}/artifacts") == {"job": job, "artifacts": []}


def test_an_upload_for_a_replica_the_node_never_ran_is_a_404_and_keeps_nothing(
    fleet: Fleet,
) -> None:
    job = fleet.submit(make_spec("elsewhere", 1))
    fleet.start_everything()
    [(ran, rep)] = [(n, r) for n, s in fleet.nodes.items() for r in s.to_run() if r.job == job]
    other = next(n for n in fleet.nodes if n != ran)
    url = f"/v1/agents/{other}/artifacts/{rep.replica}/out.txt"
    r = fleet.http.put(url, content=b"data", headers={**AGENT, "X-Sha256": "0" * 64})
    refusal(r, 404, f"node {other} ran no replica {rep.replica}")
    assert get_json(fleet, f"/v1/jobs/{job}/artifacts")["artifacts"] == []
    fleet.finish(job)


def test_a_map_of_no_hosts_still_counts_the_whole_fleet(fleet: Fleet) -> None:
    page = get_json(fleet, "/v1/console/map?hosts=")
    assert (page["pods"], page["owners"]) == ([], [])
    assert (page["gpus"], page["nodes"]) == (16, 2)

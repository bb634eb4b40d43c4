"""The API's edges: bad input, access control, node leases, and the schema's migrations."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from control_kit import ADMIN, Fleet, make_spec

from boltforge.control.store.db import Database
from boltforge.control.store.models import Base
from boltforge.wire.jobs import SubmitReply


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    with Fleet(tmp_path) as f:
        yield f


def token(fleet: Fleet, name: str, role: str, team: str | None = None) -> dict[str, str]:
    body: dict[str, Any] = {"name": name, "role": role}
    if team:
        body["team"] = team
    r = fleet.post("/v1/tokens", body)
    assert r.status_code == 201, r.text
    return {"Authorization": f"Bearer {r.json()['token']}"}


def rejected(fleet: Fleet, body: dict[str, Any]) -> list[dict[str, Any]]:
    r = fleet.post("/v1/jobs", body)
    assert r.status_code == 422, r.text
    problems: list[dict[str, Any]] = r.json()["problems"]
    assert fleet.http.get("/v1/jobs", headers=ADMIN).json()["jobs"] == []
    return problems


def test_malformed_yaml_is_rejected_with_the_line_and_nothing_is_stored(fleet: Fleet) -> None:
    [p] = rejected(fleet, {"yaml": "name: x\nteam: [unclosed\n", "source": "bad.yaml"})
    assert p["field"].startswith("yaml (line")
    assert "To fix" in p["message"]


def test_an_unknown_field_is_named_with_its_fix(fleet: Fleet) -> None:
    problems = rejected(fleet, {"spec": {**make_spec("x", 8), "gpsu": 3}})
    assert any(p["field"] == "job.gpsu" and "spelling" in p["message"] for p in problems)


def test_nine_gpus_per_host_on_eight_gpu_hosts_can_never_run(fleet: Fleet) -> None:
    problems = rejected(fleet, {"spec": make_spec("x", 9, per_node=9)})
    messages = [p["message"] for p in problems]
    assert any("can never run" in m and "9 GPU(s)" in m for m in messages)
    assert "To fix: pool h100 has 8 GPUs per host: set per_node to 8 or less" in messages


def test_a_tensor_parallel_group_larger_than_any_island_can_never_run(fleet: Fleet) -> None:
    spec = make_spec("x", 32, parallelism={"tensor": 16}, per_node=16)
    messages = [p["message"] for p in rejected(fleet, {"spec": spec})]
    assert "To fix: pool h100 has NVLink islands of 8: lower tensor parallelism to 8" in messages


def test_a_gpu_model_the_fleet_lacks_is_named_with_the_models_it_has(fleet: Fleet) -> None:
    [p] = rejected(fleet, {"spec": {**make_spec("x", 8), "gpus": "8xA100"}})
    assert p["field"] == "job.gpus" and "use one of H100-80GB" in p["message"]


def test_a_job_without_a_command_is_rejected(fleet: Fleet) -> None:
    spec = make_spec("x", 8)
    del spec["command"]
    [p] = rejected(fleet, {"spec": spec})
    assert p["field"] == "job.command" and "To fix" in p["message"]


def test_a_request_without_a_token_is_refused_with_the_fix(fleet: Fleet) -> None:
    r = fleet.http.get("/v1/jobs")
    assert r.status_code == 401 and "To fix" in r.json()["error"]


def test_a_member_submits_only_for_their_team(fleet: Fleet) -> None:
    alice = token(fleet, "alice", "member", "nlp")
    r = fleet.post("/v1/jobs", {"spec": make_spec("x", 8, team="vision")}, alice)
    assert r.status_code == 403 and "team: nlp" in r.json()["error"]


def test_a_member_sees_other_teams_work_only_in_aggregate(fleet: Fleet) -> None:
    theirs = fleet.submit(make_spec("theirs", 16, team="vision"))
    alice = token(fleet, "alice", "member", "nlp")
    mine = fleet.submit(make_spec("mine", 8, team="nlp"), alice)
    listed = fleet.http.get("/v1/jobs", headers=alice).json()
    assert [j["id"] for j in listed["jobs"]] == [mine]
    assert listed["others"] == [{"team": "vision", "pending": 0, "running": 1, "gpus": 16}]
    r = fleet.http.get(f"/v1/jobs/{theirs}", headers=alice)
    assert r.status_code == 403 and "aggregate" in r.json()["error"]
    assert fleet.post(f"/v1/jobs/{theirs}/cancel", {}, alice).status_code == 403


def test_a_viewer_reads_everything_and_changes_nothing(fleet: Fleet) -> None:
    job = fleet.submit(make_spec("x", 8))
    viewer = token(fleet, "finance", "viewer")
    assert fleet.http.get(f"/v1/jobs/{job}", headers=viewer).status_code == 200
    assert fleet.post(f"/v1/jobs/{job}/cancel", {}, viewer).status_code == 403
    assert fleet.post("/v1/jobs", {"spec": make_spec("y", 8)}, viewer).status_code == 403


def test_an_agent_token_cannot_use_the_job_api(fleet: Fleet) -> None:
    from control_kit import AGENT

    assert fleet.http.get("/v1/jobs", headers=AGENT).status_code == 403


def test_only_agent_and_admin_tokens_may_speak_the_agent_protocol(fleet: Fleet) -> None:
    alice = token(fleet, "alice", "member", "nlp")
    node = fleet.nodes["host-0"]
    calls = [
        ("post", "/v1/agents/register", {"inventory": node.inventory(), "running": []}),
        ("post", "/v1/agents/host-0/heartbeat", {"session": node.session}),
        ("post", "/v1/agents/host-0/report", {"session": node.session}),
        ("get", "/v1/agents/host-0/desired", None),
    ]
    for method, path, body in calls:
        anonymous = fleet.http.request(method, path, json=body)
        assert anonymous.status_code == 401 and "To fix" in anonymous.json()["error"], path
        member = fleet.http.request(method, path, json=body, headers=alice)
        assert member.status_code == 403 and "needs admin or agent" in member.json()["error"]
    assert fleet.nodes["host-0"].heartbeat() == 200


def test_a_silent_node_turns_suspect_then_dead_and_its_job_requeues(fleet: Fleet) -> None:
    job = fleet.submit(make_spec("train", 16))
    fleet.start_everything()
    quiet = "host-0"
    for step in (4.0, 4.0):
        fleet.clock.advance(step)
        for name, node in fleet.nodes.items():
            if name != quiet:
                node.heartbeat()
        fleet.settle()
    states = {
        n["name"]: n["state"] for n in fleet.http.get("/v1/nodes", headers=ADMIN).json()["nodes"]
    }
    assert states[quiet] == "suspect" and fleet.job(job).state == "running"
    fleet.clock.advance(10.0)
    for name, node in fleet.nodes.items():
        if name != quiet:
            node.heartbeat()
    fleet.settle()
    lost = fleet.job(job)
    assert lost.state in ("requeued", "scheduled")
    assert any(e.kind == "lost" for e in lost.events)
    assert fleet.nodes[quiet].heartbeat() == 409


def test_a_node_that_registers_again_is_told_to_stop_what_the_server_moved_past(
    fleet: Fleet,
) -> None:
    job = fleet.submit(make_spec("train", 8))
    fleet.start_everything()
    node = fleet.nodes["host-0"]
    [rep] = node.to_run()
    stale = {"replica": rep.replica, "job": job, "epoch": rep.epoch + 5, "state": "running"}
    current = {"replica": rep.replica, "job": job, "epoch": rep.epoch, "state": "running"}
    assert node.register([current])["stop"] == []
    assert node.register([stale])["stop"] == [rep.replica]


def test_the_migrations_build_exactly_the_schema_the_code_expects(tmp_path: Path) -> None:
    db = Database(f"sqlite:///{tmp_path / 'm.db'}")
    db.migrate()
    with db.engine.connect() as c:
        diff = compare_metadata(MigrationContext.configure(c), Base.metadata)
    db.close()
    assert diff == []


def test_input_with_a_lone_surrogate_is_refused_naming_it_not_a_server_error(
    tmp_path: Path,
) -> None:
    body = '{"spec": {"name": "a\\ud800", "team": "x", "gpus": 1, "command": ["a"]}}'
    with Fleet(tmp_path, hosts=1) as fleet:
        r = fleet.http.post(
            "/v1/jobs", content=body, headers={**ADMIN, "content-type": "application/json"}
        )
    assert r.status_code == 422
    [problem] = r.json()["problems"]
    assert problem["field"] == "job.name" and problem["value"] == "a\ud800"


def test_a_method_a_path_lacks_is_refused_with_every_method_it_has(fleet: Fleet) -> None:
    r = fleet.http.put("/v1/jobs", headers=ADMIN)
    assert r.status_code == 405
    assert r.headers["allow"] == "GET, POST"
    assert r.json()["error"] == "Method Not Allowed"


def test_an_overlong_idempotency_key_header_is_named_and_nothing_is_stored(fleet: Fleet) -> None:
    headers = {**ADMIN, "Idempotency-Key": "k" * 201}
    r = fleet.http.post("/v1/jobs", json={"spec": make_spec("x", 8)}, headers=headers)
    assert r.status_code == 422, r.text
    [p] = r.json()["problems"]
    assert p["field"] == "header.Idempotency-Key"
    assert "To fix" in p["message"]
    assert fleet.http.get("/v1/jobs", headers=ADMIN).json()["jobs"] == []


def test_submit_replies_and_its_schema_say_the_same(fleet: Fleet) -> None:
    r = fleet.post("/v1/jobs", {"spec": make_spec("x", 8)})
    assert r.status_code == 201 and r.headers["content-type"] == "application/json"
    SubmitReply.model_validate(r.json())
    operation = fleet.http.get("/openapi.json").json()["paths"]["/v1/jobs"]["post"]
    schema = operation["responses"]["201"]["content"]["application/json"]["schema"]
    assert schema == {"$ref": "#/components/schemas/SubmitReply"}
    assert {"name": "Idempotency-Key", "in": "header"}.items() <= operation["parameters"][0].items()

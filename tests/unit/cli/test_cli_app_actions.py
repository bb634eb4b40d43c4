"""The ``bolt`` commands that change things (``submit``, ``cancel``, ``nodes cordon|drain|
uncordon|reclaim``, ``token create``, ``artifacts --out``) run as a user types them against
the real server app in-process (see cli_app_kit), each test on a fresh two-rack fleet: what
each says it did, what the server then holds, ``--json`` replies, and bad input exiting 2
with the field and the fix."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cli_app_kit import Connections, clean_exit, serve_cli
from control_kit import AGENT, Fleet, make_spec
from s3_kit import S3
from typer.testing import CliRunner, Result

import boltforge.cli.remote as remote
from boltforge.cli.main import app
from boltforge.control.jobs.artifacts import DirectoryStore
from boltforge.control.nodes.agents import LeaseTerms
from boltforge.wire.jobs import JobDetail, NodeList, SubmitReply, TokenReply
from boltforge.wire.reclaim import ReclaimReply

runner = CliRunner()
DAY = 86400.0
SPEC = "name: probe\nteam: research\ngpus: 8\ncommand: [python, train.py]\n"


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    """Two 8-GPU hosts in one rack, whose leases outlast the test."""
    f = Fleet(tmp_path / "fleet", hosts=2, terms=LeaseTerms(2.0, DAY, DAY))
    f.clock.now = time.time()
    with f:
        yield f


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The admin token in BOLT_TOKEN, no other BOLT_* variable or saved config."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.delenv("BOLT_SERVER", raising=False)
    monkeypatch.delenv("BOLT_CA", raising=False)
    monkeypatch.setenv("BOLT_TOKEN", "adm")
    monkeypatch.setenv("COLUMNS", "100")


@pytest.fixture
def served(env: None, fleet: Fleet, monkeypatch: pytest.MonkeyPatch) -> Connections:
    return serve_cli(fleet, monkeypatch)


@pytest.fixture(scope="module")
def quiet_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """One fleet for the tests that change nothing another test looks at: refusals, and
    tokens of names no other test uses."""
    f = Fleet(tmp_path_factory.mktemp("quiet"), hosts=2, terms=LeaseTerms(2.0, DAY, DAY))
    f.clock.now = time.time()
    with f:
        yield f


@pytest.fixture
def shared(env: None, quiet_fleet: Fleet, monkeypatch: pytest.MonkeyPatch) -> Fleet:
    serve_cli(quiet_fleet, monkeypatch)
    return quiet_fleet


@pytest.fixture
def serverless(env: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """No server at all: a command that tries to connect fails the test."""

    def client(*_: object, **__: object) -> None:
        raise AssertionError("the command must refuse the input before connecting")

    monkeypatch.setattr(remote, "Client", client)


def bolt(*args: str | Path) -> Result:
    return runner.invoke(app, [str(a) for a in args])


def as_json(result: Result) -> Any:
    clean_exit(result, 0)
    return json.loads(result.stdout)


def spec_file(tmp_path: Path, text: str = SPEC, name: str = "job.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def running(fleet: Fleet, spec: dict[str, Any]) -> str:
    """Submit ``spec`` straight to the API and start its replicas; its id."""
    job = fleet.submit(spec)
    fleet.start_everything()
    assert fleet.job(job).state == "running"
    return job


def node_states(fleet: Fleet) -> dict[str, str]:
    r = fleet.http.get("/v1/nodes", headers={"Authorization": "Bearer adm"})
    return {n.name: n.state for n in NodeList.model_validate(r.json()).nodes}


# --- submit -----------------------------------------------------------------------------------


def test_submit_prints_the_job_it_made_and_the_server_queues_it(
    fleet: Fleet, served: Connections, tmp_path: Path
) -> None:
    result = bolt("submit", spec_file(tmp_path))
    clean_exit(result, 0)
    assert result.stdout == "submitted job 1 (probe, 8 GPU(s))\n"
    fleet.settle()
    detail = fleet.job("1")
    assert (detail.name, detail.team, detail.gpus) == ("probe", "research", 8)
    assert detail.state in ("scheduled", "running") and detail.nodes


def test_submit_json_is_the_servers_reply(
    fleet: Fleet, served: Connections, tmp_path: Path
) -> None:
    data = as_json(bolt("submit", spec_file(tmp_path), "--json"))
    assert set(data) == {"job", "tasks", "created", "warnings"}
    reply = SubmitReply.model_validate(data)
    assert (reply.job.name, reply.created, reply.tasks) == ("probe", True, [])


def test_a_retry_with_the_same_idempotency_key_returns_the_job_already_made(
    fleet: Fleet, served: Connections, tmp_path: Path
) -> None:
    path = spec_file(tmp_path)
    first = as_json(bolt("submit", path, "--json", "--idempotency-key", "k-1"))
    again = bolt("submit", path, "--idempotency-key", "k-1")
    clean_exit(again, 0)
    job = first["job"]["id"]
    assert again.stdout == (
        f"submitted job {job} (probe, 8 GPU(s)) (already submitted with this idempotency key)\n"
    )
    r = fleet.http.get("/v1/jobs", headers={"Authorization": "Bearer adm"})
    assert [j["id"] for j in r.json()["jobs"]] == [job]


def test_the_command_line_overrides_reach_the_job(
    fleet: Fleet, served: Connections, tmp_path: Path
) -> None:
    args = ("--gpus", "16", "--priority", "high", "--team", "nlp")
    reply = SubmitReply.model_validate(
        as_json(bolt("submit", spec_file(tmp_path), "--json", *args))
    )
    detail = fleet.job(reply.job.id)
    assert (detail.gpus, detail.priority_name, detail.team) == (16, "high", "nlp")


def test_an_array_submission_names_its_tasks_and_queue_folds_them(
    fleet: Fleet, served: Connections, tmp_path: Path
) -> None:
    running(fleet, make_spec("hog", 16))  # the whole fleet: every task waits
    result = bolt("submit", spec_file(tmp_path), "--array", "0-2")
    clean_exit(result, 0)
    assert result.stdout == "submitted array job 2: 3 task(s) 2_[0-2] of 8 GPU(s) each\n"
    queue = bolt("queue")
    clean_exit(queue, 0)
    ids = [line.split()[0] for line in queue.stdout.splitlines()[1:]]
    assert ids == ["1", "2_[0-2]"]


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("name: x\ngpus: 8\ncommand: [true]\n", "job.team"),
        ("name: x\nteam: t\ngpus: 8\ncommand: [true]\ncolour: blue\n", "colour"),
        ("name: x\nteam: t\ngpus: [\n", "line"),
    ],
    ids=["missing team", "unknown field", "broken yaml"],
)
def test_a_spec_the_server_refuses_exits_2_naming_each_problem(
    shared: Fleet, tmp_path: Path, text: str, says: str
) -> None:
    result = bolt("submit", spec_file(tmp_path, text))
    clean_exit(result, 2)
    assert result.stdout == ""
    head, *problems = result.stderr.strip().splitlines()
    assert head.startswith("error job.yaml: ") and head.endswith("problem(s)")
    assert problems and all(p.startswith("  - ") for p in problems)
    assert says in result.stderr
    assert shared.http.get("/v1/jobs", headers={"Authorization": "Bearer adm"}).json()["jobs"] == []


def test_a_bad_priority_override_exits_2_naming_priority(shared: Fleet, tmp_path: Path) -> None:
    result = bolt("submit", spec_file(tmp_path), "--priority", "urgent")
    clean_exit(result, 2)
    assert "priority" in result.stderr and "urgent" in result.stderr


def test_a_viewer_may_not_submit(shared: Fleet, tmp_path: Path) -> None:
    made = TokenReply.model_validate(
        as_json(bolt("token", "create", "vic", "--role", "viewer", "--json"))
    )
    result = bolt("submit", spec_file(tmp_path), "--token", made.token)
    clean_exit(result, 1)
    assert "error (403)" in result.stderr


# --- cancel -----------------------------------------------------------------------------------


def test_cancel_a_running_job_then_again_says_it_had_ended(
    fleet: Fleet, served: Connections
) -> None:
    job = running(fleet, make_spec("train", 16))
    first = bolt("cancel", job)
    clean_exit(first, 0)
    assert first.stdout == f"job {job} cancelled\n"
    assert fleet.job(job).state == "cancelled"
    again = bolt("cancel", job)
    clean_exit(again, 0)
    assert again.stdout == f"job {job} had already ended: cancelled\n"


def test_cancel_an_array_id_cancels_every_live_task(
    fleet: Fleet, served: Connections, tmp_path: Path
) -> None:
    reply = SubmitReply.model_validate(
        as_json(bolt("submit", spec_file(tmp_path), "--array", "0-3", "--json"))
    )
    array_id = reply.tasks[0].partition("_")[0]
    result = bolt("cancel", array_id)
    clean_exit(result, 0)
    assert result.stdout == f"cancelled 4 task(s) of array job {array_id}\n"
    assert {fleet.job(t).state for t in reply.tasks} == {"cancelled"}


# --- nodes ------------------------------------------------------------------------------------


def test_cordon_and_uncordon_with_the_token_given_before_the_subcommand(
    fleet: Fleet, served: Connections, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("BOLT_TOKEN")
    cordoned = bolt("nodes", "--token", "adm", "cordon", "host-1")
    clean_exit(cordoned, 0)
    assert cordoned.stdout == (
        "node host-1 cordoned: nothing new lands there; no jobs keep running\n"
    )
    assert node_states(fleet)["host-1"] == "cordoned"
    back = bolt("nodes", "--token", "adm", "uncordon", "host-1")
    clean_exit(back, 0)
    assert back.stdout == "node host-1 back in service (ready)\n"
    assert node_states(fleet)["host-1"] == "ready"


def test_cordon_says_the_jobs_on_the_node_keep_running(fleet: Fleet, served: Connections) -> None:
    job = running(fleet, make_spec("train", 16))
    result = bolt("nodes", "cordon", "host-0")
    clean_exit(result, 0)
    assert "1 job(s) keep running" in result.stdout
    assert fleet.job(job).state == "running"


def test_drain_asks_the_jobs_on_the_node_to_move(fleet: Fleet, served: Connections) -> None:
    job = running(fleet, make_spec("train", 16))
    data = as_json(bolt("nodes", "drain", "host-0", "--json"))
    assert (data["name"], data["state"], data["jobs"]) == ("host-0", "draining", [job])
    text = bolt("nodes", "drain", "host-1")
    clean_exit(text, 0)
    assert text.stdout == "node host-1 draining: 1 job(s) checkpointing to move elsewhere\n"
    fleet.settle()
    assert {r.job for n in fleet.nodes.values() for r in n.to_stop()} == {job}


@pytest.mark.parametrize("verb", ["cordon", "drain", "uncordon"])
def test_a_node_that_does_not_exist_exits_1_with_the_fix(shared: Fleet, verb: str) -> None:
    result = bolt("nodes", verb, "host-9")
    clean_exit(result, 1)
    assert "no node host-9. To fix: check the name with `bolt nodes`" in result.stderr


def test_reclaim_cordons_the_node_and_gives_each_job_its_grace(
    fleet: Fleet, served: Connections
) -> None:
    job = running(fleet, make_spec("train", 16))
    result = bolt("nodes", "reclaim", "host-0", "--in", "2m")
    clean_exit(result, 0)
    head, *jobs = result.stdout.splitlines()
    assert head.startswith("node host-0 is reclaimed in 2 min (at ")
    assert head.endswith("): cordoned; 1 job(s) asked to checkpoint now and move off")
    assert jobs == [f"  {job}  checkpoint within 2 min"]
    assert node_states(fleet)["host-0"] == "draining"


def test_reclaim_json_is_the_servers_reply(fleet: Fleet, served: Connections) -> None:
    before = fleet.clock()
    data = as_json(bolt("nodes", "reclaim", "host-1", "--in", "90", "--json"))
    assert set(data) == {"node", "reclaim_at", "jobs"}
    reply = ReclaimReply.model_validate(data)
    assert reply.node.name == "host-1" and reply.jobs == []
    assert reply.reclaim_at == pytest.approx(before + 90)


def test_reclaim_of_an_idle_node_has_no_jobs_to_move(served: Connections) -> None:
    result = bolt("nodes", "reclaim", "host-1", "--in", "30s")
    clean_exit(result, 0)
    assert result.stdout.rstrip().endswith(": cordoned; no jobs to move")


@pytest.mark.parametrize("given", ["soon", "-5", "2 fortnights"])
def test_reclaim_with_a_bad_duration_exits_2_before_asking_the_server(
    serverless: None, given: str
) -> None:
    result = bolt("nodes", "reclaim", "host-0", "--in", given)
    clean_exit(result, 2)
    assert result.stderr.startswith("error --in ")
    assert "To fix: pass a duration such as 120s or 2m" in result.stderr


def test_reclaim_further_off_than_a_day_is_refused_naming_in_s(shared: Fleet) -> None:
    result = bolt("nodes", "reclaim", "host-0", "--in", "2d")
    clean_exit(result, 2)
    assert result.stderr.splitlines()[0] == "error reclaim: 1 problem(s)"
    assert "  - in_s: " in result.stderr and "(got 172800.0)" in result.stderr
    assert node_states(shared)["host-0"] == "ready"


def test_reclaim_needs_its_in_option(serverless: None) -> None:
    result = bolt("nodes", "reclaim", "host-0")
    clean_exit(result, 2)
    assert "--in" in result.stderr


# --- tokens -----------------------------------------------------------------------------------


def test_token_create_shows_the_token_once_and_it_works(shared: Fleet) -> None:
    result = bolt("token", "create", "alice", "--team", "nlp")
    clean_exit(result, 0)
    head, secret = result.stdout.splitlines()
    assert head == "member token for alice for team nlp (shown once):"
    listing = bolt("queue", "--json", "--token", secret)
    clean_exit(listing, 0)
    who = shared.http.get("/v1/whoami", headers={"Authorization": f"Bearer {secret}"}).json()
    assert (who["name"], who["role"], who["team"]) == ("alice", "member", "nlp")


@pytest.mark.parametrize("role", ["viewer", "agent", "admin"])
def test_token_create_json_has_the_documented_keys(shared: Fleet, role: str) -> None:
    data = as_json(bolt("token", "create", f"{role}-1", "--role", role, "--json"))
    assert set(data) == {"name", "role", "team", "token", "id", "nodes", "expires_at"}
    assert (data["name"], data["role"], data["team"]) == (f"{role}-1", role, None)
    assert data["token"]


def test_a_member_token_needs_a_team(serverless: None) -> None:
    result = bolt("token", "create", "alice")
    clean_exit(result, 2)
    assert result.stderr.strip() == "error a member token needs a team. To fix: add --team T"


def test_a_bad_token_name_is_refused_before_sending(serverless: None) -> None:
    result = bolt("token", "create", "alice smith", "--role", "viewer")
    clean_exit(result, 2)
    assert result.stderr.startswith("error name: ") and "'alice smith'" in result.stderr


def test_an_unknown_role_is_a_usage_error(serverless: None) -> None:
    result = bolt("token", "create", "alice", "--role", "owner")
    clean_exit(result, 2)
    assert "'owner' is not one of" in result.stderr


def test_only_an_admin_may_create_tokens(shared: Fleet) -> None:
    viewer = TokenReply.model_validate(
        as_json(bolt("token", "create", "val", "--role", "viewer", "--json"))
    )
    result = bolt("token", "create", "eve", "--role", "admin", "--token", viewer.token)
    clean_exit(result, 1)
    assert "error (403)" in result.stderr


# --- artifacts --------------------------------------------------------------------------------


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def with_artifacts(fleet: Fleet, files: dict[str, bytes]) -> str:
    """A job that ran one replica, whose node uploaded ``files`` (path -> bytes)."""
    job = fleet.submit(make_spec("train", 8))
    [(node, rep)] = [(n.name, r) for n in fleet.nodes.values() for r in n.to_run()]
    for path, data in files.items():
        url = f"/v1/agents/{node}/artifacts/{rep.replica}/{path}"
        r = fleet.http.put(url, content=data, headers={**AGENT, "X-Sha256": sha(data)})
        assert r.status_code == 201, r.text
    return job


FILES = {"out/model.bin": b"weights" * 300, "metrics.json": b'{"loss": 0.1}'}


def test_artifacts_lists_each_with_its_size_and_hash(fleet: Fleet, served: Connections) -> None:
    job = with_artifacts(fleet, FILES)
    result = bolt("artifacts", job)
    clean_exit(result, 0)
    lines = result.stdout.splitlines()
    assert lines[0] == f"job {job}: 2 artifact(s)"
    rows = {line.split()[0]: line.split() for line in lines[2:]}
    assert set(rows) == {"0/out/model.bin", "0/metrics.json"}
    assert rows["0/out/model.bin"][1:3] == ["2.1", "KiB"]
    assert rows["0/metrics.json"][1:4] == ["13", "B", sha(FILES["metrics.json"])[:12]]


def test_artifacts_out_downloads_every_file_by_rank(
    fleet: Fleet, served: Connections, tmp_path: Path
) -> None:
    job = with_artifacts(fleet, FILES)
    out = tmp_path / "got"
    result = bolt("artifacts", job, "--out", out)
    clean_exit(result, 0)
    assert result.stdout.splitlines()[0] == f"job {job}: 2 artifact(s) downloaded to {out}"
    for path, data in FILES.items():
        assert (out / "0" / path).read_bytes() == data
    assert not list(out.rglob("*.part"))


def test_a_download_that_does_not_match_its_hash_is_not_kept(
    fleet: Fleet, served: Connections, tmp_path: Path
) -> None:
    job = with_artifacts(fleet, FILES)
    assert isinstance(fleet.rt.artifacts, DirectoryStore)
    [stored] = [p for p in fleet.rt.artifacts.root.rglob("model.bin") if p.is_file()]
    stored.write_bytes(b"bit rot")  # the disk under the server went bad
    out = tmp_path / "got"
    data = bolt("artifacts", job, "--out", out, "--json")
    clean_exit(data, 1)
    shown = json.loads(data.stdout)
    assert shown["mismatched"] == ["0/out/model.bin"]
    assert "sha256 mismatch, not kept: 0/out/model.bin. To fix: download again" in data.stderr
    assert not (out / "0" / "out" / "model.bin").exists()
    assert (out / "0" / "metrics.json").read_bytes() == FILES["metrics.json"]
    assert not list(out.rglob("*.part"))


def test_artifacts_kept_in_a_bucket_download_checked_by_their_sha256(
    s3: S3, env: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    url = f"s3://{s3.bucket}/bolt"
    fleet = Fleet(
        tmp_path / "fleet",
        hosts=2,
        terms=LeaseTerms(2.0, DAY, DAY),
        artifacts_url=url,
        artifacts_endpoint=s3.endpoint,
    )
    fleet.clock.now = time.time()
    with fleet:
        serve_cli(fleet, monkeypatch)
        job = with_artifacts(fleet, FILES)
        out = tmp_path / "got"
        clean_exit(bolt("artifacts", job, "--out", out), 0)
        for path, data in FILES.items():
            assert (out / "0" / path).read_bytes() == data
        key = f"bolt/{job}/files/0/out/model.bin"
        s3.client.put_object(Bucket=s3.bucket, Key=key, Body=b"bit rot")  # the bucket went bad
        again = bolt("artifacts", job, "--out", tmp_path / "again")
        clean_exit(again, 1)
        assert "sha256 mismatch, not kept: 0/out/model.bin" in again.stderr


def test_artifacts_json_carries_each_artifacts_record(fleet: Fleet, served: Connections) -> None:
    job = with_artifacts(fleet, FILES)
    data = as_json(bolt("artifacts", job, "--json"))
    assert set(data) == {"job", "artifacts", "mismatched"} and data["mismatched"] == []
    named = {a["name"]: a for a in data["artifacts"]}
    assert named["0/metrics.json"]["sha256"] == sha(FILES["metrics.json"])
    assert named["0/out/model.bin"]["size"] == len(FILES["out/model.bin"])


def test_status_after_submit_through_the_cli_agrees_with_the_server(
    fleet: Fleet, served: Connections, tmp_path: Path
) -> None:
    reply = SubmitReply.model_validate(as_json(bolt("submit", spec_file(tmp_path), "--json")))
    fleet.start_everything()
    shown = JobDetail.model_validate(as_json(bolt("status", reply.job.id, "--json")))
    assert shown == fleet.job(reply.job.id)

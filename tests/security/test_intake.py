"""What the server accepts, and how it answers what it refuses: every bound of intake, the
caller checked before a body is read, the body's size, the store's file modes and the
security headers. Each refusal is a 4xx naming the field and the fix, and leaves nothing
stored; a job the scheduler cannot order is set aside without failing the pass for others."""

from __future__ import annotations

import asyncio
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from control_kit import ADMIN, AGENT, Fleet, make_spec
from fastapi import FastAPI
from sqlalchemy import func, select
from typer.testing import CliRunner

from boltforge.cli.main import app as cli
from boltforge.control.api.bodies import too_deep
from boltforge.control.store.backups import backup
from boltforge.control.store.db import Database
from boltforge.control.store.models import JobRow
from boltforge.spec.bounds import MAX_COMMAND_BYTES, MAX_ENV_BYTES, MAX_ENV_VALUE

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    with Fleet(tmp_path, hosts=2) as f:
        yield f


def submit(fleet: Fleet, body: dict[str, Any]) -> Any:
    return fleet.http.post("/v1/jobs", json=body, headers=ADMIN)


def refused(reply: Any, status: int, field: str) -> str:
    """Assert ``reply`` is a refusal with ``status`` whose first problem names ``field`` and
    ends with a fix; its message."""
    assert reply.status_code == status, reply.text
    problems = reply.json()["problems"]
    assert problems, reply.text
    assert problems[0]["field"].startswith(field), problems
    message: str = problems[0]["message"]
    assert "To fix:" in message, message
    return message


def stored_jobs(fleet: Fleet) -> int:
    with fleet.rt.db.session() as s:
        return int(s.scalar(select(func.count()).select_from(JobRow)) or 0)


# --- finding 3: one member stops scheduling for everyone ------------------------------------


def test_a_deadline_in_year_one_is_refused_naming_the_field(fleet: Fleet) -> None:
    reply = submit(fleet, {"spec": make_spec("late", 8, deadline="0001-01-01")})
    assert "2000-01-01" in refused(reply, 422, "job.deadline")
    assert stored_jobs(fleet) == 0


def test_a_stored_job_the_core_cannot_order_is_set_aside_and_others_still_start(
    fleet: Fleet,
) -> None:
    blocker = fleet.submit(make_spec("blocker", 16))
    fleet.start_everything()
    bad = fleet.submit(make_spec("old", 8, deadline="2030-01-01"))
    good = fleet.submit(make_spec("fine", 8))
    with fleet.rt.db.session() as s:  # as an older version, or a hand edit, could leave it
        row = s.get(JobRow, bad)
        assert row is not None
        row.spec = {**row.spec, "deadline": "0001-01-01T00:00:00"}
    fleet.rt.scheduler.caches.jobs.clear()  # as after a restart: every job is built afresh
    fleet.finish(blocker)
    assert fleet.job(good).state == "scheduled"
    assert fleet.job(bad).state == "pending"
    waiting = " ".join(fleet.job(bad).waiting)
    assert "deadline" in waiting and "To fix:" in waiting, waiting


# --- finding 4: a small request that unfolds into a large one --------------------------------


def test_yaml_aliases_are_refused_before_they_unfold(fleet: Fleet) -> None:
    keys = "\n".join(f"  K{i}: *big" for i in range(1, 200))
    text = (
        "name: bomb\nteam: research\ngpus: 8\ncommand: [x]\n"
        f"env:\n  K0: &big {'a' * 1000}\n{keys}\n"
    )
    message = refused(submit(fleet, {"yaml": text}), 422, "yaml (line")
    assert "alias" in message
    assert stored_jobs(fleet) == 0


@pytest.mark.parametrize("path", ["/v1/jobs", "/v1/services"])
def test_yaml_with_a_character_yaml_forbids_is_a_422(fleet: Fleet, path: str) -> None:
    reply = fleet.http.post(path, json={"yaml": "(\x8fX"}, headers=ADMIN)
    assert "special characters" in refused(reply, 422, "yaml")


def test_service_yaml_goes_through_the_same_loader(fleet: Fleet) -> None:
    text = "kind: service\nname: s\nteam: research\ngpus: 1\ncommand: &c [x]\nimage: *c\n"
    reply = fleet.http.post("/v1/services", json={"yaml": text}, headers=ADMIN)
    assert "alias" in refused(reply, 422, "yaml (line")


@pytest.mark.parametrize(
    ("name", "text", "expected"),
    [
        ("job.yaml", "name: x\nteam: t\ngpus: &n 8\nper_node: *n\n", "alias"),
        ("job.yaml", "name: x\nteam: t\ngpus: 8\nenv: {'A;B': '1'}\n", "job.env"),
        ("fleet.yaml", "pools: " + "[" * 50_000 + "]" * 50_000 + "\n", "deeper"),
    ],
    ids=["alias", "env-key", "deep-fleet"],
)
def test_the_cli_refuses_the_same_files_with_exit_2_and_no_traceback(
    tmp_path: Path, name: str, text: str, expected: str
) -> None:
    file = tmp_path / name
    file.write_text(text)
    fleet = file if name == "fleet.yaml" else EXAMPLES / "fleets" / "lab.yaml"
    job = file if name == "job.yaml" else EXAMPLES / "jobs" / "rlhf.yaml"
    result = CliRunner().invoke(cli, ["place", "--fleet", str(fleet), "--job", str(job)])
    assert result.exit_code == 2, result.output
    assert expected in result.stderr and "To fix" in result.stderr
    assert "Traceback" not in result.output


@pytest.mark.parametrize(
    "extra",
    [
        {"env": {f"K{i}": "v" for i in range(600)}},
        {"env": {"BIG": "x" * (MAX_ENV_VALUE + 1)}},
        {"env": {f"K{i}": "x" * MAX_ENV_VALUE for i in range(MAX_ENV_BYTES // MAX_ENV_VALUE + 1)}},
        {"command": ["python", "x" * MAX_COMMAND_BYTES]},
        {"command": ["a"] * 5000},
    ],
    ids=["env-count", "env-value", "env-total", "command-bytes", "command-args"],
)
def test_oversize_env_and_command_are_refused(fleet: Fleet, extra: dict[str, Any]) -> None:
    field = "job." + next(iter(extra))
    refused(submit(fleet, {"spec": make_spec("big", 8, **extra)}), 422, field)
    assert stored_jobs(fleet) == 0


def test_a_spec_at_every_size_limit_fits_the_default_body_limit(fleet: Fleet) -> None:
    env = {f"K{i}": "x" * (MAX_ENV_VALUE - 16) for i in range(MAX_ENV_BYTES // MAX_ENV_VALUE)}
    command = ["python", "x" * (MAX_COMMAND_BYTES - 16)]
    reply = submit(fleet, {"spec": make_spec("full", 8, env=env, command=command)})
    assert reply.status_code == 201, reply.text


# --- finding 5: 500s where a 422 belongs; env keys that are shell code ----------------------


def test_fifty_thousand_deep_yaml_is_a_422(fleet: Fleet) -> None:
    text = "name: deep\nteam: research\ngpus: 8\ncommand: " + "[" * 50_000 + "]" * 50_000
    assert "deeper" in refused(submit(fleet, {"yaml": text}), 422, "yaml (line")


def test_fifty_thousand_deep_json_is_a_422_naming_the_body(fleet: Fleet) -> None:
    raw = b'{"spec": ' + b"[" * 50_000 + b"]" * 50_000 + b"}"
    headers = {**ADMIN, "Content-Type": "application/json"}
    reply = fleet.http.post("/v1/jobs", content=raw, headers=headers)
    assert "deeper" in refused(reply, 422, "body")


@pytest.mark.parametrize(
    ("body", "deep"),
    [
        (b"[[[", True),
        (b'["[[[["]', False),  # brackets in a string are text
        (b'[["\\"[[[[["]]', False),  # so are those after an escaped quote
        (b'[["[[[[[', False),  # a string left open runs to the end
    ],
)
def test_json_depth_counts_only_the_brackets_outside_strings(body: bytes, deep: bool) -> None:
    assert too_deep(body, 2) is deep


def test_a_quintillion_gpus_is_a_422(fleet: Fleet) -> None:
    assert "at most" in refused(submit(fleet, {"spec": make_spec("huge", 10**30)}), 422, "job.gpus")
    refused(submit(fleet, {"spec": make_spec("huge", 8), "gpus": str(10**30)}), 422, "job.gpus")


def test_an_array_beyond_the_stores_integers_is_a_422(fleet: Fleet) -> None:
    body = {"spec": make_spec("arr", 8), "array": f"{2**63}-{2**63 + 1}"}
    refused(submit(fleet, body), 422, "array")
    assert stored_jobs(fleet) == 0


@pytest.mark.parametrize("key", ["X=1; touch pwned; Y", "1ABC", "A B", "A-B", ""])
def test_env_keys_must_be_posix_names(fleet: Fleet, key: str) -> None:
    reply = submit(fleet, {"spec": make_spec("env", 8, env={key: "1"})})
    assert "variable name" in refused(reply, 422, "job.env")


def test_an_integer_field_past_what_the_fleet_can_mean_is_a_422(fleet: Fleet) -> None:
    spec = make_spec("pp", 8, parallelism={"pipeline": 10**30})
    refused(submit(fleet, {"spec": spec}), 422, "job.parallelism.pipeline")


def test_numbers_an_agent_reports_past_the_stores_integers_are_a_422(fleet: Fleet) -> None:
    node = fleet.nodes["host-0"]
    step = {"replica": "1-r0", "job": "1", "epoch": 0, "rank": 0, "step": 10**30, "at": 0.0}
    body = {"session": node.session, "progress": [step]}
    reply = fleet.http.post("/v1/agents/host-0/report", json=body, headers=AGENT)
    refused(reply, 422, "progress.0.step")


def test_a_gateways_infinite_load_is_a_422(fleet: Fleet) -> None:
    raw = b'{"requests_per_s": Infinity}'
    headers = {**ADMIN, "Content-Type": "application/json"}
    reply = fleet.http.post("/v1/services/s/load", content=raw, headers=headers)
    refused(reply, 422, "requests_per_s")


# --- finding 6: the caller after the body; no size limit; file modes; headers ---------------


class Probe:
    """A raw ASGI request to ``app``: its body comes in ``chunks`` without a Content-Length
    (unless ``length`` is given) and ``pulled`` counts how many of them the server read."""

    def __init__(self, app: FastAPI, headers: dict[str, str], chunks: int, size: int) -> None:
        self.app, self.chunks, self.size = app, chunks, size
        self.headers = [(k.lower().encode(), v.encode()) for k, v in headers.items()]
        self.pulled = 0
        self.status = 0
        self.reply = b""

    async def _receive(self) -> dict[str, Any]:
        self.pulled += 1
        more = self.pulled < self.chunks
        return {"type": "http.request", "body": b"x" * self.size, "more_body": more}

    async def _send(self, message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
        elif message["type"] == "http.response.body":
            self.reply += message.get("body", b"")

    def post(self, path: str) -> Probe:
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "POST",
            "scheme": "http",
            "path": path,
            "raw_path": path.encode(),
            "query_string": b"",
            "root_path": "",
            "headers": [(b"transfer-encoding", b"chunked"), *self.headers],
            "client": ("127.0.0.1", 5000),
            "server": ("testserver", 80),
        }
        asyncio.run(self.app(scope, self._receive, self._send))  # type: ignore[arg-type]
        return self


def test_an_unauthenticated_large_body_is_answered_401_without_being_read(fleet: Fleet) -> None:
    probe = Probe(fleet.app, {}, chunks=100, size=1 << 20).post("/v1/jobs")
    assert probe.status == 401 and b"To fix" in probe.reply
    assert probe.pulled == 0
    wrong = Probe(fleet.app, {"Authorization": "Bearer nope"}, 100, 1 << 20).post("/v1/jobs")
    assert wrong.status == 401 and wrong.pulled == 0


def test_a_streamed_body_over_the_limit_is_413_and_read_no_further(fleet: Fleet) -> None:
    probe = Probe(fleet.app, ADMIN, chunks=100, size=1 << 20).post("/v1/jobs")
    assert probe.status == 413 and b"--max-body" in probe.reply
    assert probe.pulled == 3  # 3 MiB had arrived when it passed the 2 MiB limit
    assert stored_jobs(fleet) == 0


def test_a_declared_body_over_the_limit_is_413(fleet: Fleet) -> None:
    raw = b'{"spec": {}, "source": "' + b"x" * (3 << 20) + b'"}'
    headers = {**ADMIN, "Content-Type": "application/json"}
    reply = fleet.http.post("/v1/jobs", content=raw, headers=headers)
    assert reply.status_code == 413, reply.text
    assert "To fix:" in reply.json()["error"]


def test_the_limit_is_the_servers_to_set(tmp_path: Path) -> None:
    with Fleet(tmp_path, hosts=1, max_body=64 << 10) as f:
        reply = submit(
            f,
            {
                "spec": make_spec(
                    "a",
                    8,
                    env={"K": "x" * (30 << 10)} | {"L": "y" * (30 << 10)} | {"M": "z" * (10 << 10)},
                )
            },
        )
        assert reply.status_code == 413
        assert submit(f, {"spec": make_spec("a", 8)}).status_code == 201


def private(path: Path) -> bool:
    return stat.S_IMODE(path.stat().st_mode) & 0o077 == 0


def test_the_store_and_its_backups_are_the_servers_user_alone(fleet: Fleet, tmp_path: Path) -> None:
    fleet.submit(make_spec("a", 8))
    store = tmp_path / "store.db"
    for name in ("store.db", "store.db-wal", "store.db-shm"):
        assert (tmp_path / name).exists() and private(tmp_path / name), name
    target = tmp_path / "backup.jsonl.gz"
    backup(f"sqlite:///{store}", target)
    assert private(target)


def test_a_store_folder_made_for_it_is_0700_and_an_old_0644_store_is_tightened(
    tmp_path: Path,
) -> None:
    old = tmp_path / "old.db"
    old.write_bytes(b"")
    old.chmod(0o644)
    for url in (f"sqlite:///{tmp_path / 'data' / 'server.db'}", f"sqlite:///{old}"):
        db = Database(url)
        db.migrate()
        db.close()
    assert stat.S_IMODE((tmp_path / "data").stat().st_mode) == 0o700
    assert private(tmp_path / "data" / "server.db")
    assert private(old)


@pytest.mark.parametrize(
    ("path", "headers"),
    [("/console/", {}), ("/v1/whoami", ADMIN), ("/v1/whoami", {}), ("/healthz", {})],
    ids=["console", "api", "refusal", "health"],
)
def test_every_reply_carries_the_security_headers(
    fleet: Fleet, path: str, headers: dict[str, str]
) -> None:
    reply = fleet.http.get(path, headers=headers)
    policy = reply.headers["content-security-policy"]
    assert "default-src 'self'" in policy and "frame-ancestors 'none'" in policy
    assert "unsafe-inline" not in policy
    assert reply.headers["x-content-type-options"] == "nosniff"
    assert reply.headers["referrer-policy"] == "no-referrer"


def test_the_console_keeps_its_token_for_the_tab_only() -> None:
    static = Path(__file__).parents[2] / "boltforge" / "console" / "static"
    code = "\n".join(p.read_text() for p in static.glob("*.js"))
    assert "localStorage" not in code and "sessionStorage" in code
    page = (static / "index.html").read_text()
    assert "<script>" not in page and " style=" not in page  # nothing inline for the CSP

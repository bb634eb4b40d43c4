"""The deadline outlook where users look: ``GET /v1/jobs/{id}`` and ``bolt status`` /
``bolt explain`` (text and ``--json``) against the real server app in-process, with jobs
submitted as YAML; and the core's verdicts on their own."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from control_kit import ADMIN, Fleet
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from boltforge.client import Client
from boltforge.core.model.gang import Gang
from boltforge.core.model.state import Allocation, FleetState
from boltforge.core.model.workload import Job, Running
from boltforge.core.queueing.deadlines import deadline_outlook, running_outlook
from boltforge.core.queueing.runtimes import MIN_RUNS, Finished
from boltforge.testing.builders import make_fleet, make_gang
from boltforge.wire.jobs import JobDetail

HOUR = 3600.0
SLEEPS = "[python, train.py]"


def yaml_job(name: str, gpus: int, t0: float, **extra: float | str) -> str:
    """A YAML job spec; ``deadline_in`` (seconds after ``t0``) becomes its ``deadline``."""
    lines = [f"name: {name}", "team: research", f"gpus: {gpus}", f"command: {SLEEPS}"]
    for key, value in extra.items():
        if key == "deadline_in":
            at = datetime.fromtimestamp(t0 + float(value), UTC)
            lines.append(f"deadline: {at.strftime('%Y-%m-%dT%H:%M:%SZ')}")
        else:
            lines.append(f"{key}: {value}")
    return "\n".join(lines) + "\n"


def submit_yaml(fleet: Fleet, text: str) -> str:
    r = fleet.post("/v1/jobs", {"yaml": text})
    assert r.status_code == 201, r.text
    fleet.settle()
    job_id: str = r.json()["job"]["id"]
    return job_id


@pytest.fixture(scope="module")
def scene(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Fleet, dict[str, str]]]:
    """32 GPUs held for two hours by ``busy`` (due in one), and waiting behind it: ``on-time``
    (1 h of work, due in 4 h), ``late`` (1 h, due in 2.5 h), ``no-deadline`` (1 h),
    ``no-limit`` (due in 4 h, no time limit) and ``plain`` (neither)."""
    with Fleet(tmp_path_factory.mktemp("outlook")) as fleet:
        t0 = fleet.clock.now
        busy = yaml_job(
            "busy", 32, t0, per_node=8, priority="high", preemptible="false",
            time_limit="2h", deadline_in=HOUR,
        )  # fmt: skip
        ids = {"busy": submit_yaml(fleet, busy)}
        fleet.start_everything()
        waiting = {
            "on-time": yaml_job("on-time", 8, t0, time_limit="1h", deadline_in=4 * HOUR),
            "late": yaml_job("late", 8, t0, time_limit="1h", deadline_in=2.5 * HOUR),
            "no-deadline": yaml_job("no-deadline", 8, t0, time_limit="1h"),
            "no-limit": yaml_job("no-limit", 4, t0, deadline_in=4 * HOUR),
            "plain": yaml_job("plain", 4, t0),
        }
        for name, text in waiting.items():
            ids[name] = submit_yaml(fleet, text)
        yield fleet, ids


class InProcess(TestClient):
    """The app in-process, for ``Client`` (which passes a timeout the test client ignores)."""

    def request(self, *args: Any, **kw: Any) -> Any:
        kw.pop("timeout", None)
        return super().request(*args, **kw)


def bolt(fleet: Fleet, monkeypatch: pytest.MonkeyPatch, *args: str) -> str:
    """What ``bolt ARGS`` prints against ``fleet`` (as admin); it must exit 0."""
    import boltforge.cli.jobs as cli_jobs
    from boltforge.cli.main import app

    def connect(server: str | None, token: str | None) -> Client:
        client = Client("http://testserver", "unused")
        client.http.close()
        client.http = InProcess(fleet.app, headers=ADMIN)
        return client

    monkeypatch.setattr(cli_jobs, "connect", connect)
    result = CliRunner().invoke(app, list(args))
    assert result.exit_code == 0, result.output
    return result.output


def test_the_status_reply_judges_each_waiting_job_against_its_deadline(
    scene: tuple[Fleet, dict[str, str]],
) -> None:
    fleet, ids = scene
    t0 = fleet.clock.now
    on_time, late = fleet.job(ids["on-time"]), fleet.job(ids["late"])
    assert on_time.state == late.state == "pending"
    assert on_time.outlook is not None and late.outlook is not None
    assert on_time.outlook.verdict == "reachable"
    assert on_time.outlook.expected_start == t0 + 2 * HOUR  # when busy's time limit ends
    assert on_time.outlook.expected_finish == t0 + 3 * HOUR
    assert on_time.outlook.slack_s == HOUR and on_time.outlook.deadline == t0 + 4 * HOUR
    assert late.outlook.verdict == "not reachable"
    assert late.outlook.expected_finish == t0 + 3 * HOUR and late.outlook.slack_s == -HOUR / 2
    assert on_time.outlook.at == late.outlook.at == t0  # judged on the server's clock


def test_a_job_without_a_deadline_gets_no_verdict_only_its_expected_finish(
    scene: tuple[Fleet, dict[str, str]],
) -> None:
    fleet, ids = scene
    free = fleet.job(ids["no-deadline"]).outlook
    assert free is not None
    assert free.verdict is None and free.deadline is None and free.slack_s is None
    assert free.expected_finish == fleet.clock.now + 3 * HOUR
    assert fleet.job(ids["plain"]).outlook is None


def test_a_deadline_without_a_runtime_is_unknown_and_says_why(
    scene: tuple[Fleet, dict[str, str]],
) -> None:
    fleet, ids = scene
    unknown = fleet.job(ids["no-limit"]).outlook
    assert unknown is not None and unknown.verdict == "unknown"
    assert unknown.expected_start == fleet.clock.now + 2 * HOUR
    assert unknown.expected_finish is None and "time_limit" in unknown.note


def test_a_running_job_is_judged_from_its_start(scene: tuple[Fleet, dict[str, str]]) -> None:
    fleet, ids = scene
    busy = fleet.job(ids["busy"])
    assert busy.state == "running" and busy.outlook is not None
    assert busy.outlook.verdict == "not reachable"
    assert busy.outlook.expected_start == busy.started_at == fleet.clock.now
    assert busy.outlook.slack_s == -HOUR


def test_bolt_explain_prints_the_verdicts(
    scene: tuple[Fleet, dict[str, str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    fleet, ids = scene
    on_time = bolt(fleet, monkeypatch, "explain", ids["on-time"])
    assert "deadline reachable: expected start in ~2.0 h, finish in ~3.0 h; due in 4.0 h" in on_time
    assert "60 min to spare" in on_time
    late = bolt(fleet, monkeypatch, "explain", ids["late"])
    assert "deadline not reachable: expected start in ~2.0 h, finish in ~3.0 h" in late
    assert "due in 2.5 h" in late and "30 min late" in late
    unknown = bolt(fleet, monkeypatch, "explain", ids["no-limit"])
    assert (
        "deadline unknown: no runtime to judge by (the job has no time_limit, and none" in unknown
    )
    free = bolt(fleet, monkeypatch, "explain", ids["no-deadline"])
    assert "  expected start in ~2.0 h, finish in ~3.0 h\n" in free
    assert not deadline_lines(free)
    plain = bolt(fleet, monkeypatch, "explain", ids["plain"])
    assert "waiting:" in plain and "expected start" not in plain and not deadline_lines(plain)


def deadline_lines(output: str) -> list[str]:
    """The lines of ``output`` that give a deadline verdict."""
    return [line for line in output.splitlines() if line.strip().startswith("deadline")]


def test_bolt_status_prints_the_verdict_and_json_carries_it(
    scene: tuple[Fleet, dict[str, str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    fleet, ids = scene
    text = bolt(fleet, monkeypatch, "status", ids["busy"])
    assert "deadline not reachable: expected start now, finish in ~2.0 h" in text
    assert "due in 60 min" in text and "60 min late" in text
    status = JobDetail.model_validate(
        json.loads(bolt(fleet, monkeypatch, "status", "--json", ids["late"]))
    )
    assert status.outlook is not None and status.outlook.verdict == "not reachable"
    explained = json.loads(bolt(fleet, monkeypatch, "explain", "--json", ids["on-time"]))
    assert explained["outlook"]["verdict"] == "reachable"
    assert explained["outlook"]["slack_s"] == HOUR
    plain = json.loads(bolt(fleet, monkeypatch, "status", "--json", ids["plain"]))
    assert plain["outlook"] is None


def test_a_job_without_a_time_limit_expects_what_jobs_like_it_took(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once jobs of its team, name and size have succeeded, a job sent without a time limit
    gets the finish their runtimes give, and ``bolt explain`` says where it came from."""
    with Fleet(tmp_path_factory.mktemp("learned")) as fleet:
        t0 = fleet.clock.now
        submit_yaml(fleet, yaml_job("busy", 32, t0, per_node=8, time_limit="2h"))
        fleet.start_everything()
        job_id = submit_yaml(fleet, yaml_job("sweep", 8, t0))
        assert fleet.job(job_id).outlook is None  # nothing like it has finished
        done = (Finished("research", "sweep", 8, HOUR) for _ in range(MIN_RUNS))
        fleet.rt.mirror.runtimes.learn_all(done)
        outlook = fleet.job(job_id).outlook
        assert outlook is not None and outlook.verdict is None
        assert outlook.expected_start == t0 + 2 * HOUR  # when busy's time limit ends
        assert outlook.expected_finish == t0 + 3 * HOUR
        said = bolt(fleet, monkeypatch, "explain", job_id)
        assert (
            "expected start in ~2.0 h, finish in ~3.0 h (runtime learned from jobs like it)" in said
        )


# --- the core on its own ---------------------------------------------------------------------


def gang_job(gpus: int, **kw: Any) -> Job:
    gang = make_gang("j", gpus=gpus, per_node=min(8, gpus))
    return Job("j", Gang(gang.name, gang.roles, gang.topology, "team", 3), "team", 0.0, **kw)


def empty_state() -> FleetState:
    """Four empty 8-GPU hosts in two racks."""
    return FleetState(make_fleet(racks=2, hosts=2))


def test_the_core_message_counts_from_now_on_any_clock() -> None:
    state = empty_state()
    now = 1_800_000_000.0
    job = gang_job(8, time_limit=HOUR, deadline=now + 2 * HOUR)
    outlook = deadline_outlook(state, job, now)
    assert outlook.reachable is True and outlook.start == now and outlook.slack == HOUR
    assert outlook.message == (
        "deadline reachable: expected start now, finish in 60 min; due in 2.0 h, 60 min to spare"
    )
    assert "t=" not in outlook.message


def test_not_before_delays_the_start_and_can_make_it_late() -> None:
    state = empty_state()
    job = gang_job(8, time_limit=HOUR, deadline=2 * HOUR)
    assert deadline_outlook(state, job, 0.0).reachable is True
    delayed = deadline_outlook(state, job, 0.0, not_before=1.5 * HOUR)
    assert delayed.start == 1.5 * HOUR and delayed.reachable is False
    assert delayed.slack == -HOUR / 2 and "30 min late" in delayed.message


def test_a_job_that_can_never_run_is_unreachable_only_with_a_deadline() -> None:
    state = empty_state()
    too_big = gang_job(1024, time_limit=HOUR, deadline=HOUR)
    assert deadline_outlook(state, too_big, 0.0).reachable is False
    undated = deadline_outlook(state, gang_job(1024, time_limit=HOUR), 0.0)
    assert undated.reachable is None and undated.finish is None and "never" in undated.gap


def test_a_running_job_finishes_its_runtime_after_it_started() -> None:
    job = gang_job(8, time_limit=2 * HOUR, deadline=1.5 * HOUR)
    run = Running(job, Allocation("j", (), 2 * HOUR, 3), start_time=0.0)
    outlook = running_outlook(run, HOUR)
    assert outlook.start == 0.0 and outlook.finish == 2 * HOUR
    assert outlook.reachable is False and outlook.slack == -HOUR / 2
    assert "expected start 60 min ago, finish in 60 min" in outlook.message

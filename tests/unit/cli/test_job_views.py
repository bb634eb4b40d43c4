"""The job views of the ``bolt`` command: ``status``, ``explain``, ``cancel`` and ``logs``,
the deadline outlook line, ``queue``, ``submit`` and the story told while waiting, run
in-process against a stand-in client that answers with wire models."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from rich.console import Console
from typer.testing import CliRunner, Result
from wire_kit import job_summary

import boltforge.cli.remote as remote
import boltforge.cli.story as story_module
import boltforge.cli.submit as submit_module
from boltforge.cli.jobs import explanation, headline, outlook_line
from boltforge.cli.main import app
from boltforge.cli.queue import ALL_STATES
from boltforge.cli.story import VICTIM_DONE, Story, Told, _order, describer
from boltforge.cli.submit import _print_end
from boltforge.client import ApiFailure
from boltforge.wire.jobs import (
    TERMINAL,
    DeadlineOutlook,
    EventOut,
    EventPage,
    JobDetail,
    JobList,
    JobSummary,
    LogPage,
    Problem,
    ReplicaOut,
    SubmitReply,
    SubmitRequest,
    TeamLoad,
)

A = 1_800_000_000.0  # when the server judged an outlook
runner = CliRunner()


# --- a stand-in for the HTTP client -----------------------------------------------------------


class FakeClient:
    """Answers the calls the job commands make from canned wire models; an ``Exception``
    among the answers is raised instead of returned. Records every call."""

    def __init__(self) -> None:
        self.server = ""
        self.token: str | None = None
        self.details: dict[str, JobDetail | Exception] = {}
        self.listing: JobList | Exception = JobList(jobs=[])
        self.cancelled: JobList | Exception = JobList(jobs=[])
        self.log_pages: list[LogPage] = []
        self.event_pages: dict[str, list[EventPage]] = {}
        self.submitted: SubmitReply | Exception | None = None
        self.calls: list[tuple[str, tuple[Any, ...]]] = []

    def __call__(self, server: str, token: str | None) -> FakeClient:
        self.server, self.token = server, token
        return self

    def __enter__(self) -> FakeClient:
        return self

    def __exit__(self, *_: object) -> None:
        return None

    def _answer(self, name: str, args: tuple[Any, ...], answer: Any) -> Any:
        self.calls.append((name, args))
        if isinstance(answer, BaseException):
            raise answer
        return answer

    def job(self, job_id: str) -> JobDetail:
        found = self.details.get(job_id, ApiFailure(404, f"job {job_id} not found"))
        return self._answer("job", (job_id,), found)  # type: ignore[no-any-return]

    def jobs(self, state: str | None = None, team: str | None = None) -> JobList:
        return self._answer("jobs", (state, team), self.listing)  # type: ignore[no-any-return]

    def cancel(self, job_id: str) -> JobList:
        return self._answer("cancel", (job_id,), self.cancelled)  # type: ignore[no-any-return]

    def logs(self, job_id: str, after: int = 0, wait: float = 0.0) -> LogPage:
        return self._answer("logs", (job_id, after, wait), self.log_pages.pop(0))  # type: ignore[no-any-return]

    def events(self, job_id: str, after: int = 0, wait: float = 0.0) -> EventPage:
        pages = self.event_pages.get(job_id) or [EventPage(job=job_id, state="running", events=[])]
        page = pages.pop(0) if len(pages) > 1 else pages[0]
        if not page.events:
            time.sleep(0.01)
        return self._answer("events", (job_id, after), page)  # type: ignore[no-any-return]

    def submit(
        self, req: SubmitRequest, idempotency_key: str | None = None, *_: object
    ) -> SubmitReply:
        return self._answer("submit", (req, idempotency_key), self.submitted)  # type: ignore[no-any-return]


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[FakeClient]:
    client = FakeClient()
    monkeypatch.setattr(remote, "Client", client)
    monkeypatch.setattr(story_module, "Client", client)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.delenv("BOLT_SERVER", raising=False)
    monkeypatch.setenv("BOLT_TOKEN", "tok-test")
    monkeypatch.setenv("COLUMNS", "80")
    yield client


def bolt(*args: str) -> Result:
    return runner.invoke(app, list(args))


def lines_fit(text: str, width: int = 80) -> bool:
    return all(len(line) <= width for line in text.splitlines())


def clean_failure(result: Result, code: int) -> None:
    assert result.exit_code == code, result.output
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)


# --- wire models built by hand ----------------------------------------------------------------


def summary(id_: str, state: str = "pending", **fields: Any) -> JobSummary:
    return job_summary(id_, state, time.time() - 3600, **fields)


def event(seq: int, at: float, kind: str, message: str, **data: Any) -> EventOut:
    return EventOut(seq=seq, at=at, kind=kind, message=message, data=data)


def detail(id_: str = "7", state: str = "running", **fields: Any) -> JobDetail:
    now = time.time()
    base: dict[str, Any] = {
        "id": id_,
        "name": "example-train",
        "team": "research",
        "priority": 20,
        "priority_name": "low",
        "state": state,
        "gpus": 16,
        "replicas": 2,
        "submitted_at": now - 3600,
        "epoch": 1,
        "gpu_hours": 4.0,
        "dollars": 10.0,
        "productive_gpu_hours": 4.0,
        "productive_dollars": 10.0,
        "events": [
            event(1, now - 3600, "queued", "queued at position 1"),
            event(2, now - 3590, "placed", "placed on h100-p0-r00-h[00-01]", epoch=1),
        ],
    }
    if state in ("running", "preempting", "scheduled"):
        base |= {
            "started_at": now - 1800,
            "nodes": "h100-p0-r00-h[00-01]",
            "explanation": ["both hosts share rack r00 (cost 3)"],
            "placement": [
                ReplicaOut(
                    replica=f"r{i}",
                    role="worker",
                    rank=i,
                    node=f"h100-p0-r00-h0{i}",
                    gpus=list(range(8)),
                    state="running",
                    pid=4000 + i,
                )
                for i in range(2)
            ],
        }
    return JobDetail.model_validate(base | fields)


# --- the deadline outlook line ----------------------------------------------------------------

CLOCK = r"\(\d{4}-\d{2}-\d{2} \d{2}:\d{2} \S*\)"

OUTLOOKS = [
    pytest.param(None, None, id="no outlook"),
    pytest.param(DeadlineOutlook(at=A), None, id="nothing known"),
    pytest.param(
        DeadlineOutlook(at=A, expected_start=A, expected_finish=A + 3600),
        r"expected start now, finish in ~60 min",
        id="time limit only",
    ),
    pytest.param(
        DeadlineOutlook(at=A, expected_start=A + 600),
        None,
        id="start but no finish and no deadline",
    ),
    pytest.param(
        DeadlineOutlook(
            at=A,
            verdict="reachable",
            deadline=A + 4 * 3600,
            expected_start=A + 2 * 3600,
            expected_finish=A + 3 * 3600,
            slack_s=3600,
        ),
        rf"deadline reachable: expected start in ~2\.0 h, finish in ~3\.0 h; "
        rf"due in 4\.0 h {CLOCK}, 60 min to spare",
        id="reachable",
    ),
    pytest.param(
        DeadlineOutlook(
            at=A,
            verdict="not reachable",
            deadline=A + 3600,
            expected_start=A + 1800,
            expected_finish=A + 2 * 3600,
            slack_s=-3600,
        ),
        rf"deadline not reachable: expected start in ~30 min, finish in ~2\.0 h; "
        rf"due in 60 min {CLOCK}, 60 min late",
        id="late",
    ),
    pytest.param(
        DeadlineOutlook(
            at=A,
            verdict="not reachable",
            deadline=A - 600,
            expected_start=A - 1200,
            expected_finish=A + 600,
            slack_s=-1200,
        ),
        rf"deadline not reachable: expected start 20 min ago, finish in ~10 min; "
        rf"due 10 min ago {CLOCK}, 20 min late",
        id="deadline passed while running",
    ),
    pytest.param(
        DeadlineOutlook(
            at=A, verdict="unknown", deadline=A + 4 * 3600, note="the job has no time_limit"
        ),
        rf"deadline unknown: the job has no time_limit; due in 4\.0 h {CLOCK}",
        id="unknown without a start",
    ),
    pytest.param(
        DeadlineOutlook(
            at=A,
            verdict="unknown",
            deadline=A + 4 * 3600,
            expected_start=A + 600,
            note="the job has no time_limit",
        ),
        rf"deadline unknown: the job has no time_limit; expected start in ~10 min; "
        rf"due in 4\.0 h {CLOCK}",
        id="unknown with a start",
    ),
    pytest.param(
        DeadlineOutlook(at=A, deadline=A + 7200, note="no capacity estimate"),
        rf"deadline unknown: no capacity estimate; due in 2\.0 h {CLOCK}",
        id="no verdict",
    ),
]


@pytest.mark.parametrize(("outlook", "pattern"), OUTLOOKS)
def test_the_outlook_line_says_start_finish_due_and_slack(
    outlook: DeadlineOutlook | None, pattern: str | None
) -> None:
    line = outlook_line(outlook)
    if pattern is None:
        assert line is None
    else:
        assert line is not None and re.fullmatch(pattern, line), line


offsets = st.floats(min_value=-30 * 86400, max_value=30 * 86400, allow_nan=False)


@given(
    deadline=offsets,
    start=st.none() | offsets,
    run=st.none() | st.floats(min_value=0, max_value=10 * 86400),
    verdict=st.sampled_from(["reachable", "not reachable", "unknown"]),
)
def test_an_outlook_with_a_deadline_always_says_when_it_is_due(
    deadline: float, start: float | None, run: float | None, verdict: str
) -> None:
    finish = None if start is None or run is None else start + run
    slack = None if finish is None else deadline - finish
    o = DeadlineOutlook.model_validate(
        {
            "at": A,
            "verdict": verdict,
            "deadline": A + deadline,
            "expected_start": None if start is None else A + start,
            "expected_finish": None if finish is None else A + finish,
            "slack_s": slack,
            "note": "" if slack is not None else "finish unknown",
        }
    )
    line = outlook_line(o)
    assert line is not None
    assert line.startswith(f"deadline {verdict}")
    assert re.search(r"due (now|in \S+ \S+|\S+ \S+ ago) " + CLOCK, line)
    assert "None" not in line and "\n" not in line
    if slack is not None:
        assert line.endswith("to spare" if slack >= 0 else "late")


# --- bolt status ------------------------------------------------------------------------------


def test_status_shows_state_where_meter_placement_and_timeline(fake: FakeClient) -> None:
    fake.details["7"] = detail(
        restarts=1,
        preemptions=2,
        last_step=1200,
        gpu_hours=4.0,
        productive_gpu_hours=3.0,
        productive_dollars=7.5,
        outlook=DeadlineOutlook(at=time.time(), expected_start=time.time() - 1800),
    )
    result = bolt("status", "7")
    assert result.exit_code == 0, result.output
    out = result.stdout
    table = out[out.index("RANK") : out.index("timeline")]
    assert lines_fit(table) and len(table.splitlines()) == 3
    assert "job 7 example-train (research, low): running on h100-p0-r00-h[00-01]" in out
    assert "16 GPU(s) in 2 replica(s)" in out and "submitted 60 min ago" in out
    assert "started 30 min ago" in out and "step 1200" in out
    assert "2 preemption(s), 1 restart(s)" in out
    assert "4.000 GPU-h ($10.00)" in out and "3.000 GPU-h ($7.50) productive" in out
    for word in ("RANK", "NODE", "PID", "h100-p0-r00-h01", "4001", "0,1,2,3,4,5,6,7"):
        assert word in out
    assert re.search(r"^\s+0\.0s queued at position 1$", out, re.M)
    assert re.search(r"^\s+10\.0s placed on h100-p0-r00-h\[00-01\]$", out, re.M)
    assert fake.calls == [("job", ("7",))]
    assert fake.token == "tok-test"


def test_status_of_a_finished_job_gives_its_end_and_exit_code_without_placement(
    fake: FakeClient,
) -> None:
    now = time.time()
    fake.details["8"] = detail(
        "8", "failed", started_at=now - 1800, finished_at=now - 600, exit_code=3
    )
    out = bolt("status", "8").stdout
    assert "[bold]" not in out and "failed" in out
    assert "ended 10 min ago" in out and "exit code 3" in out
    assert "RANK" not in out and "productive" not in out
    assert "preemption" not in out


def test_status_json_is_the_whole_job_detail(fake: FakeClient) -> None:
    d = detail(outlook=DeadlineOutlook(at=A, verdict="reachable", deadline=A + 60, slack_s=5))
    fake.details["7"] = d
    result = bolt("status", "7", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert JobDetail.model_validate(data) == d
    assert {"id", "state", "placement", "events", "gpu_hours", "outlook"} <= data.keys()
    assert data["outlook"]["verdict"] == "reachable"


def test_status_keeps_markup_in_names_and_messages_as_text(fake: FakeClient) -> None:
    d = detail(name="[bold]x[/bold]", team="a[red]")
    d.events.append(event(3, d.submitted_at + 20, "note", "see [link] now"))
    fake.details["7"] = d
    out = bolt("status", "7").stdout
    assert "[bold]x[/bold]" in out and "(a[red]," in out and "see [link] now" in out


# --- bolt explain -----------------------------------------------------------------------------

EXPLAINED = [
    pytest.param(
        {
            "state": "pending",
            "reason": "capacity",
            "position": 2,
            "waiting": ["needs 16 GPUs in one rack; the largest free rack has 8"],
        },
        [
            "waiting: capacity",
            "position 3 in line; estimated start unknown",
            "needs 16 GPUs in one rack; the largest free rack has 8",
        ],
        id="pending",
    ),
    pytest.param(
        {"state": "requeued"},
        ["waiting: not yet considered", "position ? in line; estimated start unknown"],
        id="requeued, never considered",
    ),
    pytest.param(
        {"state": "succeeded", "explanation": ["rack r00 (cost 3)", "second line"]},
        ["placed on h100-p0-r00-h[00-01]", "last placement: rack r00 (cost 3)"],
        id="finished",
    ),
    pytest.param(
        {"state": "cancelled", "events": []},
        ["cancelled"],
        id="finished without events",
    ),
    pytest.param(
        {"state": "running", "explanation": []},
        ["no placement explanation recorded"],
        id="running without explanation",
    ),
]


@pytest.mark.parametrize(("fields", "expected"), EXPLAINED)
def test_explanation_says_why_it_waits_or_why_it_runs_there(
    fields: dict[str, Any], expected: list[str]
) -> None:
    assert explanation(detail(**fields)) == expected


@pytest.mark.parametrize(
    ("spec", "said"),
    [
        ({"time_limit": 3600}, "expected start in ~20 min, finish in ~80 min"),
        ({}, "expected start in ~20 min, finish in ~80 min (runtime learned from jobs like it)"),
    ],
    ids=["its time limit", "learned"],
)
def test_a_waiting_job_gives_its_estimated_start_and_outlook(
    spec: dict[str, Any], said: str
) -> None:
    now = time.time()
    o = DeadlineOutlook(at=now, expected_start=now + 1200, expected_finish=now + 4800)
    waiting = detail(state="pending", estimated_start=now + 1200, outlook=o, spec=spec)
    lines = explanation(waiting)
    assert lines[1] == "position ? in line; estimated start ~20 min"
    assert lines[2] == said


def test_a_running_job_names_stragglers_of_its_current_placement_only() -> None:
    d = detail(epoch=2)
    d.events += [
        event(5, d.submitted_at + 50, "straggler", "rank 3 slow (old)", epoch=1),
        event(6, d.submitted_at + 90, "straggler", "rank 1 is 40% slower", epoch=2),
    ]
    lines = explanation(d)
    assert lines == ["both hosts share rack r00 (cost 3)", "rank 1 is 40% slower"]


def test_explain_prints_the_headline_then_the_indented_lines(fake: FakeClient) -> None:
    fake.details["9"] = detail("9", "pending", reason="quota", position=0)
    result = bolt("explain", "9")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0] == "job 9 example-train (research, low): pending"
    assert lines[1:3] == ["  waiting: quota", "  position 1 in line; estimated start unknown"]


def test_explain_json_carries_only_the_documented_keys(fake: FakeClient) -> None:
    fake.details["9"] = detail("9", "pending", reason="quota", position=4, waiting=["w"])
    data = json.loads(bolt("explain", "9", "--json").stdout)
    assert set(data) == {
        "id",
        "state",
        "nodes",
        "explanation",
        "reason",
        "position",
        "estimated_start",
        "waiting",
        "outlook",
    }
    assert (data["reason"], data["position"], data["waiting"]) == ("quota", 4, ["w"])


def test_headline_of_a_waiting_job_has_no_place() -> None:
    text = Console().render_str(headline(detail(state="pending", nodes=""))).plain
    assert text == "job 7 example-train (research, low): pending"


# --- refusals and errors ----------------------------------------------------------------------

REFUSALS = [
    pytest.param(ApiFailure(404, "job 7 not found"), 1, ["error (404) job 7 not found"], id="404"),
    pytest.param(
        ApiFailure(403, "job 7 belongs to team nlp"), 1, ["error (403) job 7 belongs"], id="403"
    ),
    pytest.param(
        ApiFailure(0, "cannot reach http://x: refused. To fix: start it with `bolt up`"),
        1,
        ["error cannot reach http://x", "To fix"],
        id="unreachable",
    ),
    pytest.param(
        ApiFailure(422, "bad", [Problem(field="id", value="7/x", message="not a job id")]),
        2,
        ["error 7: 1 problem(s)", "  - id: not a job id (got '7/x')"],
        id="422 with problems",
    ),
    pytest.param(ApiFailure(400, "bad id"), 2, ["error (400) bad id"], id="400 without problems"),
    pytest.param(KeyboardInterrupt(), 130, [], id="interrupted"),
]


@pytest.mark.parametrize("command", ["status", "explain"])
@pytest.mark.parametrize(("failure", "code", "shown"), REFUSALS)
def test_a_refusal_exits_non_zero_with_one_clear_message(
    fake: FakeClient, command: str, failure: BaseException, code: int, shown: list[str]
) -> None:
    fake.details["7"] = failure  # type: ignore[assignment]
    result = bolt(command, "7")
    clean_failure(result, code)
    assert result.stdout == ""
    for text in shown:
        assert text in result.stderr


@pytest.mark.parametrize("command", [["status", "7"], ["queue"], ["logs", "7"], ["cancel", "7"]])
def test_without_any_token_the_command_exits_2_and_says_how_to_get_one(
    fake: FakeClient, monkeypatch: pytest.MonkeyPatch, command: list[str]
) -> None:
    monkeypatch.delenv("BOLT_TOKEN")
    result = bolt(*command)
    clean_failure(result, 2)
    assert "no API token" in result.stderr and "--token" in result.stderr
    assert fake.calls == []


def test_the_server_flag_and_token_flag_reach_the_client(fake: FakeClient) -> None:
    fake.details["7"] = detail()
    result = bolt("status", "7", "--server", "http://ctl:9000/", "--token", "flag-tok")
    assert result.exit_code == 0, result.output
    assert (fake.server, fake.token) == ("http://ctl:9000", "flag-tok")


# --- bolt cancel ------------------------------------------------------------------------------


def test_cancelling_a_finished_job_says_so_and_sends_nothing(fake: FakeClient) -> None:
    fake.details["5"] = detail("5", "succeeded")
    result = bolt("cancel", "5")
    assert result.exit_code == 0
    assert result.stdout.strip() == "job 5 had already ended: succeeded"
    assert [name for name, _ in fake.calls] == ["job"]


@pytest.mark.parametrize(
    ("jobs", "expected"),
    [
        ([summary("5", "cancelled")], "job 5 cancelled"),
        ([summary("5", "preempting")], "job 5 not cancelled: it is preempting"),
        (
            [summary(f"42_{i}", s) for i, s in enumerate(["cancelled", "succeeded", "cancelled"])],
            "cancelled 2 task(s) of array job 42",
        ),
    ],
    ids=["cancelled", "refused", "array"],
)
def test_cancel_says_what_became_of_each_job(
    fake: FakeClient, jobs: list[JobSummary], expected: str
) -> None:
    fake.details["5"] = detail("5", "running")
    fake.cancelled = JobList(jobs=jobs)
    job_id = "42" if len(jobs) > 1 else "5"
    result = bolt("cancel", job_id)
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == expected
    assert ("cancel", (job_id,)) in fake.calls


def test_a_refused_cancel_exits_1(fake: FakeClient) -> None:
    fake.details["5"] = detail("5", "running")
    fake.cancelled = ApiFailure(403, "viewers cannot cancel jobs")
    result = bolt("cancel", "5")
    clean_failure(result, 1)
    assert "viewers cannot cancel jobs" in result.stderr


# --- bolt logs --------------------------------------------------------------------------------


def page(next_: int, lines: list[str], state: str = "running") -> LogPage:
    return LogPage.model_validate({"job": "7", "state": state, "next": next_, "lines": lines})


def test_logs_prints_every_page_until_nothing_new(fake: FakeClient) -> None:
    fake.log_pages = [page(2, ["a", "b"]), page(3, ["c"]), page(3, [])]
    result = bolt("logs", "7")
    assert result.exit_code == 0, result.output
    assert result.stdout == "a\nb\nc\n"
    assert [args for _, args in fake.calls] == [("7", 0, 0.0), ("7", 2, 0.0), ("7", 3, 0.0)]


def test_logs_follow_long_polls_until_the_job_ends(fake: FakeClient) -> None:
    fake.log_pages = [
        page(1, ["start"]),
        page(1, []),
        page(2, ["[bold]done[/]"], "succeeded"),
        page(2, [], "succeeded"),
    ]
    result = bolt("logs", "7", "-f")
    assert result.exit_code == 0, result.output
    assert result.stdout == "start\n[bold]done[/]\n"
    assert all(args[2] == 20.0 for _, args in fake.calls)
    assert fake.log_pages == []


def test_logs_of_an_unknown_job_exit_1(fake: FakeClient) -> None:
    def refuse(job_id: str, after: int = 0, wait: float = 0.0) -> LogPage:
        raise ApiFailure(404, "job 7 not found")

    fake.logs = refuse  # type: ignore[method-assign]
    result = bolt("logs", "7")
    clean_failure(result, 1)
    assert "error (404) job 7 not found" in result.stderr


# --- bolt queue -------------------------------------------------------------------------------


def queue_listing() -> JobList:
    now = time.time()
    return JobList(
        jobs=[
            summary("12", "running", started_at=now - 600, nodes="h100-p0-r00-h[00-31]"),
            summary("13", position=0, reason="capacity " * 10, estimated_start=now + 720),
            summary("42_3", array_task=3, position=1),
            summary("42_4", array_task=4, position=2),
            summary("42_7", array_task=7, position=3),
            summary("14", "failed", finished_at=now - 7200, name="x" * 90),
        ],
        others=[TeamLoad(team="nlp", pending=1, running=2, gpus=16)],
    )


def test_queue_fits_80_columns_and_folds_array_tasks(fake: FakeClient) -> None:
    fake.listing = queue_listing()
    result = bolt("queue")
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert lines_fit(out)
    for word in ("JOBID", "12", "13", "42_[3-4,7]", "14", "10 min ago", "~12 min", "2.0 h ago"):
        assert word in out
    assert [line.split()[0] for line in out.splitlines()[1:6]] == [
        "12",
        "13",
        "42_[3-4,7]",
        "14",
        "other",
    ]
    assert out.rstrip().splitlines()[-1].startswith("other teams: nlp 2 running (16 GPUs)")


def test_an_empty_queue_says_no_jobs(fake: FakeClient) -> None:
    result = bolt("queue")
    assert result.exit_code == 0 and result.stdout.strip() == "no jobs"


@pytest.mark.parametrize(
    ("flags", "sent"),
    [
        ([], (None, None)),
        (["--team", "nlp"], (None, "nlp")),
        (["--state", "pending,running"], ("pending,running", None)),
        (["--all"], (ALL_STATES, None)),
        (["--all", "--state", "failed"], ("failed", None)),
    ],
)
def test_queue_filters_reach_the_server(
    fake: FakeClient, flags: list[str], sent: tuple[str | None, str | None]
) -> None:
    assert bolt("queue", *flags).exit_code == 0
    assert fake.calls == [("jobs", sent)]


def test_queue_json_is_the_listing_with_jobs_and_others(fake: FakeClient) -> None:
    fake.listing = queue_listing()
    data = json.loads(bolt("queue", "--json").stdout)
    assert set(data) == {"jobs", "others"}
    assert [j["id"] for j in data["jobs"]] == ["12", "13", "42_3", "42_4", "42_7", "14"]
    assert data["others"] == [{"team": "nlp", "pending": 1, "running": 2, "gpus": 16}]


# --- bolt submit ------------------------------------------------------------------------------


@pytest.fixture
def spec(tmp_path: Path) -> Path:
    path = tmp_path / "train.yaml"
    path.write_text("name: train\nteam: research\ngpus: 8\n")
    return path


SUBMITTED = [
    pytest.param(
        SubmitReply(job=summary("7", name="train")),
        "submitted job 7 (train, 8 GPU(s))",
        id="created",
    ),
    pytest.param(
        SubmitReply(job=summary("7", name="train"), created=False),
        "submitted job 7 (train, 8 GPU(s)) (already submitted with this idempotency key)",
        id="repeated key",
    ),
    pytest.param(
        SubmitReply(job=summary("42", array="0-2", gpus=2), tasks=["42_0", "42_1", "42_2"]),
        "submitted array job 42: 3 task(s) 42_[0-2] of 2 GPU(s) each",
        id="array",
    ),
]


@pytest.mark.parametrize(("reply", "expected"), SUBMITTED)
def test_submit_prints_the_job_made(
    fake: FakeClient, spec: Path, reply: SubmitReply, expected: str
) -> None:
    fake.submitted = reply
    result = bolt("submit", str(spec))
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == expected


def test_submit_sends_the_spec_text_and_every_override(fake: FakeClient, spec: Path) -> None:
    fake.submitted = SubmitReply(job=summary("7"), warnings=["team research is past its budget"])
    result = bolt(
        "submit",
        str(spec),
        "--gpus",
        "2xH100",
        "--priority",
        "high",
        "--team",
        "nlp",
        "--array",
        "0-3",
        "--idempotency-key",
        "k1",
    )
    assert result.exit_code == 0, result.output
    assert "warning team research is past its budget" in result.stderr
    [(name, (req, key))] = fake.calls
    assert name == "submit" and key == "k1"
    assert req.yaml == spec.read_text() and req.source == "train.yaml"
    assert (req.gpus, req.priority, req.team, req.array) == ("2xH100", "high", "nlp", "0-3")
    assert req.workdir == str(Path.cwd())


def test_submit_json_is_the_reply(fake: FakeClient, spec: Path) -> None:
    fake.submitted = SubmitReply(job=summary("7"), warnings=["w"])
    result = bolt("submit", str(spec), "--json")
    data = json.loads(result.stdout)
    assert {"job", "tasks", "created", "warnings"} == set(data)
    assert data["job"]["id"] == "7" and data["warnings"] == ["w"]


@pytest.mark.parametrize(
    ("args", "shown"),
    [
        (["missing.yaml"], "missing.yaml: cannot read it"),
        (["SPEC", "--gpus", "8" * 41], "--gpus: String should have at most 40 characters"),
        (["SPEC", "--team", "t" * 64], "--team: String should have at most 63 characters"),
    ],
    ids=["missing file", "long gpus", "long team"],
)
def test_submit_refuses_bad_input_before_sending(
    fake: FakeClient, spec: Path, args: list[str], shown: str
) -> None:
    args = [str(spec) if a == "SPEC" else a for a in args]
    result = bolt("submit", *args)
    clean_failure(result, 2)
    assert shown in result.stderr and "To fix" in result.stderr
    assert fake.calls == []


def test_submit_with_bad_spec_problems_exits_2_naming_each_field(
    fake: FakeClient, spec: Path
) -> None:
    fake.submitted = ApiFailure(
        422,
        "invalid job",
        [
            Problem(field="job.gpus", value=-1, message="is too small"),
            Problem(field="job.team", message="is required. To fix: add it"),
        ],
    )
    result = bolt("submit", str(spec))
    clean_failure(result, 2)
    assert "train.yaml: 2 problem(s)" in result.stderr
    assert "  - job.gpus: is too small (got -1)" in result.stderr
    assert "  - job.team: is required. To fix: add it" in result.stderr


@pytest.mark.parametrize(
    ("state", "extra", "expected"),
    [
        (
            "succeeded",
            {"exit_code": 0, "last_step": 500},
            "job 7 succeeded, exit code 0, 500 step(s)",
        ),
        ("failed", {"exit_code": 137}, "job 7 failed, exit code 137"),
        ("cancelled", {}, "job 7 cancelled"),
    ],
)
def test_the_end_of_a_waited_job_gives_state_code_steps_and_cost(
    capsys: pytest.CaptureFixture[str], state: str, extra: dict[str, Any], expected: str
) -> None:
    _print_end(detail(state=state, **extra), json=False)
    out = capsys.readouterr().out.strip()
    assert out == f"{expected}, 4.000 GPU-h ($10.00)"


def test_the_end_of_a_waited_job_as_json_is_its_detail(
    capsys: pytest.CaptureFixture[str],
) -> None:
    d = detail(state="succeeded")
    _print_end(d, json=True)
    assert JobDetail.model_validate(json.loads(capsys.readouterr().out)) == d


def test_submit_wait_tells_the_story_and_exits_0_when_it_succeeds(
    fake: FakeClient, spec: Path
) -> None:
    base = time.time() - 60
    fake.submitted = SubmitReply(job=summary("7", name="train"))
    fake.details["7"] = detail(submitted_at=base)
    fake.event_pages["7"] = [
        EventPage(
            job="7",
            state="running",
            events=[
                event(1, base, "queued", "queued at position 1"),
                event(2, base + 0.25, "placed", "placed on h00", epoch=1),
                event(3, base + 5, "note", "rack r00 is the tightest"),
            ],
        ),
        EventPage(
            job="7",
            state="succeeded",
            events=[event(4, base + 30, "succeeded", "succeeded (exit code 0)")],
        ),
    ]

    result = bolt("submit", str(spec), "--wait")
    out = result.stdout
    assert "job 7 queued at position 1" in out and "job 7 placed on h00" in out
    assert "job 7 scheduled in 250 ms" in out
    assert "job 7 why: rack r00 is the tightest" in out
    assert re.search(r"\[\s+30\.0s\] job 7 succeeded \(exit code 0\)", out)
    assert result.exit_code == 1, "the final detail still says running: not a success"
    assert "job 7 running" in out
    fake.details["7"] = detail(state="succeeded", submitted_at=base, exit_code=0)
    fake.event_pages["7"] = [
        EventPage(job="7", state="succeeded", events=[event(4, base + 30, "succeeded", "ok")])
    ]
    again = bolt("submit", str(spec), "--wait")
    assert again.exit_code == 0, again.output
    assert "job 7 succeeded, exit code 0" in again.stdout


def test_submit_wait_on_an_array_reports_each_task_and_the_failures(
    fake: FakeClient, spec: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(submit_module, "time", SimpleNamespace(sleep=lambda _: None))
    fake.submitted = SubmitReply(job=summary("42", array="0-1"), tasks=["42_0", "42_1"])
    fake.listing = JobList(
        jobs=[
            summary("42_0", "succeeded", array_task=0),
            summary("42_1", "failed", array_task=1, exit_code=2),
            summary("43", "failed"),
        ]
    )
    result = bolt("submit", str(spec), "--wait")
    assert result.exit_code == 1
    assert "task 42_0 succeeded" in result.stdout
    assert "task 42_1 failed (exit code 2)" in result.stdout
    assert "1 of 2 task(s) succeeded" in result.stdout
    as_json = bolt("submit", str(spec), "--wait", "--json")
    assert json.loads(as_json.stdout) == {
        "tasks": {"42_0": "succeeded", "42_1": "failed"},
        "failed": ["42_1"],
    }


# --- the story told while waiting -------------------------------------------------------------


def recording_story(base: float = 100.0) -> tuple[Story, Console]:
    console = Console(record=True, width=120, color_system=None)
    return Story(console, "http://x", "t", base), console


def test_a_placement_that_preempts_names_its_victims_and_follows_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    story, console = recording_story()
    followed: list[tuple[str, float, frozenset[str]]] = []
    monkeypatch.setattr(
        story, "follow", lambda job, since=0.0, until=TERMINAL: followed.append((job, since, until))
    )
    lookup: Callable[[str], str] = lambda j: f"{j} (research, 32 GPUs)"  # noqa: E731
    story.tell(Told("7", event(1, 100.0, "queued", "queued")), lookup)
    story.tell(Told("7", event(2, 100.5, "placed", "placed", preempted=[1, "2"], epoch=1)), lookup)
    story.tell(Told("7", event(3, 200.0, "placed", "placed again", epoch=2)), lookup)
    story.tell(Told("7", None), lookup)
    text = console.export_text()
    assert text.splitlines() == [
        "[   0.0s] job 7 queued",
        "[   0.5s] job 7 placed",
        "[   0.5s] job 7 preempted 2 job(s): 1 (research, 32 GPUs), 2 (research, 32 GPUs)",
        "[   0.5s] job 7 scheduled in 500 ms",
        "[ 100.0s] job 7 placed again",
    ]
    assert followed == [("1", 100.5, VICTIM_DONE), ("2", 100.5, VICTIM_DONE)]


def test_a_story_line_before_the_base_is_stamped_zero() -> None:
    story, console = recording_story(base=100.0)
    story.say(50.0, "early")
    assert console.export_text().strip() == "[   0.0s] early"


def test_events_gathered_together_come_out_in_server_order_with_ends_last() -> None:
    story, _ = recording_story()
    for told in [
        Told("2", event(9, 1.0, "running", "r")),
        Told("1", None),
        Told("1", event(4, 1.0, "placed", "p")),
        Told("2", event(6, 1.0, "queued", "q")),
    ]:
        story.inbox.put(told)
    out = [story.next(timeout=0.5) for _ in range(4)]
    assert [(t.job, t.event.seq if t.event else None) for t in out if t] == [
        ("1", 4),
        ("2", 6),
        ("2", 9),
        ("1", None),
    ]
    assert story.next(timeout=0.01) is None
    assert _order(Told("x", None)) == float("inf")


def test_following_a_job_tells_its_events_once_and_ends(fake: FakeClient) -> None:
    fake.event_pages["3"] = [
        EventPage(
            job="3",
            state="running",
            events=[event(1, 5.0, "queued", "old"), event(2, 20.0, "checkpointed", "saved")],
        )
    ]
    story, _ = recording_story()
    story.follow("3", since=10.0, until=VICTIM_DONE)
    story.follow("3")
    got = [story.next(timeout=2.0) for _ in range(2)]
    story.close()
    assert [(t.job, t.event and t.event.kind) for t in got if t] == [
        ("3", "checkpointed"),
        ("3", None),
    ]
    assert story.followed == {"3"}


def test_a_refused_follow_ends_with_the_servers_message(fake: FakeClient) -> None:
    def refuse(job_id: str, after: int = 0, wait: float = 0.0) -> EventPage:
        raise ApiFailure(403, "job 3 belongs to another team")

    fake.events = refuse  # type: ignore[method-assign]
    story, _ = recording_story()
    story.follow("3")
    told = story.next(timeout=2.0)
    assert told == Told("3", None, "job 3 belongs to another team")


def test_the_describer_names_team_and_size_or_hides_another_teams_job(
    fake: FakeClient,
) -> None:
    fake.details["1"] = detail("1", gpus=32)
    describe = describer(fake)  # type: ignore[arg-type]
    assert describe("1") == "1 (research, 32 GPU(s))"
    assert describe("2") == "2 (another team)"


def test_a_spec_that_is_not_utf8_exits_2_without_a_traceback(
    fake: FakeClient, tmp_path: Path
) -> None:
    binary = tmp_path / "train.yaml"
    binary.write_bytes(b"\xff\xfename: train\n")
    result = bolt("submit", str(binary))
    clean_failure(result, 2)
    assert "train.yaml" in result.stderr
    assert fake.calls == []

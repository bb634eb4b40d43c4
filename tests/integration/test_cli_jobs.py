"""The job commands as users type them, against a real ``bolt server`` and two real agents on
loopback: submit, queue, status, explain, cancel, logs, nodes, top and tokens; bad input;
what a member may see; array jobs; the story ``submit --wait`` tells."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from controlplane import Plane, control_plane

from boltforge.testing.processes import wait_until
from boltforge.wire.jobs import JobDetail, TokenRequest

SLEEPS = '[python, -c, "import time; time.sleep(600)"]'
# Exits 0 half a second after the checkpoint signal, as a checkpointing trainer would.
CHECKPOINTS = (
    '[python, -c, "import signal, sys, time; '
    "signal.signal(signal.SIGTERM, lambda *a: (time.sleep(0.5), sys.exit(0))); "
    'time.sleep(600)"]'
)


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Plane]:
    """A server that lets a job be preempted at once, with two 8-GPU hosts in one rack."""
    home = tmp_path_factory.mktemp("plane")
    with control_plane(home, "--min-runtime", "0", "--churn", "1", hosts=2) as p:
        yield p


@pytest.fixture(autouse=True)
def empty_queue(plane: Plane) -> Iterator[None]:
    """Each test starts and ends with nothing queued or running."""
    yield
    with plane.client() as c:
        for job in c.jobs().jobs:
            c.cancel(job.id)
        wait_until(lambda: not c.jobs().jobs, 60, "the queue to empty")
        wait_until(lambda: all(not n.gpus_used for n in c.nodes().nodes), 60, "free GPUs")


def spec(tmp: Path, name: str, body: str) -> Path:
    path = tmp / f"{name}.yaml"
    path.write_text(f"name: {name}\n{body}")
    return path


def submit(plane: Plane, path: Path, *args: str, token: str | None = None) -> dict[str, Any]:
    kw = {"token": token} if token else {}
    run = plane.bolt("submit", str(path), "--json", *args, **kw)
    assert run.returncode == 0, run.stderr
    out: dict[str, Any] = json.loads(run.stdout)
    return out


def detail(plane: Plane, job: str) -> JobDetail:
    with plane.client() as c:
        return c.job(job)


def state_is(plane: Plane, job: str, *states: str) -> bool:
    return detail(plane, job).state in states


def in_line(plane: Plane, job: str) -> bool:
    d = detail(plane, job)
    return bool(d.reason) and d.position is not None


def test_submit_queue_status_explain_cancel(plane: Plane, tmp_path: Path) -> None:
    runner = spec(tmp_path, "sleeper", f"team: research\ngpus: 8\ncommand: {SLEEPS}\n")
    rack = "team: research\ngpus: 16\nper_node: 8\ntopology: {required: rack}\n"
    rack += f"command: {SLEEPS}\n"
    job = submit(plane, runner)["job"]["id"]
    wait_until(lambda: state_is(plane, job, "running"), 60, "the job to run")
    waiter = submit(plane, spec(tmp_path, "rack-wide", rack))["job"]["id"]
    wait_until(lambda: in_line(plane, waiter), 60, "a wait reason and a place in line")

    queue = plane.bolt("queue")
    assert queue.returncode == 0, queue.stderr
    assert "JOBID" in queue.stdout and "NODES/REASON" in queue.stdout
    lines = {line.split()[0]: line for line in queue.stdout.splitlines()[1:]}
    assert "running" in lines[job] and "host-" in lines[job]
    assert "pending" in lines[waiter] and detail(plane, waiter).reason in lines[waiter]
    listed = json.loads(plane.bolt("queue", "--json").stdout)
    assert [j["id"] for j in listed["jobs"]] == [job, waiter]

    status = plane.bolt("status", job)
    assert status.returncode == 0, status.stderr
    assert f"job {job}" in status.stdout and "running" in status.stdout
    assert "timeline" in status.stdout and "placed:" in status.stdout
    assert json.loads(plane.bolt("status", job, "--json").stdout)["state"] == "running"

    why_here = plane.bolt("explain", job)
    assert why_here.returncode == 0 and "inside host" in why_here.stdout
    why_not = plane.bolt("explain", waiter)
    assert "waiting:" in why_not.stdout and "position 1 in line" in why_not.stdout
    assert "requires a single rack" in why_not.stdout

    for j in (job, waiter):
        cancel = plane.bolt("cancel", j)
        assert cancel.returncode == 0 and f"job {j} cancelled" in cancel.stdout
    assert "cancelled" in plane.bolt("status", waiter).stdout
    assert "already ended" in plane.bolt("cancel", waiter).stdout


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("team: [research\n", "yaml (line"),
        ("team: research\ngpus: 8\ngpsu: 3\n", "job.gpsu: is not a known field"),
        ("team: research\ngpus: 18\nper_node: 9\n", "set per_node to 8 or less"),
        (
            "team: research\ngpus: 32\nper_node: 16\nparallelism: {tensor: 16}\n",
            "NVLink islands of 8: lower tensor parallelism to 8",
        ),
    ],
    ids=["malformed yaml", "an unknown field", "9 GPUs per 8-GPU host", "TP group past islands"],
)
def test_bad_input_is_rejected_with_the_field_and_fix(
    plane: Plane, tmp_path: Path, body: str, expected: str
) -> None:
    run = plane.bolt("submit", str(spec(tmp_path, "bad", body + f"command: {SLEEPS}\n")))
    assert run.returncode == 2, run.stderr
    assert "error bad.yaml:" in run.stderr and expected in run.stderr
    assert "To fix" in run.stderr and "Traceback" not in run.stderr
    with plane.client() as c:
        assert not c.jobs().jobs


def test_refusals_and_unreachable_servers_exit_1(plane: Plane, tmp_path: Path) -> None:
    missing = plane.bolt("status", "999")
    assert missing.returncode == 1 and "no job 999" in missing.stderr
    gone = plane.bolt("queue", "--server", "http://127.0.0.1:9")
    assert gone.returncode == 1 and "cannot reach" in gone.stderr and "To fix" in gone.stderr
    no_file = plane.bolt("submit", str(tmp_path / "nope.yaml"))
    assert no_file.returncode == 2 and "cannot read it" in no_file.stderr


def test_a_member_sees_other_teams_only_in_aggregate(plane: Plane, tmp_path: Path) -> None:
    made = plane.bolt("token", "create", "alice", "--role", "member", "--team", "nlp", "--json")
    assert made.returncode == 0, made.stderr
    alice = json.loads(made.stdout)["token"]
    body = f"team: research\ngpus: 8\ncommand: {SLEEPS}\n"
    theirs = submit(plane, spec(tmp_path, "secret", body))
    job = theirs["job"]["id"]
    wait_until(lambda: state_is(plane, job, "running"), 60, "the job to run")

    status = plane.bolt("status", job, token=alice)
    assert status.returncode == 1 and "(403)" in status.stderr and "research" in status.stderr
    listed = json.loads(plane.bolt("queue", "--json", token=alice).stdout)
    assert listed["jobs"] == []
    assert listed["others"] == [{"team": "research", "pending": 0, "running": 1, "gpus": 8}]
    shown = plane.bolt("queue", token=alice)
    assert "other teams: research 1 running (8 GPUs)" in shown.stdout
    assert "secret" not in shown.stdout
    assert plane.bolt("cancel", job, token=alice).returncode == 1


def test_an_array_job_is_one_queue_row_and_tasks_see_their_index(
    plane: Plane, tmp_path: Path
) -> None:
    body = (
        "team: research\ngpus: 8\n"
        'command: [python, -c, "import os, time; time.sleep(2); '
        "print('index', os.environ['BOLT_ARRAY_INDEX'])\"]\n"
    )
    reply = submit(plane, spec(tmp_path, "sweep", body), "--array", "0-5")
    tasks = reply["tasks"]
    assert len(tasks) == 6
    array_id = tasks[0].split("_")[0]
    queue = plane.bolt("queue").stdout
    folded = [line for line in queue.splitlines() if line.startswith(f"{array_id}_[")]
    assert len(folded) == 1, queue
    with plane.client() as c:
        wait_until(lambda: all(c.job(t).state == "succeeded" for t in tasks), 120, "every task")
    for i, task in enumerate(tasks):
        assert plane.bolt("logs", task).stdout.split() == ["index", str(i)]


def test_submit_wait_tells_the_preemption_story(plane: Plane, tmp_path: Path) -> None:
    low = f"team: research\npriority: low\ngpus: 16\nper_node: 8\ncommand: {CHECKPOINTS}\n"
    victim = submit(plane, spec(tmp_path, "low", low))["job"]["id"]
    wait_until(lambda: state_is(plane, victim, "running"), 60, "the low job to run")
    high = 'team: nlp\npriority: high\ngpus: 8\ncommand: [python, -c, "print(42)"]\n'
    run = plane.bolt("submit", str(spec(tmp_path, "high", high)), "--wait")
    assert run.returncode == 0, run.stdout + run.stderr
    out = run.stdout
    for said in (
        "queued:",
        "placed: 8 x H100-80GB on 1 host(s)",
        f"preempted 1 job(s): {victim} (research, 16 GPU(s))",
        "scheduled in",
        f"job {victim} checkpointed in",
        "running:",
        "succeeded, exit code 0",
    ):
        assert said in out, out
    assert plane.bolt("logs", victim).returncode == 0


def test_submit_wait_exits_1_when_the_job_fails(plane: Plane, tmp_path: Path) -> None:
    body = 'team: research\ngpus: 1\ncommand: [python, -c, "raise SystemExit(3)"]\n'
    run = plane.bolt("submit", str(spec(tmp_path, "fails", body)), "--wait")
    assert run.returncode == 1
    assert "failed, exit code 3" in run.stdout


def test_nodes_cordon_drain_and_uncordon(plane: Plane) -> None:
    cordoned = plane.bolt("nodes", "cordon", "host-1")
    assert cordoned.returncode == 0, cordoned.stderr
    assert "node host-1 cordoned: nothing new lands there" in cordoned.stdout
    listed = json.loads(plane.bolt("nodes", "list", "--json").stdout)["nodes"]
    assert {n["name"]: n["state"] for n in listed}["host-1"] == "cordoned"
    drained = json.loads(plane.bolt("nodes", "drain", "host-1", "--json").stdout)
    assert drained["name"] == "host-1" and drained["state"] == "cordoned"
    back = plane.bolt("nodes", "uncordon", "host-1")
    assert back.returncode == 0 and "node host-1 back in service (ready)" in back.stdout
    missing = plane.bolt("nodes", "drain", "host-9")
    assert missing.returncode == 1 and "Traceback" not in missing.stderr
    assert "no node host-9. To fix: check the name with `bolt nodes`" in missing.stderr
    with plane.client() as c:
        member = c.create_token(TokenRequest(name="mia", role="member", team="research")).token
    refused = plane.bolt("nodes", "cordon", "host-0", token=member)
    assert refused.returncode == 1 and "needs admin" in refused.stderr


def test_nodes_top_and_logs_follow(plane: Plane, tmp_path: Path) -> None:
    nodes = json.loads(plane.bolt("nodes", "--json").stdout)["nodes"]
    assert {n["name"] for n in nodes} == {"host-0", "host-1"}
    assert "2 node(s), 0 of 16 GPUs in use" in plane.bolt("nodes").stdout
    frame = plane.bolt("top", "--once")
    assert frame.returncode == 0 and "p0/r0" in frame.stdout and "GPUs 0/16" in frame.stdout
    body = 'team: research\ngpus: 1\ncommand: [python, -c, "print(1); print(2)"]\n'
    job = submit(plane, spec(tmp_path, "talks", body))["job"]["id"]
    follow = plane.bolt("logs", job, "-f", timeout=120)
    assert follow.returncode == 0 and follow.stdout.split() == ["1", "2"]

"""The node agent end to end: real replica processes, a real HTTP client, a fake server."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from agent_fake_server import AgentThread, FakeServer

from boltforge.wire.agent import ReplicaSpec

ROOT = Path(__file__).resolve().parents[2]

PRINT_ENV = """
import os, sys
from boltforge import sdk
for key in ("RANK", "CUDA_VISIBLE_DEVICES", "BOLT_CHECKPOINT_DIR", "BOLT_JOB_ID", "BOLT_EPOCH"):
    print(f"{key}={os.environ.get(key)}")
sdk.report(5, loss=0.5)
sys.exit(7)
"""

CHECKPOINTS_ON_SIGTERM = """
import os, signal, sys, time
def bye(*_):
    print("checkpointing", flush=True)
    time.sleep(0.3)
    sys.exit(0)
signal.signal(signal.SIGTERM, bye)
print("token", os.environ.get("BOLT_TOKEN"))
print("ready", os.environ["BOLT_CHECKPOINT_DIR"], flush=True)
while True:
    time.sleep(0.05)
"""

IGNORES_SIGTERM = """
import signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("ready", flush=True)
while True:
    time.sleep(0.05)
"""

LEAVES_A_CHILD = """
import subprocess, sys
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
print("child", child.pid, flush=True)
"""


def spec(code: str, name: str = "j/w0", **fields: Any) -> ReplicaSpec:
    base: dict[str, Any] = {"job": "j", "epoch": 1, "action": "run", "grace_s": 10.0}
    base["command"] = [sys.executable, "-c", code]
    return ReplicaSpec(replica=name, **{**base, **fields})


def gone(pid: int) -> bool:
    """True when ``pid`` has exited (a zombie waiting for its reaper counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):  # reaped before, or while, it was read
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


@pytest.fixture
def fake() -> Iterator[FakeServer]:
    with FakeServer() as server:
        yield server


def test_runs_a_replica_with_its_environment_and_reports_output_and_exit(
    fake: FakeServer, tmp_path: Path
) -> None:
    ckpt = tmp_path / "shared" / "ckpt"
    one = spec(PRINT_ENV, env={"RANK": "3"}, gpus=[2, 5], checkpoint_dir=str(ckpt))
    with AgentThread(fake, tmp_path / "work"):
        fake.set_desired(one)
        exited = fake.wait_for(lambda: fake.events_of("j/w0", "exited"))
        log = fake.wait_log("j/w0", "BOLT_EPOCH")
        progress = fake.wait_for(lambda: list(fake.progress))
        version = fake.set_desired(one)
        fake.wait_for(lambda: max(fake.polls) >= version)
        time.sleep(0.3)
        assert [e.kind for e in fake.events_of("j/w0")] == ["started", "exited"]
    assert exited[0].exit_code == 7 and exited[0].signal is None
    assert exited[0].checkpoint_s is None
    for line in (
        "RANK=3",
        "CUDA_VISIBLE_DEVICES=2,5",
        f"BOLT_CHECKPOINT_DIR={ckpt}",
        "BOLT_JOB_ID=j",
    ):
        assert line in log
    assert ckpt.is_dir()
    assert [c.seq for c in fake.logs] == list(range(len(fake.logs)))
    assert progress[0].step == 5 and progress[0].metrics == {"loss": 0.5}
    assert (progress[0].replica, progress[0].epoch) == ("j/w0", 1)


def test_stop_sends_the_checkpoint_signal_and_reports_how_long_it_took(
    fake: FakeServer, tmp_path: Path
) -> None:
    work = tmp_path / "work"
    with AgentThread(fake, work):
        fake.set_desired(spec(CHECKPOINTS_ON_SIGTERM, gpus=[]))
        fake.wait_log("j/w0", "ready")
        fake.set_desired(spec(CHECKPOINTS_ON_SIGTERM, action="stop", grace_s=10.0))
        exited = fake.wait_for(lambda: fake.events_of("j/w0", "exited"))[0]
        log = fake.wait_log("j/w0", "checkpointing")
    assert exited.exit_code == 0
    assert exited.checkpoint_s is not None and 0 < exited.checkpoint_s < 10
    assert f"ready {work / 'checkpoints' / 'j'}" in log


def test_a_replica_that_ignores_the_signal_is_killed_after_its_grace(
    fake: FakeServer, tmp_path: Path
) -> None:
    with AgentThread(fake, tmp_path / "work"):
        fake.set_desired(spec(IGNORES_SIGTERM, grace_s=0.5))
        fake.wait_log("j/w0", "ready")
        fake.set_desired()  # absent from the desired state: stop it
        exited = fake.wait_for(lambda: fake.events_of("j/w0", "exited"))[0]
    assert exited.signal == signal.SIGKILL and exited.exit_code is None
    assert exited.checkpoint_s is not None


def test_a_command_that_cannot_start_fails_once(fake: FakeServer, tmp_path: Path) -> None:
    broken = spec("", command=["/nonexistent/bolt-train"])
    with AgentThread(fake, tmp_path / "work"):
        fake.set_desired(broken)
        failed = fake.wait_for(lambda: fake.events_of("j/w0", "failed"))[0]
        version = fake.set_desired(broken)
        fake.wait_for(lambda: max(fake.polls) >= version)
        time.sleep(0.3)
        assert len(fake.events_of("j/w0")) == 1
    assert "/nonexistent/bolt-train" in failed.detail


def test_processes_left_behind_by_a_replica_are_killed(fake: FakeServer, tmp_path: Path) -> None:
    with AgentThread(fake, tmp_path / "work"):
        fake.set_desired(spec(LEAVES_A_CHILD))
        fake.wait_for(lambda: fake.events_of("j/w0", "exited"))
        log = fake.wait_log("j/w0", "child")
        child = int(log.split()[1])
        fake.wait_for(lambda: gone(child), timeout_s=10)


def test_fences_replicas_when_heartbeats_go_unanswered(tmp_path: Path) -> None:
    with FakeServer(lease_s=1.0, heartbeat_s=0.1) as fake, AgentThread(fake, tmp_path / "w"):
        fake.set_desired(spec(CHECKPOINTS_ON_SIGTERM))
        pid = fake.wait_for(lambda: fake.events_of("j/w0", "started"))[0].pid
        fake.wait_log("j/w0", "ready")
        assert pid is not None
        fake.partitioned = True
        fake.wait_for(lambda: gone(pid))
        fake.partitioned = False
        exited = fake.wait_for(lambda: fake.events_of("j/w0", "exited"))[0]
        fake.wait_log("j/w0", "checkpointing")
        again = fake.registrations[1]
    assert exited.exit_code == 0 and exited.checkpoint_s is not None
    # It registers again saying what it fenced: still stopping, or exited already.
    [(replica, state)] = [(r.replica, r.state) for r in again.running]
    assert replica == "j/w0" and state in ("stopping", "exited")
    assert [e.kind for e in fake.events_of("j/w0")] == ["started", "exited"]
    assert [c.seq for c in fake.logs] == list(range(len(fake.logs)))


def test_registers_again_on_a_lost_session_and_stops_what_the_lease_says(
    fake: FakeServer, tmp_path: Path
) -> None:
    with AgentThread(fake, tmp_path / "work"):
        fake.set_desired(spec(CHECKPOINTS_ON_SIGTERM))
        fake.wait_log("j/w0", "ready")
        fake.stop_on_register = ["j/w0"]
        fake.forget_sessions()
        exited = fake.wait_for(lambda: fake.events_of("j/w0", "exited"))[0]
    again = fake.registrations[1]
    assert [(r.replica, r.state) for r in again.running] == [("j/w0", "running")]
    assert exited.exit_code == 0


def test_stopping_the_agent_stops_its_replicas_gracefully(fake: FakeServer, tmp_path: Path) -> None:
    agent = AgentThread(fake, tmp_path / "work")
    with agent:
        fake.set_desired(spec(CHECKPOINTS_ON_SIGTERM))
        fake.wait_log("j/w0", "ready")
    assert agent.code == 0
    exited = fake.events_of("j/w0", "exited")
    assert exited and exited[0].exit_code == 0 and exited[0].checkpoint_s is not None


def test_a_refused_token_ends_the_agent_with_exit_2(fake: FakeServer, tmp_path: Path) -> None:
    agent = AgentThread(fake, tmp_path / "work", token="wrong")
    with agent:
        fake.wait_for(lambda: agent.code is not None, timeout_s=10)
    assert agent.code == 2


def test_bolt_agent_exits_0_after_sigterm(fake: FakeServer, tmp_path: Path) -> None:
    command = [sys.executable, "-m", "boltforge.cli.main", "agent", "--server", fake.url]
    command += ["--inventory", str(ROOT / "examples/nodes/host-1.yaml")]
    command += ["--work-dir", str(tmp_path / "work"), "--name", "cli-host"]
    command += ["--allow-shared-identity"]  # the fake server names no team
    env = {**os.environ, "BOLT_TOKEN": fake.token}
    agent = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True)
    try:
        fake.set_desired(spec(CHECKPOINTS_ON_SIGTERM))
        fake.wait_log("j/w0", "ready", timeout_s=30)
        agent.send_signal(signal.SIGTERM)
        _, err = agent.communicate(timeout=30)
    finally:
        agent.kill()
    assert agent.returncode == 0, err
    assert fake.registrations[0].inventory.name == "cli-host"
    assert fake.registrations[0].inventory.rack == "r0"
    assert fake.events_of("j/w0", "exited")[0].checkpoint_s is not None
    assert "token None" in fake.log_of("j/w0")

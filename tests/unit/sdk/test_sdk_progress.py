"""The training SDK as a replica uses it under a real agent runtime: the progress lines it
writes are what the agent forwards (step, rank, step time, checkpoint marks, metrics), a
restarted epoch finds the checkpoint its job wrote before, the environment's numbers fall back
to their defaults when unreadable, and the preemption hook installs only when asked for and
calls its callbacks once."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from boltforge import sdk
from boltforge.agent.outbox import Outbox
from boltforge.agent.runtime import AgentRuntime
from boltforge.wire.agent import Progress, ReplicaEvent, ReplicaSpec

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="replicas are Linux processes")

T = TypeVar("T")

TRAINS = """
from boltforge import sdk
sdk.report(1, loss=2.0)
sdk.report(2, loss=1.5, accuracy=1)
sdk.report(3, checkpoint=True, loss=1.0)
"""

RESUMES = """
from boltforge import sdk
state = sdk.checkpoint_dir() / "step"
start = int(state.read_text()) if state.exists() else 0
print("resumed at", start, flush=True)
for step in range(start + 1, start + 3):
    state.write_text(str(step))
    sdk.report(step, checkpoint=True)
"""


def replica(code: str, epoch: int = 1, **env: str) -> ReplicaSpec:
    return ReplicaSpec(
        replica="j-5.1.0",
        job="j-5",
        epoch=epoch,
        action="run",
        command=[sys.executable, "-c", code],
        env=env,
    )


def run_replica(work: Path, spec: ReplicaSpec) -> tuple[AgentRuntime, ReplicaEvent]:
    """Run ``spec`` under an agent runtime on ``work`` to its exit; all it wrote collected."""
    rt = AgentRuntime(work, Outbox(), on_exit=lambda: None, env={"PATH": "/usr/bin:/bin"})

    async def until(check: Callable[[], T]) -> T:
        deadline = time.monotonic() + 20
        while not (got := check()):
            assert time.monotonic() < deadline, "the replica did not exit in time"
            await asyncio.sleep(0.02)
        return got

    async def go() -> ReplicaEvent:
        await rt.start(spec)
        [event] = await until(lambda: [e for e in rt.outbox.events if e.kind == "exited"])
        rt.collect()
        return event

    return rt, asyncio.run(go())


def log_of(rt: AgentRuntime) -> str:
    return "".join(c.data for c in rt.outbox.logs)


# --- progress under the agent -----------------------------------------------------------------


def test_each_report_reaches_the_agent_as_a_progress_item_of_its_replica(tmp_path: Path) -> None:
    rt, event = run_replica(tmp_path, replica(TRAINS, epoch=3, RANK="4"))
    assert event.exit_code == 0, log_of(rt)
    items: list[Progress] = list(rt.outbox.progress)
    assert [(p.step, p.checkpoint) for p in items] == [(1, False), (2, False), (3, True)]
    assert {(p.replica, p.job, p.epoch, p.rank) for p in items} == {("j-5.1.0", "j-5", 3, 4)}
    assert items[0].metrics == {"loss": 2.0}
    assert items[1].metrics == {"loss": 1.5, "accuracy": 1.0}
    assert items[0].step_time_s is None  # the first report has no step before it
    assert all(p.step_time_s is not None and p.step_time_s >= 0 for p in items[1:])
    assert items[0].at <= items[1].at <= items[2].at <= time.time()


def test_a_restarted_epoch_finds_the_checkpoint_its_job_wrote_before(tmp_path: Path) -> None:
    first, _ = run_replica(tmp_path, replica(RESUMES, epoch=1))
    second, _ = run_replica(tmp_path, replica(RESUMES, epoch=2))
    assert "resumed at 0" in log_of(first)
    assert "resumed at 2" in log_of(second)
    assert [p.step for p in second.outbox.progress] == [3, 4]
    assert {p.epoch for p in second.outbox.progress} == {2}
    assert (tmp_path / "checkpoints" / "j-5" / "step").read_text() == "4"


# --- reading the environment ------------------------------------------------------------------


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> pytest.MonkeyPatch:
    for key in (
        "BOLT_PROGRESS_FILE",
        "BOLT_CHECKPOINT_DIR",
        "BOLT_JOB_ID",
        "BOLT_REPLICA",
        "BOLT_EPOCH",
        "BOLT_ARRAY_INDEX",
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
    ):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sdk, "_last_report", None)
    return monkeypatch


@pytest.mark.parametrize(
    ("name", "value", "read", "expected"),
    [
        pytest.param("RANK", "3", sdk.rank, 3, id="a rank"),
        pytest.param("RANK", "three", sdk.rank, 0, id="a rank that is not a number"),
        pytest.param("RANK", "", sdk.rank, 0, id="an empty rank"),
        pytest.param("WORLD_SIZE", "2.5", sdk.world_size, 1, id="a fractional world size"),
        pytest.param("WORLD_SIZE", " 16 ", sdk.world_size, 16, id="spaces around a number"),
        pytest.param("LOCAL_RANK", "-", sdk.local_rank, 0, id="a dash"),
        pytest.param("BOLT_ARRAY_INDEX", "  ", sdk.array_index, None, id="a blank array index"),
        pytest.param("BOLT_ARRAY_INDEX", "0", sdk.array_index, 0, id="array index zero"),
        pytest.param("BOLT_JOB_ID", "", sdk.job_id, "local", id="an empty job id"),
    ],
)
def test_numbers_from_the_environment_fall_back_to_their_defaults(
    clean_env: pytest.MonkeyPatch, name: str, value: str, read: Callable[[], Any], expected: Any
) -> None:
    clean_env.setenv(name, value)
    assert read() == expected


def test_the_checkpoint_dir_is_made_with_its_parents(
    clean_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    target = tmp_path / "shared" / "jobs" / "j-5"
    clean_env.setenv("BOLT_CHECKPOINT_DIR", str(target))
    assert sdk.checkpoint_dir() == target and target.is_dir()
    assert sdk.checkpoint_dir() == target  # again: no error for one that exists


def test_a_report_with_an_unreadable_epoch_or_rank_still_counts_the_step(
    clean_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    path = tmp_path / "p.jsonl"
    clean_env.setenv("BOLT_PROGRESS_FILE", str(path))
    clean_env.setenv("BOLT_EPOCH", "e2")
    clean_env.setenv("RANK", "?")
    sdk.report(7.0, loss=3)  # type: ignore[arg-type]
    [line] = (json.loads(x) for x in path.read_text().splitlines())
    assert (line["epoch"], line["rank"], line["step"], line["job"]) == (0, 0, 7, "local")
    assert line["metrics"] == {"loss": 3.0} and isinstance(line["metrics"]["loss"], float)
    assert line["replica"] == ""


def test_a_report_appends_to_what_the_file_held(
    clean_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text('{"step": 0}\n')
    clean_env.setenv("BOLT_PROGRESS_FILE", str(path))
    sdk.report(1)
    lines = path.read_text().splitlines()
    assert lines[0] == '{"step": 0}' and json.loads(lines[1])["metrics"] == {}


def test_a_metric_that_is_not_a_number_is_refused(
    clean_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    path = tmp_path / "p.jsonl"
    clean_env.setenv("BOLT_PROGRESS_FILE", str(path))
    with pytest.raises(ValueError):
        sdk.report(1, loss="high")  # type: ignore[arg-type]
    assert not path.exists() or path.read_text() == ""


# --- preemption -------------------------------------------------------------------------------


def python(code: str, *, signals: int = 0) -> str:
    """Run ``code``, which prints ``ready`` once set up; send SIGTERM ``signals`` times
    (each after the script printed ``ready`` or ``next``); its whole output."""
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        assert proc.stdout is not None
        out = [proc.stdout.readline()]
        for _ in range(signals):
            proc.send_signal(signal.SIGTERM)
            out.append(proc.stdout.readline())
        out.append(proc.stdout.read())  # to its end: the script has exited
        proc.wait(timeout=20)
    finally:
        proc.kill()
        proc.wait()
    return "".join(out)


def test_importing_the_sdk_leaves_sigterm_alone_until_preemption_is_asked_about() -> None:
    out = python(
        """
import signal
before = signal.getsignal(signal.SIGTERM)
from boltforge import sdk
print("ready", signal.getsignal(signal.SIGTERM) is before, flush=True)
print("asked", sdk.preempted(), signal.getsignal(signal.SIGTERM) is sdk._on_sigterm)
"""
    )
    assert out.split() == ["ready", "True", "asked", "False", "True"]


def test_a_second_sigterm_calls_the_callbacks_no_more() -> None:
    out = python(
        """
import time
from boltforge import sdk
calls = []
sdk.on_preempt(lambda: calls.append("first"))
sdk.on_preempt(lambda: calls.append("second"))
print("ready", flush=True)
while not sdk.preempted():
    time.sleep(0.01)
print("next", calls, flush=True)
deadline = time.time() + 0.3
while time.time() < deadline:
    time.sleep(0.01)
print("done", calls, sdk.preempted(), flush=True)
""",
        signals=2,
    )
    lines = out.strip().splitlines()
    assert lines[0] == "ready"
    assert lines[1] == "next ['first', 'second']"
    assert lines[-1] == "done ['first', 'second'] True"


def test_outside_the_main_thread_preemption_is_never_installed() -> None:
    out = python(
        """
import signal, threading
from boltforge import sdk
seen = []
t = threading.Thread(target=lambda: seen.append(sdk.preempted()))
t.start(); t.join()
print("ready", seen, signal.getsignal(signal.SIGTERM) is signal.SIG_DFL, flush=True)
"""
    )
    assert out.split() == ["ready", "[False]", "True"]

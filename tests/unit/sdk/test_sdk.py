"""The training SDK: progress lines, defaults outside Boltforge, and the preemption hook."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from boltforge import sdk
from boltforge.wire.agent import Progress


def test_report_appends_one_json_line_per_step(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    path = tmp_path / "progress.jsonl"
    for key, value in {
        "BOLT_PROGRESS_FILE": str(path),
        "BOLT_REPLICA": "j/w1",
        "BOLT_JOB_ID": "j",
        "BOLT_EPOCH": "3",
        "RANK": "8",
    }.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(sdk, "_last_report", None)
    sdk.report(1, loss=2.5)
    sdk.report(2, checkpoint=True, loss=1.5, accuracy=1)
    first, second = (json.loads(line) for line in path.read_text().splitlines())
    assert (first["replica"], first["job"], first["epoch"], first["rank"]) == ("j/w1", "j", 3, 8)
    assert first["step_time_s"] is None and first["checkpoint"] is False
    assert second["step_time_s"] >= 0 and second["checkpoint"] is True
    assert second["metrics"] == {"loss": 1.5, "accuracy": 1.0}
    fields = {k: v for k, v in second.items() if k in Progress.model_fields}
    assert Progress.model_validate(fields).step == 2


def test_outside_boltforge_everything_has_a_default(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for key in ("BOLT_PROGRESS_FILE", "BOLT_CHECKPOINT_DIR", "BOLT_JOB_ID", "BOLT_ARRAY_INDEX"):
        monkeypatch.delenv(key, raising=False)
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.chdir(tmp_path)
    sdk.report(1, loss=1.0)
    assert sdk.checkpoint_dir() == Path("checkpoints") and (tmp_path / "checkpoints").is_dir()
    assert (sdk.rank(), sdk.world_size(), sdk.local_rank()) == (0, 1, 0)
    assert (sdk.job_id(), sdk.array_index()) == ("local", None)
    monkeypatch.setenv("BOLT_ARRAY_INDEX", "4")
    monkeypatch.setenv("WORLD_SIZE", "16")
    assert (sdk.array_index(), sdk.world_size()) == (4, 16)


PREEMPTIBLE = """
import time
from boltforge import sdk
sdk.on_preempt(lambda: print("callback", flush=True))
print("ready", flush=True)
while not sdk.preempted():
    time.sleep(0.01)
print("checkpoint and exit", flush=True)
"""


def test_sigterm_sets_the_flag_and_calls_the_callbacks() -> None:
    proc = subprocess.Popen([sys.executable, "-c", PREEMPTIBLE], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0
    assert out.split("\n")[:2] == ["callback", "checkpoint and exit"]

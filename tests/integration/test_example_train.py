"""The example training script checkpoints on SIGTERM, exits 0, and resumes where it stopped."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples" / "train" / "train.py"


def last_step(progress: Path) -> int:
    lines = progress.read_text().splitlines() if progress.exists() else []
    return int(json.loads(lines[-1])["step"]) if lines else 0


def command(steps: int) -> list[str]:
    args = ["--steps", str(steps), "--step-time", "0.01", "--checkpoint-every", "1000"]
    return [sys.executable, str(SCRIPT), *args, "--print-every", "10"]


def test_resumes_from_the_checkpoint_written_on_sigterm(tmp_path: Path) -> None:
    progress = tmp_path / "progress.jsonl"
    env = {
        **os.environ,
        "BOLT_CHECKPOINT_DIR": str(tmp_path / "ckpt"),
        "BOLT_PROGRESS_FILE": str(progress),
        "BOLT_JOB_ID": "example",
    }
    first = subprocess.Popen(
        command(5000), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        deadline = time.monotonic() + 60
        while last_step(progress) < 20 and time.monotonic() < deadline:
            time.sleep(0.05)
        first.send_signal(signal.SIGTERM)
        out, _ = first.communicate(timeout=60)
    finally:
        first.kill()
    assert first.returncode == 0, out
    stopped = int(out.split("preempted at step ")[1].split(",")[0])
    assert "checkpoint written" in out
    assert stopped >= 20
    assert "resumed" not in out

    second = subprocess.run(
        command(stopped + 30), env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert second.returncode == 0, second.stdout + second.stderr
    assert f"resumed from step {stopped}" in second.stdout
    assert f"finished {stopped + 30} steps" in second.stdout
    assert last_step(progress) == stopped + 30
    assert list((tmp_path / "ckpt").iterdir()) == [tmp_path / "ckpt" / "model.npz"]

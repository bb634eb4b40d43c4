"""The batch script the bridge makes for a job sent with ``bolt submit``, run by a real
shell with a stand-in ``srun`` that runs the task on the node the test names: each node
runs its own replica, with its environment, in its working directory; quoting survives."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from boltforge.slurm.launch import batch_script, gpus_per_node
from boltforge.wire.agent import ReplicaSpec

# srun's options end at the first word that is not one; the rest is the task.
FAKE_SRUN = '#!/bin/sh\nwhile [ "${1#-}" != "$1" ]; do shift; done\nexec "$@"\n'


def replica(rank: int, command: list[str], **extra: object) -> ReplicaSpec:
    return ReplicaSpec.model_validate(
        {
            "replica": f"5.2.{rank}",
            "job": "5",
            "epoch": 2,
            "action": "run",
            "command": command,
            "env": {"RANK": str(rank), "NOTE": 'it\'s a "quoted" $value'},
            "gpus": list(range(8)),
            **extra,
        }
    )


def run_on(node: str, script: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    srun = bin_dir / "srun"
    srun.write_text(FAKE_SRUN)
    srun.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURMD_NODENAME": node}
    return subprocess.run(["/bin/sh", "-c", script], env=env, capture_output=True, text=True)


def test_each_node_runs_its_own_replica_with_its_environment(tmp_path: Path) -> None:
    show = ["sh", "-c", 'echo "$BOLT_REPLICA $RANK $BOLT_EPOCH $(pwd) $NOTE"']
    work = tmp_path / "work dir"
    work.mkdir()
    script = batch_script({"gpu-b": replica(1, show), "gpu-a": replica(0, show, cwd=str(work))})
    a, b = run_on("gpu-a", script, tmp_path), run_on("gpu-b", script, tmp_path)
    assert a.stdout.strip() == f'5.2.0 0 2 {work} it\'s a "quoted" $value'
    assert b.stdout.split()[:3] == ["5.2.1", "1", "2"]


def test_a_node_with_no_replica_fails_and_says_so(tmp_path: Path) -> None:
    script = batch_script({"gpu-a": replica(0, ["true"])})
    out = run_on("gpu-z", script, tmp_path)
    assert out.returncode == 1
    assert "no replica for node gpu-z" in out.stderr


def test_the_replicas_exit_status_is_the_jobs(tmp_path: Path) -> None:
    script = batch_script({"gpu-a": replica(0, ["sh", "-c", "exit 3"])})
    assert run_on("gpu-a", script, tmp_path).returncode == 3


def test_each_node_asks_for_the_gpus_its_replica_was_given() -> None:
    placed = {"a": replica(0, ["true"]), "b": replica(1, ["true"], gpus=[0, 1, 2, 3])}
    assert gpus_per_node(placed) == 8

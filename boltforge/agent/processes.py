"""Replica processes: the environment, the launch in their own process group, signals.

A replica runs as its command in a new session (so its process group id is its pid), with
stdout and stderr appended together to a per-replica log file under the agent's work dir.
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from boltforge.agent.sharing import gpus_used, share_env
from boltforge.wire.agent import ReplicaSpec


@dataclass(frozen=True, slots=True)
class ReplicaPaths:
    """Where one replica's output, progress lines and checkpoints live."""

    log: Path
    progress: Path
    checkpoint: Path
    scratch: Path
    env_file: Path


def safe_name(text: str) -> str:
    """``text`` as a single file name component."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", text).lstrip(".") or "_"


def replica_paths(work_dir: Path, spec: ReplicaSpec) -> ReplicaPaths:
    """The files of ``spec``'s replica at its epoch. The checkpoint dir is the spec's, else one
    per job under ``work_dir`` (shared by the job's epochs, so a restarted job resumes).
    ``scratch`` and ``env_file`` are a container's (see ``containers``)."""
    stem = f"{safe_name(spec.replica)}.e{spec.epoch}"
    checkpoint = (
        Path(spec.checkpoint_dir)
        if spec.checkpoint_dir
        else work_dir / "checkpoints" / safe_name(spec.job)
    )
    return ReplicaPaths(
        log=work_dir / "logs" / f"{stem}.log",
        progress=work_dir / "progress" / f"{stem}.jsonl",
        checkpoint=checkpoint,
        scratch=work_dir / "scratch" / stem,
        env_file=work_dir / "env" / f"{stem}.env",
    )


def shm_prefix(spec: ReplicaSpec) -> str:
    """The name prefix of the replica's own shared memory files (``BOLT_SHM_PREFIX``)."""
    return f"bolt-{safe_name(spec.job)}-{safe_name(spec.replica)}-e{spec.epoch}-"


def marks(spec: ReplicaSpec) -> dict[str, str]:
    """The variables that name a replica's process, whoever starts it: its job, replica and
    epoch (what the SDK reports as, and what a restarted agent finds its leftovers by)."""
    return {"BOLT_JOB_ID": spec.job, "BOLT_REPLICA": spec.replica, "BOLT_EPOCH": str(spec.epoch)}


def replica_env(spec: ReplicaSpec, paths: ReplicaPaths, base: Mapping[str, str]) -> dict[str, str]:
    """The replica's environment: ``base`` (the agent's own), unbuffered Python output, the
    spec's ``env`` (ranks, world size, master address), then the variables the agent owns."""
    env = {**base, "PYTHONUNBUFFERED": "1", **spec.env}
    env.update(marks(spec))
    env.update(
        CUDA_VISIBLE_DEVICES=",".join(str(g) for g in gpus_used(spec)),
        BOLT_CHECKPOINT_DIR=str(paths.checkpoint),
        BOLT_PROGRESS_FILE=str(paths.progress),
        BOLT_SHM_PREFIX=shm_prefix(spec),
        **share_env(spec),
    )
    return env


def prepare(paths: ReplicaPaths) -> None:
    """Create the replica's directories (the checkpoint dir included). Raises ``OSError``."""
    for directory in (paths.log.parent, paths.progress.parent, paths.checkpoint):
        directory.mkdir(parents=True, exist_ok=True)


async def launch(
    spec: ReplicaSpec, paths: ReplicaPaths, env: Mapping[str, str]
) -> asyncio.subprocess.Process:
    """Start ``spec``'s command as a process (see ``spawn``)."""
    if not spec.command:
        raise ValueError("the replica has no command")
    return await spawn(spec.command, paths.log, env, spec.cwd)


async def spawn(
    argv: list[str], log_path: Path, env: Mapping[str, str], cwd: str | None = None
) -> asyncio.subprocess.Process:
    """Start ``argv`` in a new process group, output appended to ``log_path``. Raises
    ``OSError`` when it cannot start (command not found, bad cwd)."""
    with log_path.open("ab") as log:
        return await asyncio.create_subprocess_exec(
            *argv,
            cwd=cwd,
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def signal_group(pgid: int, sig: int) -> bool:
    """Send ``sig`` to every process in group ``pgid``; False when none is left."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    except PermissionError:
        return False
    return True


def exit_fields(returncode: int) -> tuple[int | None, int | None]:
    """``(exit_code, signal)`` for a return code (negative means killed by that signal)."""
    return (None, -returncode) if returncode < 0 else (returncode, None)

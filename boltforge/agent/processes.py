"""Replica processes: the environment, the launch in their own process group, signals.

A replica runs as its command in a new session (so its process group id is its pid), with
stdout and stderr appended together to a per-replica log file under the agent's work dir.
Given an ``Identity`` (``identity``: its team's user), it runs as that user, with no
supplementary groups and umask 077; its checkpoint and scratch folders are that user's, mode
0700, and its log and progress files that user's, mode 0600, in folders of the agent's that
others may pass through but not list (0711). The agent's own credentials never reach it.
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from boltforge.agent.hooks import clean_env
from boltforge.agent.identity import Identity
from boltforge.agent.sharing import gpus_used, share_env
from boltforge.wire.agent import ReplicaSpec

# The agent's own credentials, kept out of the replicas' environment (with any
# ``BOLT_*_TOKEN_FILE``: see ``is_agent_secret``).
AGENT_SECRETS = frozenset({"BOLT_TOKEN", "BOLT_AGENT_TOKEN", "BOLT_ADMIN_TOKEN"})
SHARED_DIR_MODE = 0o711  # the agent's folders holding every replica's files: pass, not list
PRIVATE_DIR_MODE = 0o700
PRIVATE_FILE_MODE = 0o600
JOB_UMASK = 0o077
# Variables of the job's that a prolog or epilog also gets: ranks and the rendezvous,
# which no shell or loader interprets.
HOOK_JOB_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT")


def is_agent_secret(name: str) -> bool:
    """Whether variable ``name`` is one of the agent's credentials (a token, or where a
    token file is), which no replica or hook may get."""
    return name in AGENT_SECRETS or (name.startswith("BOLT_") and name.endswith("_TOKEN_FILE"))


def without_secrets(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` less the agent's credentials (``is_agent_secret``)."""
    return {k: v for k, v in env.items() if not is_agent_secret(k)}


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


def replica_env(
    spec: ReplicaSpec,
    paths: ReplicaPaths,
    base: Mapping[str, str],
    identity: Identity | None = None,
) -> dict[str, str]:
    """The replica's environment: ``base`` (the agent's own) less the agent's credentials,
    unbuffered Python output, the spec's ``env`` (ranks, world size, master address), then
    the variables the agent owns. Run as ``identity``, its ``HOME`` is its scratch folder and
    ``USER``/``LOGNAME`` name that user."""
    env = {**without_secrets(base), "PYTHONUNBUFFERED": "1", **without_secrets(spec.env)}
    if identity is not None:
        env.update(HOME=str(paths.scratch), USER=identity.user, LOGNAME=identity.user)
    env.update(agent_vars(spec, paths))
    return env


def agent_vars(spec: ReplicaSpec, paths: ReplicaPaths) -> dict[str, str]:
    """The variables the agent sets for a replica, whatever its job asked: its names
    (``marks``), team, GPUs, checkpoint and progress paths, shared memory prefix and GPU
    share."""
    return {
        **marks(spec),
        "BOLT_TEAM": spec.team,
        "CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in gpus_used(spec)),
        "BOLT_GPUS": ",".join(str(g) for g in gpus_used(spec)),
        "BOLT_CHECKPOINT_DIR": str(paths.checkpoint),
        "BOLT_PROGRESS_FILE": str(paths.progress),
        "BOLT_SHM_PREFIX": shm_prefix(spec),
        **share_env(spec),
    }


def hook_env(
    spec: ReplicaSpec,
    paths: ReplicaPaths,
    hook: str,
    identity: Identity | None = None,
    exit_code: int | None = None,
) -> dict[str, str]:
    """The environment of a prolog or epilog (``hook``) around ``spec``'s replica: the fixed
    ``hooks.clean_env`` base, the agent's variables for the replica (``agent_vars``), its
    rank variables (``HOOK_JOB_VARS``), ``BOLT_HOOK``, ``BOLT_USER`` (the user it runs as;
    empty: the agent's own) and, after an exit, ``BOLT_EXIT_CODE``. Nothing else of the
    job's environment: the scripts run as the agent's user."""
    env = {k: spec.env[k] for k in HOOK_JOB_VARS if k in spec.env}
    env.update(agent_vars(spec, paths))
    env.update(BOLT_HOOK=hook, BOLT_USER=identity.user if identity else "")
    if exit_code is not None:
        env["BOLT_EXIT_CODE"] = str(exit_code)
    return clean_env(env)


def prepare(paths: ReplicaPaths, identity: Identity | None = None) -> None:
    """Create the replica's directories (the checkpoint dir included). For ``identity``,
    the checkpoint and scratch folders and the log and progress files are made that user's
    and private (module docstring). Raises ``OSError``."""
    shared = (paths.log.parent, paths.progress.parent)
    for directory in (*shared, paths.checkpoint):
        directory.mkdir(parents=True, exist_ok=True)
    if identity is None:
        return
    for directory in shared:
        directory.chmod(SHARED_DIR_MODE)
    paths.scratch.mkdir(parents=True, exist_ok=True)
    for directory in (paths.checkpoint, paths.scratch):
        give(directory, identity, PRIVATE_DIR_MODE)
    for file in (paths.log, paths.progress):
        os.close(os.open(file, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, PRIVATE_FILE_MODE))
        give(file, identity, PRIVATE_FILE_MODE)


def give(path: Path, identity: Identity, mode: int) -> None:
    """Make ``path`` ``identity``'s with ``mode``, never through a symbolic link (a job could
    plant one where its files go). Raises ``OSError``."""
    if path.is_symlink():
        raise OSError(f"{path} is a symbolic link; the agent does not hand it to a job")
    os.chown(path, identity.uid, identity.gid, follow_symlinks=False)
    os.chmod(path, mode)


async def launch(
    spec: ReplicaSpec,
    paths: ReplicaPaths,
    env: Mapping[str, str],
    identity: Identity | None = None,
) -> asyncio.subprocess.Process:
    """Start ``spec``'s command as a process, as ``identity`` (see ``spawn``)."""
    if not spec.command:
        raise ValueError("the replica has no command")
    return await spawn(spec.command, paths.log, env, spec.cwd, identity)


async def spawn(
    argv: list[str],
    log_path: Path,
    env: Mapping[str, str],
    cwd: str | None = None,
    identity: Identity | None = None,
) -> asyncio.subprocess.Process:
    """Start ``argv`` in a new process group, output appended to ``log_path``; as
    ``identity`` (its uid and gid, no supplementary groups, umask 077) when given, else as
    the agent's user. Raises ``OSError`` when it cannot start (command not found, bad cwd,
    a cwd or command the user may not reach)."""
    switch: dict[str, object] = {}
    if identity is not None:
        switch = {
            "user": identity.uid,
            "group": identity.gid,
            "extra_groups": [],
            "umask": JOB_UMASK,
        }
    with log_path.open("ab") as log:
        return await asyncio.create_subprocess_exec(
            *argv,
            cwd=cwd,
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            **switch,  # type: ignore[arg-type]
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

"""Replicas as containers on a real engine (``bolt agent --runtime podman|docker``).

A replica whose spec names an ``image`` runs as ``ENGINE run`` in the foreground, the engine's
client being the replica's process: its exit code is the container's, and the checkpoint
signal sent to its process group is passed on to the container (the client's signal proxy).
What the container gets:

- limits: ``--cpus`` and ``--memory`` (swap included) from the replica's share of the node,
  where it asked for them, ``--pids-limit`` always, and open-file and process limits that
  the engine can set without privileges (``ulimits``);
- no network (``--network none``) unless its gang needs a rendezvous (``WORLD_SIZE`` > 1),
  then the host's network;
- a read-only root, with three writable mounts: a scratch directory of its own (``/scratch``,
  also ``HOME`` and ``TMPDIR``), the job's checkpoint directory (``/bolt/checkpoint``) and
  its progress file (``/bolt/progress.jsonl``); nothing else of the host;
- a non-root user (``65534:65534``, nobody), every capability dropped, no new privileges,
  and an init process as PID 1 that passes signals on;
- its GPUs: through CDI (``nvidia.com/gpu=N``) where the node has a CDI spec for them, else
  their device files (``/dev/nvidiaN`` with ``nvidiactl`` and ``nvidia-uvm``), and then
  ``CUDA_VISIBLE_DEVICES`` counts from 0 inside; on a node with neither (declared GPUs, no
  driver) ``CUDA_VISIBLE_DEVICES`` names the node's indices as for a process;
- only the job's environment (ranks, rendezvous, the ``BOLT_*`` variables) through an env
  file readable by the agent alone, never the agent's own.

After the replica ends, the container is removed with its anonymous volumes, then its scratch
directory and env file, before its exit is reported (and so before its GPUs are offered
again). A missing image fails the start at once (``image_present``) rather than hanging on a
pull: no registry is asked (``--pull never``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import signal
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from boltforge.agent.processes import ReplicaPaths, safe_name
from boltforge.agent.processes import exit_fields as process_exit
from boltforge.agent.sharing import gpus_used, share_env
from boltforge.agent.ulimits import ulimit_args
from boltforge.wire.agent import ReplicaSpec

log = logging.getLogger("boltforge.agent")

ENGINES = ("podman", "docker")
USER = "65534:65534"
PIDS_LIMIT = 4096
SHM_SIZE = "1g"
CHECKPOINT = "/bolt/checkpoint"
PROGRESS = "/bolt/progress.jsonl"
SCRATCH = "/scratch"
LABEL = "io.boltforge.replica"
CDI_DIRS = (Path("/etc/cdi"), Path("/var/run/cdi"))
DEV = Path("/dev")
ENGINE_TIMEOUT_S = 60.0
ENGINE_ERROR = "Error:"
ENGINE_ERROR_TAIL = 4096
# Exit codes the engine's client uses for its own failures (not the command's).
ENGINE_ERRORS = {
    125: "the container engine could not run the container",
    126: "the command in the image could not be invoked",
    127: "the command was not found in the image",
}


class EngineMissing(Exception):
    """The container engine asked for is not installed or does not answer."""


@dataclass(frozen=True, slots=True)
class Engine:
    """A container engine's client (``binary`` is ``podman`` or ``docker``, or a path to one)."""

    binary: str
    user: str = USER
    pids_limit: int = PIDS_LIMIT

    @classmethod
    def find(cls, kind: str) -> Engine:
        """The engine ``kind`` on this node's PATH; ``EngineMissing`` with the fix if none."""
        path = shutil.which(kind)
        if path is None:
            raise EngineMissing(
                f"--runtime {kind}: `{kind}` is not on this node's PATH. To fix: install "
                f"{kind} (see docs/forge.md) or run the agent with --runtime process"
            )
        return cls(path)

    @property
    def kind(self) -> str:
        return Path(self.binary).name

    def run_argv(
        self,
        spec: ReplicaSpec,
        name: str,
        files: ReplicaPaths,
        devices: list[str],
    ) -> list[str]:
        """The ``run`` command line for ``spec``'s replica as container ``name``."""
        argv = [self.binary, "run", "--name", name, "--label", f"{LABEL}={spec.replica}"]
        argv += ["--pull", "never", "--init", "--read-only", "--user", self.user]
        argv += ["--cap-drop", "all", "--security-opt", "no-new-privileges"]
        argv += ["--pids-limit", str(self.pids_limit), "--shm-size", SHM_SIZE]
        argv += ulimit_args(self.pids_limit)
        argv += ["--network", "host" if needs_network(spec) else "none"]
        if spec.cpus > 0:
            argv += ["--cpus", f"{spec.cpus:g}"]
        if spec.memory_gb > 0:
            limit = f"{int(spec.memory_gb * 1024)}m"
            argv += ["--memory", limit, "--memory-swap", limit]
        for inside, outside in {**mounts(files), PROGRESS: files.progress}.items():
            argv += ["--volume", f"{outside}:{inside}:rw"]
        for device in devices:
            argv += ["--device", device]
        argv += ["--env-file", str(files.env_file), "--workdir", spec.cwd or SCRATCH]
        return [*argv, str(spec.image), *spec.command]

    async def image_present(self, image: str) -> bool:
        """Whether ``image`` is in the node's image store (nothing is pulled)."""
        args = ["image", "exists", image] if self.kind == "podman" else ["image", "inspect", image]
        code, _ = await self._call(*args)
        return code == 0

    async def oom_killed(self, name: str) -> bool:
        """Whether the engine saw container ``name`` killed for passing its memory limit."""
        code, out = await self._call("inspect", "--format", "{{.State.OOMKilled}}", name)
        return code == 0 and out.strip() == "true"

    async def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to container ``name``'s init (which passes it on)."""
        await self._call("kill", "--signal", signal.Signals(sig).name, name)

    async def remove(self, name: str) -> bool:
        """Remove container ``name`` and its anonymous volumes, killing it if it still runs.
        True when there was one to remove."""
        code, _ = await self._call("rm", "--force", "--volumes", name)
        return code == 0

    async def _call(self, *args: str) -> tuple[int, str]:
        """Run the engine's client with ``args``: its exit code and output (-1 when it could
        not run or outlived ``ENGINE_TIMEOUT_S``)."""
        try:
            proc = await asyncio.create_subprocess_exec(
                self.binary,
                *args,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
            )
        except OSError as e:
            log.warning("%s %s: %s", self.kind, args[0], e)
            return -1, ""
        try:
            out, _ = await asyncio.wait_for(proc.communicate(), ENGINE_TIMEOUT_S)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            return -1, ""
        return proc.returncode or 0, out.decode(errors="replace")


def mounts(files: ReplicaPaths) -> dict[str, Path]:
    """The container's writable directories, as it sees them, to the host's."""
    return {SCRATCH: files.scratch, CHECKPOINT: files.checkpoint}


def container_name(spec: ReplicaSpec) -> str:
    """The container of ``spec``'s replica at its epoch (a valid container name)."""
    return f"bolt-{safe_name(spec.replica)}-e{spec.epoch}"


def needs_network(spec: ReplicaSpec) -> bool:
    """Whether the replica's gang rendezvouses over the network (more than one rank)."""
    try:
        return int(spec.env.get("WORLD_SIZE", "1")) > 1
    except ValueError:
        return True


def gpu_devices(
    gpus: list[int], dev: Path = DEV, cdi_dirs: tuple[Path, ...] = CDI_DIRS
) -> list[str]:
    """The ``--device`` values that pass ``gpus`` (the node's indices) into a container: CDI
    names where a CDI spec for NVIDIA GPUs exists, else the device files; none when the node
    has neither (its GPUs are declared, not driven)."""
    if not gpus:
        return []
    if any(d.is_dir() and any(d.glob("nvidia*")) for d in cdi_dirs):
        return [f"nvidia.com/gpu={g}" for g in gpus]
    files = [dev / f"nvidia{g}" for g in gpus]
    if not all(f.exists() for f in files):
        return []
    shared = [dev / n for n in ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools")]
    return [str(f) for f in files + [s for s in shared if s.exists()]]


def container_env(spec: ReplicaSpec, base: Mapping[str, str], devices: list[str]) -> dict[str, str]:
    """The container's environment: the replica's (``base``, as ``processes.replica_env``
    built it) less the agent's own variables, with the paths as the container sees them.
    GPUs passed through are numbered from 0 inside."""
    env = {"PYTHONUNBUFFERED": "1", "HOME": SCRATCH, "TMPDIR": SCRATCH, **spec.env}
    env.update({k: v for k, v in base.items() if k.startswith("BOLT_")})
    env.update(BOLT_CHECKPOINT_DIR=CHECKPOINT, BOLT_PROGRESS_FILE=PROGRESS)
    env.update(share_env(spec))
    used = gpus_used(spec)
    visible = range(len(used)) if devices else used
    env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in visible)
    return env


def write_env_file(path: Path, env: Mapping[str, str]) -> None:
    """Write ``env`` as an engine env file readable by the agent's user alone. Raises
    ``ValueError`` for a value an env file cannot carry (a line break)."""
    bad = [k for k, v in env.items() if "\n" in v or "\n" in k]
    if bad:
        raise ValueError(
            f"environment variable {bad[0]} holds a line break, which a container "
            "cannot be given. To fix: remove it from the job's env"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.writelines(f"{k}={v}\n" for k, v in env.items())


def hand_over(files: ReplicaPaths, user: str) -> None:
    """Create the container's writable mounts and give them to its ``user`` (``UID:GID``),
    private to it (folders 0700, the progress file 0600), when the agent may (it runs as
    root: a bare-process replica of any team then cannot read them on the host); else they
    stay the agent's."""
    folders = list(mounts(files).values())
    for folder in folders:
        folder.mkdir(parents=True, exist_ok=True)
    files.progress.parent.mkdir(parents=True, exist_ok=True)
    files.progress.touch()
    if os.geteuid() != 0:
        return
    uid, _, gid = user.partition(":")
    for path in (*folders, files.progress):
        if path.is_symlink():
            raise OSError(f"{path} is a symbolic link; the agent does not hand it over")
        os.chown(path, int(uid), int(gid or uid), follow_symlinks=False)
        os.chmod(path, 0o700 if path.is_dir() else 0o600)


def remove_files(files: ReplicaPaths) -> None:
    """Remove the container's scratch directory and env file (the checkpoint stays)."""
    shutil.rmtree(files.scratch, ignore_errors=True)
    files.env_file.unlink(missing_ok=True)


def exit_words(
    code: int, killed_by_agent: bool, memory_gb: float, oom: bool, said: str = ""
) -> str:
    """What a container's exit code means, when it needs words (else empty): the engine's own
    failures, with ``said``, the engine's error line (see ``engine_error``), where there is
    one, and a SIGKILL the agent did not send (out of memory: the engine saw it, or the
    container had a memory limit)."""
    if code in ENGINE_ERRORS:
        said = f"): {said}" if said else "; its log says why)"
        return f"{ENGINE_ERRORS[code]} (exit {code}{said}"
    if code != 128 + signal.SIGKILL or killed_by_agent:
        return ""
    if oom:
        return (
            f"was killed: out of memory (its limit is {memory_gb:g} GB). "
            "To fix: ask for more memory_gb"
        )
    if memory_gb > 0:
        return (
            f"was killed (SIGKILL) without the node asking: out of memory, most likely (its "
            f"limit is {memory_gb:g} GB). To fix: ask for more memory_gb"
        )
    return ""


def engine_error(log_file: Path, tail: int = ENGINE_ERROR_TAIL) -> str:
    """The engine's last ``Error: ...`` line in the last ``tail`` bytes of a replica's log
    (the engine's client writes its own failures there), without the prefix; empty when
    there is none or the log cannot be read."""
    try:
        with log_file.open("rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - tail))
            text = f.read().decode(errors="replace")
    except OSError:
        return ""
    errors = [line for line in text.splitlines() if line.startswith(ENGINE_ERROR)]
    return errors[-1].removeprefix(ENGINE_ERROR).strip() if errors else ""


def exit_fields(code: int) -> tuple[int | None, int | None]:
    """``(exit_code, signal)`` for a container's exit code: 128 + N means killed by signal N
    (what the engine reports for a container its signal ended); the client's own negative
    code as for a process."""
    if 128 < code <= 128 + 64:
        return None, code - 128
    return process_exit(code)

"""Jobs sent with ``bolt submit`` (not ``sbatch``) to a Slurm-backed server: the bridge
makes a Slurm job for each placement of one, whose batch script runs every replica on its
node, with the environment the server gave it (ranks, rendezvous, checkpoint directory).

One ``srun`` task per node; each task picks its replica by ``SLURMD_NODENAME``, so the
replica the server bound to a node runs on that node whatever order Slurm lists them in.
Slurm chooses the GPUs on each node (GRES), as it does for its own jobs.

The script is shell text built from what a job's submitter wrote (its env, command and
working directory), so nothing of theirs reaches it unquoted: every value goes through
``shlex.quote``, and a replica the script cannot carry safely (an env key that is not a
POSIX name, a NUL byte, which no argument can hold) or faithfully (an image: the bridge
runs no containers) is refused with the reason (``Unlaunchable``), before anything is
written."""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping

from boltforge.agent.processes import marks
from boltforge.wire.agent import ReplicaSpec

ENV_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class Unlaunchable(ValueError):
    """A replica the bridge will not turn into a batch script; the message says why and the
    fix, and is written on the job."""


def replica_env(spec: ReplicaSpec) -> dict[str, str]:
    """What a replica's process finds in its environment, as under the native agent."""
    env = {**spec.env, **marks(spec)}
    if spec.checkpoint_dir:
        env["BOLT_CHECKPOINT_DIR"] = spec.checkpoint_dir
    return env


def check_launchable(spec: ReplicaSpec) -> None:
    """Raise ``Unlaunchable`` when ``spec`` cannot run as a Slurm batch script as asked: an
    ``env`` key that is not a POSIX name (``[A-Za-z_][A-Za-z0-9_]*``), a NUL byte in its
    env, command or working directory, or an ``image`` (the bridge runs bare processes
    only, so a job that names an image would run outside it and outside the server's image
    policy)."""
    for key, value in replica_env(spec).items():
        if not ENV_KEY.fullmatch(key):
            raise Unlaunchable(
                f"env key {key[:60]!r} is not a POSIX variable name ([A-Za-z_][A-Za-z0-9_]*). "
                "To fix: rename it in the job's `env`"
            )
        if "\0" in value:
            raise Unlaunchable(f"env {key}'s value holds a NUL byte. To fix: remove it")
    if any("\0" in word for word in spec.command) or "\0" in (spec.cwd or ""):
        raise Unlaunchable("the command or workdir holds a NUL byte. To fix: remove it")
    if spec.image:
        raise Unlaunchable(
            f"it names the image {spec.image[:80]}, but the Slurm bridge runs no containers: "
            "its replicas would run as bare processes outside it. To fix: run it on nodes "
            "with Boltforge's agent, or drop `image`"
        )


def batch_script(placed: Mapping[str, ReplicaSpec]) -> str:
    """A POSIX shell batch script running each replica of ``placed`` (node -> its replica)
    on its node, every one in the same step; the step fails when one of them does. The
    checkpoint signal goes to the step's tasks only (``Slurm.signal(full=False)``), so a job
    whose replicas checkpoint and exit 0 on it ends completed; its Boltforge job carries on
    in the Slurm job made for its next placement. ``Unlaunchable`` (see
    ``check_launchable``) when a replica cannot be carried safely."""
    arms = []
    for node, spec in sorted(placed.items()):
        check_launchable(spec)
        exports = "".join(f"export {k}={shlex.quote(v)}; " for k, v in replica_env(spec).items())
        cd = f"cd {shlex.quote(spec.cwd)} && " if spec.cwd else ""
        arms.append(f"{shlex.quote(node)}) {exports}{cd}exec {shlex.join(spec.command)} ;;")
    unknown = 'echo "boltforge: no replica for node $SLURMD_NODENAME" >&2; exit 1 ;;'
    inner = 'case "$SLURMD_NODENAME" in\n' + "\n".join([*arms, f"*) {unknown}"]) + "\nesac"
    return f"srun --ntasks-per-node=1 --kill-on-bad-exit=1 /bin/sh -c {shlex.quote(inner)}"


def gpus_per_node(placed: Mapping[str, ReplicaSpec]) -> int:
    """The GPUs each node of the gang holds (the most any of its replicas was given)."""
    return max((len(s.gpus) for s in placed.values()), default=0)

"""Jobs sent with ``bolt submit`` (not ``sbatch``) to a Slurm-backed server: the bridge
makes a Slurm job for each placement of one, whose batch script runs every replica on its
node, with the environment the server gave it (ranks, rendezvous, checkpoint directory).

One ``srun`` task per node; each task picks its replica by ``SLURMD_NODENAME``, so the
replica the server bound to a node runs on that node whatever order Slurm lists them in.
Slurm chooses the GPUs on each node (GRES), as it does for its own jobs."""

from __future__ import annotations

import shlex
from collections.abc import Mapping

from boltforge.agent.processes import marks
from boltforge.wire.agent import ReplicaSpec


def replica_env(spec: ReplicaSpec) -> dict[str, str]:
    """What a replica's process finds in its environment, as under the native agent."""
    env = {**spec.env, **marks(spec)}
    if spec.checkpoint_dir:
        env["BOLT_CHECKPOINT_DIR"] = spec.checkpoint_dir
    return env


def batch_script(placed: Mapping[str, ReplicaSpec]) -> str:
    """A POSIX shell batch script running each replica of ``placed`` (node -> its replica)
    on its node, every one in the same step; the step fails when one of them does. The
    checkpoint signal goes to the step's tasks only (``Slurm.signal(full=False)``), so a job
    whose replicas checkpoint and exit 0 on it ends completed; its Boltforge job carries on
    in the Slurm job made for its next placement."""
    arms = []
    for node, spec in sorted(placed.items()):
        exports = "".join(f"export {k}={shlex.quote(v)}; " for k, v in replica_env(spec).items())
        cd = f"cd {shlex.quote(spec.cwd)} && " if spec.cwd else ""
        arms.append(f"{shlex.quote(node)}) {exports}{cd}exec {shlex.join(spec.command)} ;;")
    unknown = 'echo "boltforge: no replica for node $SLURMD_NODENAME" >&2; exit 1 ;;'
    inner = 'case "$SLURMD_NODENAME" in\n' + "\n".join([*arms, f"*) {unknown}"]) + "\nesac"
    return f"srun --ntasks-per-node=1 --kill-on-bad-exit=1 /bin/sh -c {shlex.quote(inner)}"


def gpus_per_node(placed: Mapping[str, ReplicaSpec]) -> int:
    """The GPUs each node of the gang holds (the most any of its replicas was given)."""
    return max((len(s.gpus) for s in placed.values()), default=0)

"""A Slurm cluster scheduled by Boltforge, for the Slurm tests and ``bench/slurm.py``: a real
slurmctld with 8 slurmd nodes of 8 emulated GPUs in two racks, a ``bolt server`` with no
agents, and ``bolt slurm-bridge`` between them. ``bolt submit`` jobs of the teams in
``TEAM_USERS`` run as those (unprivileged) users, made if missing; their files belong in
``SlurmFleet.shared``, a folder those users may write in."""

from __future__ import annotations

import json
import shutil
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from boltforge.client import Client
from boltforge.slurm.gang import parse_admin_comment
from boltforge.testing.processes import LocalCluster, Proc, bolt, child_env, spawn, wait_until
from boltforge.testing.slurm import (
    FAST_SCHEDULER,
    SlurmCluster,
    ensure_user,
    shared_folder,
    slurm_cluster,
)

PREEMPT_AT_ONCE = ["--min-runtime", "0", "--churn", "1", "--cooldown", "0"]
TEAM_USERS = {"research": "bolt-research", "batch": "bolt-batch"}

# A checkpointing job: counts steps of 0.1 s into $CKPT, resumes from it, and on SIGTERM
# (the checkpoint signal) writes it and exits 0.
TRAINER = """
CKPT="{ckpt}"
step=$(cat "$CKPT" 2>/dev/null || echo 0)
echo "resumed from step $step on $(hostname) $SLURM_JOB_NODELIST"
echo "$(date +%s.%N) start $step" >> "$CKPT.log"
trap 'echo "$step" > "$CKPT"; echo "$(date +%s.%N) term $step" >> "$CKPT.log"; exit 0' TERM
while [ "$step" -lt {steps} ]; do
    sleep 0.1
    step=$((step + 1))
    [ $((step % 10)) -eq 0 ] && echo "$step" > "$CKPT"
done
echo "$step" > "$CKPT"
echo "$(date +%s.%N) done $step" >> "$CKPT.log"
"""


@dataclass
class SlurmFleet:
    slurm: SlurmCluster
    server: LocalCluster
    data: Path
    shared: Path
    bridge: Proc | None = None
    bridge_args: tuple[str, ...] = ()

    @property
    def api(self) -> Client:
        return self.server.client()

    def start_bridge(self) -> None:
        """Start the bridge; its token in its environment (``BOLT_TOKEN``), as a deployment
        keeps it off the command line."""
        env = {**child_env(self.data), "SLURM_CONF": str(self.slurm.conf)}
        env["BOLT_TOKEN"] = self.server.admin_token
        cmd = [*bolt(), "slurm-bridge", "--server", self.server.url, "--grace", "20"]
        cmd += ["--wake-file", str(self.slurm.wake)]
        cmd += [f"--team-user={team}={user}" for team, user in TEAM_USERS.items()]
        cmd += self.bridge_args
        self.bridge = spawn(cmd, self.data / "bridge.log", env, cwd=self.data)

    def kill_bridge(self) -> None:
        assert self.bridge is not None
        self.bridge.signal(signal.SIGKILL)
        self.bridge.popen.wait(10)

    def trainer(self, name: str, *options: str, steps: int = 600) -> tuple[str, Path]:
        """sbatch the checkpointing job; its Slurm id and checkpoint file."""
        ckpt = self.data / f"{name}.ckpt"
        script = TRAINER.format(ckpt=ckpt, steps=steps)
        return self.slurm.sbatch(f"--job-name={name}", *options, script=script), ckpt

    def queue(self) -> dict[str, dict[str, Any]]:
        """Every job ``squeue --json`` shows, by id."""
        out = self.slurm.run("squeue", "--json", "--states=all")
        return {str(j["job_id"]): j for j in json.loads(out)["jobs"]}

    def squeue(self, job: str) -> dict[str, Any]:
        return self.queue()[job]  # 22.05's squeue --json ignores -j

    def boltforge_id(self, job: str) -> str | None:
        bf, _ = parse_admin_comment(str(self.squeue(job).get("admin_comment") or ""))
        return bf

    def log(self) -> str:
        return (self.data / "bridge.log").read_text()


@contextmanager
def slurm_fleet(
    data: Path,
    server_args: list[str] | None = None,
    scheduler: str | None = FAST_SCHEDULER,
    bridge_args: tuple[str, ...] = (),
    cpus: int = 32,
) -> Iterator[SlurmFleet]:
    """Slurm (``scheduler``: its SchedulerParameters; ``cpus``: each node's CPUs), a server
    and a bridge (with ``bridge_args`` besides the ``TEAM_USERS`` map), with every Slurm
    node registered."""
    for user in TEAM_USERS.values():
        ensure_user(user)
    shared = shared_folder("boltforge-shared-")
    try:
        with slurm_cluster(nodes=8, racks=2, scheduler=scheduler, cpus=cpus) as slurm:
            args = [*PREEMPT_AT_ONCE, *(server_args or [])]
            with LocalCluster(data, hosts=0, server_args=args) as server:
                fleet = SlurmFleet(slurm, server, data, shared, bridge_args=bridge_args)
                fleet.start_bridge()
                try:
                    api = fleet.api
                    wait_until(lambda: len(api.nodes().nodes) == 8, 30, "8 Slurm nodes to register")
                    yield fleet
                finally:
                    if fleet.bridge is not None and fleet.bridge.alive():
                        fleet.bridge.stop()
    finally:
        shutil.rmtree(shared, ignore_errors=True)

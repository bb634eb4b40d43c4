"""Taking Boltforge out of a real Slurm cluster (docs/slurm.md, "Taking it out again"):
``bolt slurm-release`` hands every job back to Slurm as if Boltforge had never been there."""

from __future__ import annotations

import subprocess
from functools import partial
from pathlib import Path

from slurm_kit import SlurmFleet, scheduled_slurm, wait_until

from boltforge.slurm.model import hostnames
from boltforge.testing.processes import bolt, child_env

LIVE = ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING")


def job_state(fleet: SlurmFleet, job: str) -> str:
    return str(fleet.squeue(job)["job_state"])


def running(fleet: SlurmFleet, job: str) -> bool:
    return job_state(fleet, job) == "RUNNING"


def boltforge_words(fleet: SlurmFleet) -> dict[str, str]:
    """Each live job's comment and admin comment that mention Boltforge."""
    words = {}
    for sid, j in fleet.queue().items():
        said = f"{j.get('comment') or ''} {j.get('admin_comment') or ''}"
        if j["job_state"] in LIVE and "boltforge" in said:
            words[sid] = said
    return words


def test_the_way_out_leaves_a_held_job_unpinned_and_no_job_with_boltforge_words(
    tmp_path: Path,
) -> None:
    with scheduled_slurm(tmp_path) as fleet:
        moved, _ = fleet.trainer("moved", "-N1", "--gres=gpu:8", "-A", "research")
        steady, _ = fleet.trainer("steady", "-N1", "--gres=gpu:8", "-A", "research")
        for job in (moved, steady):
            wait_until(partial(running, fleet, job), 30, "Slurm to start it")
        wait_until(lambda: "placed on" in str(fleet.squeue(steady)["comment"]), 20, "a comment")
        [pinned] = hostnames(str(fleet.squeue(moved)["nodes"]))
        fleet.kill_bridge()
        # As a preemption leaves it: requeued held, still pinned to the node it ran on.
        fleet.slurm.run("scontrol", "requeuehold", moved)
        wait_until(lambda: job_state(fleet, moved) == "PENDING", 30, "the requeue")
        assert str(fleet.squeue(moved)["required_nodes"]) == pinned
        fleet.slurm.run("scontrol", "update", f"NodeName={pinned}", "State=DRAIN", "Reason=out")

        env = {**child_env(fleet.data), "SLURM_CONF": str(fleet.slurm.conf)}
        out = subprocess.run(
            [*bolt(), "slurm-release"], env=env, capture_output=True, text=True, timeout=60
        )
        assert out.returncode == 0, out.stderr
        assert f"released 1 held job(s): {moved}" in out.stdout

        wait_until(partial(running, fleet, moved), 30, "Slurm to run it elsewhere")
        assert not fleet.squeue(moved)["required_nodes"]
        assert pinned not in hostnames(str(fleet.squeue(moved)["nodes"]))
        assert job_state(fleet, steady) == "RUNNING"  # never stopped
        assert boltforge_words(fleet) == {}

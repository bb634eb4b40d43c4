"""Nodes shared with partitions Boltforge does not manage, on a real Slurm cluster: what
another partition's jobs hold on a node counts in Boltforge's placement, so a job is never
placed on GPUs Slurm has given to someone else (it would wait there ``PENDING Resources``
while other nodes are empty)."""

from __future__ import annotations

from pathlib import Path

from slurm_kit import SlurmFleet, scheduled_slurm, wait_until

from boltforge.slurm.model import hostnames


def slurm_state(fleet: SlurmFleet, job: str) -> str:
    return str(fleet.squeue(job)["job_state"])


def slurm_nodes(fleet: SlurmFleet, job: str) -> tuple[str, ...]:
    return hostnames(str(fleet.squeue(job)["nodes"]))


def test_gpus_another_partition_holds_on_a_shared_node_are_not_placed_on(
    tmp_path: Path,
) -> None:
    with scheduled_slurm(tmp_path) as fleet:
        # A managed 1-GPU job: Boltforge counts 7 GPUs free on its node.
        small, _ = fleet.trainer("small", "--gres=gpu:1", "-A", "research", steps=6000)
        wait_until(lambda: slurm_state(fleet, small) == "RUNNING", 40, "Slurm to run it")
        (shared,) = slurm_nodes(fleet, small)

        # A job of the unmanaged partition "low" (same nodes) takes 2 more GPUs there:
        # Slurm has 5 free on that node, and 8 on every other.
        other = fleet.slurm.sbatch(
            "-p", "low", "--gres=gpu:2", "-w", shared, "--job-name=other", script="sleep 600"
        )
        wait_until(lambda: slurm_state(fleet, other) == "RUNNING", 30, "Slurm to run it")
        assert not fleet.squeue(other).get("admin_comment")  # not Boltforge's
        said = f"jobs not Boltforge's hold gpus=2,cpus=1,memory_gb=0 on node {shared}"
        wait_until(lambda: said in fleet.log(), 20, "the bridge to count them")

        # A 6-GPU job fits the shared node only if those 2 GPUs were free (the tightest
        # fit were they free): it must go to another node, and run at once.
        big, _ = fleet.trainer("big", "--gres=gpu:6", "-A", "research", steps=6000)
        wait_until(lambda: slurm_state(fleet, big) == "RUNNING", 40, "Slurm to run the 6-GPU job")
        assert shared not in slurm_nodes(fleet, big)
        bf = fleet.boltforge_id(big)
        assert bf is not None
        wait_until(lambda: fleet.api.job(bf).state == "running", 20, "Boltforge to see it run")
        assert [r.node for r in fleet.api.job(bf).placement] != [shared]
        assert slurm_state(fleet, small) == slurm_state(fleet, other) == "RUNNING"

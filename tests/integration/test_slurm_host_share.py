"""CPUs and memory on a real Slurm cluster: a job's ``-c``/``--mem`` count in Boltforge's
placement as in Slurm's, so jobs that take all of a node's CPUs go to different nodes
rather than waiting on one whose GPUs are free but whose CPUs are not."""

from __future__ import annotations

from pathlib import Path

from slurm_kit import scheduled_slurm, wait_until

from boltforge.slurm.model import hostnames

CPUS = 2  # each node's


def test_one_gpu_jobs_taking_all_of_a_nodes_cpus_land_on_three_nodes(tmp_path: Path) -> None:
    with scheduled_slurm(tmp_path, cpus=CPUS) as fleet:
        jobs = [
            fleet.trainer(f"cpu-bound-{i}", "--gres=gpu:1", "-c", str(CPUS), "-A", "research")[0]
            for i in range(3)
        ]

        def running() -> bool:
            return all(str(fleet.squeue(j)["job_state"]) == "RUNNING" for j in jobs)

        wait_until(running, 40, "Slurm to run all three")
        nodes = [hostnames(str(fleet.squeue(j)["nodes"])) for j in jobs]
        assert len({n for ns in nodes for n in ns}) == 3
        for job in jobs:
            bf = fleet.boltforge_id(job)
            assert bf is not None
            assert fleet.api.job(bf).state == "running"

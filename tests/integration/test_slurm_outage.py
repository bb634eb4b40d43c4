"""A Slurm bridge away for longer than the server's lease, on a real Slurm cluster: Slurm
keeps its jobs running meanwhile, so none is restarted, and the bridge started again hands
them back to the server as they were."""

from __future__ import annotations

import time
from pathlib import Path

from slurm_kit import SlurmFleet, scheduled_slurm, wait_until

LEASE_S = 3.0
SHORT_LEASE = ["--heartbeat", "0.5", "--lease", str(LEASE_S)]


def node_states(fleet: SlurmFleet, names: list[str]) -> set[str]:
    return {n.state for n in fleet.api.nodes().nodes if n.name in names}


def test_a_bridge_away_for_twice_the_lease_restarts_no_job_slurm_kept_running(
    tmp_path: Path,
) -> None:
    with scheduled_slurm(tmp_path, server_args=SHORT_LEASE) as fleet:
        job, ckpt = fleet.trainer("steady", "-N2", "--gres=gpu:8", "-A", "research", steps=300)
        bf = wait_until(lambda: fleet.boltforge_id(job), 20, "the bridge to take the job")
        wait_until(lambda: fleet.api.job(bf).state == "running", 30, "the job to run")
        nodes = [r.node for r in fleet.api.job(bf).placement]

        fleet.kill_bridge()
        wait_until(lambda: node_states(fleet, nodes) == {"dead"}, 30, "its nodes' leases to end")
        time.sleep(LEASE_S * 2)  # away for more than twice the lease in all
        assert fleet.api.job(bf).state == "running"  # the server wrote nothing off
        fleet.start_bridge()

        wait_until(lambda: node_states(fleet, nodes) == {"ready"}, 30, "its nodes to register")
        detail = fleet.api.job(bf)
        assert (detail.state, detail.epoch, detail.restarts) == ("running", 1, 0)
        assert str(fleet.squeue(job)["job_state"]) == "RUNNING"
        assert int(fleet.squeue(job)["restart_cnt"]) == 0
        wait_until(lambda: fleet.api.job(bf).state == "succeeded", 60, "the job to finish")
        assert fleet.api.job(bf).restarts == 0
        assert int(fleet.squeue(job)["restart_cnt"]) == 0
        assert Path(f"{ckpt}.log").read_text().count(" start ") == 1  # its script ran once

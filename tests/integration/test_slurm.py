"""Boltforge scheduling a real Slurm cluster: slurmctld with 8 slurmd nodes of 8 emulated
GPUs in two racks (topology.conf), jobs sent with plain ``sbatch`` to the managed partition
and held by ``deploy/slurm/job_submit.lua``, and ``bolt slurm-bridge`` between Slurm and
the server. Skipped where Slurm is not installed, unless BOLT_REQUIRE_SLURM=1 (CI)."""

from __future__ import annotations

from pathlib import Path

from slurm_kit import SlurmFleet, scheduled_slurm, wait_until

from boltforge.testing.slurm_fleet import TRAINER
from boltforge.wire.jobs import SubmitRequest


def rack_of(fleet: SlurmFleet, nodes: list[str]) -> set[int]:
    return {i for i, rack in enumerate(fleet.slurm.racks) for n in nodes if n in rack}


def slurm_nodes(fleet: SlurmFleet, job: str) -> list[str]:
    from boltforge.slurm.model import hostnames

    return list(hostnames(str(fleet.squeue(job)["nodes"])))


def state(fleet: SlurmFleet, job: str) -> str:
    return str(fleet.squeue(job)["job_state"])


def test_a_two_node_sbatch_job_is_held_placed_on_one_rack_and_runs_to_completion(
    tmp_path: Path,
) -> None:
    with scheduled_slurm(tmp_path) as fleet:
        assert not fleet.slurm.wake.exists()
        job, ckpt = fleet.trainer("pair", "-N2", "--gres=gpu:h100:8", "-A", "research", steps=40)
        assert fleet.slurm.wake.exists()  # job_submit.lua woke the bridge as it held the job
        bf = wait_until(lambda: fleet.boltforge_id(job), 20, "the bridge to take the job")
        wait_until(lambda: state(fleet, job) == "RUNNING", 30, "Slurm to start it")
        nodes = slurm_nodes(fleet, job)
        wait_until(lambda: state(fleet, job) == "COMPLETED", 60, "Slurm to run it")
        wait_until(lambda: fleet.api.job(bf).state == "succeeded", 20, "Boltforge to see it end")
        detail = fleet.api.job(bf)
        assert (detail.name, detail.team, detail.gpus, detail.replicas) == (
            "slurm-pair", "research", 16, 2,
        )  # fmt: skip
        assert sorted(nodes) == sorted(r.node for r in detail.placement)
        assert len(rack_of(fleet, nodes)) == 1  # both nodes under one switch
        assert ckpt.read_text().strip() == "40"


def test_a_high_priority_job_preempts_a_low_one_which_requeues_held_and_resumes_from_its_checkpoint(
    tmp_path: Path,
) -> None:
    with scheduled_slurm(tmp_path) as fleet:
        low, ckpt = fleet.trainer("low", "-N8", "--gres=gpu:8", "-A", "batch", "--qos=low")
        low_bf = wait_until(lambda: fleet.boltforge_id(low), 20, "the bridge to take it")
        wait_until(lambda: checkpointed(ckpt) >= 20, 40, "a checkpoint")

        high, _ = fleet.trainer(
            "high", "-N2", "--gres=gpu:8", "-A", "research", "--qos=high", steps=10
        )
        wait_until(lambda: state(fleet, high) == "COMPLETED", 60, "the high job to run")
        wait_until(lambda: running_at_epoch(fleet, low_bf, 2), 60, "the low job to run again")
        wait_until(lambda: logged(ckpt) >= 3, 20, "the restarted script to log its start")

        history = Path(f"{ckpt}.log").read_text().split()
        kinds = history[1::3]
        assert kinds[:3] == ["start", "term", "start"], "the checkpoint signal, then a restart"
        term_step, resumed_step = int(history[5]), int(history[8])
        assert resumed_step == term_step >= 20  # resumed from the checkpoint the signal wrote
        detail = fleet.api.job(low_bf)
        assert (detail.preemptions, detail.restarts) == (1, 0)


def checkpointed(ckpt: Path) -> int:
    return int(ckpt.read_text() or 0) if ckpt.exists() else 0


def logged(ckpt: Path) -> int:
    """How many lines (start, term, done) the trainer wrote to its log so far; Boltforge
    hears a job runs before its script has written its first line."""
    log = Path(f"{ckpt}.log")
    return len(log.read_text().splitlines()) if log.exists() else 0


def running_at_epoch(fleet: SlurmFleet, job: str, epoch: int) -> bool:
    detail = fleet.api.job(job)
    return detail.state == "running" and detail.epoch >= epoch


def test_a_job_boltforge_cannot_take_says_why_in_its_comment_and_is_not_submitted(
    tmp_path: Path,
) -> None:
    with scheduled_slurm(tmp_path) as fleet:
        job, _ = fleet.trainer("halves", "-N2", "--gres=gpu:4", "-A", "research")
        wait_until(lambda: "refused" in str(fleet.squeue(job)["comment"]), 20, "a reason")
        comment = str(fleet.squeue(job)["comment"])
        assert "whole nodes" in comment and "--gres=gpu:8" in comment
        assert state(fleet, job) == "PENDING" and fleet.boltforge_id(job) is None
        assert fleet.api.jobs().jobs == []


def test_a_waiting_job_says_why_in_its_comment(tmp_path: Path) -> None:
    with scheduled_slurm(tmp_path) as fleet:
        big, _ = fleet.trainer("big", "-N8", "--gres=gpu:8", "-A", "research")
        wait_until(lambda: state(fleet, big) == "RUNNING", 30, "the big job to run")
        queued, _ = fleet.trainer("queued", "-N1", "--gres=gpu:8", "-A", "research")
        wait_until(lambda: "waiting" in str(fleet.squeue(queued)["comment"]), 20, "a reason")
        comment = str(fleet.squeue(queued)["comment"])
        assert comment.startswith("boltforge: waiting")
        running = str(fleet.squeue(big)["comment"])
        assert running.startswith("boltforge: placed on")


def test_a_bridge_killed_and_started_again_adopts_the_running_job_without_starting_it_twice(
    tmp_path: Path,
) -> None:
    with scheduled_slurm(tmp_path) as fleet:
        job, ckpt = fleet.trainer("steady", "-N2", "--gres=gpu:8", "-A", "research", steps=150)
        bf = wait_until(lambda: fleet.boltforge_id(job), 20, "the bridge to take the job")
        wait_until(lambda: state(fleet, job) == "RUNNING", 30, "the job to run")
        fleet.kill_bridge()
        fleet.start_bridge()
        wait_until(lambda: state(fleet, job) == "COMPLETED", 60, "the job to finish")
        wait_until(lambda: fleet.api.job(bf).state == "succeeded", 20, "Boltforge to see it end")
        detail = fleet.api.job(bf)
        assert (detail.epoch, detail.restarts, detail.preemptions) == (1, 0, 0)
        assert Path(f"{ckpt}.log").read_text().count(" start ") == 1
        assert int(fleet.squeue(job)["restart_cnt"]) == 0


def test_a_job_cancelled_with_scancel_is_cancelled_in_boltforge(tmp_path: Path) -> None:
    with scheduled_slurm(tmp_path) as fleet:
        job, _ = fleet.trainer("short-lived", "-N1", "--gres=gpu:8", "-A", "research")
        bf = wait_until(lambda: fleet.boltforge_id(job), 20, "the bridge to take the job")
        wait_until(lambda: state(fleet, job) == "RUNNING", 30, "the job to run")
        fleet.slurm.run("scancel", job)
        wait_until(lambda: fleet.api.job(bf).state == "cancelled", 20, "Boltforge to cancel it")


def test_a_job_sent_with_bolt_submit_runs_as_a_slurm_job_on_the_nodes_it_was_placed_on(
    tmp_path: Path,
) -> None:
    with scheduled_slurm(tmp_path) as fleet:
        ran = fleet.shared / "ran.txt"  # the job runs as team research's user
        record = f'echo "$BOLT_REPLICA $SLURMD_NODENAME $SLURM_JOB_ID" >> {ran}'
        spec = {"name": "native", "team": "research", "gpus": 16, "command": ["sh", "-c", record]}
        job = fleet.api.submit(SubmitRequest(spec=spec)).job.id
        wait_until(lambda: fleet.api.job(job).state == "succeeded", 60, "the job to succeed")
        placed = {r.replica: r.node for r in fleet.api.job(job).placement}
        lines = sorted(tuple(line.split()) for line in ran.read_text().splitlines())
        assert [(r, n) for r, n, _ in lines] == sorted(placed.items())  # each on its node
        [sid] = {sid for _, _, sid in lines}  # one Slurm job ran them all
        assert fleet.boltforge_id(sid) == job
        assert len(rack_of(fleet, list(placed.values()))) == 1


def test_a_bolt_submit_job_preempted_through_slurm_resumes_from_its_checkpoint_in_a_new_slurm_job(
    tmp_path: Path,
) -> None:
    with scheduled_slurm(tmp_path) as fleet:
        ckpt = fleet.shared / "low.ckpt"  # the job runs as team batch's user
        per_rank = TRAINER.format(ckpt=f"{ckpt}.$RANK", steps=600)
        spec = {
            "name": "low",
            "team": "batch",
            "gpus": 64,
            "priority": "low",
            "command": ["sh", "-c", per_rank],
        }
        low = fleet.api.submit(SubmitRequest(spec=spec)).job.id
        rank0 = Path(f"{ckpt}.0")
        wait_until(lambda: checkpointed(rank0) >= 20, 60, "a checkpoint")
        first = {sid for sid in fleet.queue() if fleet.boltforge_id(sid) == low}

        high, _ = fleet.trainer(
            "high", "-N2", "--gres=gpu:8", "-A", "research", "--qos=high", steps=10
        )
        wait_until(lambda: state(fleet, high) == "COMPLETED", 60, "the high job to run")
        wait_until(lambda: running_at_epoch(fleet, low, 2), 60, "the low job to run again")
        wait_until(lambda: logged(rank0) >= 3, 20, "the restarted replica to log its start")

        made = {sid for sid in fleet.queue() if fleet.boltforge_id(sid) == low}
        assert len(first) == 1 and len(made) == 2  # a Slurm job of its own for each epoch
        [old] = first
        assert state(fleet, old) == "COMPLETED"  # its replicas checkpointed and exited 0
        history = Path(f"{rank0}.log").read_text().split()
        assert history[1::3][:3] == ["start", "term", "start"], "the checkpoint signal, a restart"
        term_step, resumed_step = int(history[5]), int(history[8])
        assert resumed_step == term_step >= 20  # resumed from the checkpoint the signal wrote
        assert fleet.api.job(low).preemptions == 1


def test_a_node_drained_in_slurm_is_cordoned_and_comes_back_when_resumed(tmp_path: Path) -> None:
    with scheduled_slurm(tmp_path) as fleet:
        fleet.slurm.run("scontrol", "update", "NodeName=n8", "State=DRAIN", "Reason=bad_dimm")
        wait_until(lambda: node_state(fleet, "n8") == "cordoned", 20, "n8 to be cordoned")
        big, _ = fleet.trainer("wide", "-N8", "--gres=gpu:8", "-A", "research")
        wait_until(lambda: "waiting" in str(fleet.squeue(big)["comment"]), 20, "a reason")
        fleet.slurm.run("scontrol", "update", "NodeName=n8", "State=RESUME")
        wait_until(lambda: node_state(fleet, "n8") == "ready", 20, "n8 to be ready again")
        wait_until(lambda: state(fleet, big) == "RUNNING", 30, "the 8-node job to run")


def node_state(fleet: SlurmFleet, name: str) -> str:
    return next(n.state for n in fleet.api.nodes().nodes if n.name == name)

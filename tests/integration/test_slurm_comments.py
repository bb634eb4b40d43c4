"""What Slurm users read in ``squeue -o "%i %T %k"`` on a real slurmctld: the comment of a
preempted job waiting again, refusals in ``sbatch`` options with their fix, why preemption
is ruled out, and a QOS that names no priority class. Skipped where Slurm is not
installed, unless BOLT_REQUIRE_SLURM=1 (CI)."""

from __future__ import annotations

from pathlib import Path

from slurm_kit import SlurmFleet, scheduled_slurm, wait_until


def comment(fleet: SlurmFleet, job: str) -> str:
    return str(fleet.squeue(job)["comment"])


def state(fleet: SlurmFleet, job: str) -> str:
    return str(fleet.squeue(job)["job_state"])


def test_a_preempted_job_waiting_again_says_so_and_not_where_it_ran(tmp_path: Path) -> None:
    with scheduled_slurm(tmp_path) as fleet:
        low, _ = fleet.trainer("low", "-N8", "--gres=gpu:8", "-A", "batch", "--qos=low")
        wait_until(lambda: state(fleet, low) == "RUNNING", 30, "the low job to run")
        wait_until(lambda: "placed on" in comment(fleet, low), 20, "where it runs")
        high, _ = fleet.trainer("high", "-N8", "--gres=gpu:8", "-A", "research", "--qos=high")
        wait_until(lambda: state(fleet, high) == "RUNNING", 60, "the high job to run")
        wait_until(lambda: "preempted" in comment(fleet, low), 20, "the low job's new comment")
        text = comment(fleet, low)
        assert text.startswith("boltforge: waiting") and "placed on" not in text


def test_more_gpus_per_node_than_a_node_has_is_refused_in_sbatch_options(tmp_path: Path) -> None:
    with scheduled_slurm(tmp_path) as fleet:
        job, _ = fleet.trainer("wide", "--gres=gpu:16", "-A", "research")
        wait_until(lambda: "refused" in comment(fleet, job), 20, "a refusal")
        text = comment(fleet, job)
        assert "To fix: ask at most `--gres=gpu:8` per node" in text
        assert fleet.boltforge_id(job) is None


def test_a_job_kept_waiting_by_the_minimum_runtime_says_so(tmp_path: Path) -> None:
    with scheduled_slurm(tmp_path, server_args=["--min-runtime", "600"]) as fleet:
        low, _ = fleet.trainer("low", "-N8", "--gres=gpu:8", "-A", "batch", "--qos=low")
        wait_until(lambda: state(fleet, low) == "RUNNING", 30, "the low job to run")
        high, _ = fleet.trainer("high", "-N1", "--gres=gpu:8", "-A", "research", "--qos=high")
        wait_until(lambda: "ruled out" in comment(fleet, high), 30, "why preemption is out")
        text = comment(fleet, high)
        assert text.startswith("boltforge: waiting") and "in its first 10 min" in text
        assert state(fleet, low) == "RUNNING"


def test_a_job_kept_waiting_by_the_churn_budget_says_so(tmp_path: Path) -> None:
    with scheduled_slurm(tmp_path, server_args=["--churn", "0.05"]) as fleet:
        low, _ = fleet.trainer("low", "-N8", "--gres=gpu:8", "-A", "batch", "--qos=low")
        wait_until(lambda: state(fleet, low) == "RUNNING", 30, "the low job to run")
        high, _ = fleet.trainer("high", "-N1", "--gres=gpu:8", "-A", "research", "--qos=high")
        wait_until(lambda: "ruled out" in comment(fleet, high), 30, "why preemption is out")
        assert "churn budget" in comment(fleet, high)
        assert state(fleet, low) == "RUNNING"


def test_a_qos_that_names_no_priority_class_says_so_with_the_fix(tmp_path: Path) -> None:
    with scheduled_slurm(tmp_path) as fleet:
        job, _ = fleet.trainer("urgent", "--gres=gpu:8", "-A", "research", "--qos=urgent")
        bf = wait_until(lambda: fleet.boltforge_id(job), 20, "the bridge to take it")
        wait_until(lambda: "QOS urgent" in comment(fleet, job), 20, "the QOS note")
        assert "--qos-class urgent=CLASS" in comment(fleet, job)
        assert fleet.api.job(bf).priority_name == "normal"
        assert fleet.log().count("QOS urgent names no priority class") == 1


def test_a_qos_mapped_by_the_bridge_gets_its_class(tmp_path: Path) -> None:
    with scheduled_slurm(tmp_path, bridge_args=("--qos-class", "urgent=high")) as fleet:
        job, _ = fleet.trainer("urgent", "--gres=gpu:8", "-A", "research", "--qos=urgent")
        bf = wait_until(lambda: fleet.boltforge_id(job), 20, "the bridge to take it")
        assert fleet.api.job(bf).priority_name == "high"
        wait_until(lambda: "placed on" in comment(fleet, job), 20, "where it runs")
        assert "QOS" not in comment(fleet, job)

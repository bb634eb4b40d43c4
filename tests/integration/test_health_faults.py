"""Health faults injected into a real control plane (a ``bolt server``, ``bolt agent``s
standing in for 8-GPU hosts, the example trainer): a host whose rank runs slow, and a job
that hangs. The straggler is found with its evidence, its host cordoned and the job moved
off at its checkpoint; the hung job is failed with the evidence in its history and its GPUs
go to the next job; a job that never reports is left alone; no GPU is ever held twice."""

from __future__ import annotations

import sys
from typing import Any

import httpx
from test_faults import TRAIN, fleet, node_state, nothing_lost, running_at_epoch, submit

from boltforge.client import Client
from boltforge.testing.processes import LocalCluster, wait_until

FAST = ["--heartbeat", "0.5", "--lease", "10"]


def trainer(name: str, gpus: int, steps: int, *flags: str) -> dict[str, Any]:
    """The example trainer on ``gpus`` GPUs (8 per host): 50 ms steps, a checkpoint every 10."""
    command = [sys.executable, str(TRAIN), "--steps", str(steps), "--step-time", "0.05"]
    command += ["--checkpoint-every", "10", "--print-every", "1000", *flags]
    spec = {"name": name, "team": "research", "gpus": gpus, "command": command}
    return {**spec, "checkpoint": {"grace": "2s"}}


def events(api: Client, job: str, kind: str) -> list[Any]:
    return [e for e in api.job(job).events if e.kind == kind]


def audit(cluster: LocalCluster) -> list[dict[str, Any]]:
    headers = {"Authorization": f"Bearer {cluster.admin_token}"}
    entries: list[dict[str, Any]] = httpx.get(f"{cluster.url}/v1/audit", headers=headers).json()
    return entries


def test_a_slow_host_is_found_cordoned_and_its_job_moves_off_at_its_checkpoint(
    tmp_path: Any,
) -> None:
    args = [*FAST, "--straggler-action", "cordon", "--straggler-samples", "10"]
    with fleet(tmp_path, 3, args) as (cluster, api):
        job = submit(api, trainer("slow-host", 16, 200, "--slow-host", "host-1"))
        wait_until(lambda: running_at_epoch(api, job, 1), 60, "the job to run")
        placed = {r.rank: r.node for r in api.job(job).placement}
        assert placed == {0: "host-0", 1: "host-1"}  # one rack: the tightest fit

        [found] = wait_until(lambda: events(api, job, "straggler"), 60, "the straggler")
        assert (found.data["rank"], found.data["node"]) == (1, "host-1")
        assert found.data["ratio"] >= 2.0 and found.data["samples"] >= 10
        assert found.data["peer_median_s"] < found.data["median_s"]
        assert "host cordoned" in found.message

        moved = wait_until(lambda: running_at_epoch(api, job, 2), 60, "the job to move")
        assert "host-1" not in {r.node for r in moved.placement}
        assert any(e.kind == "moved" for e in moved.events)
        assert node_state(api, "host-1") == "cordoned"
        assert any(
            (e["who"], e["action"], e["target"], e["detail"].get("reason"))
            == ("system", "cordon", "host-1", "straggler")
            for e in audit(cluster)
        )
        nothing_lost(cluster, api, [job])
        assert len(events(api, job, "straggler")) == 1  # not slow any more where it went


def test_a_hung_job_is_failed_after_its_timeout_and_its_gpus_go_to_the_next_job(
    tmp_path: Any,
) -> None:
    with fleet(tmp_path, 1, [*FAST, "--progress-timeout", "3s"]) as (cluster, api):
        plain = submit(api, sleeper("never-reports", 8.0))
        hung = submit(api, trainer("hangs", 4, 500, "--hang-after", "5"))
        wait_until(lambda: (api.job(hung).last_step or 0) >= 5, 60, "a few steps")

        failed = wait_until(lambda: api.job(hung).state == "failed", 30, "the reclaim")
        assert failed
        last = api.job(hung).events[-1]
        assert last.kind == "failed" and last.data["reason"] == "no-progress"
        assert last.data["last_step"] == 5 and last.data["timeout_s"] == 3.0
        assert "no progress for" in last.message and "timeout 3 s" in last.message
        assert any("hanging after step 5" in line for line in api.logs(hung).lines)

        after = submit(api, trainer("after", 4, 20))  # fits only in the hung job's GPUs
        wait_until(lambda: api.job(after).state == "succeeded", 60, "the next job to finish")
        assert api.job(plain).state in ("running", "succeeded")  # never judged
        nothing_lost(cluster, api, [plain, after])
        assert api.job(hung).state == "failed"


def sleeper(name: str, seconds: float) -> dict[str, Any]:
    """A one-GPU job that sleeps and exits 0, never reporting progress."""
    command = [sys.executable, "-c", f"import time; time.sleep({seconds})"]
    return {"name": name, "team": "research", "gpus": 1, "command": command}

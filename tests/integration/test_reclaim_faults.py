"""A spot reclaim notice on a real control plane: a ``bolt server``, two ``bolt agent``s
standing in for 8-GPU hosts, and the example trainer (which checkpoints every 10 steps and on
the checkpoint signal, and resumes from its last checkpoint).

``bolt nodes reclaim HOST --in 30s`` while the trainer runs there: it checkpoints at once,
resumes on the other host from the step it stopped at, is charged no restart, and no GPU is
ever held by two allocations; once the 30 s are up the host counts as gone, and its agent
registers again as a new instance, back in service.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from test_faults import (
    SHORT_LEASE,
    checkpointed,
    fleet,
    node_of,
    nothing_lost,
    resumed_from,
    running_at_epoch,
    submit,
    trainer,
)

from boltforge.client import Client
from boltforge.testing.processes import LocalCluster, bolt, child_env, wait_until
from boltforge.wire.reclaim import ReclaimReply

NOTICE_S = 30.0
STEP_S = 0.05
CHECKPOINT_EVERY = 10


def reclaim(cluster: LocalCluster, host: str) -> ReclaimReply:
    """``bolt nodes reclaim HOST --in 30s --json``, as a cloud notice adapter would run it."""
    cmd = [*bolt(), "nodes", "reclaim", host, "--in", "30s", "--json"]
    cmd += ["--server", cluster.url, "--token", cluster.admin_token]
    run = subprocess.run(
        cmd, capture_output=True, text=True, env=child_env(cluster.data), timeout=60
    )
    assert run.returncode == 0, run.stderr
    return ReclaimReply.model_validate_json(run.stdout)


def preempted_at(api: Client, job: str) -> list[int]:
    """The steps at which the trainer said it checkpointed on the signal, in order."""
    lines = api.logs(job).lines
    return [int(m.group(1)) for line in lines if (m := re.match(r"preempted at step (\d+)", line))]


def back_in_service(api: Client, host: str) -> bool:
    node = next(n for n in api.nodes().nodes if n.name == host)
    return node.state == "ready" and node.reclaim_at is None


def test_a_reclaimed_host_moves_its_trainer_off_in_time_and_comes_back_new(
    tmp_path: Path,
) -> None:
    with fleet(tmp_path, 2, SHORT_LEASE) as (cluster, api):
        job = submit(api, trainer("spot", 500))
        wait_until(lambda: checkpointed(api, job, 20), 60, "a checkpoint")
        host = node_of(api, job)

        reply = reclaim(cluster, host)
        assert [(j.job, j.grace_s) for j in reply.jobs] == [(job, 20.0)]  # its grace < 30 s
        assert reply.node.state == "draining" and reply.node.reclaim_at == reply.reclaim_at
        wait_until(lambda: running_at_epoch(api, job, 2), 60, "the job to move")
        assert node_of(api, job) != host
        resumed = wait_until(lambda: resumed_from(api, job), 30, "the trainer to resume")
        [stopped] = preempted_at(api, job)
        lost_steps = stopped - resumed[-1]
        requeue = next(e for e in api.job(job).events if e.kind == "checkpointed")
        lost_s = requeue.data["lost_s"]
        print(f"reclaim: stopped at step {stopped}, resumed from {resumed[-1]}, ", end="")
        print(f"lost {lost_steps} step(s); server's lost_s {lost_s}")
        assert lost_steps == 0
        assert 0.0 <= lost_s <= CHECKPOINT_EVERY * STEP_S + 2.0  # since its last reported one
        assert api.job(job).restarts == 0

        wait_until(lambda: back_in_service(api, host), NOTICE_S + 30, "the new instance")
        nothing_lost(cluster, api, [job])
        assert api.job(job).restarts == 0

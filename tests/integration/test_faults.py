"""Faults injected into a real control plane: a ``bolt server``, ``bolt agent``s standing in
for 8-GPU hosts, and the example trainer (which checkpoints every 10 steps and on the
checkpoint signal, and resumes from its last checkpoint).

Hosts die, hang and come back; the server crashes mid-burst and mid-preemption; an agent
shuts down under its job; an operator drains a node. Every scenario ends the same way: no
accepted job vanished, every one finished, and no GPU was ever held by two allocations at once.
"""

from __future__ import annotations

import os
import re
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from boltforge.client import ApiFailure, Client
from boltforge.control.store.db import Database
from boltforge.control.store.invariants import double_allocations
from boltforge.control.store.models import ReplicaRow
from boltforge.testing.processes import LocalCluster, replica_pids, wait_until
from boltforge.wire.jobs import JobDetail, SubmitRequest

TRAIN = Path(__file__).resolve().parents[2] / "examples" / "train" / "train.py"
PREEMPT_AT_ONCE = ["--min-runtime", "0", "--churn", "1", "--cooldown", "0"]
# Nodes heartbeat twice a second; silence is suspect after 2 s and fatal after 4 s.
SHORT_LEASE = [*PREEMPT_AT_ONCE, "--heartbeat", "0.5", "--lease", "4"]
# Long enough for agents to ride out a server restart without fencing their replicas.
LONG_LEASE = [*PREEMPT_AT_ONCE, "--heartbeat", "0.5", "--lease", "20"]
SETTLE_S = 120.0


def trainer(name: str, steps: int, **extra: Any) -> dict[str, Any]:
    """An 8-GPU job running the example trainer: 50 ms steps, a checkpoint every 10."""
    command = [sys.executable, str(TRAIN), "--steps", str(steps), "--step-time", "0.05"]
    command += ["--checkpoint-every", "10", "--print-every", "1000"]
    spec = {"name": name, "team": "research", "gpus": 8, "command": command}
    return {**spec, "checkpoint": {"grace": "20s"}, **extra}


def sleeper(name: str, seconds: float) -> dict[str, Any]:
    """A one-GPU job that sleeps and exits 0."""
    command = [sys.executable, "-c", f"import time; time.sleep({seconds})"]
    return {"name": name, "team": "research", "gpus": 1, "command": command}


@contextmanager
def fleet(
    tmp: Path, hosts: int, args: list[str], agent_args: dict[str, list[str]] | None = None
) -> Iterator[tuple[LocalCluster, Client]]:
    """A running local cluster: ``args`` go to the server, ``agent_args`` to the agent of
    the host they are keyed by."""
    cluster = LocalCluster(tmp, hosts=hosts, server_args=args, agent_args=agent_args or {})
    try:
        cluster.start()
        with cluster.client() as api:
            yield cluster, api
    finally:
        cluster.stop()


def submit(api: Client, spec: dict[str, Any]) -> str:
    return api.submit(SubmitRequest(spec=spec)).job.id


def checkpointed(api: Client, job: str, step: int) -> JobDetail | None:
    """The job, once it runs and has checkpointed at ``step`` or later."""
    d = api.job(job)
    ok = d.state == "running" and d.last_checkpoint_at is not None and (d.last_step or 0) >= step
    return d if ok else None


def node_of(api: Client, job: str) -> str:
    [replica] = api.job(job).placement
    return replica.node


def node_state(api: Client, name: str) -> str:
    return next(n.state for n in api.nodes().nodes if n.name == name)


def running_at_epoch(api: Client, job: str, epoch: int) -> JobDetail | None:
    d = api.job(job)
    return d if d.state == "running" and d.epoch >= epoch else None


def finished(api: Client, *jobs: str) -> bool:
    return all(api.job(j).state in ("succeeded", "failed", "cancelled") for j in jobs)


def resumed_from(api: Client, job: str) -> list[int]:
    """The steps the trainer said it resumed from, in order."""
    lines = api.logs(job).lines
    return [int(m.group(1)) for line in lines if (m := re.match(r"resumed from step (\d+)", line))]


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def store(cluster: LocalCluster) -> Database:
    return Database(f"sqlite:///{cluster.data / 'store.db'}")


def replica_states(cluster: LocalCluster, job: str, epoch: int) -> list[str]:
    db = store(cluster)
    try:
        with db.session() as s:
            q = select(ReplicaRow.state).where(ReplicaRow.job_id == job, ReplicaRow.epoch == epoch)
            return list(s.scalars(q))
    finally:
        db.close()


def nothing_lost(cluster: LocalCluster, api: Client, accepted: list[str]) -> None:
    """Every accepted job still exists and succeeded, and no GPU was ever held by two
    allocations at once."""
    wait_until(lambda: finished(api, *accepted), SETTLE_S, "every accepted job to finish")
    states = {job: api.job(job).state for job in accepted}
    assert states == dict.fromkeys(accepted, "succeeded")
    db = store(cluster)
    try:
        with db.session() as s:
            assert double_allocations(s) == []
    finally:
        db.close()


def test_a_dead_host_loses_its_job_which_resumes_from_its_checkpoint_elsewhere(
    tmp_path: Path,
) -> None:
    with fleet(tmp_path, 3, SHORT_LEASE) as (cluster, api):
        job = submit(api, trainer("victim", 150))
        wait_until(lambda: checkpointed(api, job, 20), 60, "a checkpoint")
        host = node_of(api, job)

        cluster.kill_host(host)

        wait_until(lambda: node_state(api, host) == "dead", 30, f"{host} to be declared dead")
        moved = wait_until(lambda: running_at_epoch(api, job, 2), 60, "the job to resume")
        assert node_of(api, job) != host
        assert moved.restarts == 1
        assert any(e.kind == "lost" for e in moved.events)
        nothing_lost(cluster, api, [job])
        assert resumed_from(api, job)[-1] >= 20


def test_a_hung_host_keeps_its_job_if_it_wakes_inside_its_lease_and_is_fenced_if_not(
    tmp_path: Path,
) -> None:
    with fleet(tmp_path, 3, SHORT_LEASE) as (cluster, api):
        job = submit(api, trainer("partitioned", 250))
        wait_until(lambda: checkpointed(api, job, 20), 60, "a checkpoint")
        host = node_of(api, job)

        cluster.freeze_host(host)  # a short hang: suspect, never dead
        wait_until(lambda: node_state(api, host) == "suspect", 30, f"{host} to be suspect")
        cluster.thaw_host(host)
        wait_until(lambda: node_state(api, host) == "ready", 30, f"{host} to be ready again")
        kept = api.job(job)
        assert (kept.state, kept.epoch, kept.restarts, node_of(api, job)) == (
            "running",
            1,
            0,
            host,
        )

        stale = replica_pids(host)
        cluster.freeze_host(host)  # a long hang: its lease runs out, its job moves
        wait_until(lambda: node_state(api, host) == "dead", 30, f"{host} to be declared dead")
        wait_until(lambda: running_at_epoch(api, job, 2), 60, "the job to restart elsewhere")
        cluster.thaw_host(host)

        wait_until(lambda: all(gone(pid) for pid in stale), 30, "the healed host to fence")
        wait_until(lambda: node_state(api, host) == "ready", 30, f"{host} to register again")
        assert node_of(api, job) != host
        nothing_lost(cluster, api, [job])
        done = api.job(job)
        assert done.epoch == 2 and done.restarts == 1
        # Whatever the healed host said of its fenced replica (a report, or its next
        # registration), the replica stays written off: a cut-off node changes nothing.
        assert replica_states(cluster, job, epoch=1) == ["lost"]


def test_a_server_killed_mid_burst_keeps_every_accepted_job_and_the_running_ones(
    tmp_path: Path,
) -> None:
    with fleet(tmp_path, 3, LONG_LEASE) as (cluster, api):
        steady = submit(api, trainer("steady", 300))
        wait_until(lambda: checkpointed(api, steady, 10), 60, "the steady job to run")
        accepted: list[str] = []
        burst = threading.Thread(target=submit_burst, args=(cluster, accepted, 40))
        burst.start()
        wait_until(lambda: len(accepted) >= 5, 60, "a few accepted submissions")

        cluster.kill_server()
        burst.join(60)
        cluster.restart_server()

        for job in accepted:
            api.job(job)  # every 201 is in the store
        after = submit(api, sleeper("after-restart", 0.5))
        wait_until(lambda: api.job(after).state in ("running", "succeeded"), 60, "a placement")
        still = api.job(steady)
        assert (still.state, still.epoch, still.restarts) == ("running", 1, 0)
        nothing_lost(cluster, api, [steady, *accepted, after])
        assert resumed_from(api, steady) == []  # it never stopped


def submit_burst(cluster: LocalCluster, accepted: list[str], count: int) -> None:
    """Submit ``count`` short jobs one after another, keeping the ids the server answered
    201 for; stops after the server stopped answering a few times in a row."""
    failures = 0
    with Client(cluster.url, cluster.admin_token, timeout=5.0) as client:
        for i in range(count):
            try:
                reply = client.submit(SubmitRequest(spec=sleeper(f"burst-{i}", 0.2)))
            except ApiFailure:
                failures += 1
                if failures >= 3:
                    return
                time.sleep(0.1)
                continue
            failures = 0
            if reply.created:
                accepted.append(reply.job.id)


def test_a_server_killed_mid_preemption_completes_it_after_restart(tmp_path: Path) -> None:
    with fleet(tmp_path, 1, LONG_LEASE) as (cluster, api):
        low = submit(api, trainer("low", 150, priority="low"))
        wait_until(lambda: checkpointed(api, low, 20), 60, "a checkpoint")
        high = submit(api, trainer("high", 20, team="nlp", priority="high"))

        cluster.kill_server()
        cluster.restart_server()

        wait_until(lambda: api.job(high).state == "succeeded", SETTLE_S, "the high job")
        wait_until(lambda: running_at_epoch(api, low, 2), 60, "the low job to resume")
        nothing_lost(cluster, api, [low, high])
        victim = api.job(low)
        assert victim.preemptions == 1 and victim.epoch == 2
        assert resumed_from(api, low)[-1] >= 20


@pytest.mark.parametrize("failpoint", ["decided", "dispatched"])
def test_a_server_killed_between_a_decision_and_its_actuation_acts_on_it_after_restart(
    tmp_path: Path, failpoint: str
) -> None:
    """The decision was committed before anything was acted on: the restarted server
    reads it back into its in-memory world and carries it out; it is not made again."""
    cluster = LocalCluster(tmp_path, hosts=1, server_args=LONG_LEASE)
    try:
        cluster.start()
        cluster.server_env = {"BOLT_FAILPOINTS": failpoint}
        cluster.kill_server()
        cluster.restart_server()  # armed from here on
        with cluster.client() as api:
            job = submit_once(api, sleeper("decided", 0.5))
            server = cluster.server
            assert server is not None
            wait_until(lambda: not server.alive(), 30, f"the crash at {failpoint}")
            cluster.server_env = {}
            cluster.restart_server()
            wait_until(lambda: api.job(job).state == "succeeded", SETTLE_S, "the job to run")
            detail = api.job(job)
            assert (detail.epoch, detail.restarts, detail.preemptions) == (1, 0, 0)
            nothing_lost(cluster, api, [job])
    finally:
        cluster.stop()


def submit_once(api: Client, spec: dict[str, Any]) -> str:
    """Submit with an idempotency key, retrying while the server is away: one job, once."""
    request = SubmitRequest(spec=spec, idempotency_key=f"once-{spec['name']}")
    for _ in range(100):
        try:
            return api.submit(request).job.id
        except ApiFailure:
            time.sleep(0.2)
    raise TimeoutError("the submission was never answered")


def test_an_agent_that_shuts_down_requeues_its_job_rather_than_finishing_it(
    tmp_path: Path,
) -> None:
    with fleet(tmp_path, 2, SHORT_LEASE) as (cluster, api):
        job = submit(api, trainer("orphaned", 150))
        wait_until(lambda: checkpointed(api, job, 20), 60, "a checkpoint")
        host = node_of(api, job)

        assert cluster.agents[host].stop() == 0  # checkpoints its replica, exits 0

        moved = wait_until(lambda: running_at_epoch(api, job, 2), 60, "the job to resume")
        assert moved.restarts == 1 and node_of(api, job) != host
        nothing_lost(cluster, api, [job])
        assert resumed_from(api, job)[-1] >= 20


def test_a_drained_node_moves_its_job_off_and_a_cordoned_one_gets_nothing_new(
    tmp_path: Path,
) -> None:
    with fleet(tmp_path, 3, SHORT_LEASE) as (cluster, api):
        job = submit(api, trainer("drained", 150))
        wait_until(lambda: checkpointed(api, job, 20), 60, "a checkpoint")
        host = node_of(api, job)

        drained_at = time.time()
        assert api.drain(host).name == host
        wait_until(lambda: running_at_epoch(api, job, 2), 60, "the job to move")
        assert node_of(api, job) != host
        resumed = wait_until(lambda: resumed_from(api, job), 30, "the trainer to resume")
        assert resumed[-1] >= 20
        later = [submit(api, trainer(f"later-{i}", 20)) for i in range(2)]
        wait_until(lambda: api.job(later[1]).reason, 60, "the second to wait")
        assert node_state(api, host) == "cordoned"
        assert dispatched_to(cluster, host, since=drained_at) == []

        api.uncordon(host)
        nothing_lost(cluster, api, [job, *later])


def dispatched_to(cluster: LocalCluster, node: str, since: float) -> list[str]:
    """Replicas sent to ``node`` after ``since``."""
    db = store(cluster)
    try:
        with db.session() as s:
            q = select(ReplicaRow.id).where(
                ReplicaRow.node == node, ReplicaRow.dispatched_at > since
            )
            return list(s.scalars(q))
    finally:
        db.close()

"""Real ``bolt server`` replicas on one real PostgreSQL: a follower forwards callers to the
leader; the leader SIGKILLed, a follower takes over with every accepted job; a leader
frozen (SIGSTOP) past its lease is replaced, and once thawed it stops rather than act; a
leader cut off from the store stops once it cannot renew its lease, and a follower takes
over;
clients and agents given every replica's address follow the leader."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from control_kit import fresh_database, make_spec, postgres_server
from sqlalchemy.engine import make_url

from boltforge.client import Client
from boltforge.testing.processes import LocalCluster, wait_until
from boltforge.testing.replicas import ADMIN_TOKEN, EXIT_DEPOSED, Replica, ReplicaSet
from boltforge.testing.tcp_cut import TcpRelay
from boltforge.wire.jobs import SubmitRequest

__all__ = ["postgres_server"]  # a fixture used by name
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


@pytest.fixture
def replicas(postgres_server: str, tmp_path: Path) -> Iterator[ReplicaSet]:
    group = ReplicaSet(fresh_database(postgres_server), tmp_path, count=2)
    group.start_all()
    yield group
    group.stop()


def submit(via: Replica | str, name: str, gpus: int = 8) -> str:
    """Submit a job that sleeps through one address (or a comma-separated list of them);
    the job's id."""
    servers = via.url if isinstance(via, Replica) else via
    with Client(servers, ADMIN_TOKEN) as client:
        req = SubmitRequest(spec=make_spec(name, gpus, command=["sleep", "300"]))
        return client.submit(req, idempotency_key=f"test-{name}").job.id


def jobs(via: Replica) -> list[str]:
    reply = httpx.get(via.url + "/v1/jobs", headers=ADMIN, timeout=5.0)
    return sorted(j["id"] for j in reply.json()["jobs"])


def test_a_follower_forwards_every_call_to_the_leader(replicas: ReplicaSet) -> None:
    leader, follower = replicas.replicas
    job = submit(follower, "via-follower")
    assert jobs(leader) == [job]
    assert jobs(follower) == [job]  # read through the follower, answered by the leader
    missing = httpx.get(follower.url + "/v1/jobs/999999", headers=ADMIN, timeout=5.0)
    assert missing.status_code == 404  # the leader's answer, status and all
    assert "999999" in missing.json()["error"]
    health = httpx.get(follower.url + "/healthz", timeout=5.0).json()
    assert health == {"status": "ok", "role": "follower", "replica": "r1"}


def test_a_follower_takes_over_a_killed_leader_with_every_accepted_job(
    replicas: ReplicaSet,
) -> None:
    leader, follower = replicas.replicas
    accepted = [submit(leader, f"before-{i}") for i in range(3)]
    replicas.failover(leader, freeze=False)
    assert replicas.leader() is follower
    assert jobs(follower) == sorted(accepted)
    assert submit(replicas.servers, "before-0") == accepted[0]  # a retry, same key
    after = submit(replicas.servers, "after")  # the dead address first: the next answers
    assert jobs(follower) == sorted([*accepted, after])


def test_a_leader_frozen_past_its_lease_is_replaced_and_stops_once_thawed(
    replicas: ReplicaSet,
) -> None:
    leader, follower = replicas.replicas
    first = submit(leader, "first")
    replicas.failover(leader, freeze=True)  # thawed once the follower leads
    second = submit(follower, "second")

    assert leader.proc is not None
    wait_until(lambda: not leader.alive(), 30, "the thawed leader to stop")
    assert leader.proc.popen.returncode == EXIT_DEPOSED
    assert "stopping:" in leader.proc.log.read_text()
    assert jobs(follower) == sorted([first, second])


def test_a_leader_cut_off_from_the_store_stops_and_a_follower_takes_over(
    postgres_server: str, tmp_path: Path
) -> None:
    url = fresh_database(postgres_server)
    port = make_url(url).port
    assert port is not None
    relay = TcpRelay(port)  # the leader's only way to the store
    group = ReplicaSet(url, tmp_path, count=2)
    leader, follower = group.replicas
    leader.db = url.replace(f":{port}/", f":{relay.port}/")
    try:
        group.start_all()
        job = submit(leader, "before-the-cut")
        relay.cut()
        wait_until(lambda: not leader.alive(), 30, "the cut-off leader to stop")
        assert leader.proc is not None and leader.proc.popen.returncode == EXIT_DEPOSED
        assert "could not renew its leader lease in time" in leader.proc.log.read_text()
        assert group.leader() is follower
        assert jobs(follower) == [job]
    finally:
        group.stop()


def test_agents_given_every_replica_keep_their_work_through_a_failover(
    replicas: ReplicaSet, tmp_path: Path
) -> None:
    hosts = LocalCluster(tmp_path / "hosts", hosts=0, servers=replicas.servers)
    hosts.data.mkdir()
    leader, follower = replicas.replicas
    try:
        agent = hosts.start_agent("host-0")
        job = submit(leader, "sleeper", gpus=8)
        wait_until(lambda: _state(follower, job) == "running", 60, "the job to run")
        replicas.failover(leader, freeze=False)
        wait_until(lambda: _node_ready(follower, "host-0"), 60, "the node to come back")
        assert _state(follower, job) == "running"  # not lost, not restarted
        assert agent.alive()
    finally:
        hosts.stop()


def _state(via: Replica, job: str) -> str:
    reply = httpx.get(f"{via.url}/v1/jobs/{job}", headers=ADMIN, timeout=5.0)
    return str(reply.json()["state"]) if reply.status_code == 200 else "?"


def _node_ready(via: Replica, name: str) -> bool:
    reply = httpx.get(f"{via.url}/v1/nodes", headers=ADMIN, timeout=5.0)
    if reply.status_code != 200:
        return False
    return any(n["name"] == name and n["state"] == "ready" for n in reply.json()["nodes"])

"""A server on a real PostgreSQL rides out the store's outages with no restart: PostgreSQL
stopped and started again, and a primary that dies while its streaming standby (made with
``pg_basebackup -R``, synchronous) is promoted, found through libpq's multi-host form with
``target_session_attrs=read-write``. Meanwhile submissions get 503, heartbeats are held, and
nothing accepted is lost."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from control_kit import ADMIN, Fleet, make_spec, require_postgres, wait_for

from boltforge.control.store.urls import check_store, store_url
from boltforge.testing.pgcluster import Cluster
from boltforge.testing.postgres import binaries

pytestmark = pytest.mark.skipif(
    binaries() is None and not require_postgres(), reason="PostgreSQL is not installed"
)


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    made = Cluster()
    try:
        yield made
    finally:
        made.close()


def submit(fleet: Fleet, name: str, key: str) -> httpx.Response:
    reply: httpx.Response = fleet.http.post(
        "/v1/jobs",
        json={"spec": make_spec(name, 8)},
        headers={**ADMIN, "Idempotency-Key": key},
    )
    return reply


def refused_while_away(fleet: Fleet) -> None:
    """The store is away: a submission is a 503 that says so, heartbeats are held."""
    r = submit(fleet, "during", "during")
    assert r.status_code == 503, r.text
    assert "store is unavailable" in r.json()["error"]
    assert all(node.heartbeat() == 200 for node in fleet.nodes.values())
    assert fleet.http.get("/healthz").json()["status"] == "degraded"


def test_postgresql_stopped_and_started_again_is_ridden_out(
    cluster: Cluster, tmp_path: Path
) -> None:
    with Fleet(tmp_path, hosts=2, db_url=cluster.url()) as fleet:
        job = fleet.submit(make_spec("before", 8))
        fleet.start_everything()
        cluster.stop(cluster.servers[0])
        refused_while_away(fleet)
        cluster.start(cluster.servers[0])
        wait_for(lambda: fleet.rt.db.status.available, 60.0)
        assert submit(fleet, "during", "during").status_code == 201
        fleet.settle()
        assert fleet.job(job).state == "running"
        assert fleet.http.get("/healthz").json() == {"status": "ok"}


def test_a_promoted_standby_takes_over_with_no_restart(cluster: Cluster, tmp_path: Path) -> None:
    standby = cluster.standby()
    cluster.synchronous()
    with Fleet(tmp_path, hosts=2, db_url=store_url(cluster.multi_host())) as fleet:
        accepted = [fleet.submit(make_spec(f"job{i}", 8)) for i in range(4)]
        fleet.start_everything()
        cluster.stop(cluster.servers[0], "immediate")  # the primary dies
        refused_while_away(fleet)
        cluster.promote(standby)
        wait_for(lambda: fleet.rt.db.status.available, 60.0)
        assert submit(fleet, "during", "during").status_code == 201
        fleet.settle()
        assert [fleet.job(j).name for j in accepted] == [f"job{i}" for i in range(4)]
        assert sorted(fleet.job(j).state for j in accepted) == ["pending"] * 2 + ["running"] * 2
        fleet.no_gpu_held_twice()


def test_a_missing_database_and_a_wrong_password_are_one_line_each() -> None:
    with_password = Cluster(password="right")
    try:
        wrong = check_store(with_password.url().replace(":right@", ":wrong@"))
        missing = check_store(with_password.url(database="nope"))
    finally:
        with_password.close()
    assert wrong is not None and wrong.startswith("--db: ")
    assert "password authentication failed" in wrong and "To fix:" in wrong
    assert missing is not None and "the database nope does not exist" in missing
    assert "\n" not in wrong + missing

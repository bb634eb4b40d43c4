"""While the store is away the server answers clearly and keeps its fleet: calls that need
the store get 503 with Retry-After and since when, /healthz says degraded, /metrics says so,
agents' heartbeats are held, the loop pauses, and once the store is back nothing accepted was
lost, the same idempotency key finishes the submission, and the loop resumes with a full pass
(at once when a call's write commits, without waiting for its own probe).
Faults are injected at the SQLite layer (``store_outage_kit``)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from control_kit import ADMIN, Fleet, make_spec, wait_for
from store_outage_kit import away, disk_full

from boltforge.control.scheduling import loop
from boltforge.control.store.outage import StoreFault


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    with Fleet(tmp_path, hosts=2) as f:
        yield f


def submit(fleet: Fleet, name: str, key: str) -> httpx.Response:
    body = {"spec": make_spec(name, 8)}
    reply: httpx.Response = fleet.http.post(
        "/v1/jobs", json=body, headers={**ADMIN, "Idempotency-Key": key}
    )
    return reply


def back(fleet: Fleet) -> None:
    """Wait until the paused loop has found the store writable again."""
    wait_for(lambda: fleet.rt.db.status.available)


def test_a_submission_while_the_store_is_away_is_a_503_that_says_since_when(fleet: Fleet) -> None:
    with away(fleet.rt.db.engine):
        r = submit(fleet, "train", "k-1")
        assert r.status_code == 503
        assert int(r.headers["retry-after"]) >= 1
        body = r.json()
        assert "the store is unavailable since" in body["error"]
        assert "send it again" in body["error"]
        assert body["store"]["available"] is False
        assert body["store"]["since"].endswith("Z")
        assert "unreachable" in body["store"]["reason"]


def test_health_is_degraded_with_the_reason_and_metrics_have_a_gauge(fleet: Fleet) -> None:
    assert fleet.http.get("/healthz").json() == {"status": "ok"}
    with away(fleet.rt.db.engine):
        assert submit(fleet, "train", "k-1").status_code == 503
        health = fleet.http.get("/healthz").json()
        assert health["status"] == "degraded"
        assert "unable to open database file" in health["reason"]
        scrape = fleet.http.get("/metrics")
        assert scrape.status_code == 200
        assert "bolt_store_available 0.0" in scrape.text
        assert "bolt_store_outages_total 1.0" in scrape.text
    back(fleet)
    assert fleet.http.get("/healthz").json() == {"status": "ok"}
    assert "bolt_store_available 1.0" in fleet.http.get("/metrics").text


def test_the_same_idempotency_key_makes_the_job_once_the_store_is_back(fleet: Fleet) -> None:
    with away(fleet.rt.db.engine):
        assert submit(fleet, "train", "k-1").status_code == 503
    back(fleet)
    first = submit(fleet, "train", "k-1")
    assert first.status_code == 201, first.text
    again = submit(fleet, "train", "k-1")
    assert again.json()["job"]["id"] == first.json()["job"]["id"]
    assert again.json()["created"] is False


def test_agents_heartbeats_are_held_and_their_replicas_keep_running(fleet: Fleet) -> None:
    job = fleet.submit(make_spec("train", 8))
    fleet.start_everything()
    assert fleet.job(job).state == "running"
    with away(fleet.rt.db.engine):
        fleet.clock.advance(fleet.config.terms.lease_s * 2)  # an outage longer than a lease
        for node in fleet.nodes.values():
            assert node.heartbeat() == 200  # the lease held from memory: no fencing
    back(fleet)
    for node in fleet.nodes.values():
        assert node.heartbeat() == 200
    fleet.settle()
    assert fleet.job(job).state == "running"
    assert all(not node.to_stop() for node in fleet.nodes.values())


def test_the_loop_pauses_and_resumes_with_a_full_pass(fleet: Fleet) -> None:
    full = fleet.rt.scheduler.stats.full_cycles
    with away(fleet.rt.db.engine):
        assert submit(fleet, "train", "k-1").status_code == 503
        wait_for(lambda: not fleet.rt.db.status.available)
    wait_for(lambda: fleet.rt.scheduler.stats.full_cycles > full)
    assert fleet.rt.db.status.available
    job = fleet.submit(make_spec("after", 8))
    assert fleet.job(job).state == "scheduled"


def test_a_write_that_commits_wakes_the_paused_loop_without_waiting_for_its_probe(
    fleet: Fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(loop, "PROBE_S", 3600.0)  # the loop's own probe: once, at the start
    db, probes = fleet.rt.db, list[StoreFault | None]()
    probe = db.probe

    def counted() -> StoreFault | None:
        probes.append(probe())
        return probes[-1]

    monkeypatch.setattr(db, "probe", counted)
    full = fleet.rt.scheduler.stats.full_cycles
    with away(db.engine):
        assert submit(fleet, "train", "k-1").status_code == 503
        wait_for(lambda: len(probes) == 1)  # the loop paused and found the store away
    assert not db.status.available
    assert fleet.rt.scheduler.stats.full_cycles == full
    first = submit(fleet, "train", "k-1")  # the store takes it: it is back
    assert first.status_code == 201, first.text
    wait_for(lambda: fleet.rt.scheduler.stats.full_cycles > full)
    assert len(probes) == 1  # woken by the commit, not by a probe
    assert fleet.job(first.json()["job"]["id"]).state == "scheduled"


def test_a_full_disk_refuses_writes_and_keeps_serving_reads(fleet: Fleet) -> None:
    kept = fleet.submit(make_spec("kept", 8))
    with disk_full(fleet.rt.db.engine):
        r = submit(fleet, "more", "k-2")
        assert r.status_code == 503
        assert "no disk space left" in r.json()["error"]
        assert fleet.job(kept).name == "kept"  # reads go on
        listed = fleet.http.get("/v1/jobs", headers=ADMIN)
        assert listed.status_code == 200
        assert [j["id"] for j in listed.json()["jobs"]] == [kept]
    back(fleet)
    assert submit(fleet, "more", "k-2").status_code == 201
    assert fleet.job(kept).name == "kept"


def test_an_outage_logs_a_line_away_and_a_line_back_and_no_traceback(
    fleet: Fleet, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    with away(fleet.rt.db.engine):
        for i in range(20):
            assert submit(fleet, f"j{i}", f"k-{i}").status_code == 503
        fleet.http.get("/metrics")
    back(fleet)
    store = [r for r in caplog.records if r.name == "boltforge.store"]
    assert [r.getMessage().split(" (")[0].split(" after")[0] for r in store] == [
        "store unavailable",
        "store available again",
    ]
    assert "unable to open database file" in store[0].getMessage()
    assert not [r for r in caplog.records if r.exc_info]

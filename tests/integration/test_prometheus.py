"""A real Prometheus scrapes a real ``bolt server`` (with two ``bolt agent`` processes): the
GPUs a running job holds show up in Prometheus's own query API, and go when it is cancelled.

Skipped where Prometheus is not installed (``apt-get install prometheus``), unless
``BOLT_REQUIRE_PROMETHEUS=1`` (set by CI), which makes a missing binary a failure."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from boltforge.testing.processes import LocalCluster
from boltforge.testing.prometheus import Prometheus, binary, prometheus


def require_prometheus() -> bool:
    """Whether the Prometheus test must run (CI sets BOLT_REQUIRE_PROMETHEUS=1) rather than
    skip."""
    return os.environ.get("BOLT_REQUIRE_PROMETHEUS") == "1"


@pytest.fixture(autouse=True)
def installed() -> None:
    """Skip (or fail, where required) before any process starts."""
    if binary() is None:
        if require_prometheus():
            raise RuntimeError("Prometheus is required here. To fix: apt-get install prometheus")
        pytest.skip("Prometheus is not installed (apt-get install prometheus)")


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path / "cluster", hosts=2) as c:
        yield c


@pytest.fixture
def scraper(cluster: LocalCluster, tmp_path: Path) -> Iterator[Prometheus]:
    with prometheus(tmp_path / "prometheus", [f"127.0.0.1:{cluster.port}"]) as p:
        yield p


def settles_at(server: Prometheus, promql: str, expected: float, timeout: float = 60.0) -> None:
    """Poll Prometheus until ``promql`` is one sample equal to ``expected`` (a deadline, not
    a timing claim: scrapes come every second)."""
    deadline = time.monotonic() + timeout
    seen: object = None
    while time.monotonic() < deadline:
        result = server.query(promql)
        seen = [r["value"][1] for r in result]
        if len(result) == 1 and float(result[0]["value"][1]) == expected:
            return
        time.sleep(0.25)
    raise AssertionError(f"{promql} never became {expected} (last seen {seen})")


def test_prometheus_scrapes_the_gpus_a_running_job_holds(
    cluster: LocalCluster, scraper: Prometheus
) -> None:
    headers = {"Authorization": f"Bearer {cluster.admin_token}"}
    spec = {
        "name": "sleeper",
        "team": "research",
        "gpus": 16,
        "command": [sys.executable, "-c", "import time; time.sleep(600)"],
    }
    r = httpx.post(f"{cluster.url}/v1/jobs", json={"spec": spec}, headers=headers, timeout=10)
    assert r.status_code == 201, r.text
    job = r.json()["job"]["id"]

    settles_at(scraper, 'bolt_gpus{pool="h100",state="total"}', 16)
    settles_at(scraper, 'bolt_gpus{pool="h100",state="allocated"}', 16)
    settles_at(scraper, 'bolt_nodes{state="ready"}', 2)
    [up] = scraper.query('up{job="boltforge"}')
    assert up["value"][1] == "1"

    r = httpx.post(f"{cluster.url}/v1/jobs/{job}/cancel", json={}, headers=headers, timeout=10)
    assert r.status_code == 200, r.text
    settles_at(scraper, 'bolt_gpus{pool="h100",state="allocated"}', 0)
    settles_at(scraper, 'bolt_jobs{state="cancelled"}', 1)

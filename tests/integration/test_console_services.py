"""The console's Services page in headless Chromium against a real ``bolt server`` and agent
(one 8-GPU host) whose replicas run the example serving replica and report load through the
SDK: the empty state says how to start a service; two services the autoscaler gives replicas
show their replica counts, load, SLO met and missed (the one missing it scaled up for its
latency), and links to their replica jobs, in a table that fits 1280 px; a load rise scales
one up live on the open page. Screenshots go
under ``BOLT_ARTIFACTS`` as in ``test_console_e2e.py``."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, Page, expect
from test_console_e2e import LIVE_S, mark, not_reloaded, open_console, shot

from boltforge.client import Client
from boltforge.testing import browser
from boltforge.testing.processes import LocalCluster, wait_until
from boltforge.wire.services import ServiceRequest, ServiceSummary

REPLICA = Path(__file__).resolve().parents[2] / "examples" / "serving" / "replica.py"
# Heartbeats twice a second; the autoscaler looks at the services twice a second.
SERVER = ["--heartbeat", "0.5", "--scale-every", "0.5"]
WIDTH = {"width": 1280, "height": 800}


def service(name: str, load_file: Path, slo_ms: float) -> dict[str, Any]:
    """1-2 replicas of 2 GPUs, 10 requests/s each; the replica reports p99 = 40 ms + rate."""
    return {
        "kind": "service",
        "name": name,
        "team": "nlp",
        "gpus": 2,
        "command": [sys.executable, str(REPLICA), str(load_file)],
        "checkpoint": {"grace": "5s"},
        "replicas": {"min": 1, "max": 2},
        "autoscale": {
            "rps_per_replica": 10,
            "target_utilization": 1.0,
            "latency_slo_ms": slo_ms,
            "scale_down_window": "10m",
            "predictive": False,
        },
    }


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster(tmp_path_factory.mktemp("console-services"), hosts=1, server_args=SERVER)
    try:
        yield c.start()
    finally:
        c.stop()


@pytest.fixture(scope="module")
def chromium() -> Iterator[Browser]:
    with browser.browser() as b:
        yield b


@pytest.fixture
def api(cluster: LocalCluster) -> Iterator[Client]:
    with cluster.client() as client:
        yield client


def ready(api: Client, name: str, replicas: int) -> ServiceSummary | None:
    """The service once it wants ``replicas`` and all of them run and report load."""
    s = api.service(name)
    counts = (s.desired, s.live, s.running, s.ready)
    return s if counts == (replicas,) * 4 and s.slo_met is not None else None


def services_page(chromium: Browser, cluster: LocalCluster) -> Page:
    page = open_console(chromium, cluster, cluster.admin_token, "#/services")
    page.set_viewport_size(WIDTH)  # type: ignore[arg-type]
    return page


def fits(page: Page) -> bool:
    """Whether the services table fits its card with no horizontal scrolling."""
    table = page.get_by_test_id("services-table")
    return bool(table.evaluate("t => t.scrollWidth <= t.parentElement.clientWidth"))


# First: the server has no service yet.
def test_with_no_service_the_page_says_how_to_start_one(
    chromium: Browser, cluster: LocalCluster
) -> None:
    page = services_page(chromium, cluster)
    empty = page.get_by_test_id("services-empty")
    expect(empty).to_be_visible()
    expect(empty).to_contain_text("bolt serve service.yaml")
    expect(page.get_by_test_id("services-table")).to_be_hidden()
    expect(page.get_by_test_id("nav-services")).to_have_class("active")
    shot(page, "services-empty")


def test_services_show_replicas_load_slo_and_replica_jobs_live(
    chromium: Browser, cluster: LocalCluster, api: Client, tmp_path: Path
) -> None:
    load = tmp_path / "load"
    load.write_text("5")  # 5 requests/s: one replica, p99 45 ms
    api.apply_service(ServiceRequest(spec=service("chat", load, 500)))
    api.apply_service(ServiceRequest(spec=service("embed", load, 20)))
    chat = wait_until(lambda: ready(api, "chat", 1), 60, "chat's replica to report load")
    # embed's p99 misses its SLO: the autoscaler adds its second replica for that.
    wait_until(lambda: ready(api, "embed", 2), 60, "embed's two replicas to report load")

    page = services_page(chromium, cluster)
    row = page.locator("[data-testid=service-row][data-service=chat]")
    expect(row.get_by_test_id("service-wanted")).to_have_text("1")
    for cell in ("service-live", "service-running", "service-ready"):
        expect(row.get_by_test_id(cell)).to_have_text("1")
    expect(row.get_by_test_id("service-range")).to_have_text("1-2")
    expect(row.get_by_test_id("service-p99")).to_have_text("45 ms")
    expect(row.get_by_test_id("service-slo")).to_contain_text("500 ms")
    expect(row.get_by_test_id("slo-badge")).to_have_text("met")
    expect(row.get_by_test_id("replica-link")).to_have_text(chat.replica_jobs)
    missed = page.locator("[data-testid=service-row][data-service=embed]")
    expect(missed).to_have_attribute("data-slo", "missed")
    expect(missed.get_by_test_id("slo-badge")).to_have_text("missed")
    expect(missed.get_by_test_id("service-reason")).to_contain_text("above the 20 ms SLO")
    expect(missed.get_by_test_id("service-ready")).to_have_text("2")
    assert fits(page)
    shot(page, "services")

    mark(page)
    load.write_text("15")  # 15 requests/s: two replicas each
    expect(row.get_by_test_id("service-wanted")).to_have_text("2", timeout=LIVE_S)
    expect(row.get_by_test_id("service-reason")).to_contain_text("request rate")
    expect(row.get_by_test_id("service-ready")).to_have_text("2", timeout=LIVE_S)
    expect(row.get_by_test_id("replica-link")).to_have_count(2)
    assert not_reloaded(page) and fits(page)
    shot(page, "services-scaled")

    row.get_by_test_id("replica-link").first.click()
    expect(page.get_by_test_id("job-state")).to_have_text("running")
    for name in ("chat", "embed"):
        api.delete_service(name)

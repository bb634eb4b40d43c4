"""The console in headless Chromium against a real ``bolt server`` with two real agents
(8-GPU hosts) running the example trainer: the fleet map, a job moving through its states
live, its explanation a click away, a preempted job's checkpoint and resume on its timeline,
stragglers on the rank chart, teams, utilization, a simulation report, and a member kept out
of another team's job. Every page is saved as a screenshot under ``BOLT_ARTIFACTS``
(``artifacts/console`` by default).
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, expect
from sim_kit import build, sim
from test_faults import PREEMPT_AT_ONCE, submit
from test_health_faults import trainer

from boltforge.client import Client
from boltforge.sim.report import write_report
from boltforge.testing import browser
from boltforge.testing.processes import LocalCluster, wait_until
from boltforge.wire.jobs import TokenRequest

if browser.chromium() is None and not browser.required():
    pytest.skip("no chromium (apt-get install -y chromium)", allow_module_level=True)

ARTIFACTS = Path(os.environ.get("BOLT_ARTIFACTS", "artifacts")) / "console"
LIVE_S = 60_000  # ms a live change may take to show (the machine is shared with the trainers)
SERVER = [*PREEMPT_AT_ONCE, "--heartbeat", "0.5", "--lease", "20"]
STRAGGLERS = ["--straggler-action", "report", "--straggler-samples", "10"]
TEAMS = """
teams:
  research:
    quota: {guaranteed: 8}
    budget: {monthly: 500, soft: 0.5}
  vision:
    budget: {monthly: 200}
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    tmp = tmp_path_factory.mktemp("console")
    reports = tmp / "reports"
    results = {"fifo": sim("fifo", 1.0), "default": sim("default", 0.7)}
    write_report(results, build(results), reports / "tiny", "Tiny trace", "bolt simulate")
    teams = tmp / "teams.yaml"
    teams.write_text(TEAMS)
    args = [*SERVER, *STRAGGLERS, "--reports", str(reports), "--teams", str(teams)]
    c = LocalCluster(tmp / "cluster", hosts=2, server_args=args)
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


def open_console(b: Browser, cluster: LocalCluster, token: str, route: str = "") -> Page:
    page = browser.signed_in_page(b, token)
    page.goto(f"{cluster.url}/console/{route}")
    return page


def shot(page: Page, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


def mark(page: Page) -> None:
    """Tag the page's window: the tag survives live updates, not a reload."""
    page.evaluate("window.__boltMark = 'same page'")


def not_reloaded(page: Page) -> bool:
    return bool(page.evaluate("window.__boltMark === 'same page'"))


def idle(api: Client) -> bool:
    """Whether no GPU is held (stopped jobs' processes have all exited)."""
    return all(n.gpus_used == 0 for n in api.nodes().nodes)


def test_signing_in_shows_the_fleet_map(chromium: Browser, cluster: LocalCluster) -> None:
    page = chromium.new_page(viewport=browser.VIEWPORT)  # type: ignore[arg-type]
    page.goto(f"{cluster.url}/console/")
    page.get_by_test_id("token-input").fill("not-a-token")
    page.get_by_test_id("login-button").click()
    expect(page.get_by_test_id("error-banner")).to_contain_text("unknown API token")
    page.get_by_test_id("token-input").fill(cluster.admin_token)
    page.get_by_test_id("login-button").click()
    fleet_map = page.get_by_test_id("fleet-map")
    expect(fleet_map).to_have_attribute("data-rendered", re.compile(r"^[1-9][0-9]*$"))
    expect(page.locator("[data-testid=host]")).to_have_count(2)
    expect(page.locator("[data-testid=gpu]")).to_have_count(16)
    expect(page.get_by_test_id("whoami")).to_contain_text("admin")
    expect(page.get_by_test_id("live-status")).to_have_text("live")
    shot(page, "fleet-map")
    page.locator("[data-testid=host][data-host=host-1]").click()
    panel = page.get_by_test_id("host-panel")
    expect(panel.get_by_test_id("host-name")).to_have_text("host-1")
    expect(panel.locator("[data-testid=host-gpu]")).to_have_count(8)
    expect(panel.get_by_test_id("host-health")).to_contain_text("heartbeat")
    shot(page, "fleet-host")


def test_a_preempted_jobs_timeline_shows_its_checkpoint_and_resume(
    chromium: Browser, cluster: LocalCluster, api: Client
) -> None:
    low = submit(api, {**trainer("low", 16, 400), "priority": "low"})
    page = open_console(chromium, cluster, cluster.admin_token, f"#/job/{low}")
    expect(page.get_by_test_id("job-state")).to_have_text("running", timeout=LIVE_S)
    mark(page)
    command = [sys.executable, "-c", "import time; time.sleep(2)"]
    high = {"name": "urgent", "team": "research", "gpus": 8, "priority": "high"}
    submit(api, {**high, "command": command})
    timeline = page.get_by_test_id("job-timeline")
    checkpointed = timeline.locator("[data-testid=timeline-event][data-kind=checkpointed]")
    expect(checkpointed).to_have_count(1, timeout=LIVE_S)
    resumed = timeline.locator("[data-testid=timeline-event][data-kind=resumed]")
    expect(resumed).to_have_count(1, timeout=LIVE_S)
    expect(page.get_by_test_id("job-state")).to_have_text("running")
    assert not_reloaded(page)
    shot(page, "job-preempted-and-resumed")
    api.cancel(low)


def test_a_member_cannot_see_another_teams_job(
    chromium: Browser, cluster: LocalCluster, api: Client
) -> None:
    command = [sys.executable, "-c", "import time; time.sleep(60)"]
    job = submit(api, {"name": "private", "team": "research", "gpus": 8, "command": command})
    token = api.create_token(TokenRequest(name="vera", role="member", team="vision")).token
    page = open_console(chromium, cluster, token, f"#/job/{job}")
    expect(page.get_by_test_id("error-banner")).to_contain_text("belongs to team research")
    expect(page.get_by_test_id("job-timeline")).to_have_count(0)
    expect(page.get_by_test_id("job-explanation")).to_have_count(0)
    shot(page, "member-forbidden")
    page.goto(f"{cluster.url}/console/#/fleet")
    expect(page.locator(f"[data-testid=gpu][data-owner='{job}']")).to_have_count(0)
    expect(page.locator("[data-testid=gpu][data-team=research]")).to_have_count(8)
    page.goto(f"{cluster.url}/console/#/queue")
    page.get_by_test_id("queue-view").select_option("live")
    expect(page.get_by_test_id("queue-others")).to_contain_text("research")
    expect(page.locator(f"[data-testid=queue-row][data-job='{job}']")).to_have_count(0)
    api.cancel(job)


def test_the_queue_shows_why_jobs_wait_and_filters_them(
    chromium: Browser, cluster: LocalCluster, api: Client
) -> None:
    wait_until(lambda: idle(api), 60, "the earlier scenarios' GPUs to be free")
    command = [sys.executable, "-c", "import time; time.sleep(120)"]
    hog = submit(api, {"name": "hog", "team": "research", "gpus": 16, "command": command})
    waiting = [
        submit(api, {"name": f"wait-{t}", "team": t, "gpus": 8, "command": command})
        for t in ("research", "vision")
    ]
    wait_until(lambda: api.job(hog).state == "running", 60, "the 16-GPU job to run")
    page = open_console(chromium, cluster, cluster.admin_token, "#/queue")
    rows = page.locator("[data-testid=queue-row]")
    expect(rows).to_have_count(2, timeout=LIVE_S)
    expect(page.get_by_test_id("queue-table")).to_contain_text("research")
    page.get_by_test_id("queue-team").select_option("vision")
    expect(rows).to_have_count(1)
    expect(page.locator(f"[data-testid=queue-row][data-job='{waiting[1]}']")).to_be_visible()
    shot(page, "queue")
    for job in (hog, *waiting):
        api.cancel(job)


def test_teams_utilization_and_reports_pages_draw(chromium: Browser, cluster: LocalCluster) -> None:
    page = open_console(chromium, cluster, cluster.admin_token, "#/teams")
    research = page.locator("[data-testid=team-row][data-team=research]")
    expect(research).to_contain_text("guaranteed 8")
    expect(research).to_contain_text("$500")
    expect(page.locator("[data-testid=team-row][data-team=vision]")).to_contain_text("$200")
    shot(page, "teams")
    page.goto(f"{cluster.url}/console/#/utilization")
    for chart, series in (("util-chart", "Allocated"), ("frag-chart", "Fragmentation index")):
        line = page.get_by_test_id(chart).locator(f"[data-series='{series}']")
        expect(line).to_have_attribute("points", re.compile(r"^[0-9.]+,[0-9.]+"))
    shot(page, "utilization")
    page.goto(f"{cluster.url}/console/#/reports")
    page.get_by_test_id("report-link").first.click()
    expect(page.get_by_test_id("report-title")).to_have_text("Tiny trace")
    expect(page.get_by_test_id("report-table")).to_contain_text("default")
    plots = page.locator("img[data-testid=report-plot]")
    expect(plots).to_have_count(4)
    assert all(plots.evaluate_all("els => els.map(e => e.complete && e.naturalWidth > 0)"))
    shot(page, "report")


# Last: this job's slow rank marks host-1 degraded (single-host work only for hours), which
# would keep the other scenarios' multi-host jobs waiting.
def test_a_submitted_job_moves_through_its_states_live(
    chromium: Browser, cluster: LocalCluster, api: Client
) -> None:
    page = open_console(chromium, cluster, cluster.admin_token, "#/jobs")
    expect(page.get_by_test_id("live-status")).to_have_text("live")
    mark(page)
    job = submit(api, trainer("watched", 16, 200, "--slow-host", "host-1"))
    row = page.locator(f"[data-testid=job-row][data-job='{job}']")
    expect(row).to_be_visible(timeout=LIVE_S)
    shot(page, "jobs")
    row.click()  # one click to the job and its explanation
    expect(page.get_by_test_id("job-state")).to_have_text("running", timeout=LIVE_S)
    expect(page.get_by_test_id("job-explanation")).to_contain_text("H100", timeout=LIVE_S)
    expect(page.locator("[data-testid=placement-host]")).to_have_count(2)
    straggler = page.locator("[data-testid=rank-row][data-straggler=true]")
    expect(straggler).to_have_count(1, timeout=LIVE_S)
    expect(page.locator("[data-testid=rank-row]")).to_have_count(2)
    shot(page, "job-running")
    expect(page.get_by_test_id("job-state")).to_have_text("succeeded", timeout=LIVE_S)
    kinds = page.locator("[data-testid=timeline-event]").evaluate_all(
        "els => els.map(e => e.dataset.kind)"
    )
    assert kinds[0] == "queued" and "placed" in kinds and kinds[-1] == "succeeded"
    expect(page.get_by_test_id("job-logs")).to_contain_text("step", timeout=LIVE_S)
    expect(page.get_by_test_id("job-cost")).to_contain_text("GPU")
    assert not_reloaded(page)
    shot(page, "job-succeeded")

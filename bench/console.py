"""Fleet Console responsiveness on the 16,384-GPU example fleet (examples/fleets/h100-16k.yaml).

Setup, all through the real HTTP APIs of a real ``bolt server`` (a subprocess on SQLite in a
temporary directory, fixed admin token, a one-day ``--lease`` so nodes stay ready without
heartbeats, preemption off so the picture holds still):

- **Hosts.** The 2,048 hosts of the fleet (their pools, pods and racks) register through
  ``POST /v1/agents/register`` as stand-in agents. 2,048 real ``bolt agent`` processes cannot
  run on the 2-core development machine, so this process speaks the agent protocol for them:
  it registers each host, and once the fill is placed it reads each host's desired state
  (``GET /v1/agents/{node}/desired``) and reports every replica there started
  (``POST /v1/agents/{node}/report``), so the fill jobs reach ``running``. No process runs,
  no heartbeat is sent (the lease outlasts the bench), and the jobs submitted while measuring
  stay ``scheduled`` (nothing reports them started).
- **Fill.** Six teams with burst quotas (``--teams``, 87.5% of the fleet together) each
  submit jobs of 256, 64, 16, 8 and 1 GPUs (high, normal and low priority) through
  ``POST /v1/jobs`` that add up to exactly their quota; the bench waits until the scheduler
  has placed them all. Then ``--pending`` more jobs of the same teams are submitted: they wait
  (reason ``quota``) while 2,048 GPUs stay free for the team ``bench``, which has no quota.

Measured, in headless Chromium through Playwright (the admin token put in
``localStorage["bolt.token"]`` before the page loads; a fresh browser context, so a cold
cache, for every first render):

- **map_ms**: ``page.goto(/console/#/fleet)`` until ``[data-testid=fleet-map][data-rendered]``
  holds all 2,048 host elements; **map_render_ms** is the page's own ``data-render-ms``;
  **map_fetch_start_ms** and **map_fetch_ms**: when the page's ``GET /v1/console/map`` began
  after the navigation and how long it took, by the browser's resource timing.
- **queue_ms**: ``#/queue`` (its default view: the waiting jobs) until the queue table
  holds as many rows as the page settles on (``queue_rows``, counted once before, untimed, in a
  load that waits until the count holds for a second; ``--queue-rows N`` gives it instead).
- **job_ms**: ``#/job/ID`` for a running 256-GPU job until its state, timeline and all 32
  placement hosts are drawn (**job_map_fetch_ms**: its fetch of the map of its hosts, if
  it made one).
- **live_map_ms**: with the map open, a 1-GPU job of team ``bench`` is submitted through the
  API; time until ``[data-testid=gpu][data-owner=ID]`` appears, without a reload.
  **live_map_placed_ms** is the server's share: from the submit to the job's ``placed`` event
  (same clock); the rest is the change stream, the page's batching, the map fetch and paint.
- **live_queue_ms**: with the queue open, a high-priority job of a team at its quota is
  submitted; time until its ``[data-testid=queue-row]`` appears.
- **map_api**: ``GET /v1/console/map`` at this scale: bytes decoded and on the wire, and the
  round-trip time on loopback (the server's time, near enough).

First renders are repeated ``--repeats`` times (default 5), live updates ``--live`` times
(default 20); the figures are medians and 95th percentiles of wall-clock milliseconds taken
in this process. ``--json`` prints them as one object. The server, the browser and the
temporary directory go away on exit, on an error and on Ctrl-C. Figures depend on the
machine and what else runs on it; nothing here asserts them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import yaml
from playwright.sync_api import Browser, Page, sync_playwright
from rich.console import Console
from rich.table import Table
from standin import (
    FLEET,
    auth,
    console,
    interrupts_as_keyboard,
    inventories,
    parallel,
    post,
    progress,
    register_hosts,
    report_started,
    wait_running,
    wait_used,
)

from boltforge.spec.fleet import load_fleet_spec
from boltforge.testing.browser import ARGS, chromium
from boltforge.testing.processes import LocalCluster

# A one-day lease: stand-in nodes stay ready without heartbeats. Preemption off (churn 0,
# endless minimum runtime): high-priority waiting work must not start bumping the fill.
SERVER_ARGS = ["--lease", "86400", "--min-runtime", "1e9", "--churn", "0"]
QUOTAS = {"nlp": 4096, "vision": 3072, "research": 2560, "speech": 2048, "rl": 1536, "infra": 1024}
LIVE_TEAM = "bench"  # no quota: its jobs take the free GPUs
SIZES = (256, 64, 16, 8, 1)
FILL_SHARE = {256: 0.35, 64: 0.25, 16: 0.15, 8: 0.15}  # of a team's GPUs; 1-GPU jobs fill the rest
SWEEP = 16  # tasks per 1-GPU array job
PENDING_MIX = ((1, 0.4), (8, 0.25), (16, 0.15), (64, 0.12), (256, 0.08))
PRIORITIES = ("high", "normal", "normal", "low", "low")


def stats(samples: list[float]) -> dict[str, Any]:
    if not samples:
        return {"p50": None, "p95": None, "n": 0}
    return {
        "p50": round(statistics.median(samples), 1),
        "p95": round(float(np.percentile(samples, 95)), 1),
        "n": len(samples),
    }


# ---- the work: fill to quota, then a queue that waits -----------------------------------------


def job(name: str, team: str, gpus: int, priority: str) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "name": name,
        "team": team,
        "priority": priority,
        "gpus": gpus,
        "command": ["sleep", "infinity"],
    }
    if gpus >= 8:
        spec["per_node"] = 8
    return spec


def fill_jobs() -> list[dict[str, Any]]:
    """Submissions that add up to each team's quota exactly, largest first (so they pack).
    The 1-GPU work comes as array jobs of up to ``SWEEP`` tasks (sweeps), one job per task."""
    out: list[dict[str, Any]] = []
    for team, quota in QUOTAS.items():
        done, share = 0, 0.0
        for size in SIZES[:-1]:
            share += FILL_SHARE[size]
            count = (int(quota * share) - done) // size
            for i in range(count):
                out.append({"spec": job(f"{team}-{size}g-{i}", team, size, PRIORITIES[i % 5])})
            done += count * size
        for i, first in enumerate(range(0, quota - done, SWEEP)):
            last = min(quota - done, first + SWEEP) - 1
            spec = job(f"{team}-sweep-{i}", team, 1, PRIORITIES[i % 5])
            out.append({"spec": spec, "array": f"0-{last - first}"})
    return sorted(out, key=lambda b: -int(b["spec"]["gpus"]))


def tasks(body: dict[str, Any]) -> int:
    """How many jobs a submission makes (an array's tasks)."""
    first, _, last = str(body.get("array", "0-0")).partition("-")
    return int(last) - int(first) + 1


def pending_jobs(count: int) -> list[dict[str, Any]]:
    """``count`` submissions of teams at their quota: they wait."""
    rng = np.random.default_rng(7)
    teams = list(QUOTAS)
    sizes = [s for s, _ in PENDING_MIX]
    weights = [w for _, w in PENDING_MIX]
    out = []
    for i in range(count):
        team = teams[int(rng.integers(len(teams)))]
        size = int(rng.choice(sizes, p=weights))
        spec = job(f"wait-{size}g-{i}", team, size, PRIORITIES[int(rng.integers(5))])
        out.append({"spec": spec})
    return out


def submit_all(http: httpx.Client, label: str, bodies: list[dict[str, Any]]) -> list[list[str]]:
    """Post every submission; the ids of the jobs each made (an array's tasks)."""

    def one(client: httpx.Client, body: dict[str, Any]) -> list[str]:
        reply = post(client, "/v1/jobs", body)
        return list(reply["tasks"]) or [reply["job"]["id"]]

    return parallel(label, http, bodies, one)


@dataclass
class Fleet:
    """The server and what the setup put on it."""

    url: str
    token: str
    hosts: int
    fill: list[str]
    pending: list[str]
    big_job: str
    setup_s: dict[str, float] = field(default_factory=dict)
    after_fill: dict[str, Any] = field(default_factory=dict)


def teams_file(path: Path) -> Path:
    """The server's ``--teams`` file: each team's burst quota (half of it guaranteed)."""
    teams = {t: {"quota": {"guaranteed": q // 2, "burst": q}} for t, q in QUOTAS.items()}
    path.write_text(yaml.safe_dump({"teams": teams}))
    return path


def set_up(cluster: LocalCluster, pending: int) -> Fleet:
    """Register the hosts, fill the fleet to the quotas, start the fill, queue ``pending``."""
    hosts = inventories(load_fleet_spec(FLEET))
    api = httpx.Client(base_url=cluster.url, timeout=60, headers=auth(cluster.admin_token))
    agent = httpx.Client(base_url=cluster.url, timeout=60, headers=auth(cluster.agent_token))
    took: dict[str, float] = {}
    with api, agent:
        t = time.perf_counter()
        sessions = register_hosts(agent, hosts)
        took["register_s"], t = time.perf_counter() - t, time.perf_counter()
        bodies = fill_jobs()
        fill = submit_all(api, "submitting the fill", bodies)
        wait_used(api, sum(int(b["spec"]["gpus"]) * tasks(b) for b in bodies), timeout=900)
        took["fill_s"], t = time.perf_counter() - t, time.perf_counter()
        report_started(agent, sessions)
        after = wait_running(api, sum(map(len, fill)), timeout=300)
        took["start_s"], t = time.perf_counter() - t, time.perf_counter()
        waiting = submit_all(api, "submitting the queue", pending_jobs(pending))
        took["queue_s"] = time.perf_counter() - t
    big = next(ids[0] for ids, b in zip(fill, bodies, strict=True) if b["spec"]["gpus"] == 256)
    flat = [i for ids in fill for i in ids]
    queued = [i for ids in waiting for i in ids]
    return Fleet(cluster.url, cluster.admin_token, len(hosts), flat, queued, big, took, after)


# ---- the pages, in headless Chromium ----------------------------------------------------------

# The browser's own timing of the page's first GET of a path (ms after the navigation).
FETCH = """const fetched = (path) => {
  const r = performance.getEntriesByType('resource').find((e) => e.name.includes(path));
  return r ? {start_ms: r.startTime, ms: r.responseEnd - r.startTime} : null;
};"""
MAP_READY = f"""(n) => {{
  {FETCH}
  const m = document.querySelector('[data-testid=fleet-map][data-rendered]');
  if (!m || m.querySelectorAll('[data-testid=host]').length < n) return null;
  const map = fetched('/v1/console/map');
  return {{render_ms: Number(m.dataset.renderMs), map}};
}}"""
QUEUE_READY = """(n) => {
  const rows = document.querySelectorAll('[data-testid=queue-row]').length;
  return rows >= n ? {rows} : null;
}"""
JOB_READY = f"""(n) => {{
  {FETCH}
  const state = document.querySelector('[data-testid=job-state]');
  if (!state || !state.textContent.trim()) return null;
  const hosts = document.querySelectorAll('[data-testid=placement-host]').length;
  const events = document.querySelectorAll('[data-testid=timeline-event]').length;
  return hosts >= n && events > 0 ? {{map: fetched('/v1/console/map')}} : null;
}}"""
QUEUE_ROWS = "() => document.querySelectorAll('[data-testid=queue-row]').length"
RENDER_MS = (
    "() => Number(document.querySelector('[data-testid=fleet-map]')?.dataset.renderMs ?? NaN)"
)
VIEWPORT = {"width": 1440, "height": 900}
FIRST_TIMEOUT_MS = 120_000
LIVE_TIMEOUT_MS = 30_000
LIVE_GAP_S = 1.0  # quiet between live updates: each starts with nothing else in flight


@dataclass
class Pages:
    """A browser and the fleet it looks at."""

    browser: Browser
    fleet: Fleet

    def open(self, route: str) -> tuple[Page, float]:
        """A fresh context (cold cache) with the token stored; goto ``route``. Returns the
        page and the ``perf_counter`` just before the navigation."""
        context = self.browser.new_context(viewport=VIEWPORT)  # type: ignore[arg-type]
        page = context.new_page()
        page.add_init_script(f"localStorage.setItem('bolt.token', {json.dumps(self.fleet.token)})")
        start = time.perf_counter()
        page.goto(f"{self.fleet.url}/console/#/{route}", wait_until="commit")
        return page, start

    @contextlib.contextmanager
    def opened(self, route: str, ready: str, arg: int) -> Iterator[Page]:
        """A page on ``route``, drawn (``ready(arg)``) and live; closed on exit."""
        page, _ = self.open(route)
        try:
            page.wait_for_function(ready, arg=arg, timeout=FIRST_TIMEOUT_MS)
            wait_live(page)
            yield page
        finally:
            page.context.close()

    def first_render(self, route: str, ready: str, arg: int) -> tuple[float, dict[str, Any]]:
        """Milliseconds from goto to ``ready(arg)`` holding, and what it returned."""
        page, start = self.open(route)
        try:
            found = page.wait_for_function(ready, arg=arg, timeout=FIRST_TIMEOUT_MS)
            took = (time.perf_counter() - start) * 1000.0
            value: dict[str, Any] = found.json_value()
            return took, value
        finally:
            page.context.close()


def first_renders(pages: Pages, repeats: int, queue_rows: int) -> dict[str, Any]:
    """Map, queue and job page, ``repeats`` cold loads each."""
    f = pages.fleet
    todo = [
        ("map", "fleet", MAP_READY, f.hosts),
        ("queue", "queue", QUEUE_READY, queue_rows),
        ("job", f"job/{f.big_job}", JOB_READY, 32),
    ]
    out: dict[str, Any] = {}
    with progress() as bar:
        task = bar.add_task("first renders", total=repeats * len(todo))
        for name, route, ready, arg in todo:
            runs = []
            for _ in range(repeats):
                runs.append(pages.first_render(route, ready, arg))
                bar.advance(task)
            out[f"{name}_ms"] = stats([ms for ms, _ in runs])
            out.update(page_timings(name, [v for _, v in runs]))
    return out


def page_timings(page: str, values: list[dict[str, Any]]) -> dict[str, Any]:
    """A page's own figures: the map's render time, and its fetches as the browser timed
    them (the fleet page's map, the job page's map of its hosts if it fetched one)."""
    out: dict[str, Any] = {}
    if page == "map":
        out["map_render_ms"] = stats([v["render_ms"] for v in values])
    if page != "queue":
        key = "map_fetch" if page == "map" else f"{page}_map_fetch"
        out.update(fetch_stats(key, [v["map"] for v in values], start=True))
    return out


def fetch_stats(
    key: str, seen: list[dict[str, float] | None], start: bool = False
) -> dict[str, Any]:
    """How long a fetch took (and when it began after the navigation), where it was made."""
    got = [x for x in seen if x]
    if not got:
        return {}
    out = {f"{key}_ms": stats([x["ms"] for x in got])}
    if start:
        out[f"{key}_start_ms"] = stats([x["start_ms"] for x in got])
    return out


def queue_rows_shown(pages: Pages) -> int:
    """How many rows the queue page shows (a warm-up load, not timed): the count once it has
    stayed the same for a second."""
    page, _ = pages.open("queue")
    try:
        page.wait_for_selector("[data-testid=queue-row]", timeout=FIRST_TIMEOUT_MS)
        seen, since = -1, time.monotonic()
        while time.monotonic() - since < 1.0:
            rows = int(page.evaluate(QUEUE_ROWS))
            if rows != seen:
                seen, since = rows, time.monotonic()
            time.sleep(0.1)
        return seen
    finally:
        page.context.close()


@dataclass(frozen=True)
class LiveSample:
    """One live update: the job, when it was sent (wall clock), how long until the page showed
    it, and the map's ``data-render-ms`` then (NaN off the map)."""

    job: str
    sent_at: float
    ms: float
    render_ms: float


def live_updates(pages: Pages, api: httpx.Client, repeats: int, rows: int) -> dict[str, Any]:
    """Submit through the API with the map (then the queue) open; time until it shows. The
    map's jobs (team ``bench``) are placed at once; the queue's (teams at quota) wait."""
    f = pages.fleet
    teams = list(QUOTAS)
    with progress() as bar:
        task = bar.add_task("live updates", total=2 * repeats)

        def step(page: Page, team: str, selector: str) -> LiveSample:
            sample = live_one(page, api, team, selector)
            bar.advance(task)
            return sample

        with pages.opened("fleet", MAP_READY, f.hosts) as page:
            gpu = '[data-testid=gpu][data-owner="{}"]'
            on_map = [step(page, LIVE_TEAM, gpu) for _ in range(repeats)]
        with pages.opened("queue", QUEUE_READY, rows) as page:
            row = '[data-testid=queue-row][data-job="{}"]'
            on_queue = [step(page, teams[i % len(teams)], row) for i in range(repeats)]
    return {
        "live_map_ms": stats([x.ms for x in on_map]),
        "live_map_placed_ms": stats([placed_ms(api, x) for x in on_map]),
        "live_map_render_ms": stats([x.render_ms for x in on_map]),
        "live_queue_ms": stats([x.ms for x in on_queue]),
    }


def wait_live(page: Page) -> None:
    """Until the page's change stream is connected."""
    page.wait_for_function(
        "() => document.querySelector('[data-testid=live-status]')?.textContent.trim() === 'live'",
        timeout=LIVE_TIMEOUT_MS,
    )


def live_one(page: Page, api: httpx.Client, team: str, selector: str) -> LiveSample:
    """Submit a high-priority 1-GPU job of ``team``; wait until ``selector`` (formatted with
    its id) is in the page."""
    time.sleep(LIVE_GAP_S)
    sent_at, start = time.time(), time.perf_counter()
    job_id = post(api, "/v1/jobs", {"spec": job("live", team, 1, "high")})["job"]["id"]
    page.wait_for_selector(selector.format(job_id), state="attached", timeout=LIVE_TIMEOUT_MS)
    took = (time.perf_counter() - start) * 1000.0
    return LiveSample(job_id, sent_at, took, float(page.evaluate(RENDER_MS)))


def placed_ms(api: httpx.Client, sample: LiveSample) -> float:
    """The server's share of a live update: from the submit to the job's ``placed`` event
    (same machine clock)."""
    events = api.get(f"/v1/jobs/{sample.job}").json()["events"]
    at = min(e["at"] for e in events if e["kind"] == "placed")
    return (float(at) - sample.sent_at) * 1000.0


def preflight(api: httpx.Client) -> None:
    """Fail at once, saying why, when there is no browser or the server serves no console."""
    if chromium() is None:
        raise RuntimeError("no chromium. To fix: apt-get install -y chromium")
    page = api.get("/console/")
    if page.status_code != 200 or "<script" not in page.text:
        raise RuntimeError(f"GET /console/ answered {page.status_code}: no console page served")


def map_api(api: httpx.Client, calls: int) -> dict[str, Any]:
    """``GET /v1/console/map``: size and round-trip time on loopback."""
    times, size, wire = [], 0, 0
    for _ in range(calls):
        start = time.perf_counter()
        reply = api.get("/v1/console/map")
        times.append((time.perf_counter() - start) * 1000.0)
        reply.raise_for_status()
        size, wire = len(reply.content), reply.num_bytes_downloaded
    data = reply.json()
    return {
        "bytes": size,
        "wire_bytes": wire,
        "encoding": reply.headers.get("content-encoding", "identity"),
        "owners": len(data["owners"]),
        "ms": stats(times),
    }


def measure(f: Fleet, args: argparse.Namespace) -> dict[str, Any]:
    """Every page measurement, in one headless Chromium."""
    out: dict[str, Any] = {}
    with httpx.Client(base_url=f.url, timeout=60, headers=auth(f.token)) as api:
        preflight(api)
        out["map_api"] = map_api(api, args.map_calls)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium(), args=list(ARGS))
            try:
                pages = Pages(browser, f)
                rows = args.queue_rows or queue_rows_shown(pages)
                out["queue_rows"] = rows
                out.update(first_renders(pages, args.repeats, rows))
                out.update(live_updates(pages, api, args.live, rows))
                if args.screenshots:
                    screenshots(pages, rows, args.screenshots)
            finally:
                browser.close()
    return out


def screenshots(pages: Pages, queue_rows: int, folder: Path) -> None:
    """The map, the queue and the big job's page at this scale, as PNGs in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    f = pages.fleet
    for name, route, ready, arg in (
        ("fleet-16k", "fleet", MAP_READY, f.hosts),
        ("queue-16k", "queue", QUEUE_READY, queue_rows),
        ("job-256-gpus", f"job/{f.big_job}", JOB_READY, 32),
    ):
        with pages.opened(route, ready, arg) as page:
            page.screenshot(path=str(folder / f"{name}.png"), full_page=name != "queue-16k")


# ---- running it --------------------------------------------------------------------------------


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--pending", type=int, default=2000, help="Jobs left waiting.")
    parser.add_argument("--repeats", type=int, default=5, help="First renders of each page.")
    parser.add_argument("--live", type=int, default=20, help="Live updates of each page.")
    parser.add_argument("--map-calls", type=int, default=10, help="GET /v1/console/map calls.")
    parser.add_argument(
        "--queue-rows", type=int, default=0, help="Rows the queue page shows (0: count them)."
    )
    parser.add_argument("--setup-only", action="store_true", help="Set up, report, stop.")
    parser.add_argument(
        "--screenshots", type=Path, help="Save the pages at this scale as PNGs in this folder."
    )
    parser.add_argument("--json", action="store_true")
    return parser.parse_args()


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Set up a server and its fleet in a temporary directory, measure, tear it all down."""
    with tempfile.TemporaryDirectory(prefix="boltforge-console-") as tmp:
        work = Path(tmp)
        server_args = [*SERVER_ARGS, "--teams", str(teams_file(work / "teams.yaml"))]
        with LocalCluster(work / "cluster", hosts=0, server_args=server_args) as cluster:
            setup = set_up(cluster, args.pending)
            out: dict[str, Any] = {"setup": describe(setup)}
            if not args.setup_only:
                out.update(measure(setup, args))
            return out


def describe(f: Fleet) -> dict[str, Any]:
    a = f.after_fill
    return {
        "hosts": f.hosts,
        "gpus": a["gpus"],
        "gpus_used": a["gpus_used"],
        "jobs_running": a["jobs_running"],
        "jobs_pending": len(f.pending),
        **{k: round(v, 1) for k, v in f.setup_s.items()},
    }


def show(out: dict[str, Any]) -> None:
    """The figures as a table on stdout."""
    s = out["setup"]
    print(
        f"fleet: {s['hosts']} hosts, {s['gpus_used']}/{s['gpus']} GPUs allocated, "
        f"{s['jobs_running']} jobs running, {s['jobs_pending']} waiting "
        f"(setup: register {s['register_s']} s, fill {s['fill_s']} s, "
        f"start {s['start_s']} s, queue {s['queue_s']} s)"
    )
    if "map_api" not in out:
        return
    m = out["map_api"]
    print(
        f"GET /v1/console/map: {m['bytes'] / 1e6:.2f} MB ({m['encoding']}, "
        f"{m['wire_bytes'] / 1e6:.2f} MB on the wire), {m['owners']} owners, "
        f"p50 {m['ms']['p50']} ms, p95 {m['ms']['p95']} ms"
    )
    live = s["jobs_running"] + s["jobs_pending"]
    print(
        f"queue page rows: {out['queue_rows']} (of {live} live jobs: "
        f"{s['jobs_running']} running, {s['jobs_pending']} waiting)"
    )
    table = Table(title=f"console on {s['gpus']:,} GPUs (ms)")
    for column in ("measurement", "median", "p95", "n"):
        table.add_column(column, justify="left" if column == "measurement" else "right")
    for key, label in LABELS.items():
        if key in out:
            v = out[key]
            table.add_row(label, str(v["p50"]), str(v["p95"]), str(v["n"]))
    Console().print(table)


LABELS = {
    "map_ms": "fleet map first render (goto -> all hosts)",
    "map_render_ms": "  the page's own data-render-ms",
    "map_fetch_start_ms": "  its map fetch starts (after goto)",
    "map_fetch_ms": "  its map fetch takes (browser)",
    "queue_ms": "queue first render (goto -> rows)",
    "job_ms": "job page first render (256-GPU job)",
    "job_map_fetch_ms": "  its fetch of its hosts' map takes",
    "live_map_ms": "live: submit -> GPU on the map",
    "live_map_placed_ms": "  of which submit -> placed (server)",
    "live_map_render_ms": "  the map's re-render (data-render-ms)",
    "live_queue_ms": "live: submit -> row in the queue",
}


def main() -> None:
    args = arguments()
    try:
        with interrupts_as_keyboard():
            out = run(args)
    except KeyboardInterrupt:
        console.print("interrupted: server and browser stopped")
        sys.exit(130)
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        show(out)


if __name__ == "__main__":
    main()

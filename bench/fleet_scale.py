"""The control plane at fleet scale: a real ``bolt server`` with 2,048 registered 8-GPU hosts
(16,384 GPUs, examples/fleets/h100-16k.yaml), ~1,900 jobs running and 5,000 waiting, on SQLite
and on PostgreSQL; with ``--hosts 12500``, 12,500 hosts (100,000 GPUs,
examples/fleets/h100-100k.yaml), ~12,000 jobs running and 20,000 waiting.

The fleet file follows the host count: h100-16k.yaml up to its 2,048 hosts, h100-100k.yaml
above (``--fleet`` names another); the first ``--hosts`` hosts of it are registered. Unless
``--running`` and ``--pending`` are given, they are 1,900 and 5,000 up to 2,048 hosts, and above
it 12,000 and 20,000 per 12,500 hosts, in proportion. A run at 12,500 hosts takes far longer
than one at 2,048 (every setup step grows with the fleet); fewer samples keep it short, e.g.
``--hosts 12500 --db sqlite --arrivals 20 --preemptions 5 --full-passes 5``.

Each store gets a fresh server (a subprocess, as ``LocalCluster`` starts it) on a fresh store in
a temporary directory (PostgreSQL: a throwaway ``initdb`` server on 127.0.0.1), one after the
other (``--db sqlite|postgres|both``, default both). The server runs with a one-day ``--lease``
(the stand-in nodes stay ready without heartbeats), preemption on demand (``--min-runtime 0
--cooldown 0 --churn 1000``), the teams file below, and a shorter full-pass period
(``--full-every``) when ``bolt server --help`` offers such a flag. The hosts are stand-in
agents (``bench/standin.py``): this process speaks the agent protocol for them, sharing the
agent token; no replica process runs anywhere. Traffic stays on 127.0.0.1.

The scenario, in order, everything through the public HTTP API:

1. **register_s**: wall time to register every host through ``POST /v1/agents/register`` from
   32 concurrent connections.
2. **Fill**: six teams submit whole-host jobs (8 to 256 GPUs, not preemptible) that add up to
   exactly their burst quota (``--teams``), leaving room for what follows; the bench waits
   until all are placed (``setup.fill_s``).
3. **submit_placed_per_s**: 32 concurrent connections submit ``--submits`` small jobs (1, 2, 4
   or 8 GPUs on one host, team ``bench``, which has no quota) into free room sized for them
   (a quarter more than they need); submissions divided by the time from the first submit
   sent until the last of them is placed (no job of the team left ``pending``/``requeued``,
   polled every 20 ms once all were accepted). ``detail.submit_accepted_per_s`` is the
   acceptance rate alone. Then whole free hosts beyond ``--free-hosts`` + 1 are taken by
   8-GPU jobs (``setup.topup_jobs``), so the fleet is nearly full.
4. **report_storm_s**: the desired state of every host is read (untimed), then every host's
   stand-in agent reports ``started`` for every replica there, one report per host, from 32
   concurrent connections; the time from the first report sent until no job is left
   ``scheduled`` (every one of them ``running``; ``GET /v1/jobs?state=scheduled&limit=1``
   polled every 50 ms). ``setup.running`` says how many jobs that was.
5. **Queue**: ``--pending`` jobs of the six teams (1 to 256 GPUs), all past their quota, are
   submitted; they wait (``setup.pending_reasons`` counts their reasons).
6. **arrival_to_bind_ms**: with the queue in place and the fleet nearly full, one 1-GPU job of
   team ``bench`` at a time (``--arrivals``, 0.2 s apart): from the ``POST /v1/jobs`` request
   sent until the job is bound (state ``scheduled``), seen through the server's long-poll
   ``GET /v1/jobs/{id}/events?after=N&wait=S``. ``detail.arrival_to_placed_event_ms`` runs
   until the time stamped on the job's ``placed`` event instead: the start of the scheduling
   pass that placed it (the rest is that pass, its commit and the long-poll's answer).
7. **preempt_signal_ms**: every whole free host but one is taken by an 8-GPU job; a
   low-priority, preemptible 8-GPU job (the only preemptible job in the fleet) runs on the last
   one (reported started by its stand-in agent). A high-priority 8-GPU job is submitted, which
   fits only by preempting it; the time from its POST until that host's stand-in agent,
   long-polling ``GET /v1/agents/{node}/desired?since=V&wait=S``, sees the victim's replica
   with action ``stop`` (when a real agent sends SIGTERM). The agent then reports the victim
   exited, both jobs are cancelled, the host is emptied, and the next round starts
   (``--preemptions`` rounds). ``detail.preempt_world_reads`` counts the worlds the server
   read whole from memory for incremental passes during the rounds, and
   ``detail.world_read_ms`` is its figure for such a read (``loop.world_read_ms``);
   ``detail.world_refresh_ms`` its figure for bringing the world up to date by the changes
   instead (``loop.world_refresh_ms``).
8. **full_pass_ms**: p50 and p99 of the scheduler's full passes as the server reports them in
   ``GET /v1/fleet`` (``loop.full_pass_ms``: ``p50``, ``p99`` and ``count`` over its last
   passes), read once the server has run at least ``--full-passes`` more full passes with the
   queue in place (they come every 10 s when nothing else asks for one; the bench waits for
   them). Null, with a note on stderr, when the server does not report it. The server's
   figure also covers passes from before the queue existed, if they are still in its window:
   ``passes_before_queue`` and ``passes_with_queue`` say how many of each there were.
   ``detail.full_pass_with_queue_ms`` has only passes with the queue in place, timed by the
   server too: during that wait, whenever two reads of ``/v1/fleet`` bracket exactly one pass
   and it was a full one, its ``last_cycle_ms``.
9. **rss_mib**: the server process's peak resident memory (``VmHWM`` in
   ``/proc/<pid>/status``) at the end.

``setup`` holds the time each setup step took and the counts reached (hosts registered, jobs
running, waiting), so a reader can tell the scenario was met. Latencies are wall-clock
milliseconds in this process (the ``placed`` figure compares this machine's clock with the
server's, the same clock); percentiles over all samples.

Targets at 2,048 hosts: all hosts registered in 10 s or less; at least 200 submissions per
second placed with 32 clients; 2,048 start reports absorbed in 5 s or less; arrival to bind p50
50 ms or less; high-priority submit to the victim's SIGTERM p50 50 ms or less. At 12,500 hosts
(100,000 GPUs, 12,000 running, 20,000 waiting): all hosts registered in 60 s or less; at least
300 submissions per second placed; arrival to bind p50 50 ms and p99 150 ms or less; submit to
SIGTERM p50 50 ms and p99 200 ms or less; a full pass p50 2 s and p99 4 s or less; server peak
RSS 4 GiB or less. Nothing here asserts them: the figures depend on the machine and what else
runs on it.

Progress goes to stderr; stdout gets a table, or with ``--json`` exactly one JSON document
(``{"sqlite": {...}, "postgres": {...}}``, or one store's object when ``--db`` names one).
Servers, PostgreSQL and temporary directories go away on exit, on an error and on Ctrl-C.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import yaml
from rich.console import Console
from rich.table import Table
from standin import (
    FLEET,
    THREADS,
    auth,
    console,
    fleet,
    interrupts_as_keyboard,
    inventories,
    parallel,
    post,
    register_hosts,
    wait_used,
)

from boltforge.spec.fleet import load_fleet_spec
from boltforge.testing.postgres import postgres
from boltforge.testing.processes import LocalCluster, bolt
from boltforge.wire.agent import AgentReport, Inventory, ReplicaEvent

STORES = ("sqlite", "postgres")
# A one-day lease: stand-in nodes stay ready without heartbeats. Preemption on demand: every
# round bumps a job that just started, far beyond a real churn budget.
SERVER_ARGS = ["--lease", "86400", "--min-runtime", "0", "--cooldown", "0", "--churn", "1000"]
TEAMS = ("nlp", "vision", "research", "speech", "rl", "infra")  # the fill and the queue
OPEN_TEAM = "bench"  # no quota: the timed submissions, top-up, arrivals and blockers
VICTIM_TEAM, URGENT_TEAM = "spare", "urgent"  # no quota either
SUBMIT_MIX = ((1, 0.4), (2, 0.2), (4, 0.2), (8, 0.2))
SUBMIT_ROOM = 1.25  # free room for the timed submissions: this many times their GPUs
FILL_HOSTS = (32, 8, 4, 2)  # hosts per fill job beyond one (256, 64, 32, 16 GPUs)
PENDING_MIX = ((1, 0.4), (8, 0.25), (16, 0.15), (64, 0.12), (256, 0.08))
PRIORITIES = ("high", "normal", "normal", "low", "low")
WAITING = ("pending", "requeued")
HTTP_TIMEOUT = 600.0  # per request: the server may hold a request behind long passes
PHASE_TIMEOUT = 3600.0  # per waiting step; generous, for a slow server
LONG_POLL_S = 30.0
ARRIVAL_GAP_S = 0.2
PREEMPT_ROUND_TIMEOUT = 600.0
STALL_S = 600.0  # a waiting step gives up when nothing moved for this long
ARRIVAL_TIMEOUT = 600.0  # one arrival to its bind
SERVER_FULL_S = 10.0  # the server's full-pass period when it has no option to set it
LIST_MAX = 10_000  # the most jobs one GET /v1/jobs lists
# The fleet by the host count: h100-16k.yaml (2,048 hosts) by default, h100-100k.yaml (12,500
# hosts, 100,000 GPUs) beyond it; the jobs running and waiting scale with it (``scale_defaults``).
LARGE_FLEET = FLEET.parent / "h100-100k.yaml"
SMALL_HOSTS, SMALL_RUNNING, SMALL_PENDING = 2048, 1900, 5000
LARGE_HOSTS, LARGE_RUNNING, LARGE_PENDING = 12_500, 12_000, 20_000


def note(store: str, text: str) -> None:
    console.print(f"[{store}] {text}", highlight=False, markup=False)


def stats(samples: list[float]) -> dict[str, Any]:
    if not samples:
        return {"p50": None, "p99": None, "n": 0}
    return {
        "p50": round(statistics.median(samples), 1),
        "p99": round(float(np.percentile(samples, 99)), 1),
        "n": len(samples),
    }


def world_reads(now: dict[str, Any]) -> int:
    """How many worlds the server rebuilt from memory for incremental passes (its
    ``loop.world_read_ms`` count, capped by its window; 0 when it does not say)."""
    spread = (now.get("loop") or {}).get("world_read_ms") or {}
    return int(spread.get("count", 0))


def job(
    name: str, team: str, gpus: int, priority: str = "normal", preemptible: bool = False
) -> dict[str, Any]:
    """A job that sleeps on ``gpus`` GPUs, up to 8 per host (one host when 8 or fewer)."""
    return {
        "name": name,
        "team": team,
        "priority": priority,
        "gpus": gpus,
        "per_node": min(gpus, 8),
        "preemptible": preemptible,
        "command": ["sleep", "infinity"],
    }


# ---- the plan: what goes where ---------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """The hosts, the timed submissions' sizes, the fill (team and hosts per job) and each
    team's quota, so that the fleet ends up nearly full with ``free_hosts`` (+1) whole hosts
    free."""

    hosts: list[Inventory]
    submit_sizes: list[int]
    submit_room: int
    fill: list[tuple[str, int]]
    quotas: dict[str, int]
    free_hosts: int


def fleet_file(args: argparse.Namespace) -> Path:
    """``--fleet``, or by the host count: h100-16k.yaml up to its 2,048 hosts, h100-100k.yaml
    above."""
    if args.fleet is not None:
        return Path(args.fleet)
    return FLEET if args.hosts <= SMALL_HOSTS else LARGE_FLEET


def scale_defaults(args: argparse.Namespace) -> None:
    """``--running`` and ``--pending`` when not given: 1,900 and 5,000 up to 2,048 hosts; above,
    the issue's 12,000 running and 20,000 waiting at 12,500 hosts, in proportion to the hosts."""
    small = args.hosts <= SMALL_HOSTS
    if args.running is None:
        args.running = SMALL_RUNNING if small else round(LARGE_RUNNING * args.hosts / LARGE_HOSTS)
    if args.pending is None:
        args.pending = SMALL_PENDING if small else round(LARGE_PENDING * args.hosts / LARGE_HOSTS)


def make_plan(args: argparse.Namespace) -> Plan:
    path = fleet_file(args)
    hosts = inventories(load_fleet_spec(path))
    if args.hosts > len(hosts):
        raise SystemExit(
            f"--hosts {args.hosts}: {path.name} has {len(hosts)} hosts. To fix: pass a larger "
            "--fleet or fewer --hosts"
        )
    hosts = hosts[: args.hosts]
    rng = np.random.default_rng(11)
    sizes = [s for s, _ in SUBMIT_MIX]
    weights = [w for _, w in SUBMIT_MIX]
    submit = [int(rng.choice(sizes, p=weights)) for _ in range(args.submits)]
    need = math.ceil(sum(submit) / 8)
    room = math.ceil(need * SUBMIT_ROOM) + 8
    fill_hosts = len(hosts) - room - args.free_hosts - 1
    fill_jobs = args.running - args.submits - (room - need)  # the top-up takes the rest
    if fill_jobs < 1 or fill_hosts < fill_jobs or fill_hosts > max(FILL_HOSTS) * fill_jobs:
        raise SystemExit(
            f"--running {args.running} with --submits {args.submits} on {len(hosts)} hosts "
            f"leaves {fill_hosts} host(s) for {fill_jobs} fill job(s) of 1 to "
            f"{max(FILL_HOSTS)} hosts. To fix: change --running, --submits or --hosts"
        )
    per_job = sorted(split(fill_hosts, fill_jobs), reverse=True)  # largest first: they pack
    fill = [(TEAMS[i % len(TEAMS)], k) for i, k in enumerate(per_job)]
    quotas: Counter[str] = Counter()
    for team, k in fill:
        quotas[team] += 8 * k
    return Plan(hosts, submit, room, fill, dict(quotas), args.free_hosts)


def split(total: int, count: int) -> list[int]:
    """``count`` job sizes in hosts (1 or one of ``FILL_HOSTS``) adding up to ``total``: every
    job starts at one host and takes the next size up, in turn, while hosts are left."""
    out, extra = [1] * count, total - count
    while extra > 0:
        grew = False
        for i in range(count):
            order = FILL_HOSTS[i % len(FILL_HOSTS) :] + FILL_HOSTS[: i % len(FILL_HOSTS)]
            bigger = [k for k in order if k > out[i] and k - out[i] <= extra]
            if bigger:
                extra -= bigger[0] - out[i]
                out[i] = bigger[0]
                grew = True
            if extra == 0:
                break
        if not grew:
            raise ValueError(f"{total} hosts do not split into {count} jobs")
    return out


def teams_file(path: Path, quotas: dict[str, int]) -> Path:
    """The server's ``--teams`` file: each team's burst quota (half of it guaranteed)."""
    teams = {t: {"quota": {"guaranteed": q // 2, "burst": q}} for t, q in quotas.items()}
    path.write_text(yaml.safe_dump({"teams": teams}))
    return path


def pending_jobs(count: int) -> list[dict[str, Any]]:
    """``count`` submissions of teams at their quota: they wait."""
    rng = np.random.default_rng(7)
    sizes = [s for s, _ in PENDING_MIX]
    weights = [w for _, w in PENDING_MIX]
    out = []
    for i in range(count):
        team = TEAMS[int(rng.integers(len(TEAMS)))]
        size = int(rng.choice(sizes, p=weights))
        spec = job(f"wait-{size}g-{i}", team, size, PRIORITIES[int(rng.integers(5))], True)
        out.append({"spec": spec})
    return out


def full_every_flag() -> str | None:
    """The ``bolt server`` option that sets how often full passes run, if it has one."""
    env = {**os.environ, "COLUMNS": "250", "NO_COLOR": "1", "TERM": "dumb"}
    help_text = subprocess.run(
        [*bolt(), "server", "--help"], capture_output=True, text=True, env=env, timeout=120
    ).stdout
    found = re.search(r"--(full[a-z-]*)", help_text)
    return f"--{found.group(1)}" if found else None


# ---- one store -------------------------------------------------------------------------------


@dataclass
class Bench:
    """One server and what the scenario put on it."""

    store: str
    cluster: LocalCluster
    plan: Plan
    args: argparse.Namespace
    api: httpx.Client
    agent: httpx.Client
    sessions: dict[str, str] = field(default_factory=dict)
    out: dict[str, Any] = field(default_factory=dict)
    setup: dict[str, Any] = field(default_factory=dict)
    detail: dict[str, Any] = field(default_factory=dict)
    full_at_queue: int | None = None

    def say(self, text: str) -> None:
        note(self.store, text)

    def run(self) -> dict[str, Any]:
        steps: list[tuple[str, Callable[[], None]]] = [
            ("register_s", self.register),
            ("fill_s", self.fill),
            ("submit_s", self.submit_placed),
            ("topup_s", self.top_up),
            ("storm_s", self.report_storm),
            ("queue_s", self.queue),
            ("arrivals_s", self.arrivals),
            ("preempt_s", self.preemptions),
            ("full_passes_s", self.full_passes),
        ]
        for key, step in steps:
            started = time.perf_counter()
            step()
            self.setup.setdefault(key, round(time.perf_counter() - started, 1))
        self.finish()
        return {**self.out, "setup": self.setup, "detail": self.detail}

    # -- 1. registration

    def register(self) -> None:
        hosts = self.plan.hosts
        self.say(f"registering {len(hosts)} hosts from {THREADS} connections")
        started = time.perf_counter()
        self.sessions = register_hosts(self.agent, hosts, timeout=HTTP_TIMEOUT)
        took = time.perf_counter() - started
        self.out["register_s"] = round(took, 2)
        now = fleet(self.api)
        self.setup["hosts"] = now["nodes"]
        self.setup["gpus"] = now["gpus"]
        self.say(f"{now['nodes']} hosts ({now['gpus']} GPUs) registered in {took:.1f} s")

    # -- 2. the fill

    def fill(self) -> None:
        bodies = [
            {"spec": job(f"{team}-{8 * k}g-{i}", team, 8 * k, PRIORITIES[i % 5])}
            for i, (team, k) in enumerate(self.plan.fill)
        ]
        self.say(f"fill: {len(bodies)} jobs of {len(TEAMS)} teams up to their quotas")
        self.submit_all("submitting the fill", bodies)
        gpus = sum(8 * k for _, k in self.plan.fill)
        wait_used(self.api, gpus, PHASE_TIMEOUT)
        self.setup["fill_jobs"] = len(bodies)
        self.setup["fill_gpus"] = gpus

    def submit_all(self, label: str, bodies: list[dict[str, Any]]) -> list[str]:
        def one(http: httpx.Client, body: dict[str, Any]) -> str:
            return str(post(http, "/v1/jobs", body)["job"]["id"])

        return parallel(label, self.api, bodies, one, HTTP_TIMEOUT)

    # -- 3. submissions placed per second

    def submit_placed(self) -> None:
        bodies = [
            {"spec": job(f"small-{g}g-{i}", OPEN_TEAM, g)}
            for i, g in enumerate(self.plan.submit_sizes)
        ]
        n = len(bodies)
        self.say(
            f"timed: {n} submissions of 1-8 GPUs from {THREADS} connections "
            f"({sum(self.plan.submit_sizes)} GPUs; {self.free_whole_hosts()} whole hosts free)"
        )
        sent: list[float] = []

        def one(http: httpx.Client, body: dict[str, Any]) -> str:
            sent.append(time.perf_counter())
            return str(post(http, "/v1/jobs", body)["job"]["id"])

        parallel("submitting (timed)", self.api, bodies, one, HTTP_TIMEOUT)
        accepted = time.perf_counter()
        placed = self.wait_team_placed(OPEN_TEAM, n, poll=0.02)
        first = min(sent)
        self.out["submit_placed_per_s"] = round(n / (placed - first), 1)
        self.detail["submit_accepted_per_s"] = round(n / (accepted - first), 1)
        self.detail["submits"] = n
        self.say(
            f"{n} submissions placed in {placed - first:.1f} s "
            f"({n / (placed - first):.1f}/s; accepted in {accepted - first:.1f} s)"
        )

    def waiting_of(self, team: str, limit: int = 1) -> list[dict[str, Any]]:
        reply = self.api.get(
            "/v1/jobs", params={"state": ",".join(WAITING), "team": team, "limit": limit}
        )
        reply.raise_for_status()
        jobs: list[dict[str, Any]] = reply.json()["jobs"]
        return jobs

    def wait_team_placed(self, team: str, total: int, poll: float) -> float:
        """Until no job of ``team`` waits; returns when that was first seen (perf_counter).
        Gives up after ``PHASE_TIMEOUT``, or once ``STALL_S`` pass without one more placed."""
        deadline = time.monotonic() + PHASE_TIMEOUT
        checked, moved, still = time.monotonic(), time.monotonic(), total
        while True:
            waiting = self.waiting_of(team)
            seen = time.perf_counter()
            if not waiting:
                return seen
            now = time.monotonic()
            if now - checked > 10:
                left = self.waiting_of(team, LIST_MAX)
                if len(left) < still:
                    still, moved = len(left), now
                self.say(f"  {total - still} of {total} placed")
                checked = now
                if now > deadline or now - moved > STALL_S:
                    reasons = Counter(j["reason"] for j in left)
                    raise TimeoutError(
                        f"{len(left)} of {total} jobs of team {team} still wait, none placed "
                        f"for {now - moved:.0f} s: {dict(reasons)}"
                    )
            time.sleep(poll)

    def nodes(self) -> list[dict[str, Any]]:
        reply = self.api.get("/v1/nodes")
        reply.raise_for_status()
        nodes: list[dict[str, Any]] = reply.json()["nodes"]
        return nodes

    def free_whole_hosts(self) -> int:
        return len(self.whole_free())

    def whole_free(self) -> list[str]:
        return [
            n["name"]
            for n in self.nodes()
            if n["gpus_used"] == 0 and n["state"] == "ready" and n["gpus"] > 0
        ]

    # -- the top-up: the fleet nearly full

    def top_up(self) -> None:
        free = self.free_whole_hosts()
        extra = free - (self.plan.free_hosts + 1)
        self.setup["topup_jobs"] = max(extra, 0)
        if extra <= 0:
            self.say(f"{free} whole hosts free: no top-up")
            return
        self.say(f"top-up: {extra} 8-GPU jobs, leaving {self.plan.free_hosts + 1} hosts free")
        bodies = [{"spec": job(f"topup-{i}", OPEN_TEAM, 8)} for i in range(extra)]
        self.submit_all("submitting the top-up", bodies)
        self.wait_team_placed(OPEN_TEAM, extra, poll=0.2)

    # -- 4. the report storm

    def report_storm(self) -> None:
        now = fleet(self.api)
        bound = now["jobs_running"]
        self.say(f"reading the desired state of {len(self.sessions)} hosts ({bound} jobs bound)")

        def read(http: httpx.Client, node: str) -> tuple[str, list[dict[str, Any]]]:
            reply = http.get(f"/v1/agents/{node}/desired")
            reply.raise_for_status()
            return node, [r for r in reply.json()["replicas"] if r["action"] == "run"]

        started = time.perf_counter()
        desired = dict(parallel("reading desired state", self.agent, sorted(self.sessions), read))
        self.setup["desired_read_s"] = round(time.perf_counter() - started, 1)
        todo = {node: reps for node, reps in desired.items() if reps}
        jobs = {r["job"] for reps in todo.values() for r in reps}
        replicas = sum(len(reps) for reps in todo.values())
        if len(jobs) != bound:
            self.say(f"note: {bound} jobs bound but {len(jobs)} have replicas to start")
        self.say(f"timed: {len(todo)} hosts report {replicas} replicas of {len(jobs)} jobs started")
        sent: list[float] = []

        def one(http: httpx.Client, node: str) -> None:
            at = time.time()
            events = [
                ReplicaEvent(
                    replica=r["replica"], job=r["job"], epoch=r["epoch"], kind="started", at=at
                )
                for r in todo[node]
            ]
            body = AgentReport(session=self.sessions[node], events=events)
            sent.append(time.perf_counter())
            post(http, f"/v1/agents/{node}/report", body.model_dump(mode="json"))

        parallel("reporting started (timed)", self.agent, sorted(todo), one, HTTP_TIMEOUT)
        reported = time.perf_counter()
        done = self.wait_none_scheduled(len(jobs))
        first = min(sent)
        self.out["report_storm_s"] = round(done - first, 2)
        self.detail["storm_reports_sent_s"] = round(reported - first, 2)
        after = fleet(self.api)
        self.setup.update(
            storm_hosts=len(todo),
            storm_replicas=replicas,
            storm_jobs=len(jobs),
            running=after["by_state"].get("running", 0),
            gpus_used=after["gpus_used"],
        )
        self.say(
            f"{len(jobs)} jobs running {done - first:.1f} s after the first report "
            f"(reports sent in {reported - first:.1f} s); {after['gpus_used']} GPUs in use"
        )

    def wait_none_scheduled(self, total: int) -> float:
        """Until no job is ``scheduled``; returns when that was first seen (perf_counter).
        Gives up after ``PHASE_TIMEOUT``, or once ``STALL_S`` pass without one more running."""
        deadline = time.monotonic() + PHASE_TIMEOUT
        checked, moved, running = time.monotonic(), time.monotonic(), -1
        while True:
            reply = self.api.get("/v1/jobs", params={"state": "scheduled", "limit": 1})
            reply.raise_for_status()
            seen = time.perf_counter()
            if not reply.json()["jobs"]:
                return seen
            now = time.monotonic()
            if now - checked > 10:
                count = fleet(self.api)["by_state"].get("running", 0)
                if count > running:
                    running, moved = count, now
                self.say(f"  {running} of {total} running")
                checked = now
                if now > deadline or now - moved > STALL_S:
                    raise TimeoutError(
                        f"{total - running} jobs still scheduled, none started for "
                        f"{now - moved:.0f} s after the reports"
                    )
            time.sleep(0.05)

    # -- 5. the queue

    def queue(self) -> None:
        bodies = pending_jobs(self.args.pending)
        self.say(f"queue: {len(bodies)} jobs of teams at their quota")
        started = time.perf_counter()
        self.submit_all("submitting the queue", bodies)
        self.setup["queue_submit_s"] = round(time.perf_counter() - started, 1)
        deadline = time.monotonic() + PHASE_TIMEOUT
        while True:  # until the scheduler has given every one of them a reason to wait
            reply = self.api.get("/v1/jobs", params={"state": ",".join(WAITING), "limit": LIST_MAX})
            reply.raise_for_status()
            waiting = reply.json()["jobs"]
            reasons = Counter(j["reason"] or "(none yet)" for j in waiting)
            if len(waiting) >= min(len(bodies), LIST_MAX) and "(none yet)" not in reasons:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"queue not settled in {PHASE_TIMEOUT:.0f} s: {dict(reasons)}")
            time.sleep(2.0)
        now = fleet(self.api)
        self.setup["pending"] = now["jobs_pending"]
        self.setup["pending_reasons"] = dict(reasons)
        self.full_at_queue = self.full_count(now)
        self.say(f"{now['jobs_pending']} jobs waiting: {dict(reasons)}")

    # -- 6. arrival to bind

    def arrivals(self) -> None:
        n = self.args.arrivals
        free = self.free_whole_hosts()
        self.setup["free_hosts_at_arrivals"] = free
        self.setup["gpus_free_at_arrivals"] = self.setup["gpus"] - fleet(self.api)["gpus_used"]
        self.say(f"timed: {n} arrivals of 1 GPU, one at a time ({free} whole hosts free)")
        client_ms, event_ms = [], []
        for i in range(n):
            time.sleep(ARRIVAL_GAP_S)
            wall, started = time.time(), time.perf_counter()
            body = {"spec": job(f"arrival-{i}", OPEN_TEAM, 1)}
            job_id = str(post(self.api, "/v1/jobs", body)["job"]["id"])
            _, events = self.follow(job_id, lambda state: state not in WAITING, ARRIVAL_TIMEOUT)
            client_ms.append((time.perf_counter() - started) * 1000.0)
            placed = [e["at"] for e in events if e["kind"] == "placed"]
            if placed:
                event_ms.append((min(placed) - wall) * 1000.0)
        self.out["arrival_to_bind_ms"] = stats(client_ms)
        self.detail["arrival_to_placed_event_ms"] = stats(event_ms)
        self.say(f"arrival to bind: {self.out['arrival_to_bind_ms']}")

    def follow(
        self, job_id: str, done: Callable[[str], bool], timeout: float = PHASE_TIMEOUT
    ) -> tuple[str, list[dict[str, Any]]]:
        """Long-poll the job's timeline until ``done(state)``; the state and every event."""
        after, events = 0, []
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"job {job_id} not where expected in {timeout:.0f} s")
            params = {"after": after, "wait": round(min(LONG_POLL_S, left), 3)}
            reply = self.api.get(f"/v1/jobs/{job_id}/events", params=params)
            reply.raise_for_status()
            page = reply.json()
            if page["events"]:
                events += page["events"]
                after = page["events"][-1]["seq"]
            if done(page["state"]):
                return str(page["state"]), events

    # -- 7. preemption to the victim's stop signal

    def preemptions(self) -> None:
        free = self.whole_free()
        if not free:
            raise RuntimeError(
                "no whole host left free for the preemption rounds. To fix: raise --free-hosts"
            )
        blockers = len(free) - 1
        self.setup["blockers"] = blockers
        if blockers:
            self.say(f"taking {blockers} free hosts with 8-GPU jobs, leaving one")
            bodies = [{"spec": job(f"blocker-{i}", OPEN_TEAM, 8)} for i in range(blockers)]
            self.submit_all("submitting blockers", bodies)
            self.wait_team_placed(OPEN_TEAM, blockers, poll=0.2)
        rounds = self.args.preemptions
        self.say(f"timed: {rounds} preemptions of a low-priority 8-GPU job")
        samples = []
        reads = world_reads(fleet(self.api))
        with httpx.Client(
            base_url=self.cluster.url, timeout=HTTP_TIMEOUT, headers=auth(self.cluster.agent_token)
        ) as watcher:
            for r in range(rounds):
                samples.append(self.preempt_once(r, watcher))
        self.out["preempt_signal_ms"] = stats(samples)
        now = fleet(self.api)
        self.detail["preempt_world_reads"] = world_reads(now) - reads
        self.detail["world_read_ms"] = (now.get("loop") or {}).get("world_read_ms")
        self.detail["world_refresh_ms"] = (now.get("loop") or {}).get("world_refresh_ms")
        self.say(f"high-priority submit to the victim's stop: {self.out['preempt_signal_ms']}")

    def desired(self, node: str, since: int = -1, wait: float = 0.0) -> dict[str, Any]:
        params: dict[str, Any] = {"since": since, "wait": wait}
        reply = self.agent.get(f"/v1/agents/{node}/desired", params=params)
        reply.raise_for_status()
        data: dict[str, Any] = reply.json()
        return data

    def report(self, node: str, events: list[ReplicaEvent]) -> None:
        body = AgentReport(session=self.sessions[node], events=events)
        reply = post(self.agent, f"/v1/agents/{node}/report", body.model_dump(mode="json"))
        if reply.get("refused"):
            raise RuntimeError(f"node {node}: reports refused for {reply['refused']}")

    def replicas_of(self, node: str, job_id: str, action: str) -> tuple[int, list[dict[str, Any]]]:
        """Until the node's desired state has ``job_id``'s replicas with ``action``: the
        version and those replicas."""
        since, deadline = -1, time.monotonic() + PREEMPT_ROUND_TIMEOUT
        while time.monotonic() < deadline:
            state = self.desired(node, since, LONG_POLL_S if since >= 0 else 0.0)
            reps = [r for r in state["replicas"] if r["job"] == job_id and r["action"] == action]
            if reps:
                return int(state["version"]), reps
            since = int(state["version"])
        raise TimeoutError(f"node {node} was not asked to {action} job {job_id}")

    def preempt_once(self, r: int, watcher: httpx.Client) -> float:
        """One round: the victim runs alone on the one free host; the urgent job's POST until
        the victim's agent reads its stop; then both go and the host is empty again."""
        spec = job(f"victim-{r}", VICTIM_TEAM, 8, "low", preemptible=True)
        victim = str(post(self.api, "/v1/jobs", {"spec": spec})["job"]["id"])
        self.follow(victim, lambda state: state not in WAITING, PREEMPT_ROUND_TIMEOUT)
        reply = self.api.get(f"/v1/jobs/{victim}")
        reply.raise_for_status()
        node = reply.json()["placement"][0]["node"]
        _, reps = self.replicas_of(node, victim, "run")
        now = time.time()
        self.report(
            node,
            [
                ReplicaEvent(
                    replica=x["replica"], job=victim, epoch=x["epoch"], kind="started", at=now
                )
                for x in reps
            ],
        )
        self.follow(victim, lambda state: state == "running", PREEMPT_ROUND_TIMEOUT)
        version = int(self.desired(node)["version"])
        seen: dict[str, Any] = {}

        def watch() -> None:
            since, deadline = version, time.monotonic() + PREEMPT_ROUND_TIMEOUT
            while time.monotonic() < deadline:
                params = {"since": since, "wait": LONG_POLL_S}
                try:
                    reply = watcher.get(f"/v1/agents/{node}/desired", params=params)
                    reply.raise_for_status()
                except httpx.HTTPError as e:
                    seen["error"] = repr(e)
                    return
                state = reply.json()
                stops = [
                    x for x in state["replicas"] if x["job"] == victim and x["action"] == "stop"
                ]
                if stops:
                    seen["at"], seen["stops"] = time.perf_counter(), stops
                    return
                since = int(state["version"])

        thread = threading.Thread(target=watch, daemon=True)
        thread.start()
        time.sleep(0.05)  # the long-poll is in place
        started = time.perf_counter()
        urgent = job(f"urgent-{r}", URGENT_TEAM, 8, "high")
        urgent_id = str(post(self.api, "/v1/jobs", {"spec": urgent})["job"]["id"])
        thread.join(PREEMPT_ROUND_TIMEOUT + LONG_POLL_S)
        if "at" not in seen:
            detail = self.api.get(f"/v1/jobs/{urgent_id}").json()
            raise RuntimeError(
                f"round {r}: host {node} was never told to stop victim {victim} "
                f"({seen.get('error', 'timed out')}); urgent job {urgent_id} is "
                f"{detail.get('state')}: {detail.get('reason')} {detail.get('waiting')}"
            )
        took = (float(seen["at"]) - started) * 1000.0
        self.reset(node, victim, urgent_id, seen["stops"])
        return took

    def reset(self, node: str, victim: str, urgent: str, stops: list[dict[str, Any]]) -> None:
        """The victim's agent reports it exited after its checkpoint; both jobs are cancelled
        and whatever they still have on the node is reported exited, until the node is empty."""
        now = time.time()
        self.report(
            node,
            [
                ReplicaEvent(
                    replica=x["replica"],
                    job=victim,
                    epoch=x["epoch"],
                    kind="exited",
                    at=now,
                    exit_code=0,
                    checkpoint_s=0.05,
                )
                for x in stops
            ],
        )
        for job_id in (victim, urgent):
            self.api.post(f"/v1/jobs/{job_id}/cancel").raise_for_status()
        since, deadline = -1, time.monotonic() + PREEMPT_ROUND_TIMEOUT
        while True:
            state = self.desired(node, since, LONG_POLL_S if since >= 0 else 0.0)
            if not state["replicas"]:
                return
            stop = [x for x in state["replicas"] if x["action"] == "stop"]
            if stop:
                self.report(
                    node,
                    [
                        ReplicaEvent(
                            replica=x["replica"],
                            job=x["job"],
                            epoch=x["epoch"],
                            kind="exited",
                            at=time.time(),
                            signal=15,
                        )
                        for x in stop
                    ],
                )
                since = -1
            else:
                since = int(state["version"])
            if time.monotonic() > deadline:
                raise TimeoutError(f"node {node} not empty after round: {state['replicas']}")

    # -- 8. full passes

    @staticmethod
    def full_count(now: dict[str, Any]) -> int | None:
        """Full passes the server has run (None: it does not say)."""
        loop = now.get("loop") or {}
        if "full_passes" in loop:
            return int(loop["full_passes"])
        passes = loop.get("full_pass_ms")
        return int(passes.get("count", 0)) if isinstance(passes, dict) else None

    def full_passes(self) -> None:
        """The server's own figure, once ``--full-passes`` more full passes ran with the queue
        in place; meanwhile each of them is also timed from ``last_cycle_ms`` whenever two
        reads of ``/v1/fleet`` bracket exactly one pass and it was a full one."""
        want = self.args.full_passes
        period = self.args.full_every if self.setup.get("full_every_flag") else SERVER_FULL_S
        deadline = time.monotonic() + want * (period + 2.0) * 3 + 120.0
        self.say(f"waiting for {want} full passes with the queue in place (every {period:g} s)")
        samples: list[float] = []
        prev, last_said = fleet(self.api), time.monotonic()
        while len(samples) < want and time.monotonic() < deadline:
            time.sleep(0.25)
            now = fleet(self.api)
            fulls, was = self.full_count(now), self.full_count(prev)
            one_full = fulls is not None and was is not None and fulls - was == 1
            if one_full and now["cycles"] - prev["cycles"] == 1 and now["last_cycle_ms"]:
                samples.append(float(now["last_cycle_ms"]))
            prev = now
            if time.monotonic() - last_said > 10:
                self.say(f"  {len(samples)} of {want} full passes timed")
                last_said = time.monotonic()
        passes = (prev.get("loop") or {}).get("full_pass_ms")
        count = self.full_count(prev)
        if not isinstance(passes, dict) or count is None:
            self.out["full_pass_ms"] = None
            self.say(
                "note: GET /v1/fleet has no loop.full_pass_ms: the server does not report its "
                "full passes; full_pass_ms is null"
            )
        else:
            ran = count - (self.full_at_queue or 0)
            self.out["full_pass_ms"] = {
                "p50": passes.get("p50"),
                "p99": passes.get("p99"),
                "count": passes.get("count"),
                "passes_before_queue": self.full_at_queue,
                "passes_with_queue": ran,
            }
            self.say(f"full passes (the server's figure): {self.out['full_pass_ms']}")
        self.detail["full_pass_with_queue_ms"] = stats(samples)
        self.say(f"full passes timed with the queue in place: {stats(samples)}")

    # -- the end

    def finish(self) -> None:
        now = fleet(self.api)
        self.setup["final"] = {
            "hosts": now["nodes"],
            "hosts_ready": now["nodes_ready"],
            "gpus_used": now["gpus_used"],
            "running": now["by_state"].get("running", 0),
            "scheduled": now["by_state"].get("scheduled", 0),
            "pending": now["jobs_pending"],
        }
        self.out["rss_mib"] = peak_rss_mib(self.cluster)


def peak_rss_mib(cluster: LocalCluster) -> float | None:
    """The server process's peak resident memory (VmHWM), in MiB."""
    if cluster.server is None:
        return None
    status = Path(f"/proc/{cluster.server.popen.pid}/status")
    with contextlib.suppress(OSError):
        for line in status.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) / 1024.0, 1)
    return None


def run_store(store: str, args: argparse.Namespace, plan: Plan, flag: str | None) -> dict[str, Any]:
    """The whole scenario on a fresh server and store; everything stopped afterwards."""
    started = time.perf_counter()
    with contextlib.ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="boltforge-scale-")))
        db = None
        if store == "postgres":
            note(store, "starting PostgreSQL")
            db = stack.enter_context(postgres())
        server_args = [*SERVER_ARGS, "--teams", str(teams_file(work / "teams.yaml", plan.quotas))]
        if flag:
            server_args += [flag, f"{args.full_every:g}"]
        note(store, f"starting bolt server {' '.join(server_args)}")
        up = time.perf_counter()
        cluster = LocalCluster(work / "cluster", hosts=0, db=db, server_args=server_args)
        stack.enter_context(cluster)
        api = stack.enter_context(
            httpx.Client(
                base_url=cluster.url, timeout=HTTP_TIMEOUT, headers=auth(cluster.admin_token)
            )
        )
        agent = stack.enter_context(
            httpx.Client(
                base_url=cluster.url, timeout=HTTP_TIMEOUT, headers=auth(cluster.agent_token)
            )
        )
        bench = Bench(store, cluster, plan, args, api, agent)
        bench.setup["server_start_s"] = round(time.perf_counter() - up, 1)
        bench.setup["full_every_flag"] = flag
        try:
            out = bench.run()
        except Exception:
            note(store, f"failed; the server's log: {work / 'cluster' / 'server.log'} (tail below)")
            with contextlib.suppress(OSError):
                tail = (work / "cluster" / "server.log").read_text().splitlines()[-40:]
                console.print("\n".join(tail), highlight=False, markup=False)
            raise
        note(store, "stopping the server")
    out["setup"]["total_s"] = round(time.perf_counter() - started, 1)
    return out


# ---- running it ------------------------------------------------------------------------------


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--db", choices=(*STORES, "both"), default="both")
    parser.add_argument(
        "--hosts",
        type=int,
        default=SMALL_HOSTS,
        help="Hosts of the fleet file: h100-16k.yaml up to 2,048, h100-100k.yaml above.",
    )
    parser.add_argument(
        "--fleet",
        type=Path,
        default=None,
        help="Fleet file to take the hosts from (default: by --hosts, as above).",
    )
    parser.add_argument(
        "--pending",
        type=int,
        default=None,
        help="Jobs left waiting (default 5,000; above 2,048 hosts 20,000 per 12,500 hosts).",
    )
    parser.add_argument(
        "--running",
        type=int,
        default=None,
        help="Jobs running, about (default 1,900; above 2,048 hosts 12,000 per 12,500 hosts).",
    )
    parser.add_argument("--submits", type=int, default=1000, help="Timed submissions.")
    parser.add_argument(
        "--free-hosts", type=int, default=8, help="Whole hosts left free for the arrivals."
    )
    parser.add_argument("--arrivals", type=int, default=50, help="Arrival-to-bind samples.")
    parser.add_argument("--preemptions", type=int, default=20, help="Preemption rounds.")
    parser.add_argument(
        "--full-passes", type=int, default=10, help="Full passes to see with the queue in place."
    )
    parser.add_argument(
        "--full-every",
        type=float,
        default=2.0,
        help="Seconds between full passes, if `bolt server` has an option for it.",
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    scale_defaults(args)
    return args


TARGETS = {
    "register_s": ("register all hosts (s)", "<= 10"),
    "submit_placed_per_s": ("submissions placed per s (32 clients)", ">= 200"),
    "report_storm_s": ("start reports absorbed (s)", "<= 5"),
    "arrival_to_bind_ms": ("arrival to bind (ms)", "p50 <= 50"),
    "preempt_signal_ms": ("high-priority submit to victim stop (ms)", "p50 <= 50"),
    "full_pass_ms": ("full pass, the server's figure (ms)", ""),
    "full_pass_with_queue_ms": ("  timed with the queue in place only (ms)", ""),
    "rss_mib": ("server peak RSS (MiB)", ""),
}


def cell(value: Any) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, dict):
        return f"p50 {value.get('p50')}, p99 {value.get('p99')}"
    return str(value)


def show(results: dict[str, dict[str, Any]]) -> None:
    """The figures as a table on stdout, then the scenario reached on each store."""
    table = Table(title="bolt server at fleet scale")
    table.add_column("measurement")
    for store in results:
        table.add_column(store, justify="right")
    table.add_column("target", justify="right")
    for key, (label, target) in TARGETS.items():
        values = (r.get(key, r.get("detail", {}).get(key)) for r in results.values())
        table.add_row(label, *map(cell, values), target)
    Console(width=None if sys.stdout.isatty() else 120).print(table)
    for store, r in results.items():
        if "error" in r:
            print(f"{store}: failed: {r['error']}")
            continue
        s = r["setup"]
        print(
            f"{store}: {s['hosts']} hosts, {s['running']} jobs running after the storm, "
            f"{s['pending']} waiting {s['pending_reasons']}; setup: fill {s['fill_s']} s, "
            f"queue {s['queue_s']} s, total {s['total_s']} s"
        )


def main() -> None:
    args = arguments()
    stores = STORES if args.db == "both" else (args.db,)
    plan = make_plan(args)
    flag = full_every_flag()
    if flag is None:
        console.print(
            "note: `bolt server` has no option for the full-pass period: full passes come at "
            "its default period (and whenever an exit, cancel or report wakes the loop)",
            highlight=False,
        )
    results: dict[str, dict[str, Any]] = {}
    failed = False
    try:
        with interrupts_as_keyboard():
            for store in stores:
                try:
                    results[store] = run_store(store, args, plan, flag)
                except Exception as e:  # reported, and the other store still runs
                    console.print_exception()
                    results[store] = {"error": f"{type(e).__name__}: {e}"}
                    failed = True
    except KeyboardInterrupt:
        console.print("interrupted: servers and PostgreSQL stopped")
        sys.exit(130)
    if args.json:
        print(json.dumps(results[stores[0]] if len(stores) == 1 else results, indent=2))
    else:
        show(results)
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    main()

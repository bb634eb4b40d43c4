"""Soak: thousands of short jobs through a real control plane while its hosts die, hang and
come back and its server is SIGKILLed and restarted.

A ``bolt server`` on SQLite and ``--hosts`` ``bolt agent`` processes standing in for 8-GPU
hosts (``LocalCluster``). ``--jobs`` jobs (2,000 by default) flow through it in batches, at
most ``--window`` unfinished at a time: mostly one-to-four-GPU sleepers, some 8- and 16-GPU
runs of the example trainer (which checkpoints and resumes), a few of them at high priority so
lower-priority work is preempted. Every submit carries an idempotency key and is retried with
the same key while the server is down, so a job the server accepted before it crashed is
found rather than made twice.

While jobs flow, faults come every ``--fault-every`` seconds on average (seeded by
``--seed``), one at a time, each healed before the next: a host killed (agent and replicas,
SIGKILL) and restarted after a while, a host frozen (SIGSTOP) past its lease and thawed, the
server SIGKILLed and restarted on the same store.

At the end the store is read directly: ``lost`` counts accepted jobs missing from it or not
finished by ``--deadline``; every other job must have succeeded, or failed because its restart
budget was spent (``budget_failed``); ``failed_other`` counts anything else. No GPU may ever
have been held by two allocations (``double_allocations`` over the whole replica history).
``recovery_s`` is, per fault, the time from the fault until every job that held GPUs on the
host runs again (or finished), or for a server crash until the restarted server places a job.

``--json`` prints ``{"jobs", "accepted", "completed", "budget_failed", "failed_other",
"lost", "double_allocations", "recovery_s": {"p50", "p99", ...}, "faults", "wall_s", ...}``.
Exits 1 when anything was lost, failed for another reason, or a GPU was held twice.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from sqlalchemy import func, select

from boltforge.client import ApiFailure, Client
from boltforge.control.scheduling.lifecycle import LIVE
from boltforge.control.store.db import Database
from boltforge.control.store.invariants import double_allocations
from boltforge.control.store.models import EventRow, JobRow, ReplicaRow
from boltforge.testing.processes import LocalCluster
from boltforge.wire.jobs import TERMINAL, SubmitRequest

TRAIN = Path(__file__).resolve().parents[1] / "examples" / "train" / "train.py"
HELD = ("waiting", "starting", "running", "stopping")
STARTS = ("running", "resumed")
BUDGET = "restart budget"


@dataclass(frozen=True)
class Options:
    """What one soak run does; see ``main`` for each option's meaning."""

    jobs: int
    hosts: int
    window: int
    fault_every: float
    heartbeat: float
    lease: float
    deadline: float
    seed: int


def server_args(o: Options) -> list[str]:
    """Preemption on demand (so high-priority arrivals bump work at once) and a short lease."""
    preempt = ["--min-runtime", "0", "--cooldown", "0", "--churn", "1"]
    return [*preempt, "--heartbeat", str(o.heartbeat), "--lease", str(o.lease)]


def workload(count: int, seed: int) -> list[dict[str, Any]]:
    """``count`` job specs: 92% sleepers of 0.5-4 s on 1, 2 or 4 GPUs; the rest runs of
    the example trainer on 8 or 16 GPUs, a third of them high priority."""
    rng = random.Random(seed)
    specs = []
    for i in range(count):
        r = rng.random()
        if r < 0.03:
            specs.append(trainer(f"train-{i}", 16, rng.randint(40, 80), "low", "research"))
        elif r < 0.055:
            specs.append(trainer(f"train-{i}", 8, rng.randint(40, 80), "low", "research"))
        elif r < 0.08:
            specs.append(trainer(f"urgent-{i}", 8, rng.randint(20, 40), "high", "nlp"))
        else:
            gpus = rng.choice((1, 1, 1, 1, 2, 4))
            seconds = round(rng.uniform(0.5, 4.0), 2)
            priority = rng.choice(("normal", "low"))
            specs.append(sleeper(f"sleep-{i}", gpus, seconds, priority))
    return specs


def sleeper(name: str, gpus: int, seconds: float, priority: str) -> dict[str, Any]:
    command = [sys.executable, "-S", "-c", f"import time; time.sleep({seconds})"]
    spec = {"name": name, "team": "research", "gpus": gpus, "priority": priority}
    return {**spec, "command": command, "checkpoint": {"grace": "5s"}}


def trainer(name: str, gpus: int, steps: int, priority: str, team: str) -> dict[str, Any]:
    command = [sys.executable, str(TRAIN), "--steps", str(steps), "--step-time", "0.05"]
    command += ["--checkpoint-every", "10", "--print-every", "1000"]
    spec = {"name": name, "team": team, "gpus": gpus, "priority": priority}
    return {**spec, "command": command, "checkpoint": {"grace": "10s"}}


class Store:
    """Read-only queries on the server's SQLite store, safe across server crashes."""

    def __init__(self, data: Path) -> None:
        self.db = Database(f"sqlite:///{data / 'store.db'}")

    def states(self) -> Counter[str]:
        with self.db.session() as s:
            rows = s.execute(select(JobRow.state, func.count()).group_by(JobRow.state))
            return Counter({state: int(n) for state, n in rows})

    def unfinished(self) -> int:
        counts = self.states()
        return sum(counts[state] for state in LIVE)

    def holding(self, node: str) -> list[str]:
        """The jobs with replicas holding GPUs on ``node`` now."""
        q = select(ReplicaRow.job_id).where(ReplicaRow.node == node, ReplicaRow.state.in_(HELD))
        with self.db.session() as s:
            return sorted(set(s.scalars(q)))

    def busy_nodes(self) -> list[str]:
        q = select(ReplicaRow.node).where(ReplicaRow.state.in_(HELD)).distinct()
        with self.db.session() as s:
            return sorted(s.scalars(q))

    def close(self) -> None:
        self.db.close()


@dataclass
class Submitter:
    """Submits ``specs`` in order, keeping at most ``window`` jobs unfinished. A submit that
    got no answer (the server is down) is retried with the same idempotency key until it is
    answered or ``stop`` is set; ``accepted`` maps each spec's index to its job id."""

    cluster: LocalCluster
    store: Store
    specs: list[dict[str, Any]]
    window: int
    seed: int
    stop: threading.Event
    accepted: dict[int, str] = field(default_factory=dict)
    rejected: list[str] = field(default_factory=list)
    retries: int = 0

    def run(self) -> None:
        with Client(self.cluster.url, self.cluster.admin_token, timeout=10.0) as api:
            i = 0
            while i < len(self.specs) and not self.stop.is_set():
                room = self.window - self.store.unfinished()
                if room <= 0:
                    time.sleep(0.2)
                    continue
                for _ in range(min(room, len(self.specs) - i)):
                    self._submit(api, i)
                    i += 1

    def _submit(self, api: Client, i: int) -> None:
        key = f"soak-{self.seed}-{i}"
        while not self.stop.is_set():
            try:
                reply = api.submit(SubmitRequest(spec=self.specs[i]), idempotency_key=key)
            except ApiFailure as e:
                if e.status == 0 or e.status >= 500:
                    self.retries += 1
                    time.sleep(0.2)
                    continue
                self.rejected.append(f"{key}: {e.message}")
                return
            self.accepted[i] = reply.job.id
            return


@dataclass
class Fault:
    """One injected fault: what, where, when, and the jobs holding GPUs there at that time."""

    kind: str
    target: str
    at: float
    affected: list[str]


@dataclass
class Injector:
    """Injects one fault at a time, every ``every`` seconds on average, until ``stop``; each
    fault is healed (host restarted or thawed, server restarted) before the next."""

    cluster: LocalCluster
    store: Store
    every: float
    lease: float
    rng: random.Random
    stop: threading.Event
    faults: list[Fault] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def run(self) -> None:
        while not self.stop.wait(self.rng.uniform(0.5, 1.5) * self.every):
            kind = self.rng.choices(("host_kill", "host_freeze", "server_kill"), (4, 3, 2))[0]
            try:
                getattr(self, kind)()
            except Exception as e:  # a fault that could not be healed is a finding
                self.errors.append(f"{kind}: {e}")

    def _host(self) -> str:
        busy = self.store.busy_nodes() or sorted(self.cluster.agents)
        return self.rng.choice(busy)

    def host_kill(self) -> None:
        """Kill a host outright; it comes back after 1 s to a lease and a bit (so both a
        re-registration without its replicas and an expired lease happen)."""
        host, at = self._host(), time.time()
        self._record("host_kill", host, at)
        self.cluster.kill_host(host)
        time.sleep(self.rng.uniform(1.0, self.lease + 3.0))
        self.cluster.start_agent(host)

    def host_freeze(self) -> None:
        """Hang a host past its lease, then let it resume (it must fence its replicas)."""
        host, at = self._host(), time.time()
        self._record("host_freeze", host, at)
        self.cluster.freeze_host(host)
        time.sleep(self.lease + self.rng.uniform(1.0, 4.0))
        self.cluster.thaw_host(host)

    def server_kill(self) -> None:
        """SIGKILL the server and start it again on the same store and port."""
        self._record("server_kill", "server", time.time())
        self.cluster.kill_server()
        time.sleep(self.rng.uniform(0.0, 2.0))
        self.cluster.restart_server()

    def _record(self, kind: str, target: str, at: float) -> None:
        """Note a fault about to happen at ``at``, with the jobs holding GPUs on ``target``."""
        hit = self.store.holding(target) if kind != "server_kill" else []
        self.faults.append(Fault(kind, target, at, hit))


def recovery(store: Store, fault: Fault) -> float | None:
    """Seconds from ``fault`` until each job it hit runs again or finished (host faults),
    or until the restarted server places a job (server crash); None when that never
    happened. A job whose finish the store learned only after the fault (its agent's report
    was in flight) was not hit."""
    with store.db.session() as s:
        if fault.kind == "server_kill":
            return _first(s, fault.at, ("placed",))
        worst = None
        for job in fault.affected:
            row = s.get(JobRow, job)
            ended = row.finished_at - fault.at if row and row.finished_at else None
            later = [t for t in (_first(s, fault.at, STARTS, job), ended) if t and t > 0]
            if later:
                worst = max(worst or 0.0, min(later))
            elif ended is None:
                return None
        return worst


def _first(s: Any, after: float, kinds: tuple[str, ...], job: str | None = None) -> float | None:
    """Seconds after ``after`` of the first event of ``kinds`` (of ``job``, or of any job)."""
    q = select(func.min(EventRow.at)).where(EventRow.at > after, EventRow.kind.in_(kinds))
    if job is not None:
        q = q.where(EventRow.job_id == job)
    first = s.scalar(q)
    return None if first is None else float(first) - after


def verdict(store: Store, accepted: dict[int, str]) -> dict[str, Any]:
    """What became of every accepted job, and the double-allocation check."""
    out: Counter[str] = Counter()
    examples: list[str] = []
    restarts = preemptions = 0
    with store.db.session() as s:
        for job_id in accepted.values():
            row = s.get(JobRow, job_id)
            if row is None or row.state not in TERMINAL:
                out["lost"] += 1
                examples.append(f"{job_id}: {row.state if row else 'missing'}")
                continue
            restarts, preemptions = restarts + row.restarts, preemptions + row.preemptions
            if row.state == "succeeded":
                out["completed"] += 1
            elif row.state == "failed" and BUDGET in last_message(s, job_id):
                out["budget_failed"] += 1
            else:
                out["failed_other"] += 1
                examples.append(f"{job_id} {row.state}: {last_message(s, job_id)}")
        doubles = double_allocations(s)
    return {
        "completed": out["completed"],
        "budget_failed": out["budget_failed"],
        "failed_other": out["failed_other"],
        "lost": out["lost"],
        "double_allocations": len(doubles),
        "restarts": restarts,
        "preemptions": preemptions,
        "problems": (examples + doubles)[:10],
    }


def last_message(s: Any, job_id: str) -> str:
    q = select(EventRow.message).where(EventRow.job_id == job_id).order_by(EventRow.id.desc())
    return str(s.scalars(q.limit(1)).first() or "")


def fault_line(f: Fault, took: float | None, start: float) -> dict[str, Any]:
    """One fault for the JSON report: seconds into the run, jobs hit, seconds to recover."""
    recovered = None if took is None else round(took, 2)
    return {
        "at_s": round(f.at - start, 1),
        "kind": f.kind,
        "target": f.target,
        "jobs_hit": len(f.affected),
        "recovery_s": recovered,
    }


def stats(samples: list[float]) -> dict[str, Any]:
    if not samples:
        return {"p50": None, "p99": None, "max": None, "n": 0}
    return {
        "p50": round(statistics.median(samples), 2),
        "p99": round(float(np.percentile(samples, 99)), 2),
        "max": round(max(samples), 2),
        "n": len(samples),
    }


def soak(o: Options, data: Path, console: Console) -> dict[str, Any]:
    """Run the whole soak in ``data``; the figures ``--json`` prints."""
    specs = workload(o.jobs, o.seed)
    started, started_at = time.monotonic(), time.time()
    cluster = LocalCluster(data, hosts=o.hosts, server_args=server_args(o)).start()
    store = Store(data)
    stop_submit, stop_faults = threading.Event(), threading.Event()
    sub = Submitter(cluster, store, specs, o.window, o.seed, stop_submit)
    inj = Injector(cluster, store, o.fault_every, o.lease, random.Random(o.seed), stop_faults)
    submitting = threading.Thread(target=sub.run, daemon=True)
    injecting = threading.Thread(target=inj.run, daemon=True)
    try:
        submitting.start()
        injecting.start()
        watch(o, sub, submitting, inj, store, started, console)
        stop_submit.set()
        stop_faults.set()
        injecting.join()
        submitting.join(30)
        wall = time.monotonic() - started
        out = verdict(store, sub.accepted)
        timed = [(f, recovery(store, f)) for f in inj.faults]
    finally:
        store.close()
        cluster.stop()
    kinds = Counter(f.kind for f in inj.faults)
    return {
        "jobs": o.jobs,
        "accepted": len(sub.accepted),
        **out,
        "recovery_s": stats([r for _, r in timed if r is not None]),
        "faults": {"total": len(inj.faults), **{k: kinds[k] for k in sorted(kinds)}},
        "fault_log": [fault_line(f, r, started_at) for f, r in timed],
        "fault_errors": inj.errors,
        "rejected": len(sub.rejected),
        "submit_retries": sub.retries,
        "hosts": o.hosts,
        "seed": o.seed,
        "wall_s": round(wall, 1),
    }


def watch(
    o: Options,
    sub: Submitter,
    submitting: threading.Thread,
    inj: Injector,
    store: Store,
    started: float,
    console: Console,
) -> None:
    """Show progress until every job was accepted and finished, or the deadline passed
    (faults go on until then)."""
    columns = (
        TextColumn("{task.description:>9}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[note]}"),
    )
    with Progress(*columns, console=console, transient=False) as bars:
        accepted = bars.add_task("accepted", total=o.jobs, note="")
        finished = bars.add_task("finished", total=o.jobs, note="")
        while time.monotonic() - started < o.deadline:
            done = sum(store.states()[state] for state in TERMINAL)
            last = inj.faults[-1] if inj.faults else None
            note = f"{len(inj.faults)} faults" + (
                f", last {last.kind} {last.target}" if last else ""
            )
            bars.update(accepted, completed=len(sub.accepted), note=f"{sub.retries} retries")
            bars.update(finished, completed=done, note=note)
            if not submitting.is_alive() and done >= len(sub.accepted):
                return
            time.sleep(0.5)


def table(out: dict[str, Any]) -> str:
    r = out["recovery_s"]
    faults = ", ".join(f"{k} {v}" for k, v in out["faults"].items() if k != "total")
    lines = [
        f"jobs               {out['jobs']} ({out['accepted']} accepted, {out['hosts']} hosts)",
        f"completed          {out['completed']}",
        f"budget failed      {out['budget_failed']}",
        f"failed otherwise   {out['failed_other']}",
        f"lost               {out['lost']}",
        f"double allocations {out['double_allocations']}",
        f"faults             {out['faults']['total']} ({faults})",
        f"recovery           p50 {r['p50']} s, p99 {r['p99']} s, max {r['max']} s "
        f"over {r['n']} faults",
        f"restarts           {out['restarts']}, preemptions {out['preemptions']}",
        f"submit retries     {out['submit_retries']}",
        f"wall               {out['wall_s']} s",
    ]
    lines += [f"problem            {p}" for p in out["problems"] + out["fault_errors"]]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2000, help="jobs to submit")
    parser.add_argument("--hosts", type=int, default=8, help="stand-in 8-GPU hosts")
    parser.add_argument("--window", type=int, default=96, help="most unfinished jobs at once")
    parser.add_argument("--fault-every", type=float, default=10.0, help="mean seconds between")
    parser.add_argument("--heartbeat", type=float, default=1.0, help="agent heartbeat, s")
    parser.add_argument("--lease", type=float, default=10.0, help="node lease, s")
    parser.add_argument("--deadline", type=float, default=900.0, help="give up after, s")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--keep", type=Path, default=None, help="keep the store and logs here")
    parser.add_argument("--json", action="store_true")
    a = parser.parse_args()
    o = Options(a.jobs, a.hosts, a.window, a.fault_every, a.heartbeat, a.lease, a.deadline, a.seed)
    console = Console(stderr=True)
    if a.keep is not None:
        out = soak(o, a.keep, console)
    else:
        with tempfile.TemporaryDirectory(prefix="boltforge-soak-") as tmp:
            out = soak(o, Path(tmp), console)
    print(json.dumps(out, indent=2) if a.json else table(out))
    bad = out["lost"] or out["double_allocations"] or out["failed_other"]
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()

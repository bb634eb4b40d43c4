"""Control-plane latency and throughput with a real server and real agents on loopback.

Three measurements, each on a fresh local cluster (``bolt server`` on SQLite, or
``--db URL``, plus four ``bolt agent`` processes standing in for 8-GPU hosts):

- **submit_per_s**: one-GPU jobs posted over ``--clients`` concurrent keep-alive
  connections for ``--seconds``; accepted submissions per second. The load comes from
  ``wrk`` (Debian's package) when installed, so the figure is the server's and not a Python
  client's; otherwise ``--submits`` jobs are posted by Python threads (``--client python``).
- **preempt_signal_ms**: a low-priority 32-GPU job runs (its processes have installed their
  SIGTERM handlers); a high-priority 16-GPU job is submitted; the time until the first victim
  process receives SIGTERM (the process writes the time it got the signal). Repeated
  ``--preemptions`` times.
- **start_ms**: on an idle fleet, time from submit to the job's process running (the process
  writes the time it started). Repeated ``--starts`` times.

Both sides read the same machine clock. ``--json`` prints
``{"submit_per_s": ..., "preempt_signal_ms": {"p50": ..., "p99": ...}, "start_ms": {...}}``.
Figures depend on the machine and what else runs on it; nothing here asserts them.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from boltforge.client import Client
from boltforge.testing.processes import LocalCluster
from boltforge.wire.jobs import SubmitRequest

# Preempt on demand: every round bumps the same 32 GPUs, far beyond a real churn budget.
SERVER_ARGS = ["--min-runtime", "0", "--cooldown", "0", "--churn", "1000"]
VICTIM = (
    "import signal, sys, time\n"
    "out = sys.argv[1]\n"
    "def bumped(*_):\n"
    "    open(out + '.term', 'a').write(repr(time.time()) + '\\n')\n"
    "    sys.exit(0)\n"
    "signal.signal(signal.SIGTERM, bumped)\n"
    "open(out + '.ready', 'a').write('ok\\n')\n"
    "while True:\n"
    "    time.sleep(3600)\n"
)


def spec(name: str, gpus: int, priority: str, command: list[str], team: str) -> dict[str, Any]:
    return {"name": name, "team": team, "priority": priority, "gpus": gpus, "command": command}


def wait_until(check: Any, timeout: float = 60.0, step: float = 0.005) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not met in time")
        time.sleep(step)


def has_lines(path: Path, count: int = 1) -> bool:
    return path.exists() and len(path.read_text().split()) >= count


def reaches(c: Client, job_id: str, state: str) -> bool:
    return c.job(job_id).state == state


WRK_SCRIPT = """wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer %s"
wrk.body = '%s'
"""


def submits_wrk(cluster: LocalCluster, seconds: float, clients: int, work: Path) -> float:
    """Accepted submissions per second under ``wrk`` with ``clients`` connections."""
    job = spec("tiny", 1, "low", ["sleep", "600"], "bench")
    script = work / "submit.lua"
    script.write_text(WRK_SCRIPT % (cluster.admin_token, json.dumps({"spec": job})))
    cmd = [
        "wrk",
        "-t1",
        f"-c{clients}",
        f"-d{seconds:.0f}s",
        "-s",
        str(script),
        f"{cluster.url}/v1/jobs",
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    if "Non-2xx" in out:
        raise RuntimeError(f"some submissions were refused:\n{out}")
    return float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]


def submits(cluster: LocalCluster, total: int, clients: int) -> float:
    """Accepted submissions per second with ``clients`` concurrent Python clients."""
    each = total // clients
    job = spec("tiny", 1, "low", ["sleep", "600"], "bench")
    errors: list[str] = []

    def worker(k: int) -> None:
        with Client(cluster.url, cluster.admin_token) as c:
            for i in range(each):
                try:
                    c.submit(SubmitRequest(spec={**job, "name": f"tiny-{k}-{i}"}))
                except Exception as e:  # counted, not hidden
                    errors.append(str(e))

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(clients)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    if errors:
        raise RuntimeError(f"{len(errors)} submissions failed, e.g. {errors[0]}")
    return each * clients / wall


def preemptions(cluster: LocalCluster, rounds: int, work: Path) -> list[float]:
    """Milliseconds from a high-priority submit to SIGTERM at the victim, per round."""
    out = []
    with Client(cluster.url, cluster.admin_token) as c:
        for r in range(rounds):
            mark = work / f"victim-{r}"
            low = spec("victim", 32, "low", [sys.executable, "-c", VICTIM, str(mark)], "research")
            low_id = c.submit(SubmitRequest(spec=low)).job.id
            wait_until(partial(has_lines, Path(f"{mark}.ready"), 4))
            high = spec("urgent", 16, "high", ["true"], "nlp")
            sent = time.time()
            high_id = c.submit(SubmitRequest(spec=high)).job.id
            term = Path(f"{mark}.term")
            wait_until(partial(has_lines, term))
            first = min(float(x) for x in term.read_text().split())
            out.append((first - sent) * 1000.0)
            wait_until(partial(reaches, c, high_id, "succeeded"))
            c.cancel(low_id)
            wait_until(lambda: c.fleet().gpus_used == 0)
    return out


def starts(cluster: LocalCluster, rounds: int, work: Path) -> list[float]:
    """Milliseconds from submit to the job's process running on an idle fleet."""
    out = []
    with Client(cluster.url, cluster.admin_token) as c:
        for r in range(rounds):
            mark = work / f"start-{r}"
            command = ["sh", "-c", f"date +%s.%N > {mark}"]
            sent = time.time()
            job_id = c.submit(
                SubmitRequest(spec=spec("hello", 1, "normal", command, "bench"))
            ).job.id
            wait_until(partial(has_lines, mark))
            out.append((float(mark.read_text()) - sent) * 1000.0)
            wait_until(partial(reaches, c, job_id, "succeeded"))
    return out


def stats(samples: list[float]) -> dict[str, float]:
    return {
        "p50": round(statistics.median(samples), 1),
        "p99": round(float(np.percentile(samples, 99)), 1),
        "n": len(samples),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--submits", type=int, default=2000)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--client", choices=("wrk", "python"), default=None)
    parser.add_argument("--preemptions", type=int, default=20)
    parser.add_argument("--starts", type=int, default=30)
    parser.add_argument("--db", default=None, help="Store URL (default: SQLite).")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    client = args.client or ("wrk" if shutil.which("wrk") else "python")
    out: dict[str, Any] = {"store": "postgresql" if args.db else "sqlite", "clients": args.clients}
    with tempfile.TemporaryDirectory(prefix="boltforge-bench-") as tmp:
        work = Path(tmp)
        for phase in ("submit", "preempt", "start"):
            data = work / phase
            with LocalCluster(data, db=args.db, server_args=SERVER_ARGS) as cluster:
                if phase == "submit":
                    out["submit_client"] = client
                    rate = (
                        submits_wrk(cluster, args.seconds, args.clients, data)
                        if client == "wrk"
                        else submits(cluster, args.submits, args.clients)
                    )
                    out["submit_per_s"] = round(rate, 1)
                elif phase == "preempt":
                    out["preempt_signal_ms"] = stats(preemptions(cluster, args.preemptions, data))
                else:
                    out["start_ms"] = stats(starts(cluster, args.starts, data))
    if args.json:
        json.dump(out, sys.stdout, indent=2)
        print()
        return
    print(f"store {out['store']}")
    print(
        f"submissions       {out['submit_per_s']:.0f}/s over {args.clients} connections "
        f"({client})   (target >= 500/s on SQLite)"
    )
    p = out["preempt_signal_ms"]
    print(f"submit -> SIGTERM p50 {p['p50']:.1f} ms, p99 {p['p99']:.1f} ms   (target p50 <= 50)")
    s = out["start_ms"]
    print(f"submit -> start   p50 {s['p50']:.1f} ms, p99 {s['p99']:.1f} ms")


if __name__ == "__main__":
    main()

"""Failover of the control plane: ``--replicas`` ``bolt server`` replicas on one real
PostgreSQL, four ``bolt agent`` processes standing in for 8-GPU hosts (given every
replica's address), and jobs flowing the whole time; the leader is failed ``--failovers``
times, by turns SIGKILLed and frozen (SIGSTOP until another replica leads, then SIGCONT:
it must stop on its own). A failed replica is started again as a follower.

- **failover_s**: from the leader's failure until another replica says it leads (its
  ``/healthz``), having recovered the store and acting.
- **lost**: jobs whose submission was accepted and that the control plane no longer has,
  or that it failed (each was submitted with an idempotency key and retried until
  accepted).
- **double_allocations**: pairs of job processes that ran on the same GPU of the same host
  at the same time, from the processes' own start and end records.
- **duplicate_starts**: replicas (a job's replica in one epoch) whose process started more
  than once.
- **orphans**: job processes that started and never ended: still running when the run
  ends, or killed without the grace to say so.
- **unfinished**: accepted jobs not finished when the run ends (not an error by itself).

``--json`` prints the figures as one object. Figures depend on the machine; nothing here
asserts them.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any, get_args

import numpy as np

from boltforge.client import ApiFailure, Client
from boltforge.testing.postgres import postgres
from boltforge.testing.processes import LocalCluster, wait_until
from boltforge.testing.replicas import ADMIN_TOKEN, EXIT_DEPOSED, ReplicaSet
from boltforge.wire.jobs import TERMINAL, JobState, SubmitRequest

HOSTS = 4
EVERY_STATE = ",".join(get_args(JobState))
WORKLOAD = """
import os, signal, sys, time
record = sys.argv[1]
def say(what):
    line = f"{what} {os.environ['BOLT_REPLICA']} {os.environ['BOLT_NODE']} "
    line += f"{os.environ.get('CUDA_VISIBLE_DEVICES', '')} {time.time():.6f}\\n"
    with open(record, "a") as f:
        f.write(line)
signal.signal(signal.SIGTERM, lambda *_: (say("end"), sys.exit(143)))
say("start")
time.sleep(float(sys.argv[2]))
say("end")
"""


class Flow:
    """Jobs submitted one after another, each sent again with its idempotency key until the
    control plane accepts it (a new key only once the last was accepted); answers of 500
    counted. ``gpus(n)``: the n-th job's GPUs; ``seconds``: how long each runs; keys are
    ``{prefix}-{n}``. ``states``: the jobs' states once drained, by id (the caller's)."""

    def __init__(
        self,
        servers: str,
        workload: Path,
        record: Path,
        every_s: float,
        *,
        token: str = ADMIN_TOKEN,
        gpus: Callable[[int], int] = lambda n: 16 if n % 4 == 0 else 8,  # a two-host gang
        seconds: float = 3,
        prefix: str = "flow",
    ) -> None:
        self.servers, self.workload, self.record = servers, workload, record
        self.every_s, self.token, self.gpus = every_s, token, gpus
        self.seconds, self.prefix = seconds, prefix
        self.accepted: dict[str, str] = {}  # idempotency key -> job id
        self.states: dict[str, str] = {}
        self.http_500 = 0
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with Client(self.servers, self.token, timeout=10.0) as client:
            for n in itertools.count():
                if self.stopped.is_set():
                    return
                self._submit(client, n)
                time.sleep(self.every_s)

    def _submit(self, client: Client, n: int) -> None:
        spec = {
            "name": f"flow-{n}",
            "team": "research",
            "gpus": self.gpus(n),
            "command": [sys.executable, str(self.workload), str(self.record), f"{self.seconds:g}"],
        }
        key = f"{self.prefix}-{n}"
        while not self.stopped.is_set():
            try:
                reply = client.submit(SubmitRequest.model_validate({"spec": spec}), key)
            except ApiFailure as e:
                self.http_500 += e.status == 500
                time.sleep(0.3)
                continue
            self.accepted[key] = reply.job.id
            return


def overlaps(record: Path) -> tuple[int, int, int]:
    """(double allocations, duplicate starts, orphans) from the processes' records; an
    orphan started and never ended (it still runs, or was killed without its grace)."""
    starts: Counter[str] = Counter()
    spans: dict[str, list[float]] = {}
    where: dict[str, tuple[str, list[str]]] = {}
    for line in record.read_text().splitlines() if record.exists() else []:
        what, replica, node, gpus, at = [*line.split(" "), "", "", "", "", ""][:5]
        if what == "start":
            starts[replica] += 1
            spans[replica] = [float(at), float("inf")]
            where[replica] = (node, gpus.split(","))
        elif what == "end" and replica in spans:
            spans[replica][1] = float(at)
    by_gpu: dict[tuple[str, str], list[tuple[float, float]]] = defaultdict(list)
    for replica, (node, indices) in where.items():
        for gpu in indices:
            by_gpu[(node, gpu)].append((spans[replica][0], spans[replica][1]))
    double = 0
    for runs in by_gpu.values():
        runs.sort()
        for (_, end), (start, _) in itertools.pairwise(runs):
            double += start < end
    orphans = sum(1 for _, end in spans.values() if end == float("inf"))
    return double, sum(1 for c in starts.values() if c > 1), orphans


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--failovers", type=int, default=8)
    parser.add_argument("--settle", type=float, default=4.0, help="seconds between failures")
    parser.add_argument("--every", type=float, default=0.4, help="seconds between submissions")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    data = Path(tempfile.mkdtemp(prefix="bench-failover-"))
    with postgres() as url:
        result = run(url, data, args)
    if args.json:
        print(json.dumps(result))
    else:
        for k, v in result.items():
            print(f"{k:>20}: {v}")


def run(url: str, data: Path, args: argparse.Namespace) -> dict[str, Any]:
    group = ReplicaSet(url, data, count=args.replicas)
    hosts = LocalCluster(data / "hosts", hosts=0, servers=group.servers)
    hosts.data.mkdir(parents=True)
    workload, record = data / "work.py", data / "record.log"
    workload.write_text(WORKLOAD)
    try:
        leader = group.start_all()
        for i in range(HOSTS):
            hosts.start_agent(f"host-{i}")
        wait_until(lambda: ready_nodes(group.servers) == HOSTS, 60, "the hosts")
        flow = Flow(group.servers, workload, record, args.every)
        flow.thread.start()
        times = []
        for round_ in range(args.failovers):
            time.sleep(args.settle)
            progress(f"failover {round_ + 1}/{args.failovers}: {leader.name} at {time.time():.3f}")
            times.append(group.failover(leader, freeze=round_ % 2 == 1))
            restart(group, leader)
            leader = group.leader()
        time.sleep(args.settle)
        flow.stopped.set()
        flow.thread.join(30)
        return figures(group.servers, flow, record, times)
    finally:
        hosts.stop()
        group.stop()


def restart(group: ReplicaSet, failed: Any) -> None:
    """Wait for a thawed replica to stop on its own, then start it again as a follower."""
    assert failed.proc is not None
    failed.proc.popen.wait(60)
    code = failed.proc.popen.returncode
    if code not in (EXIT_DEPOSED, -9):
        raise RuntimeError(f"replica {failed.name} exited {code}; see its log")
    group.start(failed)


def ready_nodes(servers: str) -> int:
    with Client(servers, ADMIN_TOKEN) as client:
        return sum(n.state == "ready" for n in client.nodes().nodes)


def figures(
    servers: str, flow: Flow, record: Path, times: list[float], drain_s: float = 120.0
) -> dict[str, Any]:
    ids = set(flow.accepted.values())
    deadline = time.monotonic() + drain_s
    with Client(servers, ADMIN_TOKEN) as client:
        while True:
            listed = {j.id: j.state for j in client.jobs(state=EVERY_STATE).jobs}
            if all(listed.get(j) in TERMINAL for j in ids) or time.monotonic() > deadline:
                break
            time.sleep(1.0)
    double, duplicates, orphans = overlaps(record)
    return {
        "failovers": len(times),
        "failover_s": {
            "p50": round(float(np.percentile(times, 50)), 2),
            "p99": round(float(np.percentile(times, 99)), 2),
            "max": round(max(times), 2),
        },
        "accepted": len(ids),
        "lost": sum(1 for j in ids if j not in listed or listed[j] == "failed"),
        "unfinished": sum(1 for j in ids if listed.get(j) not in TERMINAL),
        "double_allocations": double,
        "duplicate_starts": duplicates,
        "orphans": orphans,
    }


def progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()

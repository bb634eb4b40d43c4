"""Full-cycle and one-arrival times on the 16,384-GPU fleet with 5,000 pending and 1,500 running.

Job sizes and runtimes are drawn from the ITP trace (``../shared/data/traces/itp/cluster04.csv``
when present, else a fixed heavy-tailed mix with the same shape). 1,500 running jobs are placed
by the engine itself on the empty fleet (so the fleet is busy the way a scheduler leaves it),
then 5,000 jobs wait. A full pass (``run_cycle``) and an incremental pass for one arrival
(``schedule_arrival``) are each timed ``--repeat`` times on the same snapshot, with the garbage
collector set as ``bolt server`` and ``bolt simulate`` set it (``boltforge.gctune``;
``--default-gc`` leaves CPython's defaults). ``--json`` prints
``{"full_cycle_ms": {"median": ..., "p99": ...}, "incremental_ms": {"median": ..., "p99": ...}}``.
"""

from __future__ import annotations

import argparse
import csv
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from boltforge import gctune
from boltforge.core.cycle import Snapshot, run_cycle, schedule_arrival
from boltforge.core.model.gang import Gang
from boltforge.core.model.state import Allocation, FleetState
from boltforge.core.model.workload import Job, Running
from boltforge.core.placement.modes import place_now
from boltforge.core.policy import named
from boltforge.spec.fleet import load_fleet
from boltforge.testing.builders import make_gang

ROOT = Path(__file__).resolve().parents[1]
FLEET = ROOT / "examples" / "fleets" / "h100-16k.yaml"
TRACE = ROOT.parent / "shared" / "data" / "traces" / "itp" / "cluster04.csv"
FALLBACK = (
    [(1, 3600.0)] * 75
    + [(8, 7200.0)] * 17
    + [(4, 3600.0)] * 3
    + [(32, 86400.0)] * 2
    + [(16, 43200.0)] * 2
    + [(64, 172800.0)]
)


def trace_jobs() -> list[tuple[int, float]]:
    """(GPUs, runtime seconds) pairs from the ITP trace, or the fallback mix."""
    if not TRACE.exists():
        return FALLBACK
    with TRACE.open() as f:
        return [(int(r["num_gpu"]), float(r["duration"])) for r in csv.DictReader(f)]


def make_job(i: int, gpus: int, runtime: float, submit: float, teams: int) -> Job:
    gang = make_gang(f"j{i}", gpus=gpus, per_node=min(8, gpus))
    team = f"team{i % teams}"
    gang = Gang(gang.name, gang.roles, gang.topology, team, 3 if i % 5 else 2)
    return Job(f"j{i}", gang, team, submit, time_limit=runtime * 1.5)


def build(seed: int, running_n: int, pending_n: int) -> Snapshot:
    rng = random.Random(seed)
    draws = trace_jobs()
    tree = load_fleet(FLEET)
    state = FleetState(tree)
    running: list[Running] = []
    i = 0
    while len(running) < running_n:
        gpus, runtime = rng.choice(draws)
        job = make_job(i, gpus, runtime, -rng.uniform(0, 86400), 40)
        i += 1
        decision = place_now(state, job.gang)
        if decision.placement is None:
            continue
        started = job.submit_time + rng.uniform(0, 600)
        end = started + runtime
        state.allocate(Allocation(job.id, decision.placement.grants, end, job.priority))
        running.append(Running(job, state.allocations[job.id], started))
    pending = [make_job(i + k, *rng.choice(draws), float(k), 40) for k in range(pending_n)]
    return Snapshot(state, tuple(pending), tuple(running), now=float(pending_n))


def timed(fn: object, repeat: int) -> list[float]:
    assert callable(fn)
    out = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        out.append((time.perf_counter() - start) * 1000)
    return out


def stats(samples: list[float]) -> dict[str, float]:
    return {
        "median": round(statistics.median(samples), 2),
        "p99": round(float(np.percentile(samples, 99)), 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--pending", type=int, default=5000)
    parser.add_argument("--running", type=int, default=1500)
    parser.add_argument("--policy", default="default")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--default-gc", action="store_true", help="CPython's GC thresholds")
    args = parser.parse_args()
    if not args.default_gc:
        gctune.tune()
    snap = build(1, args.running, args.pending)
    policy = named(args.policy)
    used = 1 - snap.state.free_gpus / snap.state.tree.total_gpus
    result = run_cycle(snap, policy)
    full = timed(lambda: run_cycle(snap, policy), args.repeat)
    arrival = make_job(10**6, 8, 3600.0, snap.now, 40)
    inc = timed(
        lambda: schedule_arrival(snap, arrival, policy, result.reservations),
        max(args.repeat * 4, 20),
    )
    out: dict[str, Any] = {
        "fleet": "h100-16k",
        "policy": policy.name,
        "running": len(snap.running),
        "pending": len(snap.pending),
        "occupancy": round(used, 3),
        "binds": len(result.binds),
        "reservations": len(result.reservations),
        "gc": "default" if args.default_gc else "gctune",
        "full_cycle_ms": stats(full),
        "incremental_ms": stats(inc),
    }
    if args.json:
        json.dump(out, sys.stdout, indent=2)
        print()
        return
    print(
        f"{out['running']} running ({used:.0%} of GPUs), {out['pending']} pending, "
        f"policy {policy.name}: {out['binds']} binds, {out['reservations']} reservations"
    )
    print(
        f"full cycle   median {out['full_cycle_ms']['median']:.1f} ms, "
        f"p99 {out['full_cycle_ms']['p99']:.1f} ms"
    )
    print(
        f"one arrival  median {out['incremental_ms']['median']:.1f} ms, "
        f"p99 {out['incremental_ms']['p99']:.1f} ms"
    )


if __name__ == "__main__":
    main()

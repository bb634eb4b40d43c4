"""Full-cycle and one-arrival times on the 16,384-GPU fleet with 5,000 pending and 1,500 running.

Job sizes and runtimes are drawn from the ITP trace (``../shared/data/traces/itp/cluster04.csv``
when present, else a fixed heavy-tailed mix with the same shape). 1,500 running jobs are placed
by the engine itself on the empty fleet (so the fleet is busy the way a scheduler leaves it),
then 5,000 jobs wait. A full pass (``run_cycle``) and an incremental pass for one arrival
(``schedule_arrival``) are each timed ``--repeat`` times on the same snapshot, with the garbage
collector set as ``bolt server`` and ``bolt simulate`` set it (``boltforge.gctune``;
``--default-gc`` leaves CPython's defaults).

A preemption pass is timed on the fleet made full: every host holds a whole-host job of class 3
that may not be preempted, but one, which a preemptible job of class 4 holds; an 8-GPU arrival
of class 1 finds room only by evicting it (``schedule_arrival``, as the server's
pass for an arrival). ``--fleet`` names another fleet (``examples/fleets/h100-100k.yaml``
is the 100,000-GPU fleet). ``--json`` prints
``{"full_cycle_ms": {"median": ..., "p99": ...}, "incremental_ms": {...}, "preempt_ms": {...}}``.
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
from boltforge.core.model.state import Allocation, FleetState, Grant
from boltforge.core.model.topology import TopologyTree
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


def build(seed: int, running_n: int, pending_n: int, fleet: Path = FLEET) -> Snapshot:
    rng = random.Random(seed)
    draws = trace_jobs()
    tree = load_fleet(fleet)
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


def made_full(tree: TopologyTree, now: float) -> tuple[Snapshot, Job]:
    """``tree``'s fleet full (``preempt_ms`` in the module's docstring), nothing waiting, and
    the arrival that must preempt."""
    state, running = FleetState(tree), []
    hosts = [h for h, gpus in enumerate(tree.host_gpus.tolist()) if gpus]
    for n, host in enumerate(hosts):
        victim = n == len(hosts) - 1
        gpus = int(tree.host_gpus[host])
        gang = make_gang(f"fill{n}", gpus=gpus, per_node=gpus)
        gang = Gang(gang.name, gang.roles, gang.topology, "fill", 4 if victim else 3)
        job = Job(gang.name, gang, "fill", now - 7200.0, 86400.0, preemptible=victim)
        grant = Grant(gang.roles[0].name, 0, host, tuple(range(gpus)))
        state.allocate(Allocation(job.id, (grant,), now + 86400.0, job.priority))
        running.append(Running(job, state.allocations[job.id], now - 7200.0, now - 600.0))
    urgent = make_gang("urgent", gpus=8, per_node=8)
    urgent = Gang(urgent.name, urgent.roles, urgent.topology, "prod", 1)
    arrival = Job("urgent", urgent, "prod", now, 3600.0)
    return Snapshot(state, (), tuple(running), now=now), arrival


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
    parser.add_argument("--fleet", type=Path, default=FLEET, help="Fleet spec (YAML).")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--default-gc", action="store_true", help="CPython's GC thresholds")
    args = parser.parse_args()
    if not args.default_gc:
        gctune.tune()
    snap = build(1, args.running, args.pending, args.fleet)
    policy = named(args.policy)
    used = 1 - snap.state.free_gpus / snap.state.tree.total_gpus
    result = run_cycle(snap, policy)
    full = timed(lambda: run_cycle(snap, policy), args.repeat)
    arrival = make_job(10**6, 8, 3600.0, snap.now, 40)
    inc = timed(
        lambda: schedule_arrival(snap, arrival, policy, result.reservations),
        max(args.repeat * 4, 20),
    )
    packed, urgent = made_full(snap.state.tree, snap.now)
    preempted = schedule_arrival(packed, urgent, policy, ())
    if [e.job for e in preempted.evictions] != [packed.running[-1].job.id]:
        raise SystemExit(f"the urgent arrival did not evict the one preemptible job: {preempted}")
    bump = timed(lambda: schedule_arrival(packed, urgent, policy, ()), max(args.repeat * 4, 20))
    out: dict[str, Any] = {
        "fleet": args.fleet.stem,
        "policy": policy.name,
        "running": len(snap.running),
        "pending": len(snap.pending),
        "occupancy": round(used, 3),
        "binds": len(result.binds),
        "reservations": len(result.reservations),
        "gc": "default" if args.default_gc else "gctune",
        "full_cycle_ms": stats(full),
        "incremental_ms": stats(inc),
        "preempt_running": len(packed.running),
        "preempt_ms": stats(bump),
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
    print(
        f"preemption   median {out['preempt_ms']['median']:.1f} ms, "
        f"p99 {out['preempt_ms']['p99']:.1f} ms ({out['preempt_running']} running, fleet full)"
    )


if __name__ == "__main__":
    main()

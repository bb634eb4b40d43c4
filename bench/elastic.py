"""What elastic jobs buy: one trace and fleet replayed with 0%, 30% and 100% of the multi-replica
jobs elastic, under one policy.

A multi-replica job spans more than one host; made elastic (``boltforge.sim.jobs.with_elastic``)
it may run at half to twice its replicas: the cycle may start it smaller, shrink it instead of
preempting it, and grow it into capacity nobody waiting can use. Each share is one in-process
replay of the same trace on the same fleet with the same seed (failures included), so the
runs differ only in which jobs are elastic. For each it prints mean, median and p99 JCT (all
jobs, and the multi-replica ones), mean and p99 queueing delay, productive and allocated
utilization, the elastic starts, grows and shrinks, and the GPU-hours lost and slowed.
Everything printed is measured by the replays; nothing is asserted. ``--limit N`` replays only
the first N jobs, to keep the run short; ``--json`` prints one object instead of the table.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from boltforge.core.policy import named
from boltforge.sim.engine import SimConfig, simulate
from boltforge.sim.jobs import with_elastic
from boltforge.sim.metrics import compute
from boltforge.sim.records import SimResult, TraceJob
from boltforge.sim.traces import load_trace, offered_load
from boltforge.spec.fleet import load_fleet

ROOT = Path(__file__).resolve().parents[1]
FLEET = ROOT / "examples" / "fleets" / "eval" / "itp-03.yaml"
TRACE = ROOT.parent / "shared" / "data" / "traces" / "itp" / "cluster03.csv"
SHARES = (0.0, 0.3, 1.0)

# (key, header, format) of each column of the printed table, in order.
COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("elastic_share", "elastic", "{:.0%}"),
    ("elastic_jobs", "jobs", "{:,}"),
    ("mean_jct_h", "JCT h", "{:.2f}"),
    ("median_jct_h", "p50 h", "{:.2f}"),
    ("p99_jct_h", "p99 h", "{:.2f}"),
    ("multi_mean_jct_h", "multi JCT h", "{:.2f}"),
    ("mean_queue_h", "wait h", "{:.2f}"),
    ("p99_queue_h", "p99 wait h", "{:.2f}"),
    ("util_productive_pct", "prod %", "{:.1f}"),
    ("util_allocated_pct", "alloc %", "{:.1f}"),
    ("elastic_starts", "small starts", "{:,}"),
    ("grows", "grows", "{:,}"),
    ("shrinks", "shrinks", "{:,}"),
    ("gpu_hours_lost", "lost GPU-h", "{:,.0f}"),
    ("gpu_hours_slowed", "slowed GPU-h", "{:,.0f}"),
    ("wall_s", "wall s", "{:.0f}"),
)


def replay(
    trace: list[TraceJob], fleet: Path, share: float, policy: str, seed: int
) -> dict[str, Any]:
    """Replay ``trace`` on ``fleet`` with ``share`` of its multi-replica jobs elastic; the
    figures of one table row (times in hours, utilization in percent)."""
    tree = load_fleet(fleet)
    host_gpus = int(tree.host_gpus.max(initial=0))
    jobs = with_elastic(trace, share, seed, host_gpus, tree.total_gpus)
    start = time.perf_counter()
    result = simulate(tree, jobs, SimConfig(named(policy), seed=seed))
    wall = time.perf_counter() - start
    m = compute(result)
    multi = {t.id for t in trace if t.gpus > host_gpus}
    return {
        "elastic_share": share,
        "elastic_jobs": sum(t.elastic is not None for t in jobs),
        "multi_replica_jobs": len(multi),
        "finished": m.finished,
        "mean_jct_h": _hours(m.avg_jct_s),
        "median_jct_h": _hours(m.median_jct_s),
        "p99_jct_h": _hours(m.p99_jct_s),
        "multi_mean_jct_h": _hours(_mean_jct(result, multi)),
        "mean_queue_h": _hours(m.avg_queue_s),
        "p99_queue_h": _hours(m.p99_queue_s),
        "util_productive_pct": round(100 * m.util_productive, 2),
        "util_allocated_pct": round(100 * m.util_allocated, 2),
        "util_productive_contended_pct": round(100 * m.util_productive_contended, 2),
        "makespan_h": _hours(m.makespan_s),
        "elastic_starts": m.elastic_starts,
        "grows": m.grows,
        "shrinks": m.shrinks,
        "preemptions": m.preemptions,
        "gpu_hours_lost": round(m.gpu_hours_lost, 1),
        "gpu_hours_slowed": round(m.gpu_hours_slowed, 1),
        "cycles": result.cycles,
        "wall_s": round(wall, 1),
    }


def _mean_jct(result: SimResult, ids: set[str]) -> float | None:
    """Mean JCT (seconds) of the finished jobs of ``ids``; None when none finished."""
    jct = [j.finish_s - j.submit_s for j in result.jobs if j.id in ids and j.finish_s is not None]
    return float(np.mean(jct)) if jct else None


def _hours(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds / 3600.0, 3)


def render(head: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    """The header line and one table row per share, as plain text."""
    lines = [
        f"{head['jobs']:,} jobs ({head['trace']}) on {head['fleet']} ({head['gpus']:,} GPUs), "
        f"policy {head['policy']}, seed {head['seed']}, offered load {head['offered_load']}; "
        f"{rows[0]['multi_replica_jobs']:,} multi-replica jobs",
    ]
    cells = [[h for _, h, _ in COLUMNS]]
    for row in rows:
        cells.append(["-" if row[k] is None else f.format(row[k]) for k, _, f in COLUMNS])
    widths = [max(len(r[i]) for r in cells) for i in range(len(COLUMNS))]
    for r in cells:
        lines.append("  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """Parse the options, replay once per share, print the figures."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--fleet", type=Path, default=FLEET)
    default_trace = str(TRACE) if TRACE.exists() else "synthetic:3000"
    parser.add_argument("--trace", default=default_trace, help="trace file or synthetic:N")
    parser.add_argument("--policy", default="default")
    parser.add_argument("--seed", type=int, default=0, help="failures, teams, elastic picks")
    parser.add_argument(
        "--shares",
        default=",".join(f"{s:g}" for s in SHARES),
        help="comma-separated shares of the multi-replica jobs made elastic",
    )
    parser.add_argument("--limit", type=int, default=None, help="replay only the first N jobs")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    shares = [float(s) for s in args.shares.split(",") if s.strip()]
    if not shares or any(not 0.0 <= s <= 1.0 for s in shares):
        parser.error(f"--shares {args.shares}: give fractions between 0 and 1, e.g. 0,0.3,1")
    path = args.trace if args.trace.startswith("synthetic:") else Path(args.trace)
    trace = load_trace(path, seed=args.seed)[: args.limit]
    tree = load_fleet(args.fleet)
    head = {
        "trace": args.trace,
        "fleet": tree.name,
        "gpus": tree.total_gpus,
        "policy": args.policy,
        "seed": args.seed,
        "jobs": len(trace),
        "offered_load": round(offered_load(trace, tree.total_gpus), 3) if len(trace) > 1 else 0.0,
    }
    rows = [replay(trace, args.fleet, s, args.policy, args.seed) for s in shares]
    print(json.dumps({**head, "runs": rows}, indent=2) if args.json else render(head, rows))


if __name__ == "__main__":
    main()

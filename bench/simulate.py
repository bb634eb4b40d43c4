"""Simulator speed: replay ITP cluster04 on the 1,024-GPU fleet under one policy, in process.

Loads the fleet and the trace (``../shared/data/traces/itp/cluster04.csv`` by default), times
``simulate`` alone (trace loading excluded), and prints the wall time, the process's peak
resident memory (``ru_maxrss``, loading included) and simulated jobs per second, next to the
targets (60 s, 2 GiB). ``--json`` prints one object instead. The figures depend on the machine
and on what else runs on it; nothing here asserts them.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path
from typing import Any

from boltforge.core.policy import named
from boltforge.sim.engine import SimConfig, simulate
from boltforge.sim.metrics import compute
from boltforge.sim.traces import load_trace, offered_load
from boltforge.spec.fleet import load_fleet

ROOT = Path(__file__).resolve().parents[1]
FLEET = ROOT / "examples" / "fleets" / "sim-1024.yaml"
TRACE = ROOT.parent / "shared" / "data" / "traces" / "itp" / "cluster04.csv"
TARGET_WALL_S = 60.0
TARGET_RSS_GIB = 2.0


def measure(fleet: Path, trace: str, policy: str, limit: int | None) -> dict[str, Any]:
    """Replay once and return the figures (see the module docstring)."""
    tree = load_fleet(fleet)
    jobs = load_trace(trace if trace.startswith("synthetic:") else Path(trace))[:limit]
    start = time.perf_counter()
    result = simulate(tree, jobs, SimConfig(named(policy)))
    wall = time.perf_counter() - start
    result.wall_s = wall
    metrics = compute(result)
    return {
        "fleet": tree.name,
        "gpus": tree.total_gpus,
        "trace": trace,
        "policy": policy,
        "jobs": len(jobs),
        "finished": metrics.finished,
        "offered_load": round(offered_load(jobs, tree.total_gpus), 3) if len(jobs) > 1 else 0.0,
        "events": result.events,
        "cycles": result.cycles,
        "wall_s": round(wall, 2),
        "peak_rss_mib": round(peak_rss_mib(), 1),
        "jobs_per_s": round(len(jobs) / wall, 1) if wall > 0 else None,
        "target_wall_s": TARGET_WALL_S,
        "target_rss_gib": TARGET_RSS_GIB,
    }


def peak_rss_mib() -> float:
    """Peak resident set size of this process so far, in MiB (Linux reports KiB)."""
    kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return kib / (1024.0 * 1024.0) if sys.platform == "darwin" else kib / 1024.0


def render(fig: dict[str, Any]) -> str:
    """The figures as a few lines of text."""
    return "\n".join(
        (
            f"{fig['jobs']:,} jobs ({fig['trace']}) on {fig['fleet']} ({fig['gpus']:,} GPUs), "
            f"policy {fig['policy']}, offered load {fig['offered_load']}",
            f"finished {fig['finished']:,}; {fig['events']:,} events, {fig['cycles']:,} passes",
            f"wall {fig['wall_s']:.2f} s (target <= {TARGET_WALL_S:.0f} s)",
            f"peak RSS {fig['peak_rss_mib']:,.1f} MiB (target <= {TARGET_RSS_GIB:.0f} GiB)",
            f"{fig['jobs_per_s']:,} simulated jobs per second",
        )
    )


def main(argv: list[str] | None = None) -> None:
    """Parse the options, run the replay, print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fleet", type=Path, default=FLEET)
    default_trace = str(TRACE) if TRACE.exists() else "synthetic:15802"
    parser.add_argument("--trace", default=default_trace, help="trace file or synthetic:N")
    parser.add_argument("--policy", default="default")
    parser.add_argument("--limit", type=int, default=None, help="replay only the first N jobs")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    figures = measure(args.fleet, args.trace, args.policy, args.limit)
    print(json.dumps(figures, indent=2) if args.json else render(figures))


if __name__ == "__main__":
    main()

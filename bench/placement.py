"""Time to place 8-, 64-, 256- and 1,024-GPU gangs on the 16,384-GPU fleet at 60-80% occupancy.

For each occupancy level and seed a fragmented state is built (``testing.builders.occupy``),
then each gang size is placed ``--repeat`` times with ``place_now`` (a pure question: the state
is not changed). Prints medians and p99s per gang size; ``--json`` prints
``{"gangs": {"256": {"median_ms": ..., "p99_ms": ...}, ...}}``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from boltforge.core.placement.modes import place_now
from boltforge.spec.fleet import load_fleet
from boltforge.testing.builders import make_gang, occupy

FLEET = Path(__file__).resolve().parents[1] / "examples" / "fleets" / "h100-16k.yaml"
SIZES = (8, 64, 256, 1024)


def measure(repeat: int, seeds: int) -> dict[str, dict[str, float]]:
    tree = load_fleet(FLEET)
    times: dict[int, list[float]] = {s: [] for s in SIZES}
    placed: dict[int, int] = dict.fromkeys(SIZES, 0)
    for occupancy in (0.6, 0.7, 0.8):
        for seed in range(seeds):
            state = occupy(tree, occupancy, seed=seed)
            for size in SIZES:
                gang = make_gang(f"g{size}", gpus=size, per_node=min(8, size))
                place_now(state, gang)  # warm caches for this state
                for _ in range(repeat):
                    start = time.perf_counter()
                    decision = place_now(state, gang)
                    times[size].append((time.perf_counter() - start) * 1000)
                    placed[size] += int(decision.placed)
    out = {}
    for size, samples in times.items():
        out[str(size)] = {
            "median_ms": round(statistics.median(samples), 3),
            "p99_ms": round(float(np.percentile(samples, 99)), 3),
            "samples": len(samples),
            "placed_share": round(placed[size] / len(samples), 3),
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    gangs = measure(args.repeat, args.seeds)
    if args.json:
        json.dump({"fleet": "h100-16k", "gangs": gangs}, sys.stdout, indent=2)
        print()
        return
    print(f"placement on {FLEET.name} (16,384 GPUs), occupancy 60/70/80%, {args.seeds} seeds")
    print(f"{'gang':>6} {'median ms':>10} {'p99 ms':>8} {'placed':>7} {'samples':>8}")
    for size, row in gangs.items():
        print(
            f"{size:>6} {row['median_ms']:>10.2f} {row['p99_ms']:>8.2f} "
            f"{row['placed_share']:>7.0%} {row['samples']:>8}"
        )


if __name__ == "__main__":
    main()

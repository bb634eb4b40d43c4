"""Placement quality on small random fleets: the engine against exhaustive search and first-fit."""

# Each case (``boltforge.testing.exhaustive.random_case``) is a fleet of at most 10 hosts in 1-2
# pods, 1-2 pools (islands of 8, 4 or 1), 0-80% busy, and one single-role job. The engine's
# crossing cost is compared with the exhaustive optimum over every split of the replicas, and
# with first-fit's on the same state: cost, and fragmentation index after allocating. Case ``i``
# is seed ``--seed + i``, so every figure is reproducible. ``--json`` prints one JSON object.

from __future__ import annotations

import argparse
import json
import sys
import time

from boltforge.testing.exhaustive import evaluate, random_case, summarize


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--cases", type=int, default=2000, help="number of random cases")
    parser.add_argument("--seed", type=int, default=0, help="seed of the first case")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--worst", type=int, default=0, help="also list the N worst cases")
    args = parser.parse_args()
    start = time.perf_counter()
    results = [evaluate(random_case(args.seed + i)) for i in range(args.cases)]
    elapsed = time.perf_counter() - start
    summary = summarize(results)
    ranked = sorted(
        (r for r in results if r.engine is not None and r.optimum),
        key=lambda r: -(r.engine or 0.0) / (r.optimum or 1.0),
    )
    worst = [
        {"seed": r.seed, "engine": r.engine, "optimum": r.optimum} for r in ranked[: args.worst]
    ]
    if args.json:
        json.dump({**summary, "worst_cases": worst, "seconds": round(elapsed, 2)}, sys.stdout)
        print()
        return
    placed = summary["placed"]
    print(f"placement quality: {summary['cases']} cases (seeds {args.seed}..), {placed} placeable")
    print(f"  engine == optimum           {summary['optimal_share']:.2%}")
    print(f"  worst engine / optimum      {summary['worst_ratio_vs_optimal']:.3f}")
    print(f"  over 1.10 x optimum         {summary['share_over_10_percent_worse']:.2%}")
    print(f"  mean engine / optimum       {summary['mean_ratio_vs_optimal']:.4f}")
    print(f"  feasibility disagreements   {summary['feasibility_disagreements']}")
    print(f"  median cost engine / ff     {summary['median_cost_ratio_vs_first_fit']:.3f}")
    print(f"  mean cost engine / ff       {summary['mean_cost_ratio_vs_first_fit']:.3f}")
    print(
        f"  fragmentation engine / ff   {summary['fragmentation_ratio_vs_first_fit']:.3f} "
        f"(mean index {summary['mean_fragmentation_engine']:.3f} vs "
        f"{summary['mean_fragmentation_first_fit']:.3f}; median per-case ratio "
        f"{summary['median_fragmentation_ratio_vs_first_fit']:.3f})"
    )
    for row in worst:
        print(f"  worst: seed {row['seed']}: engine {row['engine']:g}, optimum {row['optimum']:g}")
    print(f"  {elapsed:.1f} s")


if __name__ == "__main__":
    main()

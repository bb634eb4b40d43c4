"""Engine against first-fit on the 16,384-GPU fleet: crossing cost and fragmentation.

On busy states of the H100 fleet (60/70/80% occupancy, ``testing.builders.occupy``), a stream
of jobs (8, 16, 32, 64, 128 and 256 GPUs, drawn with a fixed seed) is placed one after another,
once by the engine and once by first-fit (hosts in index order, as many replicas each as fit),
each on its own copy of the state. Prints the ratio of total crossing cost and the fragmentation
index and largest free rack after the stream; ``--json`` prints one object.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

from boltforge.core.model.state import Allocation, FleetState
from boltforge.core.placement.fragmentation import measure
from boltforge.core.placement.modes import place_now
from boltforge.spec.fleet import load_fleet
from boltforge.testing.builders import make_gang, occupy
from boltforge.testing.exhaustive import first_fit

FLEET = Path(__file__).resolve().parents[1] / "examples" / "fleets" / "h100-16k.yaml"
SIZES = (8, 8, 8, 16, 16, 32, 64, 128, 256)


def stream(state: FleetState, sizes: list[int], engine: bool) -> tuple[float, int]:
    """Place ``sizes`` in order on ``state`` (mutated); total cost and jobs placed."""
    total, placed = 0.0, 0
    for i, size in enumerate(sizes):
        gang = make_gang(f"s{i}", gpus=size, per_node=min(8, size))
        if engine:
            decision = place_now(state, gang)
            if decision.placement is None:
                continue
            grants, cost = decision.placement.grants, decision.placement.cost.total
        else:
            split = first_fit(state, gang.roles[0])
            if split is None:
                continue
            grants, cost = split.grants, split.cost
        state.allocate(Allocation(gang.name, tuple(grants)))
        total += cost
        placed += 1
    return total, placed


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--jobs", type=int, default=40, help="jobs per stream")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    tree = load_fleet(FLEET)
    rows = []
    for occupancy in (0.6, 0.7, 0.8):
        base = occupy(tree, occupancy, seed=11)
        sizes = random.Random(5).choices(SIZES, k=args.jobs)
        results = {}
        for name, engine in (("engine", True), ("first_fit", False)):
            state = base.copy()
            cost, placed = stream(state, sizes, engine)
            frag = measure(state)
            results[name] = {
                "cost": cost,
                "placed": placed,
                "frag": frag.index,
                "largest_free_rack": frag.largest_free_rack,
            }
        e, f = results["engine"], results["first_fit"]
        rows.append(
            {
                "occupancy": occupancy,
                "jobs": args.jobs,
                "engine": e,
                "first_fit": f,
                "cost_ratio": e["cost"] / f["cost"] if f["cost"] else 1.0,
            }
        )
    if args.json:
        json.dump({"fleet": "h100-16k", "streams": rows}, sys.stdout, indent=2)
        print()
        return
    print(f"{args.jobs} jobs (8-256 GPUs) placed in turn on the 16,384-GPU fleet")
    print(
        f"{'busy':>5} {'cost engine/ff':>15} {'placed e/ff':>12} {'frag engine':>12} "
        f"{'frag ff':>8} {'free rack e/ff':>15}"
    )
    for r in rows:
        e, f = r["engine"], r["first_fit"]
        print(
            f"{r['occupancy']:>5.0%} {r['cost_ratio']:>15.3f} {e['placed']:>5}/{f['placed']:<6} "
            f"{e['frag']:>12.3f} {f['frag']:>8.3f} "
            f"{e['largest_free_rack']:>7}/{f['largest_free_rack']:<7}"
        )


if __name__ == "__main__":
    main()

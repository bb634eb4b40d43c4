"""``bolt tour``: a guided walk through placements on the example fleets (no server needed)."""

from __future__ import annotations

import time
from pathlib import Path

from rich.console import Console
from rich.rule import Rule

from boltforge.cli.fleet import fleet_summary, print_summary
from boltforge.cli.render import decision_dict, print_decision
from boltforge.core.model.gang import Gang
from boltforge.core.model.state import FleetState
from boltforge.core.placement.modes import when_and_where
from boltforge.spec.fleet import load_fleet
from boltforge.spec.job import parse_job
from boltforge.spec.loader import read_yaml
from boltforge.spec.resolve import to_gang
from boltforge.testing.builders import occupy

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _step(console: Console, state: FleetState, title: str, gang: Gang, now: float = 0.0) -> None:
    console.print(Rule(title, align="left"))
    start = time.perf_counter()
    decision = when_and_where(state, gang, now)
    ms = (time.perf_counter() - start) * 1000
    print_decision(console, state.tree, decision_dict(state, decision, now, ms))
    if decision.placed and decision.placement:
        state.allocate(decision.placement.allocation(expected_end=now + 3600))
    console.print()


def run_tour(console: Console) -> None:
    """Place jobs one after another, showing where each lands and why."""
    lab = load_fleet(EXAMPLES / "fleets" / "lab.yaml")
    state = FleetState(lab)
    print_summary(fleet_summary(lab, state))
    console.print()

    def gang(**fields: object) -> Gang:
        return to_gang(parse_job({"team": "demo", **fields}), lab)

    _step(
        console,
        state,
        "1. an 8-GPU job takes one whole host (one NVLink island)",
        gang(name="exp-8", gpus=8),
    )
    _step(
        console,
        state,
        "2. a 16-GPU job stays inside one rack",
        gang(name="train-16", gpus=16, per_node=8),
    )
    _step(
        console,
        state,
        "3. a 4-GPU debug job takes half of the last free host",
        gang(name="debug-4", gpus=4),
    )
    _step(
        console,
        state,
        "4. a 4-GPU job fills the half-used host exactly (best fit)",
        gang(name="exp-4", gpus=4),
    )
    _step(
        console,
        state,
        "5. a 16-GPU job must wait: when and where will it start?",
        gang(name="train-16b", gpus=16, per_node=8, topology={"required": "rack"}),
    )

    hetero = load_fleet(EXAMPLES / "fleets" / "hetero-1024.yaml")
    hstate = FleetState(hetero)
    console.print(Rule("6. the 1,024-GPU heterogeneous cluster", align="left"))
    print_summary(fleet_summary(hetero, hstate))
    console.print()
    rlhf = to_gang(parse_job(read_yaml(EXAMPLES / "jobs" / "rlhf.yaml")), hetero)
    _step(console, hstate, "7. an RLHF gang (policy, reference, reward, CPU data loaders)", rlhf)
    impossible = to_gang(parse_job(read_yaml(EXAMPLES / "jobs" / "impossible.yaml")), hetero)
    _step(console, hstate, "8. a job asking for 141 GB GPUs is rejected with the fix", impossible)

    big = load_fleet(EXAMPLES / "fleets" / "h100-16k.yaml")
    console.print(Rule("9. the 16,384-GPU H100 fleet at 70% occupancy", align="left"))
    bstate = occupy(big, 0.7, seed=7)
    print_summary(fleet_summary(big, bstate))
    console.print()
    job = to_gang(parse_job(read_yaml(EXAMPLES / "jobs" / "train-256-rack.yaml")), big)
    _step(console, bstate, "10. 256 GPUs that require one rack", job)


def tour_command() -> None:
    """Walk through placements on the example fleets (no server needed)."""
    from boltforge.cli.common import console

    run_tour(console)

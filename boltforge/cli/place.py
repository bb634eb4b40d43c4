"""``bolt place`` and ``bolt check``: placement questions and spec validation, answered from
spec files without a server."""

from __future__ import annotations

import time
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from boltforge.cli.common import console, print_json, spec_errors, timed
from boltforge.cli.render import decision_dict, print_decision
from boltforge.core.model.state import FleetState
from boltforge.core.placement.modes import could_ever_fit, place_now, when_and_where
from boltforge.core.placement.place import Decision
from boltforge.spec.fleet import load_fleet
from boltforge.spec.job import load_job
from boltforge.spec.resolve import to_gang
from boltforge.spec.state import load_state


class Mode(StrEnum):
    when = "when"
    now = "now"
    ever = "ever"


def place(
    fleet: Annotated[Path, typer.Option(help="Fleet spec (YAML).")],
    job: Annotated[Path, typer.Option(help="Job spec (YAML).")],
    state: Annotated[
        Path | None, typer.Option(help="Running jobs and cordons (YAML); default: empty fleet.")
    ] = None,
    mode: Annotated[
        Mode,
        typer.Option(help="now: fits right now? ever: could it ever fit? when: when and where."),
    ] = Mode.when,
    json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Where would this job go, and why? Answers without a server.

    Exits 0 with an answer (placed or not; see `placed` in --json), 2 on invalid input.
    """
    with spec_errors():
        tree = load_fleet(fleet)
        gang = to_gang(load_job(job), tree, str(job))
        current = load_state(state, tree) if state else FleetState(tree)

    def decide() -> Decision:
        if mode == Mode.now:
            return place_now(current, gang)
        if mode == Mode.ever:
            return could_ever_fit(tree, gang)
        return when_and_where(current, gang, now=0.0)

    decision, ms = timed(decide, time.perf_counter)
    data = decision_dict(current if mode != Mode.ever else FleetState(tree), decision, 0.0, ms)
    if json:
        print_json(data)
    else:
        print_decision(console, tree, data)


def check(
    job: Annotated[Path, typer.Argument(help="Job spec (YAML).")],
    fleet: Annotated[Path | None, typer.Option(help="Also resolve it against this fleet.")] = None,
) -> None:
    """Validate a job spec (and, with --fleet, that it could ever run there)."""
    with spec_errors():
        spec = load_job(job)
        if fleet is None:
            console.print(f"[green]ok[/] {job}: job {spec.name} for team {spec.team}")
            return
        tree = load_fleet(fleet)
        gang = to_gang(spec, tree, str(job))
    decision = could_ever_fit(tree, gang)
    if decision.placement is None:
        console.print(f"[bold red]{spec.name} can never run on {tree.name}[/]")
        for r in (*decision.reasons, *(f"To fix: {f}" for f in decision.fixes)):
            console.print(f"  - {r}", markup=False, highlight=False)
        raise typer.Exit(1)
    console.print(f"[green]ok[/] {spec.name}: {gang.total_gpus} GPUs, fits {tree.name} when free")

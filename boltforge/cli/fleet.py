"""``bolt fleet``: show a fleet's shape, or make a partly occupied state to experiment with."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
import yaml
from rich.box import SIMPLE_HEAD
from rich.table import Table

from boltforge.cli.common import console, print_json, spec_errors
from boltforge.cli.render import fragmentation_dict
from boltforge.core.model.state import FleetState
from boltforge.core.model.topology import TopologyTree
from boltforge.core.placement.fragmentation import measure
from boltforge.spec.fleet import load_fleet
from boltforge.spec.state import load_state

fleet_app = typer.Typer(help="Inspect fleets and fleet states.", no_args_is_help=True)


def fleet_summary(tree: TopologyTree, state: FleetState) -> dict[str, Any]:
    free = state.free_gpus_per_host()
    pools = []
    for i, p in enumerate(tree.pools):
        mask = tree.host_pool == i
        pools.append(
            {
                "pool": p.name,
                "gpu": p.gpu_type if p.gpus_per_host else None,
                "gpu_memory_gb": p.gpu_memory_gb,
                "hosts": int(mask.sum()),
                "gpus_per_host": p.gpus_per_host,
                "nvlink_island": p.island_size,
                "gpus": int(tree.host_gpus[mask].sum()),
                "free_gpus": int(free[mask].sum()),
                "racks": len({int(r) for r in tree.host_rack[mask]}),
                "pods": len({int(r) for r in tree.host_pod[mask]}),
                "tier": str(p.tier),
                "price_per_gpu_hour": p.price_per_gpu_hour,
            }
        )
    return {
        "fleet": tree.name,
        "hosts": len(tree.hosts),
        "gpus": tree.total_gpus,
        "racks": len(tree.rack_names),
        "pods": len(tree.pod_names),
        "pools": pools,
        "fragmentation": fragmentation_dict(measure(state)),
    }


def print_summary(data: dict[str, Any]) -> None:
    console.print(
        f"[bold]{data['fleet']}[/]: {data['gpus']:,} GPUs on {data['hosts']:,} hosts, "
        f"{data['racks']} racks, {data['pods']} pods"
    )
    table = Table(
        "pool",
        "GPU",
        "hosts x GPUs",
        "island",
        "free",
        "tier",
        "$/GPU-h",
        box=SIMPLE_HEAD,
        pad_edge=False,
    )
    for p in data["pools"]:
        table.add_row(
            p["pool"],
            p["gpu"] or "(CPU)",
            f"{p['hosts']} x {p['gpus_per_host']}",
            str(p["nvlink_island"]),
            f"{p['free_gpus']}/{p['gpus']}",
            p["tier"],
            f"{p['price_per_gpu_hour']:.2f}",
        )
    console.print(table)
    f = data["fragmentation"]
    console.print(
        f"fragmentation index {f['index']:.3f}; largest free rack "
        f"{f['largest_free_rack']} GPUs, pod {f['largest_free_pod']} GPUs"
    )


@fleet_app.command("show")
def show(
    fleet: Annotated[Path, typer.Argument(help="Fleet spec (YAML).")],
    state: Annotated[Path | None, typer.Option(help="Fleet state (YAML).")] = None,
    json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Pools, hosts, racks, pods and how fragmented the free GPUs are."""
    with spec_errors():
        tree = load_fleet(fleet)
        current = load_state(state, tree) if state else FleetState(tree)
    data = fleet_summary(tree, current)
    if json:
        print_json(data)
    else:
        print_summary(data)


@fleet_app.command("occupy")
def occupy_cmd(
    fleet: Annotated[Path, typer.Argument(help="Fleet spec (YAML).")],
    occupancy: Annotated[float, typer.Option(min=0.0, max=0.99, help="Share of GPUs busy.")] = 0.7,
    seed: Annotated[int, typer.Option(help="Random seed.")] = 0,
    out: Annotated[Path | None, typer.Option(help="Write here instead of stdout.")] = None,
) -> None:
    """Write a state file with small running jobs scattered over the fleet (for experiments)."""
    from boltforge.testing.builders import occupy

    with spec_errors():
        tree = load_fleet(fleet)
    state = occupy(tree, occupancy, seed)
    running = []
    for a in state.allocations.values():
        nodes = {tree.hosts[g.host].name: list(g.gpus) for g in a.grants}
        running.append({"job": a.job, "nodes": nodes, "ends_in": f"{(a.expected_end or 0):.0f}s"})
    text = yaml.safe_dump({"running": running}, sort_keys=False, default_flow_style=None)
    if out:
        out.write_text(text)
        console.print(f"wrote {len(running)} running jobs to {out}")
    else:
        print(text, end="")

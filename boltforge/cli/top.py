"""``bolt top``: a live view of the fleet: GPUs in use per node (grouped by pod and rack),
jobs running and waiting, use by team and the scheduling loop's last pass."""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Annotated

import typer
from rich.console import Group, RenderableType
from rich.live import Live
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from boltforge.cli.common import console
from boltforge.cli.remote import CaOpt, ServerOpt, TokenOpt, api_errors, connect, shorten
from boltforge.client import ApiFailure, Client
from boltforge.wire.jobs import FleetOut, NodeOut

BAR_CELLS = 16
PER_NODE_LIMIT = 64  # above this many nodes, one bar per rack


def top_command(
    interval: Annotated[float, typer.Option(help="Seconds between refreshes.", min=0.2)] = 2.0,
    once: Annotated[bool, typer.Option("--once", help="Print one frame and exit.")] = False,
    server: ServerOpt = None,
    token: TokenOpt = None,
    ca: CaOpt = None,
) -> None:
    """Watch the fleet live (Ctrl-C quits).

    GPUs used per node, grouped by pod and rack; jobs running and waiting; use by team; the
    scheduling loop's last pass.
    """
    with connect(server, token) as client:
        if once:
            with api_errors("top"):
                console.print(frame(client))
            return
        try:
            with Live(_safe_frame(client), console=console, auto_refresh=False) as live:
                while True:
                    time.sleep(interval)
                    live.update(_safe_frame(client), refresh=True)
        except KeyboardInterrupt:
            return


def _safe_frame(client: Client) -> RenderableType:
    try:
        return frame(client)
    except ApiFailure as e:
        return Text(f"{time.strftime('%H:%M:%S')} {e.message}", style="red")


def frame(client: Client) -> RenderableType:
    """One picture of the fleet, from ``/v1/fleet`` and ``/v1/nodes``."""
    fleet = client.fleet()
    nodes = client.nodes().nodes
    parts: list[RenderableType] = [
        Text.from_markup(
            f"[bold]boltforge top[/] {escape(client.server)}  {time.strftime('%H:%M:%S')}"
        ),
        Text(summary(fleet)),
        Text(""),
        racks_table(nodes),
    ]
    if fleet.by_team:
        parts += [Text(""), teams_table(fleet)]
    return Group(*parts)


def summary(f: FleetOut) -> str:
    share = f"{100 * f.gpus_used / f.gpus:.0f}%" if f.gpus else "-"
    cycle = "-" if f.last_cycle_ms is None else f"{f.last_cycle_ms:.1f} ms"
    return (
        f"nodes {f.nodes_ready}/{f.nodes} ready   GPUs {f.gpus_used}/{f.gpus} used ({share})   "
        f"jobs {f.jobs_running} running, {f.jobs_pending} pending\n"
        f"fragmentation {f.fragmentation:.3f}   last cycle {cycle} ({f.cycles} passes)"
    )


def bar(used: int, total: int, cells: int = BAR_CELLS) -> str:
    """``████░░░░`` markup: the used share of ``total`` in ``cells`` characters."""
    if total <= 0:
        return "[dim]" + "·" * cells + "[/]"
    width = min(cells, total)
    full = round(width * used / total)
    return f"[green]{'█' * full}[/][dim]{'░' * (width - full)}[/]"


def racks_table(nodes: list[NodeOut]) -> Table:
    """Rows per node (or per rack, on a big fleet) under a pod/rack heading."""
    table = Table(box=None, pad_edge=False, header_style="bold", show_edge=False)
    for name in ("POD/RACK", "NODE", "GPUS", "USED", "STATE", "JOBS"):
        table.add_column(name, no_wrap=True, overflow="ellipsis", max_width=30)
    racks: dict[tuple[str, str], list[NodeOut]] = defaultdict(list)
    for n in nodes:
        racks[(n.pod, n.rack)].append(n)
    per_node = len(nodes) <= PER_NODE_LIMIT
    for (pod, rack), members in sorted(racks.items()):
        if not per_node:
            used, total = sum(n.gpus_used for n in members), sum(n.gpus for n in members)
            ready = sum(n.state == "ready" for n in members)
            label = f"{len(members)} nodes"
            table.add_row(
                f"{pod}/{rack}", label, bar(used, total), f"{used}/{total}", f"{ready} ready", ""
            )
            continue
        for i, n in enumerate(members):
            where = f"{pod}/{rack}" if i == 0 else ""
            jobs = shorten(",".join(n.jobs), 24) or "-"
            count = f"{n.gpus_used}/{n.gpus}"
            table.add_row(where, n.name, bar(n.gpus_used, n.gpus), count, n.state, jobs)
    return table


def teams_table(f: FleetOut) -> Table:
    table = Table(box=None, pad_edge=False, header_style="bold", show_edge=False)
    for name in ("TEAM", "GPUS", "USED"):
        table.add_column(name, no_wrap=True, overflow="ellipsis", max_width=30)
    for team, gpus in sorted(f.by_team.items(), key=lambda kv: -kv[1]):
        table.add_row(team, bar(gpus, f.gpus, 32), str(gpus))
    return table

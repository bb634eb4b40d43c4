"""``bolt nodes``: every registered node with its place in the fleet, GPUs in use, state,
last heartbeat and the jobs on it."""

from __future__ import annotations

import time

from rich.table import Table

from boltforge.cli.common import console, print_json
from boltforge.cli.remote import JsonOpt, ServerOpt, TokenOpt, ago, api_errors, connect
from boltforge.wire.jobs import NodeOut

STATE_STYLE = {"ready": "green", "suspect": "yellow", "dead": "red", "cordoned": "dim"}


def nodes_command(json: JsonOpt = False, server: ServerOpt = None, token: TokenOpt = None) -> None:
    """List the nodes: pool, pod and rack, GPUs in use, state and the jobs on each."""
    with connect(server, token) as client, api_errors("nodes"):
        listing = client.nodes()
    if json:
        print_json(listing.model_dump(mode="json"))
        return
    if not listing.nodes:
        hint = "no nodes registered yet. To fix: start `bolt agent` on each host"
        console.print(hint, style="dim")
        return
    console.print(nodes_table(listing.nodes, time.time()))
    used = sum(n.gpus_used for n in listing.nodes)
    total = sum(n.gpus for n in listing.nodes)
    console.print(f"{len(listing.nodes)} node(s), {used} of {total} GPUs in use", highlight=False)


def nodes_table(nodes: list[NodeOut], now: float) -> Table:
    table = Table(box=None, pad_edge=False, header_style="bold")
    for name in ("NODE", "POOL", "GPU", "USED", "POD", "RACK", "STATE", "HEARTBEAT", "JOBS"):
        right = name == "USED"
        table.add_column(
            name,
            no_wrap=True,
            overflow="ellipsis",
            max_width=40,
            justify="right" if right else "left",
        )
    for n in nodes:
        style = STATE_STYLE.get(n.state, "yellow")
        table.add_row(
            n.name,
            n.pool,
            n.gpu or "-",
            f"{n.gpus_used}/{n.gpus}",
            n.pod,
            n.rack,
            f"[{style}]{n.state}[/]",
            ago(n.last_heartbeat, now),
            ",".join(n.jobs) or "-",
        )
    return table

"""``bolt nodes``: every registered node with its place in the fleet, GPUs in use, state,
last heartbeat and the jobs on it; ``bolt nodes cordon|drain|uncordon NODE`` take a node out
of service and back, and ``bolt nodes reclaim NODE --in 120s`` passes on a spot reclaim
notice (admin)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated

import typer
from rich.table import Table
from rich.text import Text

from boltforge.cli.common import EXIT_BAD_INPUT, console, print_json
from boltforge.cli.remote import (
    CaOpt,
    JsonOpt,
    ServerOpt,
    TokenOpt,
    ago,
    api_errors,
    connect,
    fail,
    span,
)
from boltforge.client import Client
from boltforge.spec.units import seconds
from boltforge.wire.jobs import NodeOut
from boltforge.wire.reclaim import ReclaimReply

STATE_STYLE = {
    "ready": "green",
    "suspect": "yellow",
    "dead": "red",
    "cordoned": "dim",
    "draining": "magenta",
}
NodeArg = Annotated[str, typer.Argument(help="The node's name, as `bolt nodes` lists it.")]

nodes_app = typer.Typer(
    help="List the nodes (the default), or cordon, drain, uncordon or reclaim one (admin).",
    invoke_without_command=True,
    no_args_is_help=False,
)


@dataclass(frozen=True, slots=True)
class Target:
    """The --server/--token given before the subcommand (``bolt nodes --token T cordon N``)."""

    server: str | None
    token: str | None


@nodes_app.callback(invoke_without_command=True)
def nodes_group(
    ctx: typer.Context,
    json: JsonOpt = False,
    server: ServerOpt = None,
    token: TokenOpt = None,
    ca: CaOpt = None,
) -> None:
    """List the nodes: pool, pod and rack, GPUs in use, state and the jobs on each. The
    subcommands cordon, drain and uncordon take a node out of service and back, and reclaim
    passes on a spot reclaim notice (admin)."""
    ctx.obj = Target(server, token)
    if ctx.invoked_subcommand is None:
        nodes_command(json, server, token)


@nodes_app.command("list")
def list_command(
    json: JsonOpt = False, server: ServerOpt = None, token: TokenOpt = None, ca: CaOpt = None
) -> None:
    """List the nodes (the same as `bolt nodes`)."""
    nodes_command(json, server, token)


@nodes_app.command("cordon")
def cordon_command(
    ctx: typer.Context,
    node: NodeArg,
    json: JsonOpt = False,
    server: ServerOpt = None,
    token: TokenOpt = None,
    ca: CaOpt = None,
) -> None:
    """Give NODE no new work; the jobs on it keep running."""
    out = _call(ctx, server, token, "cordon", lambda c: c.cordon(node))
    _said(out, json, f"node {node} cordoned: nothing new lands there; {_jobs(out)} keep running")


@nodes_app.command("drain")
def drain_command(
    ctx: typer.Context,
    node: NodeArg,
    json: JsonOpt = False,
    server: ServerOpt = None,
    token: TokenOpt = None,
    ca: CaOpt = None,
) -> None:
    """Cordon NODE and move its jobs elsewhere at their next checkpoint.

    Each job on it gets the checkpoint signal and its grace period, then requeues and resumes
    elsewhere from its last step."""
    out = _call(ctx, server, token, "drain", lambda c: c.drain(node))
    _said(out, json, f"node {node} draining: {_jobs(out)} checkpointing to move elsewhere")


@nodes_app.command("reclaim")
def reclaim_command(
    ctx: typer.Context,
    node: NodeArg,
    in_: Annotated[
        str, typer.Option("--in", help="When the cloud takes NODE back: 120s, 2m or 90.")
    ],
    json: JsonOpt = False,
    server: ServerOpt = None,
    token: TokenOpt = None,
    ca: CaOpt = None,
) -> None:
    """Pass on a spot reclaim notice: NODE goes away --in this long.

    NODE is cordoned and each job on it is asked to checkpoint now, with its grace cut to
    the time left, then requeues and resumes elsewhere from that checkpoint. When the time
    is up the node counts as gone; whatever is still there requeues from its last
    checkpoint, charged no restart."""
    try:
        in_s = seconds(in_)
    except ValueError as e:
        fail(f"--in {in_!r} {e}. To fix: pass a duration such as 120s or 2m", EXIT_BAD_INPUT)
    given = ctx.obj if isinstance(ctx.obj, Target) else Target(None, None)
    with connect(server or given.server, token or given.token) as c, api_errors("reclaim"):
        reply = c.reclaim(node, in_s)
    if json:
        print_json(reply.model_dump(mode="json"))
        return
    for line in reclaim_lines(reply, time.time()):
        console.print(line, highlight=False)


def reclaim_lines(reply: ReclaimReply, now: float) -> list[str]:
    """What a reclaim notice did, in words: the deadline, then each job and its grace."""
    at = time.strftime("%H:%M:%S", time.localtime(reply.reclaim_at))
    head = f"node {reply.node.name} is reclaimed in {span(reply.reclaim_at - now)} (at {at})"
    if not reply.jobs:
        return [f"{head}: cordoned; no jobs to move"]
    lines = [f"{head}: cordoned; {len(reply.jobs)} job(s) asked to checkpoint now and move off"]
    lines += [f"  {j.job}  checkpoint within {span(j.grace_s)}" for j in reply.jobs]
    return lines


@nodes_app.command("uncordon")
def uncordon_command(
    ctx: typer.Context,
    node: NodeArg,
    json: JsonOpt = False,
    server: ServerOpt = None,
    token: TokenOpt = None,
    ca: CaOpt = None,
) -> None:
    """Return a cordoned or drained NODE to service."""
    out = _call(ctx, server, token, "uncordon", lambda c: c.uncordon(node))
    _said(out, json, f"node {node} back in service ({out.state})")


def _call(
    ctx: typer.Context,
    server: str | None,
    token: str | None,
    what: str,
    call: Callable[[Client], NodeOut],
) -> NodeOut:
    given = ctx.obj if isinstance(ctx.obj, Target) else Target(None, None)
    with connect(server or given.server, token or given.token) as client, api_errors(what):
        return call(client)


def _jobs(out: NodeOut) -> str:
    return f"{len(out.jobs)} job(s)" if out.jobs else "no jobs"


def _said(out: NodeOut, json: bool, sentence: str) -> None:
    if json:
        print_json(out.model_dump(mode="json"))
    else:
        console.print(sentence, highlight=False)


def nodes_command(json: bool = False, server: str | None = None, token: str | None = None) -> None:
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


SHOWN_JOBS = 3  # job ids a row names before it says how many more


def nodes_table(nodes: list[NodeOut], now: float) -> Table:
    """One row per node. Every column keeps the width of what it shows (up to 40) but
    JOBS, which gives way on a narrow terminal; a node running many jobs names the first
    few and counts the rest."""
    table = Table(box=None, pad_edge=False, header_style="bold")
    rows = [_node_row(n, now) for n in nodes]
    for i, name in enumerate(NODE_COLUMNS):
        shown = [len(Text.from_markup(r[i]).plain) for r in rows]
        table.add_column(
            name,
            no_wrap=True,
            overflow="ellipsis",
            min_width=None if name == "JOBS" else min(max([len(name), *shown]), 40),
            max_width=40,
            justify="right" if name == "USED" else "left",
        )
    for row in rows:
        table.add_row(*row)
    return table


NODE_COLUMNS = ("NODE", "POOL", "GPU", "USED", "POD", "RACK", "STATE", "HEARTBEAT", "JOBS")


def _node_row(n: NodeOut, now: float) -> tuple[str, ...]:
    style = STATE_STYLE.get(n.state, "yellow") if n.reclaim_at is None else "magenta"
    return (
        n.name,
        n.pool,
        n.gpu or "-",
        f"{n.gpus_used}/{n.gpus}",
        n.pod,
        n.rack,
        f"[{style}]{state_text(n, now)}[/]",
        ago(n.last_heartbeat, now),
        jobs_text(n.jobs),
    )


def jobs_text(jobs: list[str]) -> str:
    """The node's jobs: ``a,b`` for a few; ``30: a,b,c,...`` (the count first, so a narrow
    terminal never cuts it) past ``SHOWN_JOBS``; ``-`` for none."""
    if not jobs:
        return "-"
    if len(jobs) <= SHOWN_JOBS:
        return ",".join(jobs)
    return f"{len(jobs)}: " + ",".join(jobs[:SHOWN_JOBS]) + ",..."


def state_text(n: NodeOut, now: float) -> str:
    """The node's state (``ready, degraded`` when it takes single-host work only), or
    ``reclaim in 60 s`` while a spot reclaim notice is pending (``reclaimed`` once the time
    passed)."""
    if n.reclaim_at is None:
        return f"{n.state}, degraded" if n.degraded and n.state != "dead" else n.state
    left = n.reclaim_at - now
    return f"reclaim in {span(left)}" if left > 0 and n.state != "dead" else "reclaimed"

"""One job at a time: ``bolt status`` (state, where, meter, timeline), ``bolt explain`` (why
here, or why still waiting), ``bolt cancel`` and ``bolt logs``."""

from __future__ import annotations

import sys
import time
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from boltforge.cli.common import console, print_json
from boltforge.cli.remote import (
    JsonOpt,
    ServerOpt,
    TokenOpt,
    ago,
    api_errors,
    connect,
    until,
)
from boltforge.client import ApiFailure, Client
from boltforge.wire.jobs import TERMINAL, JobDetail

JobArg = Annotated[str, typer.Argument(help="Job id (an array task is 42_3).", show_default=False)]
FOLLOW_POLL_S = 20.0


def status_command(
    job: JobArg, json: JsonOpt = False, server: ServerOpt = None, token: TokenOpt = None
) -> None:
    """Show a job's state, where it runs, what it has cost so far, and its timeline."""
    with connect(server, token) as client, api_errors(job):
        d = client.job(job)
    if json:
        print_json(d.model_dump(mode="json"))
        return
    console.print(headline(d), highlight=False)
    console.print(_facts(d), highlight=False)
    if d.placement:
        console.print(placement_table(d))
    console.print("[bold]timeline[/]")
    for ev in d.events:
        stamp = f"{max(ev.at - d.submitted_at, 0.0):8.1f}s"
        console.print(f"  [dim]{stamp}[/] {escape(ev.message)}", highlight=False)


def headline(d: JobDetail) -> str:
    """``job 7 example-train (research, low): running on host-[0-3]``."""
    where = f" on {d.nodes}" if d.nodes else ""
    return (
        f"[bold]job {d.id}[/] {escape(d.name)} ({escape(d.team)}, {d.priority_name}): "
        f"[bold]{d.state}[/]{escape(where)}"
    )


def _facts(d: JobDetail) -> str:
    now = time.time()
    parts = [f"{d.gpus} GPU(s) in {d.replicas} replica(s)", f"submitted {ago(d.submitted_at, now)}"]
    if d.started_at is not None:
        parts.append(f"started {ago(d.started_at, now)}")
    if d.finished_at is not None:
        parts.append(f"ended {ago(d.finished_at, now)}")
    if d.exit_code is not None:
        parts.append(f"exit code {d.exit_code}")
    if d.last_step is not None:
        parts.append(f"step {d.last_step}")
    if d.preemptions or d.restarts:
        parts.append(f"{d.preemptions} preemption(s), {d.restarts} restart(s)")
    parts.append(f"{d.gpu_hours:.3f} GPU-h (${d.dollars:.2f})")
    if d.productive_gpu_hours < d.gpu_hours - 5e-4:
        kept = f"{d.productive_gpu_hours:.3f} GPU-h (${d.productive_dollars:.2f}) productive"
        parts.append(kept)
    return "  " + "; ".join(parts)


def placement_table(d: JobDetail) -> Table:
    table = Table(box=None, pad_edge=False, header_style="bold", title_justify="left")
    for name in ("RANK", "ROLE", "NODE", "GPUS", "STATE", "PID", "EXIT"):
        table.add_column(name, no_wrap=True, overflow="ellipsis", max_width=32)
    for r in d.placement:
        table.add_row(
            str(r.rank),
            r.role,
            r.node,
            ",".join(map(str, r.gpus)) or "-",
            r.state,
            "-" if r.pid is None else str(r.pid),
            "-" if r.exit_code is None else str(r.exit_code),
        )
    return table


def explain_command(
    job: JobArg, json: JsonOpt = False, server: ServerOpt = None, token: TokenOpt = None
) -> None:
    """Explain why a job runs where it does, or why it waits and when it should start."""
    with connect(server, token) as client, api_errors(job):
        d = client.job(job)
    if json:
        keys = ("id", "state", "nodes", "explanation", "reason", "position", "estimated_start")
        print_json({k: v for k, v in d.model_dump(mode="json").items() if k in (*keys, "waiting")})
        return
    console.print(headline(d), highlight=False)
    for line in explanation(d):
        console.print(f"  {escape(line)}", highlight=False)


def explanation(d: JobDetail) -> list[str]:
    """The lines ``bolt explain`` prints under the headline."""
    if d.state in ("pending", "requeued"):
        pos = "?" if d.position is None else str(d.position + 1)
        start = "unknown" if d.estimated_start is None else until(d.estimated_start)
        head = [
            f"waiting: {d.reason or 'not yet considered'}",
            f"position {pos} in line; estimated start {start}",
        ]
        return head + list(d.waiting)
    if d.state in TERMINAL:
        last = d.events[-1].message if d.events else d.state
        return [last, *(f"last placement: {x}" for x in d.explanation[:1])]
    found = [
        e.message for e in d.events if e.kind == "straggler" and e.data.get("epoch") == d.epoch
    ]
    return [*(list(d.explanation) or ["no placement explanation recorded"]), *found]


def cancel_command(job: JobArg, server: ServerOpt = None, token: TokenOpt = None) -> None:
    """Cancel a job, or every live task of an array job.

    Each replica gets the checkpoint signal; its GPUs are freed once it exits.
    """
    with connect(server, token) as client, api_errors(job):
        ended = _ended_state(client, job)
        if ended:
            console.print(f"job {job} had already ended: {ended}", highlight=False)
            return
        out = client.cancel(job)
    cancelled = [j for j in out.jobs if j.state == "cancelled"]
    if len(out.jobs) > 1:
        console.print(f"cancelled {len(cancelled)} task(s) of array job {job}", highlight=False)
        return
    for j in out.jobs:
        what = "cancelled" if j.state == "cancelled" else f"not cancelled: it is {j.state}"
        console.print(f"job {j.id} {what}", highlight=False)


def _ended_state(client: Client, job: str) -> str | None:
    """The final state of ``job`` if it has ended (None for a live job or an array id)."""
    try:
        state = client.job(job).state
    except ApiFailure:
        return None
    return state if state in TERMINAL else None


def logs_command(
    job: JobArg,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing new output until the job ends.")
    ] = False,
    server: ServerOpt = None,
    token: TokenOpt = None,
) -> None:
    """Print a job's output (every replica's, as it arrived); -f follows it to the end."""
    after = 0
    with connect(server, token) as client, api_errors(job):
        while True:
            page = client.logs(job, after=after, wait=FOLLOW_POLL_S if follow else 0.0)
            sys.stdout.write("".join(f"{line}\n" for line in page.lines))
            sys.stdout.flush()
            moved = page.next != after
            after = page.next
            if not moved and (not follow or page.state in TERMINAL):
                return

"""One job at a time: ``bolt status`` (state, where, meter, timeline), ``bolt explain`` (why
here, or why still waiting), ``bolt cancel`` and ``bolt logs``."""

from __future__ import annotations

import re
import sys
import time
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from boltforge.cli.common import console, print_json
from boltforge.cli.remote import (
    CaOpt,
    JsonOpt,
    ServerOpt,
    TokenOpt,
    ago,
    api_errors,
    connect,
    span,
    until,
)
from boltforge.client import ApiFailure, Client
from boltforge.wire.gpuamount import gpu_amount
from boltforge.wire.jobs import TERMINAL, DeadlineOutlook, JobDetail

JobArg = Annotated[str, typer.Argument(help="Job id (an array task is 42_3).", show_default=False)]
StatusArg = Annotated[
    str,
    typer.Argument(help="Job id (an array task is 42_3), or a service's name.", show_default=False),
]
FOLLOW_POLL_S = 20.0
JOB_ID = re.compile(r"^\d+(_\d+)?$")  # 42, or an array task 42_3


def status_command(
    job: StatusArg,
    json: JsonOpt = False,
    server: ServerOpt = None,
    token: TokenOpt = None,
    ca: CaOpt = None,
) -> None:
    """Show a job's state, where it runs, what it has cost so far, and its timeline; or,
    given a service's name, its replicas, load and SLO."""
    if not JOB_ID.match(job):
        _service_status(job, json, server, token)
        return
    with connect(server, token) as client, api_errors(job):
        d = client.job(job)
    if json:
        print_json(d.model_dump(mode="json"))
        return
    console.print(headline(d), highlight=False)
    console.print(_facts(d), highlight=False)
    line = job_outlook_line(d)
    if line is not None:
        console.print(f"  {escape(line)}", highlight=False)
    if d.placement:
        console.print(placement_table(d))
    console.print("[bold]timeline[/]")
    for ev in d.events:
        stamp = f"{max(ev.at - d.submitted_at, 0.0):8.1f}s"
        console.print(f"  [dim]{stamp}[/] {escape(ev.message)}", highlight=False)


def _service_status(name: str, json: bool, server: str | None, token: str | None) -> None:
    from boltforge.cli.serve import services_table

    with connect(server, token) as client, api_errors(name):
        found = client.service(name)
    if json:
        print_json(found.model_dump(mode="json"))
        return
    console.print(services_table([found]))
    jobs = ", ".join(found.replica_jobs) or "none"
    console.print(f"  replica jobs: {escape(jobs)}", highlight=False)


def headline(d: JobDetail) -> str:
    """``job 7 example-train (research, low): running on host-[0-3]``."""
    where = f" on {d.nodes}" if d.nodes else ""
    return (
        f"[bold]job {d.id}[/] {escape(d.name)} ({escape(d.team)}, {d.priority_name}): "
        f"[bold]{d.state}[/]{escape(where)}"
    )


def _facts(d: JobDetail) -> str:
    now = time.time()
    amount = gpu_amount(d.gpus, d.gpu_part, d.replicas)
    parts = [f"{amount} in {d.replicas} replica(s)", f"submitted {ago(d.submitted_at, now)}"]
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
    job: JobArg,
    json: JsonOpt = False,
    server: ServerOpt = None,
    token: TokenOpt = None,
    ca: CaOpt = None,
) -> None:
    """Explain why a job runs where it does, or why it waits and when it should start."""
    with connect(server, token) as client, api_errors(job):
        d = client.job(job)
    if json:
        keys = ("id", "state", "nodes", "explanation", "reason", "position", "estimated_start")
        shown = (*keys, "waiting", "outlook")
        print_json({k: v for k, v in d.model_dump(mode="json").items() if k in shown})
        return
    console.print(headline(d), highlight=False)
    for line in explanation(d):
        console.print(f"  {escape(line)}", highlight=False)


def explanation(d: JobDetail) -> list[str]:
    """The lines ``bolt explain`` prints under the headline."""
    outlook = [line] if (line := job_outlook_line(d)) is not None else []
    if d.state in ("pending", "requeued"):
        pos = "?" if d.position is None else str(d.position + 1)
        start = "unknown" if d.estimated_start is None else until(d.estimated_start)
        head = [
            f"waiting: {d.reason or 'not yet considered'}",
            f"position {pos} in line; estimated start {start}",
        ]
        return head + outlook + list(d.waiting)
    if d.state in TERMINAL:
        last = d.events[-1].message if d.events else d.state
        return [last, *(f"last placement: {x}" for x in d.explanation[:1])]
    found = [
        e.message for e in d.events if e.kind == "straggler" and e.data.get("epoch") == d.epoch
    ]
    return [*(list(d.explanation) or ["no placement explanation recorded"]), *outlook, *found]


def job_outlook_line(d: JobDetail) -> str | None:
    """``d``'s outlook line; a job without a time limit has its finish marked learned."""
    return outlook_line(d.outlook, learned=d.spec.get("time_limit") is None)


def outlook_line(o: DeadlineOutlook | None, learned: bool = False) -> str | None:
    """The deadline outlook in one line, times counted from when the server judged it:
    ``deadline reachable: expected start in ~2.0 h, finish in ~3.0 h; due in 4.0 h
    (2027-01-15 12:00 UTC), 60 min to spare``. A job without a deadline gets only its
    expected finish (``expected start now, finish in ~60 min``), or None when unknown.
    ``learned``: the job has no time limit, so a finish comes from the runtime learned from
    jobs like it, and the line says so."""
    if o is None:
        return None
    timing = _timing(o)
    if learned and o.expected_finish is not None:
        timing += " (runtime learned from jobs like it)"
    if o.deadline is None:
        return None if o.expected_finish is None else timing
    due = f"due {_relative(o.deadline, o.at)} ({_clock(o.deadline)})"
    if o.slack_s is None:
        known = "" if o.expected_start is None else f"{timing}; "
        return f"deadline {o.verdict or 'unknown'}: {o.note}; {known}{due}"
    spare = f"{span(o.slack_s)} {'to spare' if o.slack_s >= 0 else 'late'}"
    return f"deadline {o.verdict}: {timing}; {due}, {spare}"


def _timing(o: DeadlineOutlook) -> str:
    """``expected start in ~2.0 h, finish in ~3.0 h`` (the finish only when known)."""
    start = "?" if o.expected_start is None else _relative(o.expected_start, o.at, "~")
    finish = "" if o.expected_finish is None else _relative(o.expected_finish, o.at, "~")
    return f"expected start {start}" + (f", finish {finish}" if finish else "")


def _relative(at: float, now: float, about: str = "") -> str:
    """``at`` from ``now``: ``now``, ``in ~12 min`` or ``12 min ago`` (``about`` marks an
    estimate)."""
    left = at - now
    if abs(left) <= 1:
        return "now"
    return f"in {about}{span(left)}" if left > 0 else f"{span(left)} ago"


def _clock(at: float) -> str:
    """``at`` as local wall-clock time: ``2027-01-15 12:00 UTC``."""
    return time.strftime("%Y-%m-%d %H:%M %Z", time.localtime(at))


def cancel_command(
    job: JobArg, server: ServerOpt = None, token: TokenOpt = None, ca: CaOpt = None
) -> None:
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
    ca: CaOpt = None,
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

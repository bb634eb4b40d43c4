"""``bolt queue``: the jobs in line and running, like Slurm's squeue, one row per job (the
pending tasks of an array job fold into one row such as ``42_[3-99]``)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Annotated, get_args

import typer
from rich.table import Table

from boltforge.cli.common import console, print_json
from boltforge.cli.remote import (
    CaOpt,
    JsonOpt,
    ServerOpt,
    TokenOpt,
    ago,
    api_errors,
    cell,
    connect,
    until,
)
from boltforge.ranges import ranges
from boltforge.wire.gpuamount import gpu_amount
from boltforge.wire.jobs import TERMINAL, JobList, JobState, JobSummary, TeamLoad

WAITING = ("pending", "requeued")
ALL_STATES = ",".join(get_args(JobState))


@dataclass(frozen=True, slots=True)
class Row:
    """One printed row: a job, or the waiting tasks of one array job folded together."""

    job: JobSummary
    label: str


def queue_command(
    team: Annotated[str | None, typer.Option(help="Only this team's jobs.")] = None,
    state: Annotated[
        str | None,
        typer.Option(help="Only jobs in these states (comma-separated), e.g. pending,running."),
    ] = None,
    all_: Annotated[
        bool, typer.Option("--all", help="Include finished jobs (succeeded, failed, cancelled).")
    ] = False,
    json: JsonOpt = False,
    server: ServerOpt = None,
    token: TokenOpt = None,
    ca: CaOpt = None,
) -> None:
    """List jobs in queue order, like squeue.

    Shows each job's position, estimated start, and where it runs or why it waits. The
    waiting tasks of an array job share one row (42_[3-99]). Members see other teams' work
    only in aggregate, under the table.
    """
    states = state or (ALL_STATES if all_ else None)
    with connect(server, token) as client, api_errors("queue"):
        listing = client.jobs(state=states, team=team)
    if json:
        print_json(listing.model_dump(mode="json"))
        return
    print_queue(listing)


def print_queue(listing: JobList) -> None:
    rows = fold(listing.jobs)
    if rows:
        console.print(queue_table(rows, time.time()))
    else:
        console.print("no jobs", style="dim")
    if listing.others:
        console.print(others_line(listing.others), highlight=False)


def fold(jobs: list[JobSummary]) -> list[Row]:
    """Rows in queue order; the waiting tasks of an array job become one row at the place
    of its first task, labelled ``42_[3-99]``."""
    order: list[JobSummary | str] = []
    tasks: dict[str, list[JobSummary]] = {}
    for job in jobs:
        if job.array_task is None or job.state not in WAITING:
            order.append(job)
            continue
        array_id = job.id.partition("_")[0]
        if array_id not in tasks:
            order.append(array_id)
        tasks.setdefault(array_id, []).append(job)
    return [Row(o, o.id) if isinstance(o, JobSummary) else _folded(o, tasks[o]) for o in order]


def _folded(array_id: str, tasks: list[JobSummary]) -> Row:
    if len(tasks) == 1:
        return Row(tasks[0], tasks[0].id)
    indexes = ranges(t.array_task for t in tasks if t.array_task is not None)
    return Row(tasks[0], f"{array_id}_[{indexes}]")


def queue_table(rows: list[Row], now: float) -> Table:
    """The queue as a table that fits the terminal: NAME, TEAM and NODES/REASON shrink (cut
    with an ellipsis) before the id, state and numbers do."""
    table = Table(box=None, pad_edge=False, header_style="bold")
    table.add_column("JOBID", no_wrap=True)
    table.add_column("NAME", max_width=32)
    table.add_column("TEAM", max_width=16)
    for name in ("PRI", "ST"):
        table.add_column(name, no_wrap=True)
    for name in ("GPUS", "POS"):
        table.add_column(name, justify="right", no_wrap=True)
    table.add_column("START", no_wrap=True)
    table.add_column("NODES/REASON", min_width=8)
    for row in rows:
        j = row.job
        table.add_row(
            row.label,
            cell(j.name),
            cell(j.team),
            j.priority_name,
            j.state,
            gpu_amount(j.gpus, j.gpu_part, j.replicas, unit=False),
            "-" if j.position is None else str(j.position + 1),
            _start(j, now),
            cell(j.reason or "-" if j.state in WAITING else j.nodes or "-"),
        )
    return table


def _start(j: JobSummary, now: float) -> str:
    """Estimated start for a waiting job; when it started (or ended) otherwise."""
    if j.state in WAITING:
        return until(j.estimated_start, now)
    if j.state in TERMINAL:
        return ago(j.finished_at, now)
    return ago(j.started_at, now)


def others_line(others: list[TeamLoad]) -> str:
    """``other teams: nlp 2 running (16 GPUs), 1 pending; vision ...``."""
    parts = [f"{t.team} {t.running} running ({t.gpus} GPUs), {t.pending} pending" for t in others]
    return "other teams: " + "; ".join(parts)

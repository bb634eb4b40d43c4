"""``bolt cost``: GPU-hours and dollars by team, project or job, for showback and chargeback."""

from __future__ import annotations

import csv
import sys
from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated

import typer
from rich.table import Table
from rich.text import Text

from boltforge.cli.common import console, print_json
from boltforge.cli.remote import CaOpt, JsonOpt, ServerOpt, TokenOpt, api_errors, cell, connect
from boltforge.wire.cost import BudgetOut, CostReply, CostRow, SavingsOut

CSV_COLUMNS = (
    "group",
    "team",
    "project",
    "job",
    "name",
    "jobs",
    "gpu_hours",
    "dollars",
    "productive_gpu_hours",
    "productive_dollars",
    "vcpu_hours",
    "productive_vcpu_hours",
)


class By(StrEnum):
    TEAM = "team"
    PROJECT = "project"
    JOB = "job"


def cost_command(
    by: Annotated[By, typer.Option(help="One row per team, project or job.")] = By.TEAM,
    since: Annotated[
        str, typer.Option(help="How far back: a duration such as 30d, 12h or 3600.")
    ] = "30d",
    csv_: Annotated[
        bool, typer.Option("--csv", help="Print CSV (one row per group, no total).")
    ] = False,
    json: JsonOpt = False,
    server: ServerOpt = None,
    token: TokenOpt = None,
    ca: CaOpt = None,
) -> None:
    """Show what GPUs and CPUs cost: allocated and productive GPU-hours, vCPU-hours and
    dollars (the VCPU-H column appears when any job held CPUs).

    Allocated is every GPU-hour (and vCPU-hour) a job held, at its pool's prices; productive
    leaves out the
    work a preemption, a lost node or a failure threw away (the time since the job's last
    checkpoint). A run that began before --since counts only its part inside the window.
    Members see their own team's projects and jobs; other teams appear as totals.
    """
    with connect(server, token) as client, api_errors("cost"):
        reply = client.cost(by=by.value, since=since)
    if json:
        print_json(reply.model_dump(mode="json"))
    elif csv_:
        write_csv(reply)
    else:
        print_cost(reply)


def write_csv(reply: CostReply) -> None:
    """The groups (and other teams' totals) as CSV on stdout, numbers to 6 decimal places."""
    out = csv.writer(sys.stdout, lineterminator="\n")
    out.writerow(CSV_COLUMNS)
    for r in reply.rows + reply.others:
        out.writerow(
            [
                r.key,
                r.team,
                r.project or "",
                r.job or "",
                r.name or "",
                r.jobs,
                f"{r.gpu_hours:.6f}",
                f"{r.dollars:.6f}",
                f"{r.productive_gpu_hours:.6f}",
                f"{r.productive_dollars:.6f}",
                f"{r.vcpu_hours:.6f}",
                f"{r.productive_vcpu_hours:.6f}",
            ]
        )


def print_cost(reply: CostReply) -> None:
    console.print(_heading(reply), highlight=False)
    if reply.rows or reply.others:
        console.print(cost_table(reply))
    else:
        console.print("no GPU time in this window", style="dim")
    if reply.savings is not None:
        console.print(savings_line(reply.savings), highlight=False)
    for b in reply.budgets:
        console.print(budget_line(b), highlight=False)


def _heading(reply: CostReply) -> str:
    start, end = (_day(t) for t in (reply.since, reply.until))
    return f"[bold]cost by {reply.by}[/], {start} to {end} (UTC)"


def _day(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M")


def cost_table(reply: CostReply) -> Table:
    """The groups, then other teams' totals, then a total row; names shrink before numbers,
    so the table fits 80 columns."""
    table = Table(box=None, pad_edge=False, header_style="bold")
    labels = _label_columns(reply.by)
    for name in labels:
        table.add_column(name, max_width=24 if name == "NAME" else 18)
    if reply.by != "job":
        table.add_column("JOBS", justify="right", no_wrap=True)
    vcpus = reply.total.vcpu_hours > 0
    for name in ("GPU-H", *(["VCPU-H"] if vcpus else []), "DOLLARS", "PROD GPU-H", "PROD $"):
        table.add_column(name, justify="right", no_wrap=True)
    table.add_column("PROD", justify="right", no_wrap=True)
    for r in reply.rows:
        table.add_row(*_labels(r, reply.by), *_numbers(r, reply.by, vcpus))
    for r in reply.others:
        table.add_row(*_other(r, reply.by), *_numbers(r, reply.by, vcpus), style="dim")
    table.add_section()
    blank = [""] * (len(labels) - 1)
    table.add_row("TOTAL", *blank, *_numbers(reply.total, reply.by, vcpus), style="bold")
    return table


def _label_columns(by: str) -> list[str]:
    if by == "team":
        return ["TEAM"]
    if by == "project":
        return ["TEAM", "PROJECT"]
    return ["JOBID", "NAME", "TEAM"]


def _labels(r: CostRow, by: str) -> list[Text | str]:
    if by == "team":
        return [cell(r.team)]
    if by == "project":
        return [cell(r.team), cell(r.project or "-")]
    return [r.job or r.key, cell(r.name or ""), cell(r.team)]


def _other(r: CostRow, by: str) -> list[Text | str]:
    """Labels of another team's total, which a member sees without its projects or jobs."""
    if by == "team":
        return [cell(r.team)]
    if by == "project":
        return [cell(r.team), "(other team)"]
    return ["-", "(other team)", cell(r.team)]


def _numbers(r: CostRow, by: str, vcpus: bool = False) -> list[str]:
    share = r.productive_gpu_hours / r.gpu_hours if r.gpu_hours > 0 else 1.0
    if not r.gpu_hours and r.vcpu_hours > 0:  # CPUs only
        share = r.productive_vcpu_hours / r.vcpu_hours
    jobs = [] if by == "job" else [str(r.jobs)]
    return [
        *jobs,
        f"{r.gpu_hours:,.1f}",
        *([f"{r.vcpu_hours:,.1f}"] if vcpus else []),
        f"${r.dollars:,.2f}",
        f"{r.productive_gpu_hours:,.1f}",
        f"${r.productive_dollars:,.2f}",
        f"{share:.0%}",
    ]


def budget_line(b: BudgetOut) -> str:
    """``budget nlp 2026-11: $8,120.00 of $10,000.00 (81%), past the soft limit``."""
    share = b.spent / b.monthly if b.monthly else 0.0
    tail = {
        "ok": "",
        "warn": f", past the soft limit of ${b.soft:,.2f}",
        "over": ", at the hard limit: only production work is admitted",
    }[b.state]
    color = {"ok": "green", "warn": "yellow", "over": "red"}[b.state]
    return (
        f"budget [bold]{b.team}[/] {b.month}: [{color}]${b.spent:,.2f}[/] of "
        f"${b.monthly:,.2f} ({share:.0%}){tail}"
    )


def savings_line(s: SavingsOut) -> str:
    """``saved vs static pools: $24.00 (static $128.00, fleet $104.00, 2.0 h)``, with a minus
    sign, in red, when the shared fleet cost more than static team pools would have."""
    color = "green" if s.saved_dollars >= 0 else "red"
    sign = "-" if s.saved_dollars < 0 else ""
    return (
        f"saved vs static pools: [{color}]{sign}${abs(s.saved_dollars):,.2f}[/] "
        f"(static ${s.static_dollars:,.2f}, fleet ${s.shared_dollars:,.2f}, {s.hours:,.1f} h)"
    )

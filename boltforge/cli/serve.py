"""``bolt serve``: run an inference service (create or update it from its spec), list the
services with their replicas, load and SLO, or stop one."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from boltforge.cli.common import EXIT_BAD_INPUT, console, print_json
from boltforge.cli.remote import CaOpt, JsonOpt, ServerOpt, TokenOpt, ago, api_errors, connect, fail
from boltforge.wire.services import ServiceRequest, ServiceSummary


def serve_command(
    file: Annotated[
        Path | None,
        typer.Argument(help="Service spec (YAML, `kind: service`).", show_default=False),
    ] = None,
    delete: Annotated[
        str | None, typer.Option(help="Stop the service of this name.", show_default=False)
    ] = None,
    json: JsonOpt = False,
    server: ServerOpt = None,
    token: TokenOpt = None,
    ca: CaOpt = None,
) -> None:
    """Run a service from FILE (or update the one of its name), stop one with --delete, or,
    with neither, list the services: replicas wanted, running and ready, load, and SLO."""
    if file is not None and delete is not None:
        fail("give a FILE to run or --delete NAME, not both", EXIT_BAD_INPUT)
    with connect(server, token) as client, api_errors(str(file or delete or "services")):
        if file is not None:
            shown = [client.apply_service(_request(file))]
        elif delete is not None:
            shown = [client.delete_service(delete)]
        else:
            shown = client.services().services
    if json:
        print_json([s.model_dump(mode="json") for s in shown])
        return
    if not shown:
        console.print("no services. To start one: `bolt serve service.yaml`")
        return
    console.print(services_table(shown))


def _request(file: Path) -> ServiceRequest:
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as e:
        fail(f"{file}: cannot read it ({e.strerror}). To fix: check the path", EXIT_BAD_INPUT)
    return ServiceRequest(yaml=text, source=file.name[:200])


COLUMNS = ("SERVICE", "TEAM", "LIVE/WANT", "RANGE", "READY", "REQ/S", "QUEUE", "P99", "SLO")


def services_table(services: list[ServiceSummary]) -> Table:
    """One row per service: replicas live of wanted, the range, ready ones, load, SLO and
    why the count last changed. Every column but the last keeps its width; the reason is cut
    to what the terminal leaves."""
    now = time.time()
    rows = [_row(s, now) for s in services]
    table = Table(box=None, pad_edge=False, header_style="bold")
    for i, name in enumerate(COLUMNS):
        width = max([len(name), *(Text.from_markup(r[i]).cell_len for r in rows)])
        table.add_column(name, no_wrap=True, min_width=width)
    table.add_column("WHY", no_wrap=True, overflow="ellipsis", ratio=1)
    for row in rows:
        table.add_row(*row)
    return table


def _row(s: ServiceSummary, now: float) -> list[str]:
    load = s.load
    return [
        escape(s.name),
        escape(s.team),
        f"{s.live}/{s.desired}",
        f"{s.min_replicas}-{s.max_replicas}",
        str(s.ready),
        "-" if load is None else f"{load.requests_per_s:.1f}",
        "-" if load is None else f"{load.queued:.0f}",
        "-" if load is None or load.p99_ms is None else f"{load.p99_ms:.0f}ms",
        _slo(s),
        escape(f"{s.reason} ({ago(s.scaled_at, now)})" if s.scaled_at else s.reason),
    ]


def _slo(s: ServiceSummary) -> str:
    if s.latency_slo_ms is None:
        return "-"
    word = {None: "[dim]?[/]", True: "[green]met[/]", False: "[red]missed[/]"}[s.slo_met]
    return f"{s.latency_slo_ms:g}ms {word}"

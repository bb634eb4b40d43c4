"""``bolt admin backup|restore``: copy the control plane's store to one portable file while
the server runs, and load such a file into a fresh store that a new server carries on from
(SQLite or PostgreSQL either side)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn
from rich.table import Table

from boltforge.cli.common import console, errors, print_json
from boltforge.cli.remote import JsonOpt, fail
from boltforge.control.store.backups import (
    BackupError,
    BackupSummary,
    RestoreSummary,
    backup,
    restore,
)
from boltforge.control.store.db import default_url

admin_app = typer.Typer(
    help="Back up the control plane's store, and restore it into a fresh one (operators).",
    no_args_is_help=True,
)

DbOpt = Annotated[
    str | None,
    typer.Option(
        "--db",
        help="Store URL, as `bolt server --db` takes it (default: the server's default, "
        "SQLite under the user's data directory), e.g. postgresql+psycopg://user@host/db.",
        show_default=False,
    ),
]


@admin_app.command("backup")
def backup_command(
    file: Annotated[
        Path,
        typer.Argument(
            help="The backup file to write (gzip-compressed JSON Lines), e.g. "
            "boltforge-2026-01-15.bak.gz.",
            show_default=False,
        ),
    ],
    db: DbOpt = None,
    json: JsonOpt = False,
) -> None:
    """Back up the store to FILE, as one snapshot, while the server runs.

    Every row of every table is read in one read-only transaction. FILE appears only once it
    is complete (it is written as FILE.partial and renamed), so a backup that fails leaves
    no file that looks complete, and an older FILE as it was.
    """
    with _failures(), _bars(json) as bars:
        summary = backup(db or default_url(), file, bars)
    if json:
        print_json(_as_json(summary))
        return
    console.print(rows_table(summary.tables))
    console.print(
        f"backed up {summary.rows} rows of {len(summary.tables)} tables (schema revision "
        f"{summary.revision}) from {summary.url} to {summary.path} ({size(summary.bytes)})",
        highlight=False,
        markup=False,
    )


@admin_app.command("restore")
def restore_command(
    file: Annotated[
        Path, typer.Argument(help="A file `bolt admin backup` wrote.", show_default=False)
    ],
    db: DbOpt = None,
    force: Annotated[
        bool,
        typer.Option(
            "--force", help="Replace what the store holds (refused without it when not empty)."
        ),
    ] = False,
    json: JsonOpt = False,
) -> None:
    """Restore FILE into an empty store, for a new server to carry on from.

    The schema is then upgraded to this version's: start `bolt server --db` on the store to
    carry on where the backed-up server was. The whole file is checked first, and the rows
    land in one transaction: a restore that fails leaves the store as it was. A store that
    holds data is refused unless --force.
    """
    url = db or default_url()
    with _failures(), _bars(json) as bars:
        summary = restore(file, url, force, bars)
    if json:
        print_json(_as_json(summary))
        return
    console.print(rows_table(summary.tables))
    replaced = f", replacing the {summary.replaced} rows it held" if summary.replaced else ""
    console.print(
        f"restored {summary.rows} rows of {len(summary.tables)} tables from {summary.path} "
        f"(taken {summary.created_at} at schema revision {summary.revision}) into "
        f"{summary.url}{replaced}; schema now at revision {summary.schema}",
        highlight=False,
        markup=False,
    )
    console.print(f"To carry on: bolt server --db {url}", highlight=False, markup=False)


def rows_table(tables: dict[str, int]) -> Table:
    """One line per table with its rows, then the total."""
    table = Table(box=None, pad_edge=False, header_style="bold", show_footer=True)
    table.add_column("TABLE", footer="total")
    table.add_column("ROWS", justify="right", footer=str(sum(tables.values())))
    for name, rows in tables.items():
        table.add_row(name, str(rows))
    return table


def size(n: int) -> str:
    """``812 B``, ``2.6 KiB``, ``41.0 MiB``: a file size at a glance."""
    shown = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if shown < 1024 or unit == "GiB":
            return f"{n} B" if unit == "B" else f"{shown:.1f} {unit}"
        shown /= 1024
    return f"{n} B"


def _as_json(s: BackupSummary | RestoreSummary) -> dict[str, Any]:
    """A summary as ``--json`` prints it: ``file`` and ``db``, then its other fields and
    ``rows``."""
    fields = {k: v for k, v in dataclasses.asdict(s).items() if k not in ("path", "url")}
    return {"file": s.path, "db": s.url, **fields, "rows": s.rows}


@contextmanager
def _failures() -> Iterator[None]:
    """A ``BackupError`` (it names the problem and the fix) exits 1 in one line; Ctrl-C 130
    (a backup then leaves no file, a restore the store as it was)."""
    try:
        yield
    except BackupError as e:
        fail(escape(str(e)))
    except KeyboardInterrupt:
        raise typer.Exit(130) from None


class _TableBars:
    """A progress callback that keeps one bar per table."""

    def __init__(self, bars: Progress) -> None:
        self.bars = bars
        self.tasks: dict[str, TaskID] = {}

    def __call__(self, table: str, done: int, total: int) -> None:
        if table not in self.tasks:
            self.tasks[table] = self.bars.add_task(table, total=total)
        self.bars.update(self.tasks[table], completed=done)


@contextmanager
def _bars(quiet: bool) -> Iterator[_TableBars]:
    """Progress bars on stderr, shown only on a terminal and not with --json."""
    columns = (TextColumn("{task.description:>14}"), BarColumn(), MofNCompleteColumn())
    shown = not quiet and errors.is_terminal
    with Progress(*columns, console=errors, transient=True, disable=not shown) as bars:
        yield _TableBars(bars)

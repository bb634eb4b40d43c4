"""``bolt artifacts JOB [--out DIR]``: list a job's artifacts, or download them and check
each one's sha256."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from boltforge.cli.common import console, errors, print_json
from boltforge.cli.remote import CaOpt, JsonOpt, ServerOpt, TokenOpt, api_errors, connect
from boltforge.client import Client
from boltforge.wire.jobs import Artifact

EXIT_MISMATCH = 1


def artifacts_command(
    job: Annotated[str, typer.Argument(help="Job id.", show_default=False)],
    out: Annotated[
        Path | None,
        typer.Option(
            metavar="DIR",
            help="Download every artifact into DIR (as DIR/<rank>/<path>), checking each "
            "one's sha256.",
        ),
    ] = None,
    server: ServerOpt = None,
    token: TokenOpt = None,
    ca: CaOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """List a job's artifacts (the `outputs:` its replicas left, by rank), or download them.
    Exits 1 when a download's sha256 is not the one the server recorded (the file is then
    not kept)."""
    with connect(server, token) as client, api_errors(job):
        found = client.artifacts(job).artifacts
        if out is not None:
            bad = [a.name for a in found if not _download(client, job, a, out)]
        else:
            bad = []
    if json_out:
        print_json({"job": job, "artifacts": [a.model_dump() for a in found], "mismatched": bad})
    else:
        console.print(_table(job, found, out))
    if bad:
        errors.print(
            f"[bold red]error[/] sha256 mismatch, not kept: {escape(', '.join(bad))}. "
            "To fix: download again",
            highlight=False,
        )
        raise typer.Exit(EXIT_MISMATCH)


def _download(client: Client, job: str, artifact: Artifact, out: Path) -> bool:
    """Fetch ``artifact`` into ``out``; True when its sha256 matches (else nothing kept)."""
    target = out / artifact.name
    target.parent.mkdir(parents=True, exist_ok=True)
    part = target.with_name(target.name + ".part")
    digest = hashlib.sha256()
    with part.open("wb") as f:
        for chunk in client.download_artifact(job, artifact.name):
            digest.update(chunk)
            f.write(chunk)
    if digest.hexdigest() != artifact.sha256:
        part.unlink()
        return False
    part.replace(target)
    return True


def _table(job: str, found: list[Artifact], out: Path | None) -> Table | str:
    if not found:
        return f"job {job} has no artifacts (yet: they arrive once each replica has ended)"
    title = f"job {job}: {len(found)} artifact(s)" + (f" downloaded to {out}" if out else "")
    table = Table(title=title, title_justify="left", box=None)
    for column in ("NAME", "SIZE", "SHA256", "EPOCH"):
        table.add_column(column, justify="right" if column == "SIZE" else "left")
    for a in found:
        table.add_row(escape(a.name), _size(a.size), a.sha256[:12], str(a.epoch))
    return table


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)

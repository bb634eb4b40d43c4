"""Plumbing shared by the commands that talk to a server: the --server/--token options,
connecting, turning refusals into one-line errors and exit codes, and short time text."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated, NoReturn

import typer
from rich.text import Text

from boltforge.cli.common import EXIT_BAD_INPUT, errors
from boltforge.client import ApiFailure, Client, resolve

EXIT_REFUSED = 1

ServerOpt = Annotated[
    str | None,
    typer.Option(
        "--server",
        help="Control plane URL (default: BOLT_SERVER, then the address `bolt up` saved, "
        "then http://127.0.0.1:8600).",
        show_default=False,
    ),
]
TokenOpt = Annotated[
    str | None,
    typer.Option(
        "--token",
        help="API token (default: BOLT_TOKEN, then the token `bolt up` saved).",
        show_default=False,
    ),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")]


def fail(message: str, code: int = EXIT_REFUSED) -> NoReturn:
    """Print ``error: message`` (which ends with the fix) on stderr and exit with ``code``."""
    errors.print(f"[bold red]error[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def connect(server: str | None, token: str | None) -> Client:
    """A client for the resolved server and token; exits 2 when there is no token at all."""
    url, tok = resolve(server, token)
    if not tok:
        fail(
            "no API token. To fix: pass --token, set BOLT_TOKEN, or start a local fleet "
            "with `bolt up`",
            EXIT_BAD_INPUT,
        )
    return Client(url, tok)


@contextmanager
def api_errors(source: str = "request") -> Iterator[None]:
    """Turn an ``ApiFailure`` into a clean exit: bad input (400, 422) prints each problem with
    its field and fix and exits 2; any other refusal, or no answer, exits 1."""
    try:
        yield
    except ApiFailure as e:
        if e.status in (400, 422) and e.problems:
            head = f"[bold red]error[/] {source}: {len(e.problems)} problem(s)"
            errors.print(head, highlight=False, soft_wrap=True)
            for p in e.problems:
                shown = "" if p.value is None else f" (got {p.value!r})"
                line = f"  - {p.field}: {p.message}{shown}"
                errors.print(line, highlight=False, markup=False, soft_wrap=True)
            raise typer.Exit(EXIT_BAD_INPUT) from None
        code = EXIT_BAD_INPUT if e.status in (400, 422) else EXIT_REFUSED
        status = f" ({e.status})" if e.status else ""
        errors.print(f"[bold red]error[/]{status} ", end="", highlight=False)
        errors.print(e.message, highlight=False, markup=False, soft_wrap=True)
        raise typer.Exit(code) from None
    except KeyboardInterrupt:
        raise typer.Exit(130) from None


def span(seconds: float) -> str:
    """``45 s``, ``12 min``, ``3.5 h`` or ``2 d``: a duration at a glance."""
    s = abs(seconds)
    if s < 90:
        return f"{math.ceil(s)} s"
    if s < 90 * 60:
        return f"{round(s / 60)} min"
    if s < 48 * 3600:
        return f"{s / 3600:.1f} h"
    return f"{s / 86400:.0f} d"


def until(at: float | None, now: float | None = None) -> str:
    """An estimated start as ``~12 min`` from now (``now`` when it is due, ``?`` unknown)."""
    if at is None:
        return "?"
    left = at - (time.time() if now is None else now)
    return "now" if left <= 1 else f"~{span(left)}"


def ago(at: float | None, now: float | None = None) -> str:
    """A past moment as ``12 min ago`` (``-`` when unknown)."""
    if at is None:
        return "-"
    return f"{span((time.time() if now is None else now) - at)} ago"


def cell(text: str) -> Text:
    """A table cell that is cut with an ellipsis, never wrapped, when its column must shrink
    to fit the terminal (put it in a column with ``no_wrap=False`` so that column shrinks
    before the short, fixed ones)."""
    return Text(text, no_wrap=True, overflow="ellipsis")


def shorten(text: str, width: int) -> str:
    """``text`` cut to ``width`` characters with an ellipsis."""
    return text if len(text) <= width else text[: max(width - 1, 0)] + "…"

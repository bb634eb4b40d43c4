"""Plumbing shared by the commands that talk to a server: the --server/--token/--ca options,
connecting, turning refusals into one-line errors and exit codes, and short time text."""

from __future__ import annotations

import math
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated, NoReturn

import typer
from rich.markup import escape
from rich.text import Text
from typer._click.globals import get_current_context

from boltforge.cli.common import EXIT_BAD_INPUT, errors
from boltforge.client import ApiFailure, Client, resolve, resolve_ca

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
CA_KEY = "boltforge.ca"  # where --ca leaves its value in the click context's meta


def _given_ca(ctx: typer.Context, value: str | None) -> None:
    """Keep a --ca given on a command or on its group for ``connect``."""
    if value:
        ctx.meta[CA_KEY] = value


CaOpt = Annotated[
    str | None,
    typer.Option(
        "--ca",
        metavar="PATH",
        help="CA certificate(s) (PEM) to verify an https server with (default: BOLT_CA, "
        "then the CA `bolt up --tls` saved, then the system's trusted CAs).",
        show_default=False,
        expose_value=False,  # it reaches `connect` through the click context
        callback=_given_ca,
    ),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")]


def fail(message: str, code: int = EXIT_REFUSED) -> NoReturn:
    """Print ``error: message`` (which ends with the fix) on stderr and exit with ``code``.
    ``message`` is plain text: brackets in it (user input, validation messages) are shown
    as they are, never read as markup."""
    errors.print(f"[bold red]error[/] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def connect(server: str | None, token: str | None) -> Client:
    """A client for the resolved server, token and CA bundle (``--ca`` on the command that
    runs, see ``CaOpt``, else ``client.resolve_ca``); exits 2 when there is no token at all
    or the CA bundle cannot be loaded."""
    url, tok = resolve(server, token)
    if not tok:
        fail(
            "no API token. To fix: pass --token, set BOLT_TOKEN, or start a local fleet "
            "with `bolt up`",
            EXIT_BAD_INPUT,
        )
    given = _ca_given()
    ca = resolve_ca(url, given)
    if ca is None:
        return Client(url, tok)
    from boltforge.tls import BadCA  # loads cryptography: only for those who use TLS

    try:
        return Client(url, tok, ca=ca)
    except BadCA as e:
        source = "--ca" if given else "BOLT_CA" if os.environ.get("BOLT_CA") else "saved CA"
        fail(
            f"{source} {e}. To fix: pass --ca (or set BOLT_CA) to the PEM file of the CA "
            "that signed the server's certificate",
            EXIT_BAD_INPUT,
        )


def _ca_given() -> str | None:
    """The --ca of the command that runs, when one was given."""
    ctx = get_current_context(silent=True)
    return ctx.meta.get(CA_KEY) if ctx is not None else None


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

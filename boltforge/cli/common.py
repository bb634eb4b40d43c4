"""Shared CLI plumbing: the rich console and turning spec errors into clean exits."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import typer
from rich.console import Console

from boltforge.spec.errors import SpecError

console = Console(soft_wrap=True)
errors = Console(stderr=True)

EXIT_BAD_INPUT = 2


@contextmanager
def spec_errors() -> Iterator[None]:
    """Print a ``SpecError`` as a list of fixable problems and exit 2, never a traceback."""
    try:
        yield
    except SpecError as e:
        head = f"[bold red]error[/] {e.source}: {len(e.problems)} problem(s)"
        errors.print(head, highlight=False, soft_wrap=True)
        for p in e.problems:
            errors.print(f"  - {p.render()}", highlight=False, markup=False, soft_wrap=True)
        raise typer.Exit(EXIT_BAD_INPUT) from None


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=False) + "\n")


def timed(fn: Callable[[], Any], clock: Callable[[], float]) -> tuple[Any, float]:
    """Run ``fn`` and return its result with the elapsed milliseconds."""
    start = clock()
    out = fn()
    return out, (clock() - start) * 1000.0

"""Every command's ``--help`` at 80 columns: no line wider than the terminal, and no
sentence broken before the line is full (what hand-wrapped docstrings gave rich)."""

from __future__ import annotations

from collections.abc import Iterator
from itertools import pairwise

import pytest
import typer
from typer import _click as click
from typer.testing import CliRunner

from boltforge.cli.helptext import reflow
from boltforge.cli.main import app

COLUMNS = 80
TEXT = COLUMNS - 2  # rich pads the description one column each side
runner = CliRunner()


def commands(command: click.Command, ctx: click.Context, path: list[str]) -> Iterator[str]:
    yield " ".join(path)
    for name in getattr(command, "list_commands", lambda _: [])(ctx):
        sub = command.get_command(ctx, name)  # type: ignore[attr-defined]
        yield from commands(sub, click.Context(sub, parent=ctx, info_name=name), [*path, name])


root = typer.main.get_command(app)
EVERY = list(commands(root, click.Context(root, info_name="bolt"), []))


def early_breaks(help_text: str) -> list[str]:
    """Description lines (those before the first panel) that end although the next line's
    first word would have fitted on them: a break rich did not choose."""
    lines = help_text.split("\n")
    end = next((i for i, line in enumerate(lines) if line.startswith("╭")), len(lines))
    found = []
    for line, after in pairwise(lines[:end]):
        text, following = line.rstrip(), after.strip()
        if not text.strip() or not following or after.startswith("  ") or following[:2] == "- ":
            continue
        if len(text) + 1 + len(following.split()[0]) <= TEXT:
            found.append(text)
    return found


@pytest.mark.parametrize("path", EVERY)
def test_help_fits_80_columns_without_early_breaks(path: str) -> None:
    result = runner.invoke(
        app, [*path.split(), "--help"], prog_name="bolt", env={"COLUMNS": str(COLUMNS)}
    )
    assert result.exit_code == 0, result.output
    assert max(len(line) for line in result.output.split("\n")) <= COLUMNS
    assert early_breaks(result.output) == []


def test_every_command_is_checked() -> None:
    assert {"", "submit", "queue", "nodes drain", "admin restore", "demo"} <= set(EVERY)


def test_the_check_finds_a_hand_wrapped_paragraph() -> None:
    broken = " Runs go in parallel processes. A spot pool loses hosts\n at random (seeded).\n"
    assert early_breaks(broken) == [" Runs go in parallel processes. A spot pool loses hosts"]


def test_reflow_joins_paragraph_lines_and_keeps_paragraphs_and_items() -> None:
    text = """First line
    goes on.

    Second paragraph with ``code``
    that goes on.

    - an item
      continued
    - another item
    \f
    not help
    kept as is"""
    assert reflow(text) == (
        "First line goes on.\n\nSecond paragraph with `code` that goes on.\n\n"
        "- an item continued\n- another item\f\nnot help\nkept as is"
    )


def test_reflow_leaves_verbatim_paragraphs_alone() -> None:
    text = "Intro.\n\n\b\nline one\nline two"
    assert reflow(text) == text

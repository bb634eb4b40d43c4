"""Help texts that rich can wrap: docstrings reflowed before ``--help`` renders them.

Docstrings are wrapped by hand at the source's line length; typer hands their paragraphs
to rich with those line breaks kept, and rich then wraps each hand-made line again at the
terminal's width, breaking sentences mid-line. ``reflow`` joins each paragraph into one
line so that rich alone decides where lines end; ``reflow_tree`` applies it to a command,
its parameters and its subcommands.
"""

from __future__ import annotations

import inspect

from typer import _click as click

VERBATIM = "\b"  # click's marker: a paragraph that starts with it keeps its line breaks
NO_HELP = "\f"  # click's marker: what follows it is not help
ITEM = ("- ", "* ")


def reflow(text: str) -> str:
    """``text`` dedented, each paragraph's lines joined by single spaces, with a list item
    (a line starting ``- `` or ``* ``) kept on a line of its own and a paragraph marked
    ``\\b`` or indented as a whole left as written; ``` ``code`` ``` becomes ``` `code` ```.
    Anything after ``\\f`` is left as it is."""
    shown, mark, rest = inspect.cleandoc(text).partition(NO_HELP)
    paragraphs = [_paragraph(p) for p in shown.split("\n\n")]
    return "\n\n".join(paragraphs).replace("``", "`") + mark + rest


def _paragraph(paragraph: str) -> str:
    if paragraph.startswith((VERBATIM, " ")):
        return paragraph
    lines: list[str] = []
    for line in paragraph.split("\n"):
        if not line.strip():
            continue
        if lines and not line.lstrip().startswith(ITEM):
            lines[-1] = f"{lines[-1].rstrip()} {line.strip()}"
        else:
            lines.append(line.rstrip())
    return "\n".join(lines)


def reflow_tree(command: click.Command) -> click.Command:
    """``command`` with its help, its parameters' help and, for a group, every loaded
    subcommand's help reflowed in place; returns ``command``."""
    if command.help:
        command.help = reflow(command.help)
    for param in command.params:
        text = getattr(param, "help", None)
        if text:
            param.help = reflow(text)  # type: ignore[attr-defined]
    for sub in getattr(command, "commands", {}).values():
        reflow_tree(sub)
    return command

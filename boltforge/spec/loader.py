"""Reading YAML files, with missing files and syntax errors reported as ``SpecError``.

Every YAML a user writes (job, service, fleet, teams and inventory files, and the YAML text
the API is sent) is read here, by a loader that takes plain data only (``yaml.SafeLoader``)
and refuses, while the document is composed and before any value is built:

* aliases (``*name``): the document's size is then its text's size, so a small request
  cannot unfold into a large one (the "billion laughs");
* nesting deeper than ``MAX_DEPTH`` levels (specs need fewer than ten), which would
  otherwise exhaust the interpreter's stack.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from yaml.nodes import Node

from boltforge.spec.errors import _MISSING, SpecError, SpecProblem

MAX_DEPTH = 32


class Refused(yaml.MarkedYAMLError):
    """A document the loader will not build: ``problem`` says why and how to fix it."""


class BoundedLoader(yaml.SafeLoader):
    """``SafeLoader`` that refuses aliases and nesting past ``MAX_DEPTH`` (module docstring)."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.depth = 0

    def compose_node(self, parent: Node | None, index: int) -> Node | None:
        event = self.peek_event()  # type: ignore[no-untyped-call]
        if isinstance(event, yaml.AliasEvent):
            raise _refused(
                "uses an alias (*name). To fix: write the value out in full; "
                "aliases and anchors are not accepted",
                event,
            )
        if self.depth >= MAX_DEPTH:
            raise _refused(f"nests deeper than {MAX_DEPTH} levels. To fix: flatten it", event)
        self.depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1


def _refused(problem: str, event: yaml.Event) -> Refused:
    mark = event.start_mark
    return Refused(problem=problem, problem_mark=mark if isinstance(mark, yaml.Mark) else None)


def read_yaml(path: str | Path) -> Any:
    """Load one YAML document from ``path``."""
    return parse_yaml(read_text(path), str(path))


def read_text(path: str | Path) -> str:
    """The UTF-8 text of ``path``; ``SpecError`` naming the file when it cannot be read."""
    p = Path(path)
    try:
        return p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpecError(str(p), [SpecProblem("file", _MISSING, "does not exist")]) from None
    except (IsADirectoryError, PermissionError, UnicodeDecodeError) as e:
        raise SpecError(str(p), [SpecProblem("file", _MISSING, f"cannot be read: {e}")]) from None


def parse_yaml(text: str, source: str) -> Any:
    """Load one YAML document from ``text`` with ``BoundedLoader``; syntax errors and
    refused documents become a ``SpecError`` naming the line and column."""
    try:
        loader = BoundedLoader(text)  # reads the text: a character YAML forbids raises here
        try:
            return loader.get_single_data()
        finally:
            loader.dispose()
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "somewhere"
        problem = getattr(e, "problem", None) or str(e)
        if not isinstance(e, Refused):
            problem = f"{problem}. To fix: correct the syntax"
        raise SpecError(source, [SpecProblem(f"yaml ({where})", _MISSING, problem)]) from None

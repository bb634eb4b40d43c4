"""Reading YAML files, with missing files and syntax errors reported as ``SpecError``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from boltforge.spec.errors import _MISSING, Problem, SpecError


def read_yaml(path: str | Path) -> Any:
    """Load one YAML document from ``path``."""
    return parse_yaml(read_text(path), str(path))


def read_text(path: str | Path) -> str:
    """The UTF-8 text of ``path``; ``SpecError`` naming the file when it cannot be read."""
    p = Path(path)
    try:
        return p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpecError(str(p), [Problem("file", _MISSING, "does not exist")]) from None
    except (IsADirectoryError, PermissionError, UnicodeDecodeError) as e:
        raise SpecError(str(p), [Problem("file", _MISSING, f"cannot be read: {e}")]) from None


def parse_yaml(text: str, source: str) -> Any:
    """Load one YAML document from ``text``; syntax errors become a ``SpecError`` naming the
    line and column."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "somewhere"
        problem = getattr(e, "problem", None) or str(e)
        raise SpecError(
            source, [Problem(f"yaml ({where})", _MISSING, f"{problem}. To fix: correct the syntax")]
        ) from None

"""Spec errors that name the field, the value and the fix, never a traceback."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError


@dataclass(frozen=True, slots=True)
class SpecProblem:
    """One thing wrong with a spec: where (``field``), what was given, and how to fix it."""

    field: str
    value: Any
    message: str

    def render(self) -> str:
        shown = "" if self.value is _MISSING else f" (got {self.value!r})"
        return f"{self.field}: {self.message}{shown}"


class SpecError(Exception):
    """A spec file could not be used; ``problems`` lists every reason, each with its fix."""

    def __init__(self, source: str, problems: list[SpecProblem]) -> None:
        self.source = source
        self.problems = problems
        super().__init__(self.render())

    def render(self) -> str:
        lines = [f"{self.source}: {len(self.problems)} problem(s)"]
        lines += ["  " + p.render() for p in self.problems]
        return "\n".join(lines)


class _Missing:
    def __repr__(self) -> str:
        return "<missing>"


_MISSING: Any = _Missing()

_HINTS = {
    "missing": "is required. To fix: add it",
    "extra_forbidden": "is not a known field. To fix: remove it or check its spelling",
    "int_parsing": "must be a whole number",
    "int_type": "must be a whole number",
    "float_parsing": "must be a number",
    "bool_parsing": "must be true or false",
    "model_type": "must be a mapping of its own fields. To fix: write it as `key: value` lines "
    "under the field (see the examples in the docs)",
    "model_attributes_type": "must be a mapping of its own fields. To fix: write it as "
    "`key: value` lines under the field",
    "dict_type": "must be a mapping. To fix: write it as `key: value` lines under the field",
    "list_type": "must be a list. To fix: write each item on its own `- ` line",
    "greater_than": "is too small",
    "greater_than_equal": "is too small",
    "less_than_equal": "is too large",
    "string_pattern_mismatch": (
        "must be lowercase letters, digits, '-', '_' or '.', starting with a letter or digit. "
        "To fix: e.g. `llama-pretrain`"
    ),
}

# Limits (``spec/bounds.py``) whose own message names the limit; the fix is added.
_FIXES = {
    "string_too_long": "shorten it",
    "too_long": "give fewer items",
    "less_than": "change the value",
    "finite_number": "give a finite number",
}


def _path(prefix: str, loc: tuple[int | str, ...]) -> str:
    out = prefix
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out


def from_validation(source: str, prefix: str, error: ValidationError) -> SpecError:
    """Turn pydantic's errors into ``SpecProblem``s with field paths like ``job.roles[0].gpus``."""
    problems = []
    for e in error.errors(include_url=False):
        loc = tuple(p for p in e["loc"] if not str(p).startswith("function-"))
        kind = e["type"]
        message = str(e["msg"]).removeprefix("Value error, ")
        if kind == "missing" and loc == ("team",):
            message = "is required: every job belongs to a team. To fix: add `team: <your team>`"
        elif kind == "string_pattern_mismatch" and loc and loc[-1] == "name" and "pool" in str(loc):
            message = "must be lowercase letters, digits and '-'. To fix: e.g. `h100`"
        elif kind in _HINTS and kind not in (
            "greater_than",
            "less_than_equal",
            "greater_than_equal",
        ):
            message = _HINTS[kind]
        elif kind in _HINTS:
            message = f"{message}. To fix: change the value"
        elif kind in _FIXES:
            message = f"{message}. To fix: {_FIXES[kind]}"
        value = _MISSING if kind == "missing" else e.get("input", _MISSING)
        if isinstance(value, dict | list):
            value = _MISSING
        problems.append(SpecProblem(_path(prefix, loc), value, message))
    return SpecError(source, problems)

"""The scheduling core stays pure: no I/O, no clock, no global randomness, no outer layers."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

CORE = Path(__file__).resolve().parents[3] / "boltforge" / "core"
CORE_FILES = sorted(CORE.rglob("*.py"))

# Standard-library modules with no I/O, clock or global state, plus numpy and the core itself.
ALLOWED_MODULES = frozenset(
    {
        "__future__",
        "abc",
        "bisect",
        "collections",
        "dataclasses",
        "enum",
        "functools",
        "heapq",
        "itertools",
        "math",
        "numbers",
        "operator",
        "types",
        "typing",
        "numpy",
    }
)
ALLOWED_PACKAGE = "boltforge.core"

# Why some tempting imports are refused, so a failure says what to do instead.
WHY = {
    "random": "core takes a seeded RNG as input; never import random",
    "time": "core takes `now` as an argument; never read the clock",
    "datetime": "core takes `now` as an argument; never read the clock",
    "logging": "core returns explanations; callers log them",
}
FORBIDDEN_CALLS = {
    "open": "no file I/O in core",
    "print": "no output from core; return explanations instead",
    "input": "no console input in core",
    "breakpoint": "no debugger hooks in core",
    "__import__": "no dynamic imports in core",
    "exec": "no dynamic code in core",
    "eval": "no dynamic code in core",
}
# Attribute chains that reach global state even through allowed modules.
FORBIDDEN_ATTRIBUTES = {
    "time": "core takes `now` as an argument; never read the clock",
    "np.random": "core takes a seeded RNG as input; numpy's global RNG is off limits",
    "numpy.random": "core takes a seeded RNG as input; numpy's global RNG is off limits",
}
ALLOWED_RANDOM_ATTRIBUTES = frozenset({"Generator"})  # type annotations for an injected RNG


@dataclass(frozen=True, slots=True)
class Violation:
    """One thing in a core file that breaks the boundary."""

    line: int
    what: str
    why: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.what} ({self.why})"


def _allowed(module: str) -> bool:
    if module == ALLOWED_PACKAGE or module.startswith(ALLOWED_PACKAGE + "."):
        return True
    return module.split(".")[0] in ALLOWED_MODULES


def _why(module: str) -> str:
    return WHY.get(module.split(".")[0], f"only {ALLOWED_PACKAGE}, numpy and pure stdlib")


def _dotted(node: ast.expr) -> str | None:
    """``a.b.c`` for a chain of names and attributes, else None."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return ".".join(reversed(parts))


def _imported(node: ast.Import | ast.ImportFrom, package: str) -> list[str]:
    """Fully qualified names an import statement brings in (relative imports resolved)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        parent = package.split(".")[: len(package.split(".")) - node.level + 1]
        base = ".".join([*parent, base] if base else parent)
    # ``from boltforge import spec`` imports a package, so judge ``boltforge.spec``.
    if base in {"boltforge", ""}:
        return [f"{base}.{alias.name}".lstrip(".") for alias in node.names]
    return [base]


def violations(source: str, package: str = ALLOWED_PACKAGE) -> list[Violation]:
    """Everything in ``source`` (a module of ``package``) that the core must not do."""
    found: list[Violation] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import | ast.ImportFrom):
            for name in _imported(node, package):
                if not _allowed(name):
                    found.append(Violation(node.lineno, f"imports {name}", _why(name)))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            if node.func.id in FORBIDDEN_CALLS:
                what = f"calls {node.func.id}()"
                found.append(Violation(node.lineno, what, FORBIDDEN_CALLS[node.func.id]))
        elif isinstance(node, ast.Attribute):
            chain = _dotted(node.value)
            if chain in FORBIDDEN_ATTRIBUTES and not (
                chain.endswith("random") and node.attr in ALLOWED_RANDOM_ATTRIBUTES
            ):
                what = f"uses {chain}.{node.attr}"
                found.append(Violation(node.lineno, what, FORBIDDEN_ATTRIBUTES[chain]))
    return sorted(found, key=lambda v: v.line)


def test_the_core_package_has_modules_to_check() -> None:
    assert len(CORE_FILES) >= 10, f"expected the core's modules under {CORE}"


@pytest.mark.parametrize("path", CORE_FILES, ids=[p.name for p in CORE_FILES])
def test_core_module_stays_inside_the_boundary(path: Path) -> None:
    package = ".".join(["boltforge", *path.parent.relative_to(CORE.parent).parts])
    problems = violations(path.read_text(encoding="utf-8"), package)
    assert not problems, f"{path.relative_to(CORE.parent.parent)}:\n" + "\n".join(
        f"  {p}" for p in problems
    )


SAMPLES = [
    ("import os", "imports os"),
    ("import sys", "imports sys"),
    ("import time", "imports time"),
    ("from datetime import datetime", "imports datetime"),
    ("import socket", "imports socket"),
    ("import asyncio", "imports asyncio"),
    ("import io", "imports io"),
    ("from pathlib import Path", "imports pathlib"),
    ("import subprocess", "imports subprocess"),
    ("import yaml", "imports yaml"),
    ("from pydantic import BaseModel", "imports pydantic"),
    ("import sqlalchemy.orm", "imports sqlalchemy.orm"),
    ("import threading", "imports threading"),
    ("import logging", "imports logging"),
    ("import random", "imports random"),
    ("from boltforge.spec.units import seconds", "imports boltforge.spec.units"),
    ("from boltforge import cli", "imports boltforge.cli"),
    ("from ..spec import errors", "imports boltforge.spec"),
    ("def f():\n    import os\n", "imports os"),
    ("x = open('fleet.yaml')", "calls open()"),
    ("print('placed')", "calls print()"),
    ("from boltforge.core import levels\nt = time.monotonic()", "uses time.monotonic"),
    ("import numpy as np\nx = np.random.rand(3)", "uses np.random.rand"),
]


@pytest.mark.parametrize(("source", "expected"), SAMPLES, ids=[s[1] for s in SAMPLES])
def test_the_checker_catches(source: str, expected: str) -> None:
    assert expected in [v.what for v in violations(source)]


CLEAN = [
    "from __future__ import annotations",
    "from dataclasses import dataclass, field",
    "from collections import defaultdict",
    "import numpy as np\nimport numpy.typing as npt",
    "from boltforge.core.model.levels import Level",
    "from boltforge.core import cost as costs",
    "from . import levels",
    "from .state import FleetState",
    "import numpy as np\ndef f(rng: np.random.Generator) -> float:\n    return rng.random()",
    "def f(state):\n    return state.time.end",
]


@pytest.mark.parametrize("source", CLEAN, ids=[s.splitlines()[-1] for s in CLEAN])
def test_the_checker_accepts(source: str) -> None:
    assert violations(source) == []


def test_random_is_refused_with_the_reason() -> None:
    (problem,) = violations("import random")
    assert "seeded RNG" in problem.why

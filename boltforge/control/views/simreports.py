"""Simulation reports the console opens: folders that ``bolt simulate --report`` wrote.

Contract: a report is a direct sub-folder of the server's reports folder (``bolt server
--reports``) holding a ``summary.json``; its name is the folder's name. Only ``.png`` files
directly inside a report are served, and names are checked against the folder's listing, so
no path outside it can be reached. A report whose ``summary.json`` cannot be read is left out
of the list (and named in the error when opened).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from boltforge.wire.console import ReportEntry, ReportOut

SUMMARY = "summary.json"


class ReportError(Exception):
    """A report that is missing or unreadable; the message names it and the fix."""


def listing(root: Path) -> list[ReportEntry]:
    """Every readable report under ``root``, newest first (none if ``root`` is missing)."""
    if not root.is_dir():
        return []
    out = []
    for folder in sorted(p for p in root.iterdir() if (p / SUMMARY).is_file()):
        try:
            summary = _summary(folder)
        except ReportError:
            continue
        out.append(
            ReportEntry(
                name=folder.name,
                title=str(summary.get("title", folder.name)),
                policies=sorted(summary.get("policies") or {}),
                created_at=(folder / SUMMARY).stat().st_mtime,
            )
        )
    return sorted(out, key=lambda r: -r.created_at)


def report(root: Path, name: str) -> ReportOut:
    """The report ``name``: title, command, comparison table and plot files."""
    folder = _folder(root, name)
    summary = _summary(folder)
    columns, rows = _table(summary)
    return ReportOut(
        name=name,
        title=str(summary.get("title", name)),
        command=str(summary.get("command", "")),
        columns=columns,
        rows=rows,
        files=sorted(p.name for p in folder.glob("*.png")),
    )


def plot(root: Path, name: str, file: str) -> Path:
    """The path of plot ``file`` of report ``name`` (``ReportError`` if it has none such)."""
    folder = _folder(root, name)
    found = {p.name: p for p in folder.glob("*.png")}
    if file not in found:
        raise ReportError(f"report {name} has no plot {file}. To fix: pick one it lists")
    return found[file]


def _folder(root: Path, name: str) -> Path:
    folders = {p.name: p for p in root.iterdir() if p.is_dir()} if root.is_dir() else {}
    if name not in folders or not (folders[name] / SUMMARY).is_file():
        raise ReportError(
            f"no report {name} in {root}. To fix: write one with "
            f"`bolt simulate ... --report {root / name}`"
        )
    return folders[name]


def _summary(folder: Path) -> dict[str, Any]:
    try:
        data = json.loads((folder / SUMMARY).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ReportError(f"report {folder.name}: {SUMMARY} is unreadable ({e})") from None
    if not isinstance(data, dict):
        raise ReportError(f"report {folder.name}: {SUMMARY} is not an object")
    return data


def _table(summary: dict[str, Any]) -> tuple[list[tuple[str, str]], list[dict[str, str]]]:
    """The table as written (``table``), else one built from each policy's plain figures
    (reports written before the table was kept)."""
    table = summary.get("table")
    if isinstance(table, dict):
        columns = [(str(k), str(label)) for k, label in table.get("columns", [])]
        rows = [{str(k): str(v) for k, v in r.items()} for r in table.get("rows", [])]
        return columns, rows
    policies: dict[str, dict[str, Any]] = summary.get("policies") or {}
    keys = sorted({k for m in policies.values() for k, v in m.items() if _plain(v)})
    columns = [("policy", "Policy"), *[(k, k) for k in keys]]
    rows = [
        {"policy": name, **{k: str(m.get(k, "")) for k in keys}} for name, m in policies.items()
    ]
    return columns, rows


def _plain(value: object) -> bool:
    return isinstance(value, int | float | str) and not isinstance(value, bool)

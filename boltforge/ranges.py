"""Compact text for lists of numbers and host names, as Slurm writes them: ``0-3,6`` and
``host-[0-3,6]``."""

from __future__ import annotations

import re
from collections.abc import Iterable

_NUMBERED = re.compile(r"^(.*?)(\d+)$")


def ranges(values: Iterable[int]) -> str:
    """``[0, 1, 2, 3, 6]`` as ``0-3,6`` (sorted, duplicates dropped)."""
    out: list[str] = []
    start = prev = None
    for v in sorted(set(values)):
        if prev is not None and v == prev + 1:
            prev = v
            continue
        if start is not None:
            out.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = v
    if start is not None:
        out.append(str(start) if start == prev else f"{start}-{prev}")
    return ",".join(out)


def hostlist(names: Iterable[str]) -> str:
    """Host names with a shared prefix folded: ``host-0, host-1, host-3`` as ``host-[0-1,3]``.
    Zero-padded suffixes keep their width; names without a number are listed as they are."""
    groups: dict[tuple[str, int], list[int]] = {}
    plain: list[str] = []
    for name in dict.fromkeys(names):
        m = _NUMBERED.match(name)
        if m is None:
            plain.append(name)
            continue
        digits = m.group(2)
        width = len(digits) if digits.startswith("0") and len(digits) > 1 else 0
        groups.setdefault((m.group(1), width), []).append(int(digits))
    out = list(plain)
    for (prefix, width), numbers in groups.items():
        if len(numbers) == 1:
            out.append(f"{prefix}{str(numbers[0]).zfill(width)}")
            continue
        spans = [
            "-".join(part.zfill(width) for part in span.split("-"))
            for span in ranges(numbers).split(",")
        ]
        out.append(f"{prefix}[{','.join(spans)}]")
    return ",".join(out)

"""Durations in specs: ``90``, ``"90s"``, ``"40m"``, ``"2h"``, ``"1d"`` become seconds."""

from __future__ import annotations

import re

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_PATTERN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")


def seconds(value: object) -> float:
    """Parse a duration; raise ValueError with the accepted forms when it is not one."""
    if isinstance(value, bool):
        raise ValueError("must be a duration such as 90, '90s', '40m' or '2h'")
    if isinstance(value, int | float):
        if value != value:  # NaN: no duration, and it compares false with every bound
            raise ValueError("must be a duration such as 90, '90s', '40m' or '2h'")
        if value < 0:
            raise ValueError("must not be negative")
        return float(value)
    match = _PATTERN.match(str(value))
    if not match:
        raise ValueError("must be a duration such as 90, '90s', '40m' or '2h'")
    return float(match.group(1)) * _UNITS[match.group(2) or "s"]

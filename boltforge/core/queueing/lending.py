"""Use it or lose it: when a queue's unused guarantee is lent to the shared pool, and back.

A queue with a guarantee of ``G`` GPUs *uses* it at ``held / G``. When that stays below
``rule.below`` for ``rule.after_s`` seconds, the unused part is lent: the queue's effective
guarantee drops to what it holds (``effective``), so GPUs borrowed by others on that capacity
are no longer reclaimed for it. The guarantee is restored at once when the queue wants it back:
it has a waiting job that the lent part would admit, or its use climbs back to the threshold.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import Enum

from boltforge.core.queueing.quota import ANY, overage

DAY_S = 86400.0


@dataclass(frozen=True, slots=True)
class LendRule:
    """Lend a guarantee used below ``below`` (a share of it) for ``after_s`` seconds.
    ``below`` of 0 never lends."""

    below: float = 0.5
    after_s: float = DAY_S


class GuaranteeChange(Enum):
    """What a pass does to a queue's guarantee."""

    LEND = "lend"
    RESTORE = "restore"


def idle_since(
    runs: Iterable[tuple[float, float | None, int]],
    limit: float,
    floor: float,
    now: float,
) -> float | None:
    """When the current stretch of holding fewer than ``limit`` GPUs began, no earlier than
    ``floor``; None when the GPUs held at ``now`` reach ``limit``.

    ``runs`` are ``(start, end, gpus)`` with ``end`` None for runs still going; the GPUs held
    at a time are the sum over the runs covering it (``start <= t < end``)."""
    if limit <= 0:
        return None
    steps: dict[float, int] = {}
    for start, end, gpus in runs:
        if start <= now:
            steps[start] = steps.get(start, 0) + gpus
            if end is not None and end <= now:
                steps[end] = steps.get(end, 0) - gpus
    held, busy_until = 0, floor
    times = sorted(steps)
    for i, t in enumerate(times):
        held += steps[t]
        if held >= limit:
            busy_until = max(busy_until, times[i + 1] if i + 1 < len(times) else now + 1.0)
    return None if busy_until > now else busy_until


def effective(guaranteed: Mapping[str, int], held: Mapping[str, int]) -> dict[str, int]:
    """A lent guarantee: each pool entry capped at the GPUs held in that pool, and ``"*"`` at
    the GPUs held beyond the pool entries (never more than the guarantee itself)."""
    pools = {p: n for p, n in guaranteed.items() if p != ANY}
    out = {p: min(n, held.get(p, 0)) for p, n in pools.items()}
    if ANY in guaranteed:
        out[ANY] = min(guaranteed[ANY], overage(pools, held))
    return out


def decide(
    rule: LendRule,
    guaranteed: int,
    since: float | None,
    lent: bool,
    wanted: bool,
    now: float,
) -> GuaranteeChange | None:
    """The change to a queue's guarantee this pass, if any.

    ``since``: when its use fell below ``rule.below`` (``idle_since``), None when it is at or
    above it; ``lent``: whether the guarantee is lent now; ``wanted``: whether the queue has a
    waiting job the lent part would admit. A lent guarantee is restored when wanted or used
    again; a kept one is lent once unused for ``rule.after_s`` and not wanted."""
    if lent:
        return GuaranteeChange.RESTORE if wanted or since is None else None
    if guaranteed <= 0 or wanted or since is None or rule.below <= 0:
        return None
    return GuaranteeChange.LEND if now - since >= rule.after_s else None

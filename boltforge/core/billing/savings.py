"""What sharing the fleet saved over a window, against every team owning a static pool.

*Static*: each team owns, in each pool, as many GPUs as it ever held there at once during the
window (its peak), so it could have run the same work at the same times without sharing, and
pays for them for the whole window at the pool's price. *Shared*: what the fleet actually
cost: every GPU of every live node for the time it was live in the window, at its price, idle
or busy. *Saved* is static minus shared; it is negative when the fleet is larger than the
teams' peaks together, and stays negative. The window starts no earlier than the first node's
life: before it there was no fleet to compare, shared or static.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

HOUR_S = 3600.0


@dataclass(frozen=True, slots=True)
class Use:
    """GPUs a team held in a pool from ``start`` to ``end`` (None: still held)."""

    team: str
    pool: str
    gpus: int
    start: float
    end: float | None


@dataclass(frozen=True, slots=True)
class Life:
    """A node's GPUs, their price per GPU-hour, and when it was live (``end`` None: still)."""

    pool: str
    gpus: int
    price: float
    start: float
    end: float | None


@dataclass(frozen=True, slots=True)
class Savings:
    """The two costs over ``hours`` from ``since``, and what each team would have owned."""

    since: float
    hours: float
    static_dollars: float
    shared_dollars: float
    peaks: dict[str, dict[str, int]]

    @property
    def saved_dollars(self) -> float:
        return self.static_dollars - self.shared_dollars


def peak(uses: Iterable[Use], since: float, until: float) -> int:
    """The most GPUs ``uses`` held at once within ``[since, until)`` (a use ending when
    another starts does not overlap it)."""
    steps: dict[float, int] = {}
    for u in uses:
        start, end = max(u.start, since), min(until if u.end is None else u.end, until)
        if start < end:
            steps[start] = steps.get(start, 0) + u.gpus
            steps[end] = steps.get(end, 0) - u.gpus
    held, best = 0, 0
    for t in sorted(steps):
        held += steps[t]
        best = max(best, held)
    return best


def savings(
    uses: Iterable[Use], lives: Iterable[Life], prices: dict[str, float], since: float, until: float
) -> Savings:
    """Static and shared cost over ``[since, until]``, cut to start at the first node's life;
    ``prices`` are dollars per GPU-hour by pool (a pool missing there costs nothing in the
    static figure)."""
    lives = list(lives)
    since = max(since, min((life.start for life in lives), default=until))
    hours = max(until - since, 0.0) / HOUR_S
    groups: dict[tuple[str, str], list[Use]] = {}
    for u in uses:
        groups.setdefault((u.team, u.pool), []).append(u)
    peaks: dict[str, dict[str, int]] = {}
    for (team, pool), group in sorted(groups.items()):
        n = peak(group, since, until)
        if n:
            peaks.setdefault(team, {})[pool] = n
    static = sum(n * prices.get(p, 0.0) * hours for t in peaks.values() for p, n in t.items())
    shared = sum(life.gpus * life.price * _live_hours(life, since, until) for life in lives)
    return Savings(since, hours, static, shared, peaks)


def _live_hours(life: Life, since: float, until: float) -> float:
    end = until if life.end is None else min(life.end, until)
    return max(end - max(life.start, since), 0.0) / HOUR_S

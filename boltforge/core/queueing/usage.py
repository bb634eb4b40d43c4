"""Fair-share usage from the stretches of GPUs each queue held, decayed exactly.

This is the one computation of usage: the server (``control.world.usage``, from its runs) and
the simulator (from its run segments) both call it, so the same history gives the same figure.

A GPU held at time ``t`` counts ``2 ** (-(now - t) / half_life_s)`` GPU-seconds at ``now``, so a
``Holding`` of ``gpus`` GPUs over ``[start, end]`` counts the integral of that weight over the
part of the stretch up to ``now``::

    gpus * h / ln 2 * (2 ** (-(now - end) / h) - 2 ** (-(now - start) / h))

An open holding (``end`` None), or one ending after ``now``, counts up to ``now``; one starting
after ``now`` counts nothing. Each holding is charged to its queue and to every queue above it
(``quota.lineage``), so the root ``""`` holds the cluster's total. Every queue of a holding
appears in the result, with 0 when nothing of it falls before ``now``.

``usage_of`` computes usage from the whole history; ``carry`` brings usage known at ``as_of``
forward to ``now`` from only what was held since:
``U(now) = U(as_of) * 2 ** (-(now - as_of) / h) + (integral over (as_of, now])``. Both give the
same figure (to rounding) for the same holdings, so a caller may keep a running value and carry
it from step to step.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from boltforge.core.model.workload import Usage
from boltforge.core.queueing.quota import lineage


@dataclass(frozen=True, slots=True)
class Holding:
    """``gpus`` GPUs held for a job of ``queue`` from ``start`` to ``end`` (None: still held)."""

    queue: str
    gpus: float
    start: float
    end: float | None = None


def decayed_gpu_s(gpus: float, start: float, end: float, now: float, half_life_s: float) -> float:
    """The GPU-seconds ``gpus`` GPUs held over ``[start, end]`` count at ``now``: the integral of
    ``gpus * 2 ** (-(now - t) / half_life_s)`` over ``[start, min(end, now)]`` (0 when empty).
    ``half_life_s`` must be positive (the caller checks)."""
    stop = min(end, now)
    if stop <= start:
        return 0.0
    rate = math.log(2) / half_life_s
    return gpus * math.exp(-rate * (now - stop)) * -math.expm1(-rate * (stop - start)) / rate


def usage_of(holdings: Iterable[Holding], now: float, half_life_s: float) -> Usage:
    """Usage at ``now`` from every holding (see the module's rules), as of ``now``.

    Raises ``ValueError`` when the half-life is not positive.
    """
    _check_half_life(half_life_s)
    out: dict[str, float] = {}
    _charge(out, holdings, float("-inf"), now, half_life_s)
    return Usage(out, now)


def carry(usage: Usage, now: float, half_life_s: float, holdings: Iterable[Holding]) -> Usage:
    """``usage`` (as of ``usage.as_of``) carried forward to ``now``, exactly: every queue's usage
    decayed by ``2 ** (-(now - usage.as_of) / half_life_s)``, plus what ``holdings`` held inside
    ``(usage.as_of, now]``, decayed to ``now``.

    ``holdings`` must include every stretch held at some point of that interval (ended ones and
    open ones); the parts before ``usage.as_of`` are ignored, since ``usage`` counts them. Raises
    ``ValueError`` when ``now`` is before ``usage.as_of`` or the half-life is not positive.
    """
    _check_half_life(half_life_s)
    if now < usage.as_of:
        raise ValueError(f"now ({now}) is before the usage's as_of ({usage.as_of})")
    kept = 2.0 ** (-(now - usage.as_of) / half_life_s)
    out = {q: u * kept for q, u in usage.by_queue.items()}
    _charge(out, holdings, usage.as_of, now, half_life_s)
    return Usage(out, now)


def _charge(
    out: dict[str, float],
    holdings: Iterable[Holding],
    since: float,
    now: float,
    half_life_s: float,
) -> None:
    """Add to ``out`` what each holding held inside ``[since, now]``, decayed to ``now``, for its
    queue and every queue above it."""
    for h in holdings:
        end = h.end if h.end is not None else now
        amount = decayed_gpu_s(h.gpus, max(h.start, since), end, now, half_life_s)
        for q in lineage(h.queue):
            out[q] = out.get(q, 0.0) + amount


def _check_half_life(half_life_s: float) -> None:
    if not half_life_s > 0:
        raise ValueError(f"half_life_s must be positive (got {half_life_s})")

"""Health verdicts over running jobs' progress: ranks that straggle behind their peers, and
jobs that hold GPUs but make no progress (zombies). Pure: the caller reads the store and the
clock and acts on the verdicts.

A **straggler** is a rank whose median step time over its recent window is both at least
``ratio`` times its peers' (the median of the other ranks' medians) and more than ``mads``
scaled median absolute deviations above it. Medians make one slow step, a pause for a
checkpoint or a slow first step after a resume count for nothing; comparing against the
*other* ranks keeps a two-rank job judgeable; the MAD keeps a job whose ranks are naturally
spread from being flagged. If more than half the judged ranks look slow, none is flagged: the
rest are fast, not these slow.

A **zombie** is a job that has made no progress (no rank reported a step) for longer than its
progress timeout: since its last report, or since its replicas started when it never
reported in this allocation. Where NVML samples the job's GPUs, they must also have held
memory while computing nothing for longer than the timeout: a job that computes without
reporting is busy, not hung.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

MAD_SCALE = 1.4826  # makes the MAD estimate a standard deviation for normal data


class StragglerAction(StrEnum):
    """What the control plane does about a straggler: record it, or also cordon its host and
    move the job off at its next checkpoint."""

    REPORT = "report"
    CORDON = "cordon"


@dataclass(frozen=True, slots=True)
class HealthRules:
    """The site's health settings. ``progress_timeout_s`` is the server default for jobs that
    reported progress in their current allocation (None: no default); ``max_cordoned`` is the
    largest share of nodes the straggler action may leave cordoned."""

    straggler_action: StragglerAction = StragglerAction.REPORT
    straggler_ratio: float = 1.5
    straggler_mads: float = 3.0
    min_samples: int = 10
    window: int = 20
    progress_timeout_s: float | None = 1800.0
    max_cordoned: float = 0.1


@dataclass(frozen=True, slots=True)
class RankTimes:
    """One rank's recent step times (oldest first) and the node it runs on."""

    rank: int
    node: str
    step_times: tuple[float, ...]


@dataclass(frozen=True, slots=True)
class Straggler:
    """A rank flagged as a straggler, with the evidence: its median step time, its peers'
    median (``peers`` ranks), their scaled MAD, the ratio and how many samples it rests on."""

    rank: int
    node: str
    median_s: float
    peer_median_s: float
    peer_mad_s: float
    ratio: float
    samples: int
    peers: int

    def describe(self) -> str:
        """``rank 1 on host-1: median step 0.150 s, 3.0x the 0.050 s of its 1 peer(s) ...``."""
        return (
            f"rank {self.rank} on {self.node}: median step {self.median_s:.3f} s, "
            f"{self.ratio:.1f}x the {self.peer_median_s:.3f} s of its {self.peers} peer(s) "
            f"(over its last {self.samples} steps)"
        )

    def evidence(self) -> dict[str, Any]:
        """The finding as plain data, for an event."""
        return {
            "rank": self.rank,
            "node": self.node,
            "median_s": round(self.median_s, 6),
            "peer_median_s": round(self.peer_median_s, 6),
            "peer_mad_s": round(self.peer_mad_s, 6),
            "ratio": round(self.ratio, 3),
            "samples": self.samples,
            "peers": self.peers,
        }


@dataclass(frozen=True, slots=True)
class Stall:
    """A zombie verdict: no progress for ``idle_s`` (> ``timeout_s``) since ``since``; where
    NVML samples the job's GPUs, ``gpu_idle_s`` is how long all of them have held memory
    while computing nothing."""

    idle_s: float
    timeout_s: float
    since: float
    reported: bool
    gpu_idle_s: float | None = None

    def describe(self) -> str:
        """``no progress for 612 s since its last step report; timeout 600 s``, and what
        NVML saw."""
        what = "its last step report" if self.reported else "its replicas started (no report)"
        text = f"no progress for {self.idle_s:.0f} s since {what}; timeout {self.timeout_s:.0f} s"
        if self.gpu_idle_s is not None:
            text += f"; its GPUs held memory and computed nothing for {self.gpu_idle_s:.0f} s"
        return text


def median(values: Sequence[float]) -> float:
    """The median of a non-empty sequence (the mean of the middle two for an even count)."""
    if not values:
        raise ValueError("median of nothing")
    ordered = sorted(values)
    mid = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[mid]
    return (ordered[mid - 1] + ordered[mid]) / 2.0


def mad(values: Sequence[float], center: float) -> float:
    """The scaled median absolute deviation of ``values`` around ``center``."""
    return MAD_SCALE * median([abs(v - center) for v in values])


def stragglers(ranks: Sequence[RankTimes], rules: HealthRules) -> list[Straggler]:
    """The ranks of one job that straggle (see the module docstring), by rank.

    Only a rank with at least ``rules.min_samples`` step times is judged or counted as a
    peer; each uses its last ``rules.window``. A job with fewer than two judged ranks has no
    stragglers. Independent of rank order and of the unit of time."""
    medians = {
        r.rank: (median(r.step_times[-rules.window :]), min(len(r.step_times), rules.window))
        for r in ranks
        if len(r.step_times) >= rules.min_samples
    }
    if len(medians) < 2:
        return []
    nodes = {r.rank: r.node for r in ranks}
    found = []
    for rank, (own, samples) in sorted(medians.items()):
        peers = [m for other, (m, _) in medians.items() if other != rank]
        ref = median(peers)
        spread = mad(peers, ref)
        if ref <= 0.0 or own < rules.straggler_ratio * ref:
            continue
        if own - ref <= rules.straggler_mads * spread:
            continue
        found.append(Straggler(rank, nodes[rank], own, ref, spread, own / ref, samples, len(peers)))
    return found if 2 * len(found) <= len(medians) else []


def progress_timeout(own_s: float | None, reported: bool, rules: HealthRules) -> float | None:
    """The progress timeout a job is judged by, or None when it is not judged.

    The job's own ``health.progress_timeout`` wins: 0 turns judging off, anything else
    applies even before its first report. Without one, the server default applies only to
    a job that reported progress in its current allocation: a job that does not use the SDK
    never reports and is never judged."""
    if own_s is not None:
        return own_s if own_s > 0 else None
    return rules.progress_timeout_s if reported else None


def stalled(
    last_report: float | None, started: float | None, now: float, timeout_s: float | None
) -> Stall | None:
    """A ``Stall`` when the job made no progress for more than ``timeout_s`` at ``now``:
    measured from its last report, else from when its replicas started; None when it is
    not judged (no timeout, or not started)."""
    since = last_report if last_report is not None else started
    if timeout_s is None or since is None:
        return None
    idle = now - since
    if idle <= timeout_s:
        return None
    return Stall(idle, timeout_s, since, last_report is not None)


def gpus_idle_for(idle_since: Sequence[float | None], now: float) -> float | None:
    """How long every one of a job's GPUs has held memory while computing nothing, given when
    each one became so (None: it computes, or holds no memory); None when any GPU is busy or
    none was sampled."""
    if not idle_since or any(t is None for t in idle_since):
        return None
    return now - max(t for t in idle_since if t is not None)


def confirm(stall: Stall | None, sampled: bool, gpu_idle_s: float | None) -> Stall | None:
    """A progress ``stall`` checked against the GPUs where NVML samples them (``sampled``):
    a job whose GPUs computed within its timeout is busy, just not reporting, and is no
    zombie; one whose GPUs all sat idle with memory held past it is. Without samples the
    stall stands on progress alone."""
    if stall is None or not sampled:
        return stall
    if gpu_idle_s is None or gpu_idle_s <= stall.timeout_s:
        return None
    return replace(stall, gpu_idle_s=gpu_idle_s)


def may_cordon(cordoned: int, nodes: int, rules: HealthRules) -> bool:
    """Whether the straggler action may cordon one more node when ``cordoned`` of ``nodes``
    already are: at most ``rules.max_cordoned`` of the fleet, and always at least one."""
    return cordoned + 1 <= max(1, int(rules.max_cordoned * nodes))

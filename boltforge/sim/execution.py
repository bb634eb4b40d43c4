"""How fast a job runs where it was placed, and what an interruption costs it.

**Speed.** A job on one host runs at full speed wherever its GPUs sit. A job spanning hosts
runs its collectives over the widest link it crosses: its step time, relative to running on the
tightest domain the empty fleet would give it, is ``SPEED[widest] / SPEED[ideal]`` with

====================  =====
widest level crossed  step
====================  =====
host or rack          1.0
pod (across racks)    1.5
spine (across pods)   2.2
====================  =====

calibrated to published step times for data-parallel training (ideal 1.0x, a first-fit
placement that scatters across racks about 1.5x, split across pods about 2.2x). Replicas off
their network rail add ``OFF_RAIL`` per misaligned replica share.

**Interruptions.** A run segment starts at ``start``; a resumed job first spends the restart
overhead (reload and warm-up) making no progress. The job checkpoints every
``checkpoint_interval`` seconds from the segment start (as ``Running.checkpoint_before``
prices it). Preempted or failed at ``t``, it keeps the progress made up to its last checkpoint
and loses the rest and the restart time.

**Size.** A job's work is counted in seconds at the size it asked for (``duration_s``). An
elastic job running ``size`` times that many GPUs (fewer replicas after a shrink or an elastic
start, more after a growth) progresses ``size`` times as fast: data-parallel replicas that
scale linearly, the model the scheduling core prices resizes with. Its useful GPU-seconds are
the same for any size, the requested GPUs times the work done.

**Resizes.** A running elastic job resized in place checkpoints first (as torchrun's elastic
agent does on a membership change), so it keeps all its progress (``evacuated``) and starts a
new segment on its new GPUs, paying the restart overhead again as warm-up.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from boltforge.core.model.state import Grant
from boltforge.core.model.topology import TopologyTree
from boltforge.core.placement.answers import Placement
from boltforge.core.placement.crossing import role_cost
from boltforge.core.placement.patience import STEP_FACTOR
from boltforge.core.placement.patience import widest as _widest

# The step-time factors the cycle's patience weighs placements by: the replay charges the same.
SPEED = STEP_FACTOR
OFF_RAIL = 0.1


def widest(placement: Placement) -> str:
    """The widest level a placement's rings cross: host, rack, pod or spine."""
    return _widest(placement.cost.hops)


def slowdown(placement: Placement, ideal: Placement | None) -> float:
    """Step-time factor of ``placement`` against ``ideal`` (the empty fleet's placement)."""
    replicas = sum(len(r.grants) for r in placement.roles)
    return _factor(placement.cost.hops, replicas, ideal)


def regranted_slowdown(
    tree: TopologyTree, grants: Iterable[Grant], ideal: Placement | None
) -> float:
    """Step-time factor of a one-role job resized in place onto ``grants`` (its kept grants
    after a shrink, or its old grants and the added ones after a growth) against ``ideal``
    (the empty fleet's placement of a job that size), priced as ``slowdown`` prices a
    placement of those grants."""
    held = list(grants)
    return _factor(role_cost(tree, held).hops, len(held), ideal)


def _factor(hops: Mapping[str, int], replicas: int, ideal: Placement | None) -> float:
    base = SPEED[widest(ideal)] if ideal is not None else 1.0
    factor = SPEED[_widest(hops)] / base
    if replicas > 1:
        factor *= 1.0 + OFF_RAIL * hops.get("rail", 0) / replicas
    return max(factor, 1.0)


@dataclass(frozen=True, slots=True)
class Segment:
    """One uninterrupted run: when it started, on how many GPUs, how slow, how long before
    progress starts, and ``size``: its GPUs over the GPUs the job asked for (1.0 unless an
    elastic job runs smaller or larger), the factor its progress is sped up by."""

    start: float
    gpus: int
    slowdown: float
    warmup: float
    size: float = 1.0

    def finish_time(self, remaining_s: float) -> float:
        """When it finishes ``remaining_s`` seconds of work at the requested size on an ideal
        placement, if nothing interrupts it."""
        return self.start + self.warmup + remaining_s * self.slowdown / self.size


@dataclass(frozen=True, slots=True)
class SegmentOutcome:
    """What a segment produced: GPU-seconds held, useful, and thrown away; work kept (seconds
    at the requested size on an ideal placement)."""

    allocated_gpu_s: float
    productive_gpu_s: float
    lost_gpu_s: float
    work_s: float


def finished(seg: Segment, end: float, remaining_s: float) -> SegmentOutcome:
    """The segment ran to completion at ``end``: all remaining work counts."""
    held = seg.gpus * (end - seg.start)
    useful = seg.gpus * remaining_s / seg.size
    return SegmentOutcome(held, useful, seg.gpus * min(seg.warmup, end - seg.start), remaining_s)


def evacuated(seg: Segment, end: float) -> SegmentOutcome:
    """The segment was stopped at ``end`` right after a checkpoint: all progress is kept and
    only restart time still inside the warm-up is lost."""
    ran = max(end - seg.start, 0.0)
    kept_wall = max(ran - seg.warmup, 0.0)
    return SegmentOutcome(
        seg.gpus * ran,
        seg.gpus * kept_wall / seg.slowdown,
        seg.gpus * min(seg.warmup, ran),
        kept_wall / seg.slowdown * seg.size,
    )


def warmup_gpu_s(seg: Segment, end: float) -> float:
    """GPU-seconds of the segment spent in restart warm-up up to ``end``."""
    return seg.gpus * min(seg.warmup, max(end - seg.start, 0.0))


def interrupted(seg: Segment, end: float, checkpoint_interval: float | None) -> SegmentOutcome:
    """The segment was stopped at ``end``: progress up to the last checkpoint is kept (none
    without a checkpoint interval)."""
    ran = max(end - seg.start, 0.0)
    tick = 0.0
    if checkpoint_interval is not None and checkpoint_interval > 0:
        tick = checkpoint_interval * math.floor(ran / checkpoint_interval)
    kept_wall = max(tick - seg.warmup, 0.0)
    progress_wall = max(ran - seg.warmup, 0.0)
    lost = seg.gpus * (min(seg.warmup, ran) + progress_wall - kept_wall)
    return SegmentOutcome(
        seg.gpus * ran,
        seg.gpus * kept_wall / seg.slowdown,
        lost,
        kept_wall / seg.slowdown * seg.size,
    )

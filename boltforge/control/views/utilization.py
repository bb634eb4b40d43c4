"""Utilization over time for the console: a sample of the fleet every few seconds.

Contract: ``sample`` reads the store once and returns GPUs on live nodes, GPUs held by
replicas (allocated), GPUs held by replicas whose processes run (compute), GPUs of those whose
job reported a training step in the last ``PRODUCTIVE_WINDOW_S`` (productive), and the
fragmentation index of the fleet as a scheduling pass sees it. Jobs that do not report steps
through the SDK count as compute, never as productive. ``History`` keeps the samples of the
last ``KEEP_S`` seconds in memory: a restarted server starts a new history.
"""

from __future__ import annotations

import threading
from collections import deque

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from boltforge.control.scheduling.world import USABLE_NODES, World
from boltforge.control.store.models import HELD, NodeRow, RankProgressRow, ReplicaRow
from boltforge.core.placement.fragmentation import measure
from boltforge.wire.console import UtilSample

PRODUCTIVE_WINDOW_S = 120.0
KEEP_S = 24 * 3600.0


def sample(s: Session, world: World, now: float) -> UtilSample:
    """The fleet's utilization at ``now`` (see the module docstring)."""
    live = select(func.coalesce(func.sum(NodeRow.gpus), 0)).where(NodeRow.state.in_(USABLE_NODES))
    gpus = int(s.scalar(live) or 0)
    recent = select(RankProgressRow.job_id).where(RankProgressRow.at >= now - PRODUCTIVE_WINDOW_S)
    stepping = set(s.scalars(recent.distinct()))
    allocated = compute = productive = 0
    q = select(ReplicaRow.job_id, ReplicaRow.state, ReplicaRow.gpus).where(
        ReplicaRow.state.in_(HELD)
    )
    for job, state, held in s.execute(q):
        allocated += len(held)
        if state in ("running", "stopping"):
            compute += len(held)
            productive += len(held) if job in stepping else 0
    return UtilSample(
        at=now,
        gpus=gpus,
        allocated=allocated,
        compute=compute,
        productive=productive,
        fragmentation=fragmentation_index(world) if gpus else 0.0,
    )


def fragmentation_index(world: World) -> float:
    """The core's fragmentation index (0 to 1, 4 decimals) of the fleet as a scheduling pass
    reading ``world`` sees it; 0 for a fleet without GPUs."""
    return round(measure(world.state).index, 4) if world.fleet.tree.total_gpus else 0.0


class History:
    """Samples in time order, the oldest dropped past ``keep_s``; safe across threads."""

    def __init__(self, every_s: float, keep_s: float = KEEP_S) -> None:
        self.every_s = every_s
        self._samples: deque[UtilSample] = deque(maxlen=max(int(keep_s / every_s), 1))
        self._lock = threading.Lock()

    def add(self, point: UtilSample) -> None:
        with self._lock:
            self._samples.append(point)

    def since(self, at: float) -> list[UtilSample]:
        with self._lock:
            return [p for p in self._samples if p.at >= at]

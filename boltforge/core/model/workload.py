"""Jobs as the scheduling cycle sees them: pending work, running work, and fleet capacity."""

from __future__ import annotations

from dataclasses import dataclass, field

from boltforge.core.model.gang import Gang
from boltforge.core.model.state import Allocation

# Priority classes: lower is more important.
SERVING, PRODUCTION, INTERACTIVE, BATCH = 0, 1, 2, 3


@dataclass(frozen=True, slots=True)
class Hold:
    """GPUs kept for a job that lost a host, so it can restart next to where it ran.

    ``allocation`` is what its replicas on the healthy hosts held (their roles, ranks, hosts
    and GPUs); the caller puts it in the fleet state under its own id (``allocation.job``,
    e.g. ``held:<job>``) with ``expected_end`` the end of the hold, so no other job takes
    those GPUs meanwhile. ``lost`` are the hosts it lost, to name the replacements.
    """

    allocation: Allocation
    lost: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class Job:
    """A job the cycle may start, keep, resize or evict.

    ``queue`` is the leaf of the quota tree the job is charged to (``org/team/project``; the
    team's name when the spec names no project). Times are seconds on the caller's clock.
    ``time_limit`` bounds the run; ``estimate`` is a learned runtime estimate, used for backfill
    when present; ``typical`` what jobs like it typically took (a median, at most its time
    limit), used to rank it (``core/queueing/shortest.py``), never for backfill. ``elastic`` is
    the replica range of the gang's first role (None when the job is rigid).
    ``checkpoint_interval`` and ``restart_overhead`` price lost work when the job is preempted.
    ``held``: GPUs kept for its restart after a host failure (the cycle places it on them first,
    replacing only the lost hosts; see ``core/placement/recovery.py``). ``spread``: no host
    holds more than half of the jobs of one non-empty group (rounded up: two go to two hosts)
    when other hosts have room, so one host failure takes at most half of an inference service's
    replicas while the rest still pack (``apart`` in ``core/cycle/place.py``).
    """

    id: str
    gang: Gang
    queue: str
    submit_time: float
    time_limit: float | None = None
    estimate: float | None = None
    deadline: float | None = None
    preemptible: bool = True
    elastic: tuple[int, int] | None = None
    checkpoint_interval: float | None = None
    restart_overhead: float = 60.0
    attained_gpu_seconds: float = 0.0
    held: Hold | None = None
    spread: str = ""
    typical: float | None = None

    @property
    def priority(self) -> int:
        return self.gang.priority

    @property
    def gpus(self) -> int:
        return self.gang.total_gpus

    def expected_runtime(self) -> float | None:
        """What backfill may rely on: the learned estimate, else the time limit, else unknown."""
        return self.estimate if self.estimate is not None else self.time_limit


@dataclass(frozen=True, slots=True)
class Running:
    """A job holding resources: where, since when, and what bumping it would cost."""

    job: Job
    allocation: Allocation
    start_time: float
    last_checkpoint: float | None = None
    last_preempted: float | None = None
    last_resized: float | None = None
    borrowed: bool = False
    gpus: int = field(init=False, compare=False)  # GPUs its allocation's grants hold

    def __post_init__(self) -> None:
        object.__setattr__(self, "gpus", sum(len(g.gpus) for g in self.allocation.grants))

    def expected_end(self) -> float | None:
        runtime = self.job.expected_runtime()
        return None if runtime is None else self.start_time + runtime

    def checkpoint_before(self, now: float) -> float | None:
        """The last checkpoint at or before ``now``: the recorded one, else the last tick of
        the job's checkpoint interval since it started (None: it has never checkpointed)."""
        if self.last_checkpoint is not None:
            return self.last_checkpoint
        every = self.job.checkpoint_interval
        if every is None or every <= 0 or now < self.start_time + every:
            return None
        return self.start_time + every * ((now - self.start_time) // every)

    def lost_gpu_seconds(self, now: float) -> float:
        """GPU-seconds lost if evicted at ``now``: work since the last checkpoint, plus restart."""
        saved = self.checkpoint_before(now)
        since = saved if saved is not None else self.start_time
        return self.gpus * (max(now - since, 0.0) + self.job.restart_overhead)


@dataclass(frozen=True, slots=True)
class Usage:
    """Decayed historic usage per queue (GPU-seconds), carried from cycle to cycle."""

    by_queue: dict[str, float] = field(default_factory=dict)
    as_of: float = 0.0

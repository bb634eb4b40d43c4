"""What a simulation reads and writes: trace jobs in, per-job records and samples out.

These types are shared by the trace readers, the engine, the metrics and the report; they hold
plain numbers so results serialize to JSON without conversion.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class TraceJob:
    """One job of a trace: when it was submitted, how long it runs, what it asks for.

    ``submit_s`` is seconds from the trace's start; ``duration_s`` the job's runtime when it
    runs uninterrupted on an ideal placement; ``team`` the team charged (derived
    deterministically when the trace has none). ``deadline_s`` (None: no deadline) is when the
    job must finish, on the same clock as ``submit_s``. ``elastic`` (None: rigid) is the range
    of replicas the job can run at, in the replicas the simulator splits it into on a fleet
    (``boltforge.sim.jobs.per_replica``); ``duration_s`` is still its runtime at ``gpus``.
    ``priority`` is its class (lower is more important, see ``boltforge.core.model.workload``;
    trace jobs are batch, 3). ``time_limit_s`` (None: none given) is the limit the user asked
    for, used as given; without one the replay's limit model gives it one
    (``boltforge.sim.limits``).
    """

    id: str
    submit_s: float
    duration_s: float
    gpus: int
    team: str
    deadline_s: float | None = None
    elastic: tuple[int, int] | None = None
    priority: int = 3
    time_limit_s: float | None = None


@dataclass(slots=True)
class JobRecord:
    """What happened to one job in a simulation (times in simulated seconds).

    ``start_s`` is the first start (None: never started), ``finish_s`` the completion (None:
    unfinished when the simulation stopped). ``allocated_gpu_s`` counts every GPU-second the
    job held; ``productive_gpu_s`` only the work that counted (ideal-placement progress that
    was not lost); ``lost_gpu_s`` work thrown away by preemptions and failures, restarts
    included. ``dollars`` is ``allocated_gpu_s`` at each pool's price. ``reclaims`` counts the
    runs a spot reclaim stopped; ``reclaim_lost_gpu_s`` the work those runs threw away since
    their last checkpoint (restart overhead not included). ``deadline_s`` as in ``TraceJob``.

    An elastic job may run at another size than ``gpus``: ``elastic_starts`` counts the runs
    it started below its requested size, ``grows`` and ``shrinks`` the times it was resized
    in place while running (each one a new segment: it checkpoints, restarts on the new
    GPUs and is charged for what each segment held).
    """

    id: str
    team: str
    gpus: int
    submit_s: float
    duration_s: float
    start_s: float | None = None
    finish_s: float | None = None
    preemptions: int = 0
    failures: int = 0
    allocated_gpu_s: float = 0.0
    productive_gpu_s: float = 0.0
    lost_gpu_s: float = 0.0
    dollars: float = 0.0
    slowdown: float = 1.0  # placement slowdown of the last run (1.0 = ideal)
    reclaims: int = 0
    reclaim_lost_gpu_s: float = 0.0
    deadline_s: float | None = None
    elastic_starts: int = 0
    grows: int = 0
    shrinks: int = 0


@dataclass(frozen=True, slots=True)
class Sample:
    """The fleet at one instant: GPUs allocated and doing useful work, queue length, and the
    fragmentation index (0: free GPUs form whole blocks, 1: scattered)."""

    t: float
    allocated_gpus: int
    productive_gpus: float
    queued: int
    fragmentation: float


@dataclass(slots=True)
class SimResult:
    """One policy's run over one trace on one fleet; ``reclaims`` counts spot hosts taken back."""

    policy: str
    fleet: str
    total_gpus: int
    jobs: list[JobRecord] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    dollars_by_pool: dict[str, float] = field(default_factory=dict)
    events: int = 0
    cycles: int = 0
    wall_s: float = 0.0
    seed: int = 0
    reclaims: int = 0

"""What a scheduling cycle decides: binds, evictions, resizes, reservations, and why jobs wait."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import NamedTuple

from boltforge.core.model.state import Grant
from boltforge.core.placement.answers import Placement


class WaitReason(StrEnum):
    """Why a job is still pending, in the words `bolt queue` shows in its REASON column."""

    QUOTA = "quota"
    TOPOLOGY = "topology"
    CAPACITY = "capacity"
    RESERVATION = "reservation-ahead"
    RESERVED = "reserved"
    PREEMPTION = "preemption-budget"
    NEVER = "never-fits"
    BEHIND = "behind-head-of-queue"


@dataclass(frozen=True, slots=True)
class Bind:
    """Start ``job`` on ``placement`` (``replicas`` below the request for an elastic start)."""

    job: str
    placement: Placement
    replicas: int | None = None
    borrowed_gpus: int = 0
    note: str = ""
    position: int = -1


@dataclass(frozen=True, slots=True)
class Evict:
    """Checkpoint and stop ``job`` (or shrink it to ``shrink_to`` replicas) to make room.

    A shrink keeps the job running on ``keep`` (the grants it holds still); the caller
    restarts it there, from its checkpoint, at the smaller size."""

    job: str
    for_job: str
    lost_gpu_seconds: float
    shrink_to: int | None = None
    keep: tuple[Grant, ...] = ()


@dataclass(frozen=True, slots=True)
class Resize:
    """Grow a running elastic ``job`` to ``replicas``, adding ``added`` (its new replicas)."""

    job: str
    replicas: int
    added: Placement
    note: str = ""


@dataclass(frozen=True, slots=True)
class Reserve:
    """``job`` is promised ``placement`` at ``start``; backfill must not delay it."""

    job: str
    start: float
    placement: Placement
    hosts: frozenset[int]


class Waiting(NamedTuple):
    """A job left pending: its place in line, the reason, the evidence, and a start estimate.

    ``estimate_basis`` says how the estimate was made: ``"when-and-where"`` (a placement the
    engine found on the expected state), ``"reservation"``, or ``"capacity"`` (GPU counts
    only, for jobs further down the queue).

    A named tuple rather than a dataclass: a pass makes one for every job it looks at and
    leaves waiting, thousands a pass on a long queue, and a tuple is made in a third of the
    time. Change one with ``_replace``.
    """

    job: str
    position: int
    reason: WaitReason
    detail: tuple[str, ...] = ()
    estimated_start: float | None = None
    estimate_basis: str = ""


@dataclass(frozen=True, slots=True)
class CycleResult:
    """Everything one cycle decided. Evictions come first when the caller acts on them."""

    binds: tuple[Bind, ...] = ()
    evictions: tuple[Evict, ...] = ()
    resizes: tuple[Resize, ...] = ()
    reservations: tuple[Reserve, ...] = ()
    waiting: tuple[Waiting, ...] = ()
    notes: tuple[str, ...] = field(default=())

    def why(self, job: str) -> Waiting | None:
        """The diagnosis of ``job`` if it was left waiting."""
        return next((w for w in self.waiting if w.job == job), None)

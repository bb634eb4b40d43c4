"""Named scheduling policies, each a composition of named parts.

A ``Policy`` is five parts, one per question the cycle asks (``core/cycle/``):

- ``order``: in which order pending jobs are looked at (``Order``; ``cycle/order.py``);
- ``placement``: how a job's placement is chosen (``PlacementRule``; ``cycle/place.py``);
- ``backfill``: whether later jobs may start ahead of blocked ones, and how many blocked jobs
  are promised a start (``Backfill``; ``cycle/reserve.py``);
- ``preemption``: whether and how a waiting job may evict running ones (``Preemption``, or
  None: never; ``cycle/preempt.py``);
- ``elastic``: whether elastic jobs start smaller and grow (``Elastic``, or None: never;
  ``cycle/resize.py``).

The parts below are named for what they do, and the five policies of ``POLICIES`` are
declared from them.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Self

from boltforge.core.preempt.bump import BumpRule
from boltforge.core.preempt.victims import PreemptRules
from boltforge.core.queueing.shortest import SizeRule


class Ordering(StrEnum):
    """How pending jobs are ordered."""

    FAIR = "fair"  # priority class, deadline urgency, hierarchical fair share, DRF, age
    FIFO = "fifo"  # arrival order
    PRIORITY = "priority"  # priority class, then arrival (Slurm's multifactor without fair share)
    LAS = "las"  # Tiresias: least attained service in discrete queues, starvation promotion


class BackfillMode(StrEnum):
    """Whether later jobs may start in gaps ahead of blocked ones."""

    NONE = "none"
    EASY = "easy"  # one reservation: the first blocked job
    CONSERVATIVE = "conservative"  # a reservation for each of the first `reservations` blocked


class _Part:
    """What every part can do: a copy with some fields changed."""

    __slots__ = ()

    def with_(self, **changes: object) -> Self:
        return replace(self, **changes)  # type: ignore[type-var]


@dataclass(frozen=True, slots=True)
class Order(_Part):
    """In which order a pass looks at the pending jobs.

    ``by``: the rule (``Ordering``). ``strict``: once a job cannot start, every job behind it
    waits (head-of-line blocking, as in plain FIFO). ``size``: under FAIR ordering, rank jobs
    inside a class by aged work left with fair share folded in (``core/queueing/shortest.py``)
    instead of by fair share, then arrival. ``half_life_s``: how fast past usage fades from
    fair share. Under LAS (Tiresias): ``las_thresholds``, the GPU-seconds of attained service
    splitting the discrete queues, and ``starvation_s``, how long a job waits before it is
    promoted to the top queue.
    """

    by: Ordering = Ordering.FAIR
    strict: bool = False
    size: SizeRule | None = None
    half_life_s: float = 7 * 86400.0
    las_thresholds: tuple[float, ...] = (3600.0 * 8, 3600.0 * 8 * 24)
    starvation_s: float = 3 * 86400.0


@dataclass(frozen=True, slots=True)
class PlacementRule(_Part):
    """How a job's placement is chosen.

    ``topology_aware``: the placement engine (NVLink islands, rails, racks; lookahead) rather
    than first fit. ``lookahead``: how far down the queue lookahead runs (0: never), each job
    checked against the few behind it (``core/placement/lookahead.py``). ``patience``: a gang
    whose best placement now is wider than the empty fleet's waits for a tight one when that
    finishes sooner (``core/placement/patience.py``).
    """

    topology_aware: bool = True
    lookahead: int = 16
    patience: bool = False


@dataclass(frozen=True, slots=True)
class Backfill(_Part):
    """Whether later jobs may start ahead of blocked ones, on hosts no promised start needs.

    ``mode``: none, EASY (the first blocked job gets a reservation) or conservative (the first
    ``reservations`` blocked jobs do). ``estimate_waits``: how many waiting jobs per pass get a
    when-and-where start estimate.
    """

    mode: BackfillMode = BackfillMode.CONSERVATIVE
    reservations: int = 4
    estimate_waits: int = 32

    @property
    def depth(self) -> int:
        """How many waiting jobs a full pass reserves a start for: none without backfill, the
        head job under EASY, ``reservations`` under conservative backfill."""
        if self.mode == BackfillMode.NONE:
            return 0
        return 1 if self.mode == BackfillMode.EASY else self.reservations


@dataclass(frozen=True, slots=True)
class Preemption(_Part):
    """How a waiting job may evict (or shrink) running jobs.

    ``rules``: which jobs are victims at all, and the churn budget (``core/preempt/victims.py``).
    ``attempts``: how many jobs per pass may search for victims. ``bump``: a waiting job may
    bump a running job of its own class that has far more time left than it needs
    (``core/preempt/bump.py``); None: preemption only across classes.
    """

    rules: PreemptRules = field(default_factory=PreemptRules)
    attempts: int = 8
    bump: BumpRule | None = None


@dataclass(frozen=True, slots=True)
class Elastic(_Part):
    """How elastic jobs are resized (``core/elastic.py``): started smaller when that finishes
    sooner, grown into what nobody waiting can use when the time saved exceeds
    ``resize_cost_s``, and not resized again within ``resize_window_s``."""

    resize_cost_s: float = 60.0
    resize_window_s: float = 1800.0


@dataclass(frozen=True, slots=True)
class Policy:
    """One named scheduling profile; the simulator runs several side by side.

    ``preemption`` and ``elastic`` are None under a policy that never preempts or never
    resizes.
    """

    name: str
    order: Order = Order()
    placement: PlacementRule = PlacementRule()
    backfill: Backfill = Backfill()
    preemption: Preemption | None = Preemption()
    elastic: Elastic | None = Elastic()

    @property
    def ordering(self) -> Ordering:
        """The order part's rule (``order.by``)."""
        return self.order.by

    @property
    def churn_window_s(self) -> float:
        """How long a preemption counts against the churn budget (the preemption part's rules;
        the default rules' window under a policy that never preempts, where nothing reads it)."""
        rules = PreemptRules() if self.preemption is None else self.preemption.rules
        return rules.churn_window_s

    def with_(self, **changes: object) -> Policy:
        """A copy with some parts (or the name) replaced."""
        return replace(self, **changes)  # type: ignore[arg-type]

    def with_preempt_rules(self, rules: PreemptRules) -> Policy:
        """A copy whose preemption follows ``rules``; the same policy when it never preempts."""
        if self.preemption is None:
            return self
        return replace(self, preemption=replace(self.preemption, rules=rules))


# Orders.
# Priority class, deadline urgency, hierarchical fair share with DRF, then arrival.
FAIR_SHARE = Order(Ordering.FAIR)
# The default's order inside a class: least work left first, a waiting job's work halving
# every 32 hours, its team's fair share weighing in with half the exponent
# (``core/queueing/shortest.py``).
SHORTEST_AGED = SizeRule(aging_s=32 * 3600.0, fair_weight=0.5)
SHORTEST_FIRST = Order(Ordering.FAIR, size=SHORTEST_AGED)
ARRIVAL_ORDER = Order(Ordering.FIFO)
STRICT_ARRIVAL_ORDER = Order(Ordering.FIFO, strict=True)  # head-of-line blocking
PRIORITY_THEN_ARRIVAL = Order(Ordering.PRIORITY)
LEAST_ATTAINED_SERVICE = Order(Ordering.LAS)

# Placement rules.
FIRST_FIT = PlacementRule(topology_aware=False, lookahead=0)
TOPOLOGY_AWARE = PlacementRule(topology_aware=True, lookahead=0)
TOPOLOGY_LOOKAHEAD = PlacementRule(topology_aware=True, lookahead=16)
TOPOLOGY_LOOKAHEAD_PATIENT = PlacementRule(topology_aware=True, lookahead=16, patience=True)

# Backfill modes.
NO_BACKFILL = Backfill(BackfillMode.NONE, reservations=0)
EASY_BACKFILL = Backfill(BackfillMode.EASY, reservations=1)
CONSERVATIVE_BACKFILL = Backfill(BackfillMode.CONSERVATIVE, reservations=4)

# Preemption.
NO_PREEMPTION = None
ACROSS_CLASSES = Preemption()
# The default also bumps a running job of its class that has at least 8 times its need (plus
# what the bumped job loses) left, and only within 5 minutes of that job's last checkpoint
# (``core/preempt/bump.py``). Both chosen on ITP clusters 01-03 (``docs/evaluation.md``).
BUMP_PEERS = BumpRule(gain=8.0)
PEER_RULES = PreemptRules(peer_window_s=300.0)
ACROSS_CLASSES_AND_BUMP_PEERS = Preemption(rules=PEER_RULES, bump=BUMP_PEERS)

# Elasticity.
NO_RESIZING = None
RESIZE = Elastic()

POLICIES: dict[str, Policy] = {
    p.name: p
    for p in (
        Policy(
            "default",
            order=SHORTEST_FIRST,
            placement=TOPOLOGY_LOOKAHEAD_PATIENT,
            backfill=CONSERVATIVE_BACKFILL,
            preemption=ACROSS_CLASSES_AND_BUMP_PEERS,
            elastic=RESIZE,
        ),
        Policy(
            "fifo",
            order=STRICT_ARRIVAL_ORDER,
            placement=FIRST_FIT,
            backfill=NO_BACKFILL,
            preemption=NO_PREEMPTION,
            elastic=NO_RESIZING,
        ),
        Policy(
            "slurm-like",
            order=PRIORITY_THEN_ARRIVAL,
            placement=FIRST_FIT,
            backfill=EASY_BACKFILL,
            preemption=NO_PREEMPTION,
            elastic=NO_RESIZING,
        ),
        Policy(  # whatever fits starts, in arrival order
            "greedy",
            order=ARRIVAL_ORDER,
            placement=FIRST_FIT,
            backfill=NO_BACKFILL,
            preemption=NO_PREEMPTION,
            elastic=NO_RESIZING,
        ),
        Policy(
            "tiresias",
            order=LEAST_ATTAINED_SERVICE,
            placement=TOPOLOGY_AWARE,
            backfill=NO_BACKFILL,
            preemption=ACROSS_CLASSES,
            elastic=NO_RESIZING,
        ),
    )
}


def named(name: str) -> Policy:
    """The policy called ``name``; raise KeyError listing the known names."""
    if name not in POLICIES:
        raise KeyError(f"unknown policy {name!r}; known: {', '.join(POLICIES)}")
    return POLICIES[name]

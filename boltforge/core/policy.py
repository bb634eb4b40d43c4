"""Named scheduling policies: how a cycle orders, places, backfills, preempts and resizes."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import StrEnum

from boltforge.core.preempt.bump import BumpRule
from boltforge.core.preempt.victims import PreemptRules
from boltforge.core.queueing.shortest import SizeRule

# The default's order inside a class: least work left first, a waiting job's work halving
# every 32 hours, its team's fair share weighing in with half the exponent
# (``core/queueing/shortest.py``).
SHORTEST_AGED = SizeRule(aging_s=32 * 3600.0, fair_weight=0.5)
# The default bumps a running job of its class that has at least 8 times its need (plus what
# the bumped job loses) left, and only within 5 minutes of that job's last checkpoint
# (``core/preempt/bump.py``). Both chosen on ITP clusters 01-03 (``docs/evaluation.md``).
BUMP_PEERS = BumpRule(gain=8.0)
PEER_RULES = PreemptRules(peer_window_s=300.0)


class Ordering(StrEnum):
    """How pending jobs are ordered."""

    FAIR = "fair"  # priority class, deadline urgency, hierarchical fair share, DRF, age
    FIFO = "fifo"  # arrival order
    PRIORITY = "priority"  # priority class, then arrival (Slurm's multifactor without fair share)
    LAS = "las"  # Tiresias: least attained service in discrete queues, starvation promotion


class Backfill(StrEnum):
    """Whether later jobs may start in gaps ahead of blocked ones."""

    NONE = "none"
    EASY = "easy"  # one reservation: the first blocked job
    CONSERVATIVE = "conservative"  # a reservation for each of the first `reservations` blocked


@dataclass(frozen=True, slots=True)
class Policy:
    """One named scheduling profile; the simulator runs several side by side.

    ``strict_order``: once a job cannot start, every job behind it waits (head-of-line
    blocking, as in plain FIFO). ``reservations`` bounds conservative backfill's depth;
    ``estimate_waits`` how many waiting jobs per pass get a when-and-where start estimate;
    ``preempt_attempts`` how many jobs per pass may search for victims.
    Tiresias parameters: ``las_thresholds`` (GPU-seconds of attained service splitting the
    discrete queues) and ``starvation_s`` (a job waiting this long is promoted to the top queue).
    ``size``: under FAIR ordering, rank jobs inside a class by aged work left with fair share
    folded in (``core/queueing/shortest.py``) instead of by fair share, then arrival.
    ``patience``: a gang whose best placement now is wider than the empty fleet's waits for a
    tight one when that finishes sooner (``core/placement/patience.py``).
    ``bump``: a waiting job may bump a running job of its own class that has far more time
    left than it needs (``core/preempt/bump.py``); None: preemption only across classes.
    """

    name: str
    ordering: Ordering = Ordering.FAIR
    strict_order: bool = False
    topology_aware: bool = True
    backfill: Backfill = Backfill.CONSERVATIVE
    reservations: int = 4
    preemption: bool = True
    elastic: bool = True
    lookahead: int = 16
    half_life_s: float = 7 * 86400.0
    resize_cost_s: float = 60.0
    resize_window_s: float = 1800.0
    estimate_waits: int = 32
    las_thresholds: tuple[float, ...] = (3600.0 * 8, 3600.0 * 8 * 24)
    starvation_s: float = 3 * 86400.0
    preempt_rules: PreemptRules = field(default_factory=PreemptRules)
    preempt_attempts: int = 8
    size: SizeRule | None = None
    patience: bool = False
    bump: BumpRule | None = None

    def with_(self, **changes: object) -> Policy:
        return replace(self, **changes)  # type: ignore[arg-type]


# Arrival order on first fit with nothing else: no backfill, preemption, elasticity or lookahead.
_ARRIVAL = Policy(
    "arrival",
    ordering=Ordering.FIFO,
    topology_aware=False,
    backfill=Backfill.NONE,
    reservations=0,
    preemption=False,
    elastic=False,
    lookahead=0,
)

POLICIES: dict[str, Policy] = {
    "default": Policy(
        "default", size=SHORTEST_AGED, patience=True, bump=BUMP_PEERS, preempt_rules=PEER_RULES
    ),
    "fifo": _ARRIVAL.with_(name="fifo", strict_order=True),  # head-of-line blocking
    "slurm-like": _ARRIVAL.with_(
        name="slurm-like", ordering=Ordering.PRIORITY, backfill=Backfill.EASY, reservations=1
    ),
    "greedy": _ARRIVAL.with_(name="greedy"),  # whatever fits starts, in arrival order
    "tiresias": Policy(
        "tiresias",
        ordering=Ordering.LAS,
        topology_aware=True,
        backfill=Backfill.NONE,
        reservations=0,
        preemption=True,
        elastic=False,
        lookahead=0,
    ),
}


def named(name: str) -> Policy:
    """The policy called ``name``; raise KeyError listing the known names."""
    if name not in POLICIES:
        raise KeyError(f"unknown policy {name!r}; known: {', '.join(POLICIES)}")
    return POLICIES[name]

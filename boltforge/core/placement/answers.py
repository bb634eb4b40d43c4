"""What placement answers look like: outcomes, role plans, gang placements and decisions."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum

from boltforge.core.model.levels import Level
from boltforge.core.model.state import Allocation, Grant
from boltforge.core.model.topology import TopologyTree
from boltforge.core.placement import crossing as costs


class Outcome(IntEnum):
    """Graded answers, comparable with ``max()``: never < not now < later < now."""

    NEVER = 0
    NOT_NOW = 1
    LATER = 2
    NOW = 3


@dataclass(frozen=True, slots=True)
class Alternative:
    """A placement the chosen one beat: where it was and what it would have cost.

    ``cost`` is exact for candidates the engine priced in full and otherwise the search's
    estimate, which is exact unless replicas would straddle NVLink islands or leave their rail.
    """

    level: Level
    domain: str
    cost: float
    hosts: int


@dataclass(frozen=True, slots=True)
class RolePlan:
    """Where one role goes: the domain that holds it, its grants, its cost and the runners-up."""

    role: str
    level: Level
    domain: str
    grants: tuple[Grant, ...]
    cost: costs.CostBreakdown
    alternatives: tuple[Alternative, ...]
    gpu_type: str


@dataclass(frozen=True, slots=True)
class Placement:
    """A whole gang's placement. ``cost`` is the sum of its roles' crossing costs."""

    job: str
    roles: tuple[RolePlan, ...]
    cost: costs.CostBreakdown
    notes: tuple[str, ...] = ()

    @property
    def grants(self) -> tuple[Grant, ...]:
        return tuple(g for r in self.roles for g in r.grants)

    @property
    def main(self) -> RolePlan:
        return self.roles[0]

    def nodes(self, tree: TopologyTree) -> dict[str, list[int]]:
        """Host name to the GPU indices the gang holds there, whole or in part (a share's
        GPU); CPU-only replicas map to []."""
        out: dict[str, list[int]] = {}
        for g in self.grants:
            gpus = g.gpus if g.share is None else (g.share.gpu,)
            out.setdefault(tree.hosts[g.host].name, []).extend(gpus)
        return {h: sorted(v) for h, v in out.items()}

    def allocation(self, expected_end: float | None = None, priority: int = 3) -> Allocation:
        return Allocation(self.job, self.grants, expected_end, priority)

    @property
    def rail_aligned(self) -> bool:
        return self.cost.hops["rail"] == 0


@dataclass(frozen=True, slots=True)
class Decision:
    """The answer to a placement question: the outcome, and a placement or the reasons why not."""

    outcome: Outcome
    placement: Placement | None = None
    reasons: tuple[str, ...] = ()
    fixes: tuple[str, ...] = ()
    start_time: float | None = None
    waits_for: tuple[str, ...] = field(default=())

    @property
    def placed(self) -> bool:
        return self.outcome == Outcome.NOW

"""What upkeep the mirror shows due (``loop.upkeep_due``), as data: which live nodes' leases
ran out, went quiet or reached their spot reclaim time, and whether a recovery hold is to
end. The pass opens an upkeep transaction only when this says so, so a node it misses is
never expired, and one it names for nothing costs a transaction per pass."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pytest

from boltforge.control.nodes.agents import LeaseTerms
from boltforge.control.scheduling.loop import upkeep_due
from boltforge.control.store.mirror import LiveJob, LiveNode, Mirror

TERMS = LeaseTerms(heartbeat_s=2.0, suspect_s=6.0, lease_s=15.0)
NOW = 1000.0
HOLD_S = 60.0


def mirror_of(nodes: Sequence[LiveNode] = (), jobs: Sequence[LiveJob] = ()) -> Mirror:
    m = Mirror()
    m.nodes = {n.name: n for n in nodes}
    m.jobs = {j.id: j for j in jobs}
    return m


def node(**values: Any) -> LiveNode:
    base: dict[str, Any] = {
        "name": "n",
        "state": "ready",
        "last_heartbeat": NOW - 1.0,
        "lease_expires_at": NOW + 14.0,
    }
    base.update(values)
    return LiveNode(**base)


@dataclass(frozen=True)
class NodeCase:
    name: str
    node: LiveNode
    due: bool


NODE_CASES = [
    NodeCase("fresh-heartbeat", node(), False),
    NodeCase("lease-ran-out", node(lease_expires_at=NOW - 0.1), True),
    NodeCase("lease-ends-this-instant", node(lease_expires_at=NOW), False),
    NodeCase("quiet-past-suspect", node(last_heartbeat=NOW - 6.5), True),
    NodeCase("quiet-exactly-suspect", node(last_heartbeat=NOW - 6.0), False),
    NodeCase("already-suspect-and-quiet", node(state="suspect", last_heartbeat=NOW - 7), False),
    NodeCase(
        "suspect-whose-lease-ran-out",
        node(state="suspect", last_heartbeat=NOW - 16, lease_expires_at=NOW - 1),
        True,
    ),
    NodeCase("dead-with-an-old-lease", node(state="dead", lease_expires_at=NOW - 100), False),
    NodeCase("never-heard-from", node(last_heartbeat=None, lease_expires_at=None), False),
    NodeCase("reclaim-time-reached", node(reclaim_at=NOW), True),
    NodeCase("reclaim-time-ahead", node(reclaim_at=NOW + 1), False),
    NodeCase("dead-past-its-reclaim", node(state="dead", reclaim_at=NOW - 5), False),
]


@pytest.mark.parametrize("case", NODE_CASES, ids=[c.name for c in NODE_CASES])
def test_which_nodes_are_due(case: NodeCase) -> None:
    nodes, holds = upkeep_due(mirror_of([case.node]), TERMS, NOW, HOLD_S)
    assert nodes == ({"n"} if case.due else set())
    assert holds is False


def test_only_the_due_nodes_of_a_fleet_are_named() -> None:
    fleet = [
        node(name="quiet", last_heartbeat=NOW - 10),
        node(name="fine"),
        node(name="gone", state="dead", lease_expires_at=NOW - 99),
        node(name="reclaimed", reclaim_at=NOW - 1),
    ]
    nodes, _ = upkeep_due(mirror_of(fleet), TERMS, NOW, HOLD_S)
    assert nodes == {"quiet", "reclaimed"}


def job(state: str, hold_at: float | None) -> LiveJob:
    hold = None if hold_at is None else {"at": hold_at, "grants": [], "lost": ["n"]}
    return LiveJob(id="1", state=state, recovery_hold=hold)


@pytest.mark.parametrize(
    ("state", "hold_at", "due"),
    [
        ("requeued", None, False),
        ("requeued", NOW - 10.0, False),  # still within its hold
        ("requeued", NOW - HOLD_S, True),  # the hold ends this instant
        ("requeued", NOW - HOLD_S - 1, True),
        ("pending", NOW - HOLD_S - 1, True),
        ("scheduled", NOW - 1.0, True),  # placed: whatever was held is to be cleared
        ("running", NOW - 1.0, True),
    ],
    ids=[
        "no-hold",
        "within-hold",
        "hold-ends-now",
        "hold-over",
        "pending-hold-over",
        "placed-with-hold",
        "running-with-hold",
    ],
)
def test_when_a_recovery_hold_is_due_to_end(state: str, hold_at: float | None, due: bool) -> None:
    nodes, holds = upkeep_due(mirror_of(jobs=[job(state, hold_at)]), TERMS, NOW, HOLD_S)
    assert holds is due
    assert nodes == set()


def test_a_hold_without_a_time_counts_from_zero_and_is_long_over() -> None:
    hold = LiveJob(id="1", state="requeued", recovery_hold={"grants": []})
    _, holds = upkeep_due(mirror_of(jobs=[hold]), TERMS, NOW, HOLD_S)
    assert holds is True

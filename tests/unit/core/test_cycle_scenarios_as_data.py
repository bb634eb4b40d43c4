"""Whole scheduling passes as data: who starts, who is bumped and why the rest wait, for
reclaim of borrowed guarantees (and lent ones that reclaim nothing), burst limits up the
queue tree, cordons, fair share by usage and weight, and deadline urgency."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from boltforge.core.cycle import Snapshot, run_cycle
from boltforge.core.decisions import WaitReason
from boltforge.core.model.gang import Gang
from boltforge.core.model.state import Allocation, FleetState, Grant
from boltforge.core.model.workload import Job, Running, Usage
from boltforge.core.policy import FAIR_SHARE, POLICIES
from boltforge.core.preempt.victims import PreemptRules
from boltforge.core.queueing.lending import effective
from boltforge.core.queueing.quota import QueueSpec, QuotaTree
from boltforge.testing.builders import make_fleet, make_gang

LAB = make_fleet(racks=2, hosts=2)  # 4 hosts of 8 GPUs: h0, h1 in rack 0; h2, h3 in rack 1
NOW = 100_000.0
HOUR = 3600.0
# The default policy with arrival order inside a class (so fair share decides alone) and a
# churn budget a 32-GPU lab can use.
POLICY = (
    POLICIES["default"].with_(order=FAIR_SHARE).with_preempt_rules(PreemptRules(churn_fraction=1.0))
)


@dataclass(frozen=True)
class Run:
    """A running job holding whole hosts (by index) since an hour ago, ending never."""

    name: str
    hosts: tuple[int, ...]
    priority: int = 3
    queue: str = "cv"
    borrowed: bool = False
    gpus: tuple[int, ...] = tuple(range(8))


@dataclass(frozen=True)
class Ask:
    """A pending job of ``gpus`` GPUs on whole hosts (or one host when fewer than 8)."""

    name: str
    gpus: int = 8
    priority: int = 3
    queue: str = "ops"
    submit: float = NOW - 60.0
    limit: float | None = None
    deadline: float | None = None


@dataclass(frozen=True)
class Scenario:
    id: str
    running: tuple[Run, ...]
    pending: tuple[Ask, ...]
    started: tuple[str, ...]
    bumped: frozenset[str] = frozenset()
    reasons: dict[str, WaitReason] = field(default_factory=dict)
    says: dict[str, str] = field(default_factory=dict)
    quota: QuotaTree | None = None
    usage: dict[str, float] = field(default_factory=dict)
    cordoned: tuple[int, ...] = ()
    borrowed: dict[str, int] = field(default_factory=dict)


def gang(name: str, gpus: int, priority: int, queue: str) -> Gang:
    base = make_gang(name, gpus=gpus, per_node=min(gpus, 8))
    return Gang(base.name, base.roles, base.topology, queue, priority)


def snapshot(s: Scenario) -> Snapshot:
    state = FleetState(LAB)
    running = []
    for r in s.running:
        grants = tuple(Grant("worker", i, h, r.gpus) for i, h in enumerate(r.hosts))
        total = len(r.gpus) * len(r.hosts)
        job = Job(r.name, gang(r.name, total, r.priority, r.queue), r.queue, 0.0)
        state.allocate(Allocation(r.name, grants, None, r.priority))
        running.append(Running(job, state.allocations[r.name], NOW - HOUR, borrowed=r.borrowed))
    for h in s.cordoned:
        state.cordoned[h] = True
    pending = tuple(
        Job(
            a.name,
            gang(a.name, a.gpus, a.priority, a.queue),
            a.queue,
            a.submit,
            time_limit=a.limit,
            deadline=a.deadline,
        )
        for a in s.pending
    )
    usage = Usage(dict(s.usage), NOW)
    return Snapshot(state, pending, tuple(running), NOW, quota=s.quota, usage=usage)


OPS_16 = QuotaTree.build([QueueSpec("ops", {"*": 16}), QueueSpec("cv"), QueueSpec("nlp")])
# ops has lent its whole guarantee (it held nothing for a day): the guarantee it keeps is
# what it holds, so the GPUs others borrowed on it are no longer owed back.
OPS_LENT = QuotaTree.build(
    [QueueSpec("ops", effective({"*": 16}, {})), QueueSpec("cv"), QueueSpec("nlp")]
)
NESTED = QuotaTree.build(
    [QueueSpec("org", {}, {"*": 16}), QueueSpec("org/nlp", {"*": 8}), QueueSpec("org/cv")]
)
CV_BORROWS_ALL = (Run("cv-a", (0, 1), borrowed=True), Run("cv-b", (2, 3), borrowed=True))
# Three hosts held by serving work (never bumped): exactly one 8-GPU job can start.
ONE_HOST_LEFT = (Run("serve", (0, 1, 2), priority=0, queue="infra"),)

SCENARIOS = [
    Scenario(
        "a guaranteed queue reclaims borrowed GPUs from work of its own class",
        CV_BORROWS_ALL,
        (Ask("ops-1"),),
        started=("ops-1",),
        bumped=frozenset({"cv-a"}),
        quota=OPS_16,
        borrowed={"ops-1": 0},
    ),
    Scenario(
        "a lent guarantee is owed nothing: the job waits and no borrower is bumped",
        CV_BORROWS_ALL,
        (Ask("ops-1"),),
        started=(),
        reasons={"ops-1": WaitReason.CAPACITY},
        quota=OPS_LENT,
    ),
    Scenario(
        "a queue without a guarantee cannot bump borrowed work of its own class",
        CV_BORROWS_ALL,
        (Ask("nlp-1", queue="nlp"),),
        started=(),
        reasons={"nlp-1": WaitReason.CAPACITY},
        quota=OPS_16,
    ),
    Scenario(
        "reclaim passes over class: borrowed production work goes back to a batch job",
        (Run("cv-a", (0, 1), priority=1, borrowed=True), Run("cv-b", (2, 3), priority=1)),
        (Ask("ops-1"),),
        started=("ops-1",),
        bumped=frozenset({"cv-a"}),
        quota=OPS_16,
    ),
    Scenario(
        "borrowed serving work is never reclaimed",
        (Run("cv-a", (0, 1), priority=0, borrowed=True), Run("cv-b", (2, 3), priority=0)),
        (Ask("ops-1"),),
        started=(),
        reasons={"ops-1": WaitReason.CAPACITY},
        says={"ops-1": "serving job"},
        quota=OPS_16,
    ),
    Scenario(
        "GPUs beyond the guarantee are reported borrowed on the bind",
        (),
        (Ask("ops-1", gpus=24),),
        started=("ops-1",),
        quota=OPS_16,
        borrowed={"ops-1": 8},
    ),
    Scenario(
        "a parent's burst limit holds back its child and names both",
        (Run("cv-a", (0,), queue="org/cv"),),
        (Ask("nlp-1", gpus=16, queue="org/nlp"),),
        started=(),
        reasons={"nlp-1": WaitReason.QUOTA},
        says={"nlp-1": "queue org (which org/nlp belongs to) would hold 24 GPUs"},
        quota=NESTED,
    ),
    Scenario(
        "an unknown queue is charged to its nearest ancestor's limits",
        (Run("cv-a", (0,), queue="org/cv"),),
        (Ask("x-1", gpus=16, queue="org/nlp/new-project"),),
        started=(),
        reasons={"x-1": WaitReason.QUOTA},
        says={"x-1": "burst limit of 16"},
        quota=NESTED,
    ),
    Scenario(
        "free GPUs only on cordoned hosts are no capacity at all",
        ONE_HOST_LEFT,
        (Ask("ops-1"),),
        started=(),
        reasons={"ops-1": WaitReason.CAPACITY},
        cordoned=(3,),
    ),
    Scenario(
        "enough free GPUs split over hosts is a topology wait, not a capacity one",
        (
            Run("left", (0, 1), gpus=(0, 1, 2, 3), priority=0, queue="infra"),
            Run("right", (2, 3), gpus=(4, 5, 6, 7), priority=0, queue="infra"),
        ),
        (Ask("ops-1"),),
        started=(),
        reasons={"ops-1": WaitReason.TOPOLOGY},
    ),
    Scenario(
        "the queue that used less of its share starts first",
        ONE_HOST_LEFT,
        (Ask("nlp-1", queue="nlp", submit=NOW - 500.0), Ask("cv-1", queue="cv")),
        started=("cv-1",),
        reasons={"nlp-1": WaitReason.CAPACITY},
        quota=QuotaTree.build([QueueSpec("nlp"), QueueSpec("cv")]),
        usage={"nlp": 9e6, "cv": 1e6, "": 1e7},
    ),
    Scenario(
        "at equal usage the queue with the larger weight has the larger share and goes first",
        ONE_HOST_LEFT,
        (Ask("nlp-1", queue="nlp", submit=NOW - 500.0), Ask("cv-1", queue="cv")),
        started=("cv-1",),
        quota=QuotaTree.build([QueueSpec("nlp"), QueueSpec("cv", weight=3.0)]),
        usage={"nlp": 5e6, "cv": 5e6, "": 1e7},
    ),
    Scenario(
        "a job whose deadline is near goes ahead of fair share within its class",
        ONE_HOST_LEFT,
        (
            Ask("cv-1", queue="cv", submit=NOW - 500.0),
            Ask("nlp-1", queue="nlp", limit=HOUR, deadline=NOW + 1.5 * HOUR),
        ),
        started=("nlp-1",),
        quota=QuotaTree.build([QueueSpec("nlp"), QueueSpec("cv")]),
        usage={"nlp": 9e6, "cv": 1e6, "": 1e7},
    ),
    Scenario(
        "a far deadline is no urgency: fair share decides",
        ONE_HOST_LEFT,
        (
            Ask("cv-1", queue="cv", submit=NOW - 500.0),
            Ask("nlp-1", queue="nlp", limit=HOUR, deadline=NOW + 10 * HOUR),
        ),
        started=("cv-1",),
        quota=QuotaTree.build([QueueSpec("nlp"), QueueSpec("cv")]),
        usage={"nlp": 9e6, "cv": 1e6, "": 1e7},
    ),
    Scenario(
        "urgency never lifts a job above a more important class",
        ONE_HOST_LEFT,
        (
            Ask("urgent", priority=3, limit=HOUR, deadline=NOW + HOUR),
            Ask("important", priority=2, submit=NOW - 1.0),
        ),
        started=("important",),
    ),
]


@pytest.mark.parametrize("s", SCENARIOS, ids=[s.id for s in SCENARIOS])
def test_scenario(s: Scenario) -> None:
    snap = snapshot(s)
    result = run_cycle(snap, POLICY)
    assert tuple(b.job for b in result.binds) == s.started
    assert {e.job for e in result.evictions} == s.bumped
    for name, reason in s.reasons.items():
        why = result.why(name)
        assert why is not None and why.reason == reason, (name, why)
    for name, words in s.says.items():
        why = result.why(name)
        assert why is not None and any(words in d for d in why.detail), why
    for name, count in s.borrowed.items():
        (bind,) = [b for b in result.binds if b.job == name]
        assert bind.borrowed_gpus == count
    # What the pass decided can be carried out on the fleet as it was.
    after = snap.state.copy()
    for e in result.evictions:
        after.release(e.job)
    for b in result.binds:
        assert not any(snap.state.cordoned[g.host] for g in b.placement.grants)
        after.allocate(b.placement.allocation())


def test_a_reclaim_says_whose_quota_the_victim_ran_on() -> None:
    (s,) = [s for s in SCENARIOS if s.id.startswith("a guaranteed queue reclaims")]
    (bind,) = run_cycle(snapshot(s), POLICY).binds
    assert "runs on quota borrowed from ops: reclaimed first" in bind.note


def test_scenario_ids_are_unique() -> None:
    assert len({s.id for s in SCENARIOS}) == len(SCENARIOS)

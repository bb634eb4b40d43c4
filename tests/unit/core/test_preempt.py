"""Preemption: scenarios written as data, and properties every choice of victims keeps.

A scenario is a small fleet, the jobs running on it (where, what class, how long since their
checkpoint), a job that wants to start, and what ``find_victims`` must answer: exactly which
jobs are evicted or shrunk, or that preemption cannot help and why. The properties run random
fleets, jobs and rules through ``find_victims`` and check the rules hold on every answer.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from boltforge.core.model.gang import Gang
from boltforge.core.model.levels import Level
from boltforge.core.model.state import Allocation, FleetState, Grant
from boltforge.core.model.topology import TopologyTree
from boltforge.core.model.workload import BATCH, INTERACTIVE, PRODUCTION, SERVING, Job, Running
from boltforge.core.placement.place import place_gang
from boltforge.core.preempt.choose import (
    NoVictims,
    PreemptRules,
    Victims,
    find_victims,
    preemption_worth_it,
    release_victims,
)
from boltforge.testing.builders import make_fleet, make_gang, make_role, occupy

NOW = 100_000.0
MIN = 60.0
ALL = tuple(range(8))
OPEN = PreemptRules(churn_fraction=1.0)  # no churn limit unless a scenario sets one


def host(short: str) -> str:
    """``r0-h1`` (pod 0) or ``p1-r0-h1`` as the builders name hosts: ``h100-p0-r0-h1``."""
    return "h100-" + (short if short.startswith("p") else "p0-" + short)


@dataclass(frozen=True)
class Busy:
    """A running job: one replica per host (``gpus`` on each), its class and its history.

    Times are minutes before ``NOW``: it started ``age`` ago, last checkpointed ``checkpoint``
    ago (None: never) and was last preempted ``preempted`` ago (None: never).
    """

    id: str
    hosts: tuple[str, ...]
    cls: int = BATCH
    gpus: tuple[int, ...] = ALL
    age: float = 120.0
    checkpoint: float | None = 30.0
    preempted: float | None = None
    elastic: tuple[int, int] | None = None
    preemptible: bool = True

    def running(self, tree: TopologyTree) -> Running:
        grants = tuple(
            Grant("worker", i, tree.host_index[host(h)], self.gpus)
            for i, h in enumerate(self.hosts)
        )
        role = make_role(replicas=len(grants), gpus=len(self.gpus))
        gang = Gang(self.id, (role,), priority=self.cls)
        job = Job(self.id, gang, "batch-queue", 0.0, elastic=self.elastic)
        job = replace(job, preemptible=self.preemptible)
        held = Allocation(self.id, grants, None, self.cls)
        return Running(job, held, NOW - self.age * MIN, ago(self.checkpoint), ago(self.preempted))


def ago(minutes: float | None) -> float | None:
    return None if minutes is None else NOW - minutes * MIN


def batch(
    id: str,
    *hosts: str,
    checkpoint: float | None = 30.0,
    age: float = 120.0,
    preempted: float | None = None,
    gpus: tuple[int, ...] = ALL,
    preemptible: bool = True,
) -> Busy:
    """A class-3 job with one replica on each of ``hosts`` (times in minutes before NOW)."""
    return Busy(id, hosts, BATCH, gpus, age, checkpoint, preempted, preemptible=preemptible)


def serving(id: str, *hosts: str) -> Busy:
    """A class-0 job with one replica on each of ``hosts``."""
    return Busy(id, hosts, cls=SERVING)


def wants(
    gpus: int, cls: int = INTERACTIVE, per_node: int = 8, required: Level | None = None
) -> Job:
    """The job that wants to start: ``gpus`` GPUs, ``per_node`` per replica, class ``cls``."""
    gang = replace(make_gang("new", gpus=gpus, per_node=per_node, required=required), priority=cls)
    return Job("new", gang, "research", NOW)


@dataclass(frozen=True)
class Scenario:
    """A fleet, its running jobs, a job to start, and the answer ``find_victims`` must give.

    ``evicted``/``shrunk`` are checked exactly when set; ``says`` are substrings of the
    explanation (or of the reasons when ``refused``).
    """

    fleet: TopologyTree
    busy: tuple[Busy, ...]
    job: Job
    rules: PreemptRules = OPEN
    recent: tuple[tuple[float, int], ...] = ()
    reclaim: frozenset[str] = frozenset()
    over_quota: frozenset[str] = frozenset()
    evicted: set[str] | None = None
    shrunk: dict[str, int] = field(default_factory=dict)
    refused: bool = False
    says: tuple[str, ...] = ()


def fleet(racks: int = 1, hosts: int = 2, pods: int = 1) -> TopologyTree:
    """Pods of racks of 8-GPU hosts, named ``h100-p0-r0-h0`` and so on."""
    return make_fleet(pods=pods, racks=racks, hosts=hosts)


SCENARIOS = [
    pytest.param(
        Scenario(
            fleet(racks=3),
            (
                batch("a-scattered", "r1-h0"),
                serving("s1", "r1-h1"),
                batch("b-scattered", "r2-h0"),
                serving("s2", "r2-h1"),
                batch("c-together", "r0-h0"),
                batch("d-together", "r0-h1"),
            ),
            wants(16),
            evicted={"c-together", "d-together"},
            says=(
                "in rack h100-p0-r0",
                "placement cost 23 on 2 host(s)",
                "beat pod h100-p0: 8.3 GPU-hours over 2 victim(s), placement cost 50 "
                "(equal loss and victims, costlier placement (50))",
            ),
        ),
        id="a 16-GPU job evicts the two batch jobs sharing one rack, not two scattered ones",
    ),
    pytest.param(
        Scenario(
            fleet(racks=3),
            (
                batch("a", "r1-h0", checkpoint=5),
                serving("s1", "r1-h1"),
                batch("b", "r2-h0", checkpoint=5),
                serving("s2", "r2-h1"),
                batch("c", "r0-h0", checkpoint=40),
                batch("d", "r0-h1", checkpoint=40),
            ),
            wants(16, required=Level.RACK),
            evicted={"c", "d"},
        ),
        id="a rack-bound job clears one rack even when scattered victims would lose less",
    ),
    pytest.param(
        Scenario(
            fleet(hosts=1),
            (serving("web", "r0-h0"),),
            wants(8, cls=SERVING),
            refused=True,
            says=(
                "only class 0 jobs run in the racks that could hold it",
                "1 serving job (class 0) is never preempted",
            ),
        ),
        id="class 0 is never a victim, not even of another class-0 job",
    ),
    pytest.param(
        Scenario(
            fleet(hosts=1),
            (Busy("prod", ("r0-h0",), cls=PRODUCTION),),
            wants(8, cls=SERVING),
            evicted={"prod"},
        ),
        id="class 1 is preempted by class 0",
    ),
    pytest.param(
        Scenario(
            fleet(hosts=1),
            (Busy("prod", ("r0-h0",), cls=PRODUCTION),),
            wants(8, cls=INTERACTIVE),
            refused=True,
            says=("1 class-1 job can be preempted only by class 0",),
        ),
        id="class 1 is preempted only by class 0",
    ),
    pytest.param(
        Scenario(
            fleet(),
            (
                Busy("borrower", ("r0-h0",), cls=INTERACTIVE, checkpoint=60),
                batch("cheap", "r0-h1", checkpoint=40),
            ),
            wants(8, cls=INTERACTIVE),
            reclaim=frozenset({"borrower"}),
            evicted={"borrower"},
            says=("runs on quota borrowed from research: reclaimed first", "x0.25"),
        ),
        id="borrowed work is reclaimed first even at equal class",
    ),
    pytest.param(
        Scenario(
            fleet(),
            (batch("over", "r0-h0", checkpoint=50), batch("within", "r0-h1", checkpoint=40)),
            wants(8),
            over_quota=frozenset({"over"}),
            evicted={"over"},
            says=("[over its quota]",),
        ),
        id="work over its quota goes before work within quota",
    ),
    pytest.param(
        Scenario(
            fleet(),
            (
                Busy("interactive", ("r0-h0",), cls=INTERACTIVE, checkpoint=20),
                batch("batch", "r0-h1", checkpoint=30),
            ),
            wants(8, cls=PRODUCTION),
            evicted={"batch"},
        ),
        id="a less important class goes before a more important one that would lose less",
    ),
    pytest.param(
        Scenario(
            fleet(hosts=1),
            (batch("fresh", "r0-h0", age=5, checkpoint=None),),
            wants(8),
            refused=True,
            says=("1 candidate victim is in its first 10 min",),
        ),
        id="a job in its first 10 minutes is protected",
    ),
    pytest.param(
        Scenario(
            fleet(),
            (batch("fresh", "r0-h0", age=5, checkpoint=None), batch("old", "r0-h1", checkpoint=50)),
            wants(8),
            evicted={"old"},
        ),
        id="a job in its first 10 minutes is passed over for an older one",
    ),
    pytest.param(
        Scenario(
            fleet(),
            (
                batch("bumped", "r0-h0", checkpoint=5, preempted=20),
                batch("other", "r0-h1", checkpoint=50),
            ),
            wants(8),
            evicted={"other"},
        ),
        id="a job preempted 20 minutes ago is not preempted again",
    ),
    pytest.param(
        Scenario(
            fleet(hosts=4),
            tuple(batch(f"b{i}", f"r0-h{i}") for i in range(4)),
            wants(8),
            rules=PreemptRules(churn_fraction=0.5),
            recent=((NOW - 60, 12),),
            refused=True,
            says=("preempting would exceed the churn budget (20 of 16 GPUs per 10 min)",),
        ),
        id="the churn budget stops a preemption that would exceed it",
    ),
    pytest.param(
        Scenario(
            fleet(hosts=4),
            tuple(batch(f"b{i}", f"r0-h{i}") for i in range(4)),
            wants(8),
            rules=PreemptRules(churn_fraction=0.5),
            recent=((NOW - 11 * MIN, 12),),
            evicted={"b0"},
            says=("8 GPUs preempted (8 of 16 GPUs per 10 min churn budget)",),
        ),
        id="preemptions older than the churn window do not count against it",
    ),
    pytest.param(
        Scenario(
            fleet(),
            (Busy("elastic", ("r0-h0", "r0-h1"), elastic=(1, 2), checkpoint=50),),
            wants(8),
            evicted=set(),
            shrunk={"elastic": 1},
            says=(
                "elastic: shrink from 2 to 1 replica(s), 8 GPUs x 60 s restart = 0.13 GPU-hours",
            ),
        ),
        id="an elastic victim is shrunk instead of evicted",
    ),
    pytest.param(
        Scenario(
            fleet(),
            (Busy("elastic", ("r0-h0", "r0-h1"), elastic=(1, 2), checkpoint=50),),
            wants(8),
            rules=replace(OPEN, shrink=False),
            evicted={"elastic"},
        ),
        id="with shrinking off (a policy without elasticity) an elastic victim is evicted",
    ),
    pytest.param(
        Scenario(
            fleet(hosts=3),
            (Busy("elastic", ("r0-h0", "r0-h1", "r0-h2"), elastic=(2, 3)),),
            wants(16),
            evicted={"elastic"},
        ),
        id="an elastic job is evicted when shrinking to its minimum is not enough",
    ),
    pytest.param(
        Scenario(
            fleet(hosts=3),
            (
                batch("fifty", "r0-h0", checkpoint=50),
                batch("ten", "r0-h1", checkpoint=10),
                batch("thirty", "r0-h2", checkpoint=30),
            ),
            wants(8),
            evicted={"ten"},
            says=("ten: 8 GPUs x (10 min since checkpoint + 60 s restart) = 1.5 GPU-hours",),
        ),
        id="the victim with the least work since its checkpoint is chosen",
    ),
    pytest.param(
        Scenario(
            fleet(hosts=1),
            (Busy("peer", ("r0-h0",), cls=INTERACTIVE),),
            wants(8, cls=INTERACTIVE),
            refused=True,
            says=("no cascades",),
        ),
        id="no cascade: a class-2 job never displaces another class-2 job",
    ),
    pytest.param(
        Scenario(
            fleet(hosts=1),
            (batch("pinned", "r0-h0", preemptible=False),),
            wants(8),
            refused=True,
            says=("1 job is not preemptible",),
        ),
        id="a job marked not preemptible is never a victim",
    ),
    pytest.param(
        Scenario(
            fleet(),
            (
                batch("useful", "r0-h0", gpus=(0, 1, 2, 3), checkpoint=10),
                batch("cheapest", "r0-h1", gpus=(0, 1, 2, 3), checkpoint=5),
                batch("costly", "r0-h1", gpus=(4, 5, 6, 7), checkpoint=50),
            ),
            wants(8),
            evicted={"useful"},
        ),
        id="a victim whose GPUs the placement does not use is pruned",
    ),
    pytest.param(
        Scenario(
            fleet(),
            (batch("a", "r0-h0"),),
            wants(8),
            evicted=set(),
            says=("fits now: nothing to preempt",),
        ),
        id="a job that fits now preempts nothing",
    ),
    pytest.param(
        Scenario(
            fleet(racks=2, hosts=3),
            (
                batch("a", "r0-h0"),
                batch("b", "r0-h1"),
                serving("s0", "r0-h2"),
                batch("c", "r1-h0"),
                batch("d", "r1-h1"),
                serving("s1", "r1-h2"),
            ),
            wants(24, required=Level.RACK),
            refused=True,
            says=(
                "even evicting every eligible job leaves no rack with room",
                "2 serving jobs (class 0) are never preempted",
            ),
        ),
        id="even evicting every eligible job leaves no rack with room",
    ),
    pytest.param(
        Scenario(
            fleet(),
            (batch("a", "r0-h0"),),
            wants(64),
            refused=True,
            says=("it could never run on this fleet",),
        ),
        id="a job the fleet could never hold is told so",
    ),
    pytest.param(
        Scenario(
            fleet(racks=2),
            (
                batch("a", "r0-h0"),
                batch("b", "r0-h1"),
                batch("c", "r1-h0", checkpoint=20),
                serving("s", "r1-h1"),
            ),
            wants(16),
            evicted={"a", "c"},
            says=(
                "to place new (16 GPUs, class 2) in pod h100-p0: evict 2 job(s)",
                "a: 8 GPUs x (30 min since checkpoint + 60 s restart) = 4.1 GPU-hours [class 3]",
                "c: 8 GPUs x (20 min since checkpoint + 60 s restart) = 2.8 GPU-hours [class 3]",
                "why pod h100-p0: no other rack, pod or fleet-wide choice loses less work",
                "1 other domain(s) could not do better: even the least work they could lose",
                "total: 6.9 GPU-hours lost; 16 GPUs preempted (16 of 32 GPUs per 10 min",
            ),
        ),
        id="scattered victims that lose less work win, and the explanation shows the arithmetic",
    ),
]


def build(s: Scenario) -> tuple[FleetState, list[Running]]:
    state = FleetState(s.fleet)
    running = [b.running(s.fleet) for b in s.busy]
    for r in running:
        state.allocate(r.allocation)
    return state, running


@pytest.mark.parametrize("s", SCENARIOS)
def test_scenario(s: Scenario) -> None:
    state, running = build(s)
    got = find_victims(state, s.job, running, s.rules, NOW, list(s.recent), s.reclaim, s.over_quota)
    if s.refused:
        assert isinstance(got, NoVictims), got
        text = got.reasons
    else:
        assert isinstance(got, Victims), got
        text = got.explanation
        if s.evicted is not None:
            assert set(got.jobs) == s.evicted, text
        assert got.shrink == s.shrunk, text
        check_valid(state, running, s.job, got, s.rules, s.recent, s.reclaim)
    joined = "\n".join(text)
    for phrase in s.says:
        assert phrase in joined, joined


# --- whether preempting is worth it ------------------------------------------------------


def victims_losing(gpu_hours: float) -> Victims:
    state = FleetState(fleet())
    placement, _ = place_gang(state, make_gang("new", gpus=8))
    assert placement is not None
    jobs = ("j-17",) if gpu_hours else ()
    return Victims(jobs, {}, placement, gpu_hours * 3600, (), {})


WORTH = [
    pytest.param(
        3.4,
        40 * MIN,
        64,
        True,
        "preempting loses 3.4 GPU-hours; waiting ~40 min costs 42.7 GPU-hours of the 64-GPU "
        "job's time: preempt",
        id="losing 3.4 GPU-hours beats a 64-GPU job waiting 40 minutes",
    ),
    pytest.param(
        20.0,
        10 * MIN,
        8,
        False,
        "preempting loses 20.0 GPU-hours; waiting ~10 min costs 1.3 GPU-hours of the 8-GPU "
        "job's time: wait",
        id="a short wait beats losing a lot of work",
    ),
    pytest.param(
        3.4,
        None,
        8,
        True,
        "preempting loses 3.4 GPU-hours; the wait is unknown: preempt",
        id="when the wait is unknown, preempt",
    ),
    pytest.param(0.0, 60.0, 8, True, "nothing to preempt: it fits now", id="nothing to lose: go"),
]


@pytest.mark.parametrize(("lost_h", "wait_s", "gpus", "preempt", "sentence"), WORTH)
def test_preemption_worth_it(
    lost_h: float, wait_s: float | None, gpus: int, preempt: bool, sentence: str
) -> None:
    assert preemption_worth_it(victims_losing(lost_h), wants(gpus), wait_s) == (preempt, sentence)


# --- what every answer must satisfy ------------------------------------------------------


def check_valid(
    state: FleetState,
    running: list[Running],
    job: Job,
    got: Victims,
    rules: PreemptRules = OPEN,
    recent: tuple[tuple[float, int], ...] = (),
    reclaim: frozenset[str] = frozenset(),
) -> None:
    """Victims keep the class rules, protections and churn budget, and free a valid placement."""
    by_id = {r.job.id: r for r in running}
    touched = set(got.jobs) | set(got.shrink)
    assert not set(got.jobs) & set(got.shrink), "a job is either evicted or shrunk"
    assert set(got.shrink) == set(got.dropped)
    for name in touched:
        run = by_id[name]
        victim = run.job
        assert victim.priority != SERVING, "class 0 is never a victim"
        assert victim.preemptible
        if name not in reclaim:
            assert victim.priority > job.priority, "no cascades: only less important classes"
            assert victim.priority != PRODUCTION or job.priority == SERVING
        assert NOW - run.start_time >= rules.min_runtime_s, "protected in its first minutes"
        assert run.last_preempted is None or NOW - run.last_preempted >= rules.cooldown_s
    freed = sum(by_id[j].gpus for j in got.jobs)
    for name, count in got.shrink.items():
        victim, held = by_id[name].job, state.allocations[name]
        first = victim.gang.roles[0].name
        dropped = got.dropped[name]
        assert all(g in held.grants and g.role == first for g in dropped)
        current = sum(g.role == first for g in held.grants)
        assert victim.elastic is not None and victim.elastic[0] <= count == current - len(dropped)
        freed += sum(len(g.gpus) for g in dropped)
    used = sum(n for t, n in recent if NOW - t < rules.churn_window_s)
    if touched:
        assert used + freed <= rules.churn_fraction * state.tree.total_gpus + 1e-9, "churn budget"
    after = independently_released(state, got)
    after.allocate(got.placement.allocation())  # raises Conflict on any clash
    held_gpus = Counter(
        (g.host, gpu) for a in after.allocations.values() for g in a.grants for gpu in g.gpus
    )
    assert all(n == 1 for n in held_gpus.values()), "a GPU is held twice"
    assert sum(held_gpus.values()) + after.free_gpus == state.tree.total_gpus
    lost = sum(by_id[j].lost_gpu_seconds(NOW) for j in got.jobs) + sum(
        sum(len(g.gpus) for g in got.dropped[j]) * by_id[j].job.restart_overhead for j in got.shrink
    )
    assert got.lost_gpu_seconds == pytest.approx(lost)
    hosts = {g.host for g in got.placement.grants}
    for name in touched:
        grants = state.allocations[name].grants if name in got.jobs else got.dropped[name]
        assert any(g.host in hosts for g in grants), f"{name} frees nothing the job uses"


def independently_released(state: FleetState, got: Victims) -> FleetState:
    """Release the evicted jobs and drop the shrunk jobs' named grants, without the module."""
    after = state.copy()
    for name in got.jobs:
        after.release(name)
    for name, dropped in got.dropped.items():
        held = after.release(name)
        keep = tuple(g for g in held.grants if g not in dropped)
        after.allocate(Allocation(name, keep, held.expected_end, held.priority))
    mine = release_victims(state, got)
    assert np.array_equal(mine.free, after.free), "release_victims frees exactly the victims"
    return after


# --- random worlds -------------------------------------------------------------------------


@dataclass(frozen=True)
class World:
    """A busy fleet, its running jobs' records, a job that wants in, and the caller's inputs."""

    state: FleetState
    running: list[Running]
    job: Job
    rules: PreemptRules
    recent: tuple[tuple[float, int], ...]
    reclaim: frozenset[str]
    over_quota: frozenset[str]


@st.composite
def worlds(draw: st.DrawFn) -> World:
    """A small fleet (islands of 8 or 4), 60-100% busy, some jobs holding CPUs too."""
    tree = make_fleet(
        pods=draw(st.integers(1, 2)),
        racks=draw(st.integers(1, 3)),
        hosts=draw(st.integers(1, 4)),
        island=draw(st.sampled_from([8, 4])),
    )
    fraction, churn = draw(st.floats(0.6, 1.0)), draw(st.sampled_from([0.0, 0.0, 0.25]))
    state = occupy(tree, fraction, seed=draw(st.integers(0, 2**16)), churn=churn)
    for k in range(draw(st.integers(0, 2))):  # jobs holding CPUs as well as GPUs
        role = make_role(
            "w",
            replicas=draw(st.integers(1, 2)),
            gpus=draw(st.sampled_from([1, 2, 4])),
            cpus=draw(st.sampled_from([32, 64])),
        )
        placement, _ = place_gang(state, make_gang(f"cpu-{k}", roles=(role,)))
        if placement is not None:
            state.allocate(Allocation(f"cpu-{k}", placement.grants, None, BATCH))
    running = [draw(records(a)) for _, a in sorted(state.allocations.items())]
    return World(state, running, draw(newcomers(tree, state.free_gpus)), *draw(inputs(state)))


@st.composite
def newcomers(draw: st.DrawFn, tree: TopologyTree, free: int) -> Job:
    """A job that mostly asks for more than is free; perhaps CPUs too, or a CPU-only role."""
    sizes = [n for n in (1, 2, 4, 8, 16, 24, 32) if n <= tree.total_gpus]
    crowded = [n for n in sizes if n > free] or sizes
    gpus = draw(st.sampled_from(crowded) | st.sampled_from(crowded) | st.sampled_from(sizes))
    per_node = min(gpus, draw(st.sampled_from([1, 2, 4, 8])))
    roles = [
        make_role(
            "worker",
            replicas=gpus // per_node,
            gpus=per_node,
            cpus=draw(st.sampled_from([0, 0, 32, 96])),
        )
    ]
    if draw(st.integers(0, 3)) == 0:
        roles.append(make_role("loader", replicas=1, gpus=0, cpus=16))
    required = draw(st.sampled_from([None, None, Level.RACK, Level.POD]))
    gang = replace(
        make_gang("new", roles=tuple(roles), required=required),
        priority=draw(st.sampled_from([0, 1, 1, 2, 2, 3])),
    )
    return Job("new", gang, "research", NOW)


@st.composite
def inputs(
    draw: st.DrawFn, state: FleetState
) -> tuple[PreemptRules, tuple[tuple[float, int], ...], frozenset[str], frozenset[str]]:
    """Rules, recent preemptions, and who borrows from the job's queue or runs over quota."""
    rules = PreemptRules(
        min_runtime_s=draw(st.sampled_from([0.0, 600.0])),
        cooldown_s=draw(st.sampled_from([0.0, 3600.0])),
        churn_fraction=draw(st.sampled_from([0.05, 0.25, 0.5, 1.0, 1.0])),
    )
    recent = tuple(
        draw(st.lists(st.tuples(st.floats(NOW - 1200, NOW), st.integers(0, 16)), max_size=3))
    )
    names = sorted(state.allocations)
    some = st.frozensets(st.sampled_from(names), max_size=3) if names else st.just(frozenset())
    return rules, recent, draw(some), draw(some)


@st.composite
def records(draw: st.DrawFn, held: Allocation) -> Running:
    """What the cycle knows about a running job: class, age, checkpoint, elasticity."""
    replicas = len(held.grants)
    role = make_role("w", replicas=replicas, gpus=len(held.grants[0].gpus))
    gang = Gang(held.job, (role,), priority=draw(st.sampled_from([0, 1, 2, 3, 3, 3])))
    elastic = None
    if replicas > 1 and draw(st.integers(0, 2)):
        elastic = (draw(st.integers(1, replicas)), replicas)
    job = Job(
        held.job,
        gang,
        "q",
        0.0,
        preemptible=draw(st.sampled_from([True, True, True, False])),
        elastic=elastic,
        restart_overhead=draw(st.sampled_from([0.0, 60.0, 300.0])),
    )
    start = NOW - draw(st.floats(0, 20_000))
    checkpoint = draw(st.one_of(st.none(), st.floats(start, NOW)))
    preempted = draw(st.sampled_from([None, None, None]) | st.floats(NOW - 7200, NOW))
    return Running(job, held, start, checkpoint, preempted)


EXAMPLES = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def ask(w: World) -> Victims | NoVictims:
    return find_victims(
        w.state, w.job, w.running, w.rules, NOW, list(w.recent), w.reclaim, w.over_quota
    )


@EXAMPLES
@given(worlds())
def test_victims_keep_the_rules_and_free_a_valid_placement(w: World) -> None:
    got = ask(w)
    if isinstance(got, NoVictims):
        assert got.reasons
        return
    check_valid(w.state, w.running, w.job, got, w.rules, w.recent, w.reclaim)


@EXAMPLES
@given(worlds())
def test_find_victims_changes_nothing_and_answers_the_same_twice(w: World) -> None:
    before = (w.state.free.copy(), w.state.free_cpus.copy(), w.state.cordoned.copy())
    allocations, running = dict(w.state.allocations), list(w.running)
    first, second = ask(w), ask(w)
    assert np.array_equal(w.state.free, before[0])
    assert np.array_equal(w.state.free_cpus, before[1])
    assert np.array_equal(w.state.cordoned, before[2])
    assert w.state.allocations == allocations and w.running == running
    assert type(first) is type(second)
    if isinstance(first, Victims) and isinstance(second, Victims):
        assert (first.jobs, first.shrink, first.explanation) == (
            second.jobs,
            second.shrink,
            second.explanation,
        )
        assert first.placement.grants == second.placement.grants
    else:
        assert first == second


def test_a_rack_bound_job_on_the_busy_2048_host_fleet_gets_valid_victims() -> None:
    tree = make_fleet(pods=8, racks=8, hosts=32)
    state = occupy(tree, 0.8, seed=3)
    rng = np.random.default_rng(3)
    running = []
    for name, held in sorted(state.allocations.items()):
        role = make_role("w", replicas=len(held.grants), gpus=len(held.grants[0].gpus))
        gang = Gang(name, (role,), priority=int(rng.integers(0, 4)))
        start = NOW - float(rng.uniform(0, 20_000))
        running.append(Running(Job(name, gang, "q", 0.0), held, start, start + 300))
    job = wants(128, cls=PRODUCTION, required=Level.RACK)
    for k in range(64):  # fill every rack that could still take the job
        placement, _ = place_gang(state, job.gang)
        if placement is None:
            break
        held = Allocation(f"fill-{k}", placement.grants, None, BATCH)
        state.allocate(held)
        gang = Gang(held.job, (make_role(replicas=16),), priority=BATCH)
        running.append(Running(Job(held.job, gang, "q", 0.0), held, NOW - 7200, NOW - 600))
    rules = PreemptRules()
    got = find_victims(state, job, running, rules, NOW)
    assert isinstance(got, Victims), got
    check_valid(state, running, job, got, rules)
    assert got.placement.main.level <= Level.RACK

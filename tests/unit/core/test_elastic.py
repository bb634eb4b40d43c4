"""Growing running elastic jobs: scenarios written as data, and properties of every growth.

A scenario is a small fleet, the jobs running on it (where, elastic range, runtime, last
resize), how many jobs are still waiting, and what ``grow`` must answer: the new replica count
of each job that grows (every other job must not grow), where the new replicas go, and what the
note says. The properties run random fleets and jobs through ``grow`` and check that the added
replicas never clash with running work or with each other, and that the answer is repeatable.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from boltforge.core.elastic import grow, growth_id
from boltforge.core.model.gang import Gang
from boltforge.core.model.levels import Level
from boltforge.core.model.state import Allocation, FleetState, Grant
from boltforge.core.model.topology import TopologyTree
from boltforge.core.model.workload import BATCH, PRODUCTION, Job, Running
from boltforge.core.placement.place import place_gang
from boltforge.core.policy import POLICIES, Policy
from boltforge.testing.builders import make_fleet, make_gang, make_role

NOW = 600.0
HOUR = 3600.0
ALL = tuple(range(8))
DEFAULT = POLICIES["default"]


def host(short: str) -> str:
    """``r0-h1`` (pod 0) or ``p1-r0-h1`` as the builders name hosts: ``h100-p0-r0-h1``."""
    return "h100-" + (short if short.startswith("p") else "p0-" + short)


@dataclass(frozen=True)
class Run:
    """A running job with one replica of ``gpus`` on each of ``hosts``, started at time 0.

    ``elastic`` None makes it rigid; ``runtime`` None leaves its end unknown; ``resized`` is
    how many minutes before ``NOW`` it was last resized (None: never).
    """

    id: str
    hosts: tuple[str, ...]
    elastic: tuple[int, int] | None = (1, 4)
    runtime: float | None = 4 * HOUR
    resized: float | None = None
    cls: int = BATCH
    gpus: tuple[int, ...] = ALL
    required: Level | None = None

    def running(self, tree: TopologyTree) -> Running:
        grants = tuple(
            Grant("worker", i, tree.host_index[host(h)], self.gpus)
            for i, h in enumerate(self.hosts)
        )
        role = make_role(replicas=len(grants), gpus=len(self.gpus))
        gang = replace(make_gang(self.id, roles=(role,), required=self.required), priority=self.cls)
        job = Job(self.id, gang, "research", 0.0, time_limit=self.runtime, elastic=self.elastic)
        held = Allocation(self.id, grants, self.runtime, self.cls)
        last = None if self.resized is None else NOW - self.resized * 60.0
        return Running(job, held, 0.0, last_resized=last)


def rigid(id: str, *hosts: str, gpus: tuple[int, ...] = ALL) -> Run:
    """A rigid job holding ``gpus`` on each of ``hosts``: capacity nobody may grow into."""
    return Run(id, hosts, elastic=None, gpus=gpus)


@dataclass(frozen=True)
class Scenario:
    """A fleet, its running jobs, how many jobs wait, and what ``grow`` must answer.

    ``grows`` maps each job that grows to its new replica count; no other job may grow.
    ``inside`` maps a job to the rack or pod (short name) its new replicas must stay in;
    ``says`` are substrings of the growing jobs' notes.
    """

    fleet: TopologyTree
    runs: tuple[Run, ...]
    grows: dict[str, int]
    pending_ahead: int = 0
    policy: Policy = DEFAULT
    inside: dict[str, str] = field(default_factory=dict)
    says: tuple[str, ...] = ()


def world(s: Scenario) -> tuple[FleetState, list[Running]]:
    state = FleetState(s.fleet)
    running = [r.running(s.fleet) for r in s.runs]
    for r in running:
        state.allocate(r.allocation)
    return state, running


RACKS = make_fleet(racks=2, hosts=4)  # h100-p0-r0-h0 .. h100-p0-r1-h3
WIDE = make_fleet(racks=2, hosts=5)  # h100-p0-r0-h0 .. h100-p0-r1-h4
PODS = make_fleet(pods=2, racks=2, hosts=2)  # h100-p0-r0-h0 .. h100-p1-r1-h1

SCENARIOS = [
    pytest.param(
        Scenario(
            WIDE,  # rack r1 is fuller, so best fit alone would put the new replicas there
            (Run("e", ("r0-h0", "r0-h1")), rigid("a", "r1-h0", "r1-h1", "r1-h2")),
            grows={"e": 4},
            inside={"e": "p0-r0"},
            says=(
                "grow 2->4 replicas: finishes 115 min sooner, resize costs 60 s",
                "adds 2 replica(s) inside rack h100-p0-r0",
            ),
        ),
        id="an elastic job below its maximum grows into free hosts of its own rack",
    ),
    pytest.param(
        Scenario(
            PODS,
            (  # pod p1 is fuller, so best fit alone would put the new replica there
                Run("e", ("r0-h0", "r0-h1"), elastic=(1, 3)),
                rigid("b", "p1-r0-h1", "p1-r1-h0", "p1-r1-h1"),
            ),
            grows={"e": 3},
            inside={"e": "p0"},
        ),
        id="a job whose rack is full grows into its own pod before another pod",
    ),
    pytest.param(
        Scenario(
            RACKS,
            (Run("e", ("r0-h0", "r0-h1"), runtime=NOW + 100.0),),
            grows={},
        ),
        id="growth that saves less than the resize cost is skipped",
    ),
    pytest.param(
        Scenario(
            RACKS,
            (Run("e", ("r0-h0", "r0-h1"), resized=10),),
            grows={},
        ),
        id="a job resized 10 minutes ago is not resized again",
    ),
    pytest.param(
        Scenario(
            RACKS,
            (Run("e", ("r0-h0", "r0-h1"), resized=31),),
            grows={"e": 4},
        ),
        id="a job resized 31 minutes ago may grow again",
    ),
    pytest.param(
        Scenario(
            RACKS,
            (Run("e", ("r0-h0", "r0-h1")),),
            grows={},
            pending_ahead=1,
        ),
        id="nothing grows while jobs are waiting",
    ),
    pytest.param(
        Scenario(
            RACKS,
            (Run("e", ("r0-h0", "r0-h1")),),
            grows={},
            policy=POLICIES["fifo"],
        ),
        id="a policy without elastic scheduling never grows a job",
    ),
    pytest.param(
        Scenario(
            RACKS,
            (rigid("r", "r0-h0", "r0-h1"),),
            grows={},
        ),
        id="a rigid job never grows",
    ),
    pytest.param(
        Scenario(
            RACKS,
            (Run("e", ("r0-h0", "r0-h1"), elastic=(1, 3)),),
            grows={"e": 3},
        ),
        id="growth stops at the elastic maximum",
    ),
    pytest.param(
        Scenario(
            RACKS,
            (Run("e", ("r0-h0", "r0-h1"), elastic=(1, 2)),),
            grows={},
        ),
        id="a job at its elastic maximum does not grow",
    ),
    pytest.param(
        Scenario(
            RACKS,
            (Run("e", ("r0-h0", "r0-h1"), runtime=None),),
            grows={},
        ),
        id="a job with no known end does not grow",
    ),
    pytest.param(
        Scenario(
            RACKS,
            (
                Run("e", ("r0-h0", "r0-h1"), required=Level.RACK),
                rigid("a", "r0-h2", "r0-h3"),
            ),
            grows={},
        ),
        id="a job required to stay in one rack does not grow outside it",
    ),
    pytest.param(
        Scenario(
            RACKS,
            (
                Run("e", ("r0-h0", "r0-h1"), elastic=(1, 8)),
                rigid("a", "r0-h2", "r1-h0", "r1-h1", "r1-h2"),
            ),
            grows={"e": 4},
            says=("grow 2->4 replicas",),
        ),
        id="a job grows by as many replicas as fit when its maximum does not fit",
    ),
    pytest.param(
        Scenario(
            RACKS,
            (
                Run("batch", ("r0-h0",), elastic=(1, 2)),
                Run("prod", ("r1-h0",), elastic=(1, 2), cls=PRODUCTION),
                rigid("a", "r0-h1", "r0-h2", "r0-h3", "r1-h1", "r1-h2"),
            ),
            grows={"prod": 2},
        ),
        id="the more important class grows first when room is short",
    ),
    pytest.param(
        Scenario(
            RACKS,
            (
                Run("half", ("r0-h0", "r0-h1"), elastic=(1, 4)),
                Run("quarter", ("r1-h0",), elastic=(1, 4)),
                rigid("a", "r0-h2", "r0-h3", "r1-h1", "r1-h2"),
            ),
            grows={"quarter": 2},
        ),
        id="the job furthest below its maximum grows first within a class",
    ),
    pytest.param(
        Scenario(
            RACKS,
            (
                Run("e", ("r0-h0", "r0-h1"), gpus=(0, 1, 2, 3)),
                rigid("a", "r0-h2", "r0-h3"),
            ),
            grows={"e": 4},
            inside={"e": "p0-r0"},  # its rack has room only on its own hosts
        ),
        id="new replicas fill the free GPUs of the job's own hosts before another rack",
    ),
]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_scenario(scenario: Scenario) -> None:
    state, running = world(scenario)
    resizes = grow(state, running, scenario.policy, NOW, scenario.pending_ahead)
    assert {r.job: r.replicas for r in resizes} == scenario.grows
    for r in resizes:
        assert len(r.added.grants) == r.replicas - _current(state, r.job)
        if r.job in scenario.inside:
            _assert_inside(state.tree, r.added.grants, scenario.inside[r.job])
    notes = " | ".join(r.note for r in resizes)
    for text in scenario.says:
        assert text in notes


def _current(state: FleetState, job: str) -> int:
    return sum(g.role == "worker" for g in state.allocations[job].grants)


def _assert_inside(tree: TopologyTree, grants: tuple[Grant, ...], domain: str) -> None:
    names = {tree.hosts[g.host].name for g in grants}
    assert all(n.startswith(f"h100-{domain}-") for n in names), (domain, names)


def test_added_replicas_are_numbered_after_the_job_s_own() -> None:
    s = Scenario(RACKS, (Run("e", ("r0-h0", "r0-h1")),), grows={"e": 4})
    state, running = world(s)
    (resize,) = grow(state, running, DEFAULT, NOW)
    assert [g.replica for g in resize.added.grants] == [2, 3]
    assert {g.role for g in resize.added.grants} == {"worker"}


def test_a_job_shrunk_earlier_in_this_pass_does_not_grow_back() -> None:
    s = Scenario(RACKS, (Run("e", ("r0-h0", "r0-h1", "r0-h2")),), grows={})
    state, running = world(s)
    held = state.release("e")
    state.allocate(replace(held, grants=held.grants[:2]))  # the pass shrank it to 2
    assert grow(state, running, DEFAULT, NOW) == []


def test_growth_already_applied_counts_toward_the_maximum() -> None:
    s = Scenario(RACKS, (Run("e", ("r0-h0", "r0-h1")),), grows={"e": 4})
    state, running = world(s)
    (first,) = grow(state, running, DEFAULT, NOW)
    state.allocate(Allocation(growth_id("e"), first.added.grants))
    assert grow(state, running, DEFAULT, NOW) == []


def test_grow_leaves_its_input_state_unchanged() -> None:
    s = Scenario(RACKS, (Run("e", ("r0-h0", "r0-h1")),), grows={"e": 4})
    state, running = world(s)
    free, cordoned = state.free.copy(), state.cordoned.copy()
    assert grow(state, running, DEFAULT, NOW)
    assert np.array_equal(state.free, free) and np.array_equal(state.cordoned, cordoned)
    assert set(state.allocations) == {"e"}


# --- properties ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Spec:
    """One random job: replicas of ``gpus`` GPUs (and ``cpus``), growth room, class, runtime."""

    replicas: int
    gpus: int
    cpus: float
    room: int
    cls: int
    runtime: float
    resized: float | None


specs = st.builds(
    Spec,
    replicas=st.integers(1, 3),
    gpus=st.sampled_from([1, 2, 4, 8]),
    cpus=st.sampled_from([0.0, 16.0, 48.0]),
    room=st.integers(0, 4),
    cls=st.integers(0, 3),
    runtime=st.floats(NOW + 10.0, 10 * HOUR),
    resized=st.one_of(st.none(), st.floats(0.0, NOW)),
)


@st.composite
def worlds(draw: st.DrawFn) -> tuple[FleetState, list[Running]]:
    """A random fleet with random running jobs (elastic or rigid) placed by the engine."""
    tree = make_fleet(
        pods=draw(st.integers(1, 2)), racks=draw(st.integers(1, 2)), hosts=draw(st.integers(1, 3))
    )
    state = FleetState(tree)
    running: list[Running] = []
    for i, spec in enumerate(draw(st.lists(specs, min_size=1, max_size=8))):
        role = make_role(replicas=spec.replicas, gpus=spec.gpus, cpus=spec.cpus)
        gang = Gang(f"j{i}", (role,), priority=spec.cls)
        placement, _ = place_gang(state, gang)
        if placement is None:
            continue
        elastic = (1, spec.replicas + spec.room) if spec.room or draw(st.booleans()) else None
        job = Job(gang.name, gang, "research", 0.0, time_limit=spec.runtime, elastic=elastic)
        held = placement.allocation(spec.runtime, spec.cls)
        state.allocate(held)
        running.append(Running(job, held, 0.0, last_resized=spec.resized))
    return state, running


PROPERTIES = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPERTIES
@given(worlds())
def test_added_replicas_never_overlap_running_work_or_each_other(
    w: tuple[FleetState, list[Running]],
) -> None:
    state, running = w
    resizes = grow(state, running, DEFAULT, NOW)
    trial = state.copy()
    for r in resizes:
        trial.allocate(Allocation(growth_id(r.job), r.added.grants))  # raises Conflict on a clash
    jobs = {run.job.id: run for run in running}
    assert len({r.job for r in resizes}) == len(resizes)
    for r in resizes:
        job = jobs[r.job].job
        assert job.elastic is not None and r.replicas <= job.elastic[1]
        assert r.replicas == len(jobs[r.job].allocation.grants) + len(r.added.grants)


@PROPERTIES
@given(worlds())
def test_grow_is_deterministic(w: tuple[FleetState, list[Running]]) -> None:
    state, running = w
    first = grow(state, running, DEFAULT, NOW)
    assert grow(state, running, DEFAULT, NOW) == first
    assert grow(state.copy(), list(reversed(running)), DEFAULT, NOW) == first

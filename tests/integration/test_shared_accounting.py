"""Fair-share usage and dollars have one computation: the simulator and the server agree on the
same history, and usage carried forward step by step equals usage computed from scratch."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from boltforge.control.scheduling.world import usage
from boltforge.control.store.db import Database
from boltforge.control.store.models import JobRow, RunRow
from boltforge.control.views import billing as cost
from boltforge.core.billing.meter import Stretch, dollars_per_hour, meter_stretch, pool_dollars
from boltforge.core.model.topology import Tier, TopologyTree
from boltforge.core.model.workload import Usage
from boltforge.core.policy import SHORTEST_FIRST, Policy, named
from boltforge.core.preempt.victims import PreemptRules
from boltforge.core.queueing.usage import Holding, carry, decayed_gpu_s, usage_of
from boltforge.sim.engine import SimConfig, Simulation
from boltforge.sim.records import SimResult, TraceJob
from boltforge.sim.spot import Reclaim
from boltforge.testing.builders import make_fleet, make_pool

HOUR = 3600.0
HALF_LIFE = 3 * HOUR
PRICES = {"reserved": 4.0, "spot": 1.8}
FLEET = make_fleet(
    racks=1,
    hosts=2,
    pools=[
        make_pool("reserved", price=PRICES["reserved"]),
        make_pool("spot", tier=Tier.SPOT, price=PRICES["spot"]),
    ],
)  # 2 hosts of 8 GPUs in each pool

# Two teams, one with two projects, so usage rolls up from project to team to the root. More
# work than the fleet holds at once, so jobs queue; spot reclaims and host failures stop runs,
# which resume later.
TRACE = [
    TraceJob("n1", 0.0, 5 * HOUR, 16, "lab/nlp"),
    TraceJob("v1", 60.0, 3 * HOUR, 8, "lab/cv"),
    TraceJob("o1", 120.0, 4 * HOUR, 8, "ops"),
    TraceJob("o2", 1800.0, 2 * HOUR, 8, "ops"),
    TraceJob("n2", 2 * HOUR, 1 * HOUR, 4, "lab/nlp"),
    TraceJob("v2", 3 * HOUR, 6 * HOUR, 8, "lab/cv"),
    TraceJob("o3", 4 * HOUR, 3 * HOUR, 16, "ops"),
    TraceJob("n3", 5 * HOUR, 2 * HOUR, 8, "lab/nlp"),
    TraceJob("o4", 6 * HOUR, 1 * HOUR, 4, "ops"),
    TraceJob("v3", 7 * HOUR, 2 * HOUR, 8, "lab/cv"),
]


@dataclass(frozen=True)
class Run:
    """One run segment the simulator ended: which job, its GPUs per pool, when."""

    job: str
    queue: str
    gpus: int
    pools: dict[str, int]
    start: float
    end: float


class Recorder(Simulation):
    """The simulator, noting every segment it ends and the usage after every refresh."""

    def __init__(self, tree: TopologyTree, trace: list[TraceJob], config: SimConfig) -> None:
        super().__init__(tree, trace, config)
        self.runs: list[Run] = []
        self.refreshed: list[Usage] = []

    def _charge(self, key: str, live: Any, *rest: Any) -> None:
        pools: dict[str, int] = defaultdict(int)
        for g in live.run.allocation.grants:
            pools[self.tree.pool_of(g.host).name] += len(g.gpus)
        seg = live.segment
        self.runs.append(Run(key, live.run.job.queue, seg.gpus, dict(pools), seg.start, self.now))
        super()._charge(key, live, *rest)

    def _refresh_usage(self) -> None:
        before = self.usage
        super()._refresh_usage()
        if self.usage is not before:
            self.refreshed.append(self.usage)


def replay(policy: Policy, **config: Any) -> Recorder:
    sim = Recorder(FLEET, TRACE, SimConfig(policy, **config))
    sim.run()
    return sim


@pytest.fixture(scope="module")
def fair() -> Recorder:
    """Fair order, usage refreshed at every full pass, spot hosts reclaimed without time to
    checkpoint, host failures: runs start, stop, resume and finish in both pools."""
    return replay(
        named("default").with_(order=SHORTEST_FIRST.with_(half_life_s=HALF_LIFE)),
        seed=3,
        usage_refresh_s=0.0,
        failures_per_1000_gpu_day=300.0,
        repair_s=HOUR,
        reclaims={"spot": Reclaim(rate_per_host_day=4.0, notice_s=30.0, back_after_s=HOUR)},
    )


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Database]:
    db = Database(f"sqlite:///{tmp_path / 'accounting.db'}")
    db.migrate()
    yield db
    db.close()


def write_history(db: Database, sim: Recorder) -> None:
    """The simulator's runs as the server stores them: a job row per job and a run row per
    segment, priced per hour as the server prices a bind (each GPU at its pool's price)."""
    by_job: dict[str, list[Run]] = defaultdict(list)
    for r in sim.runs:
        by_job[r.job].append(r)
    with db.session() as s:
        for num, t in enumerate(sim.trace, 1):
            runs = by_job[t.id]
            record = sim.records[t.id]
            s.add(
                JobRow(
                    id=t.id,
                    num=num,
                    name=t.id,
                    team=t.team.split("/")[0],
                    project=t.team.partition("/")[2] or None,
                    queue=t.team,
                    priority=3,
                    state="succeeded" if record.finish_s is not None else "pending",
                    spec={"gpus": t.gpus},
                    gpus=t.gpus,
                    replicas=1,
                    submitted_at=t.submit_s,
                    started_at=record.start_s,
                    finished_at=record.finish_s,
                    epoch=len(runs),
                    waiting=[],
                    explanation=[],
                )
            )
            s.flush()
            for epoch, r in enumerate(runs, 1):
                price = sum(PRICES[pool] * gpus for pool, gpus in r.pools.items())
                s.add(
                    RunRow(
                        job_id=t.id,
                        epoch=epoch,
                        queue=r.queue,
                        team=t.team.split("/")[0],
                        gpus=r.gpus,
                        dollars_per_hour=price,
                        started_at=r.start,
                        ended_at=r.end,
                    )
                )


def assert_same_usage(mine: Usage, theirs: Usage) -> None:
    assert mine.as_of == theirs.as_of
    for q in set(mine.by_queue) | set(theirs.by_queue):
        expected = theirs.by_queue.get(q, 0.0)
        assert mine.by_queue.get(q, 0.0) == pytest.approx(expected, rel=1e-9, abs=1e-6), q


def test_the_history_stops_and_resumes_runs_in_both_pools(fair: Recorder) -> None:
    sim = fair
    assert all(j.finish_s is not None for j in sim.result.jobs)
    assert sum(j.failures + j.reclaims for j in sim.result.jobs) >= 2
    assert len(sim.runs) > len(TRACE)  # some job ran more than once
    assert {p for r in sim.runs for p in r.pools} == set(PRICES)
    assert len(sim.refreshed) > 5


def test_server_usage_matches_the_simulators_at_every_refresh(
    store: Database, fair: Recorder
) -> None:
    """At each instant the simulator refreshed fair-share usage (carried forward from its last
    refresh, open runs counted up to then), the server's usage from its stored runs agrees,
    for every team, project and the root."""
    sim = fair
    write_history(store, sim)
    with_open_runs = 0
    with store.session() as s:
        for seen in sim.refreshed:
            assert_same_usage(seen, usage(s, seen.as_of, HALF_LIFE))
            with_open_runs += any(r.start < seen.as_of < r.end for r in sim.runs)
    assert with_open_runs > 0
    final = sim.refreshed[-1].by_queue
    assert final[""] == pytest.approx(final["lab"] + final["ops"])
    assert final["lab"] == pytest.approx(final["lab/nlp"] + final["lab/cv"])


def assert_same_dollars(store: Database, sim: Recorder) -> None:
    end = max(r.end for r in sim.runs)
    with store.session() as s:
        jobs = cost.job_meters(s, 0.0, end)
    meters = {m.job: m.meter for m in jobs}
    by_team = {row.key: row.dollars for row in cost.group(jobs, "team")}
    result: SimResult = sim.result
    for record in result.jobs:
        assert meters[record.id].dollars == pytest.approx(record.dollars, rel=1e-12)
        assert meters[record.id].gpu_s == pytest.approx(record.allocated_gpu_s, rel=1e-12)
    teams: dict[str, float] = defaultdict(float)
    for record in result.jobs:
        teams[record.team.split("/")[0]] += record.dollars
    assert by_team == pytest.approx(dict(teams), rel=1e-12)
    assert sum(by_team.values()) == pytest.approx(sum(result.dollars_by_pool.values()), rel=1e-12)


def test_server_dollars_match_the_simulators_by_job_and_team(
    store: Database, fair: Recorder
) -> None:
    write_history(store, fair)
    assert_same_dollars(store, fair)


def test_dollars_agree_when_the_scheduler_preempts(store: Database) -> None:
    """Least attained service first: a long job is preempted for newcomers and resumes."""
    trace = [
        TraceJob("long", 0.0, 12 * HOUR, 32, "ops"),
        TraceJob("short", 2 * HOUR, HOUR, 8, "lab/nlp"),
    ]
    las = named("tiresias").with_preempt_rules(PreemptRules(churn_fraction=1.0))
    sim = Recorder(FLEET, trace, SimConfig(las, failures_per_1000_gpu_day=0.0))
    sim.run()
    assert sim.records["long"].preemptions >= 1
    write_history(store, sim)
    assert_same_dollars(store, sim)


# ------------------------------------------------------------------------ the computation itself

EXAMPLES = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
QUEUES = ("lab/nlp", "lab/cv", "ops", "lab")
instants = st.floats(0.0, 1e5, allow_nan=False)
holdings = st.lists(
    st.builds(
        Holding,
        st.sampled_from(QUEUES),
        st.integers(1, 64),
        instants,
        st.one_of(st.none(), instants),
    ),
    max_size=12,
)


@EXAMPLES
@given(holdings, st.lists(instants, min_size=1, max_size=4), st.floats(60.0, 1e6))
def test_carrying_usage_step_by_step_equals_computing_it_from_scratch(
    held: list[Holding], steps: list[float], half_life: float
) -> None:
    """``U(t2) = U(t1) * 2**(-(t2-t1)/h) + the integral over (t1, t2]``, over any steps."""
    times = sorted(steps)
    running = usage_of(held, times[0], half_life)
    for t in times[1:]:
        running = carry(running, t, half_life, held)
        assert_same_usage(running, usage_of(held, t, half_life))


@EXAMPLES
@given(holdings, instants, st.floats(60.0, 1e6))
def test_usage_is_the_decayed_integral_charged_up_the_tree(
    held: list[Holding], now: float, half_life: float
) -> None:
    got = usage_of(held, now, half_life)
    rate = math.log(2) / half_life
    expect: dict[str, float] = defaultdict(float)
    for h in held:
        end = min(h.end if h.end is not None else now, now)
        start = min(h.start, end)
        amount = h.gpus * (math.exp(-rate * (now - end)) - math.exp(-rate * (now - start))) / rate
        for q in (h.queue, *(["lab"] if h.queue.startswith("lab/") else []), ""):
            expect[q] += amount
    for q, value in expect.items():
        assert got.by_queue[q] == pytest.approx(value, rel=1e-9, abs=1e-6)


def test_a_half_life_of_holding_counts_what_the_weights_add_up_to() -> None:
    # 8 GPUs for one half-life, ending now: 8 * h / ln 2 * (1 - 1/2).
    assert decayed_gpu_s(8, 0.0, HOUR, HOUR, HOUR) == pytest.approx(4 * HOUR / math.log(2))
    # A stretch that has not started, or starts after now, counts nothing.
    assert decayed_gpu_s(8, 2 * HOUR, 3 * HOUR, HOUR, HOUR) == 0.0
    # An open holding counts up to now; one ending later is clipped to now.
    assert (
        usage_of([Holding("ops", 8, 0.0)], HOUR, HOUR).by_queue
        == usage_of([Holding("ops", 8, 0.0, 5 * HOUR)], HOUR, HOUR).by_queue
    )


@pytest.mark.parametrize(
    ("now", "half_life", "says"),
    [(-1.0, HOUR, "before the usage's as_of"), (10.0, 0.0, "must be positive")],
    ids=["time running backwards is refused", "a zero half-life is refused"],
)
def test_carry_refuses_impossible_arguments(now: float, half_life: float, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        carry(Usage({}, 0.0), now, half_life, [])


def test_dollars_per_pool_add_up_to_the_meter_of_one_stretch() -> None:
    pools = {"reserved": 8, "spot": 4}
    split = pool_dollars(pools, PRICES, 100.0, 100.0 + 2 * HOUR)
    whole = Stretch(12, dollars_per_hour(pools, PRICES), 100.0, 100.0 + 2 * HOUR)
    assert split == pytest.approx({"reserved": 64.0, "spot": 14.4})
    assert sum(split.values()) == pytest.approx(meter_stretch(whole, 0.0, 1e9).dollars)

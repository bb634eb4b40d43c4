"""Bumping inside a class: a waiting job takes the GPUs of a running job of its own class
that has far more time left than it needs, when the bumped job loses little."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from boltforge.core.cycle import Snapshot, run_cycle
from boltforge.core.model.gang import Gang
from boltforge.core.model.state import Allocation, FleetState, Grant
from boltforge.core.model.workload import Job, Running
from boltforge.core.policy import POLICIES, Preemption
from boltforge.core.preempt.bump import (
    TIERS,
    BumpRule,
    Margins,
    needs_s,
    standing,
    tier,
    tiers,
    time_left,
    worth_bumping,
)
from boltforge.core.preempt.victims import PreemptRules
from boltforge.testing.builders import make_fleet, make_gang

HOUR = 3600.0
NOW = 100 * HOUR
BUMPING = POLICIES["default"].with_(
    preemption=Preemption(rules=PreemptRules(churn_fraction=1.0), bump=BumpRule(gain=4.0))
)
HOST = make_fleet(racks=1, hosts=1)  # one host of 8 GPUs
ALLOCATION = Allocation("any", (Grant("w", 0, 0, tuple(range(8))),), None, 3)  # 8 GPUs


def job(
    name: str,
    hours: float | None,
    cls: int = 3,
    attained_hours: float = 0.0,
    every: float | None = HOUR,
) -> Job:
    gang = make_gang(name, gpus=8, per_node=8)
    gang = Gang(gang.name, gang.roles, gang.topology, "team", cls)
    limit = None if hours is None else hours * HOUR
    attained = 8 * attained_hours * HOUR
    return Job(
        name,
        gang,
        "team",
        NOW,
        time_limit=limit,
        checkpoint_interval=every,
        attained_gpu_seconds=attained,
    )


def on_the_host(victim: Job, ran_hours: float) -> tuple[FleetState, Running]:
    """A fleet of one host that ``victim`` fills, started ``ran_hours`` ago."""
    state = FleetState(HOST)
    state.allocate(Allocation(victim.id, (Grant("w", 0, 0, tuple(range(8))),), None, 3))
    return state, Running(victim, state.allocations[victim.id], NOW - ran_hours * HOUR)


def cycle(
    victim: Job, ran_hours: float, waiting: Job, policy: object = BUMPING, explain: bool = True
) -> list[str]:
    """The jobs a full pass evicts when ``waiting`` finds ``victim`` on the only host
    (``explain=False``: a pass nobody reads the reasons of, as the simulator's)."""
    state, run = on_the_host(victim, ran_hours)
    snap = Snapshot(state, (waiting,), (run,), NOW)
    result = run_cycle(snap, policy, explain=explain)  # type: ignore[arg-type]
    return [e.job for e in result.evictions]


# --- scenarios: (victim's limit h, hours it ran, waiting job's limit h, bumped?) ---------------
SCENARIOS = [
    pytest.param(100, 10.0, 1, True, id="90 h left against a 1 h job: bumped"),
    pytest.param(100, 0.1, 1, False, id="inside its minimum runtime: kept"),
    pytest.param(3, 1.0, 1, False, id="2 h left against a 1 h job: under 4x, kept"),
    pytest.param(100, 10.5, 25, False, id="89.5 h left against a 25 h job: under 4x, kept"),
    pytest.param(None, 200.0, None, True, id="no limits: ran 200 h against a fresh job's 24 h"),
    pytest.param(None, 40.0, None, False, id="no limits: ran 40 h, under 4x a fresh job's 24 h"),
]


@pytest.mark.parametrize(("limit", "ran", "need", "bumped"), SCENARIOS)
def test_a_long_runner_is_bumped_only_when_it_pays(
    limit: float | None, ran: float, need: float | None, bumped: bool
) -> None:
    evicted = cycle(job("long", limit), ran, job("short", need))
    assert evicted == (["long"] if bumped else [])


@pytest.mark.parametrize(("limit", "ran", "need", "bumped"), SCENARIOS)
def test_a_pass_nobody_reads_bumps_the_same_jobs(
    limit: float | None, ran: float, need: float | None, bumped: bool
) -> None:
    evicted = cycle(job("long", limit), ran, job("short", need), explain=False)
    assert evicted == (["long"] if bumped else [])


def test_margins_count_only_the_running_jobs_a_paying_bump_may_take() -> None:
    """Of five running jobs of 8 GPUs, a bump for a 1-hour job of class 3 may take the one
    of class 4 and the peer with 90 h left, never the peer with 2 h left, the one of class
    2 or the one inside its minimum runtime."""
    runs = [
        Running(job("lower", 100, cls=4), ALLOCATION, NOW - 10 * HOUR),
        Running(job("peer-long", 100), ALLOCATION, NOW - 10 * HOUR),
        Running(job("peer-short", 3), ALLOCATION, NOW - HOUR),
        Running(job("higher", 100, cls=2), ALLOCATION, NOW - 10 * HOUR),
        Running(job("young", 100, cls=4), ALLOCATION, NOW - 60.0),
    ]
    margins = Margins(runs, NOW, PreemptRules())
    everyone = np.ones(len(runs), dtype=np.bool_)
    need = needs_s(job("short", 1), NOW)
    assert margins.room(job("short", 1), need, BumpRule(4.0), frozenset(), everyone) == (2, 16)
    owed = frozenset({"higher"})
    assert margins.room(job("short", 1), need, BumpRule(4.0), owed, everyone) == (3, 24)
    held = np.array([False, True, True, True, True])
    assert margins.room(job("short", 1), need, BumpRule(4.0), frozenset(), held) == (1, 8)


def test_without_a_bump_rule_the_default_never_preempts_its_own_class() -> None:
    assert cycle(job("long", 100), 10.0, job("short", 1)) == ["long"]
    assert cycle(job("long", 100), 10.0, job("short", 1), POLICIES["default"]) == []


def test_work_since_the_last_checkpoint_counts_against_bumping() -> None:
    # 30 h left; 1 h needed; checkpointing every hour loses at most 1 h: bumped
    assert cycle(job("long", 40, every=HOUR), 10.0, job("short", 1)) == ["long"]
    # never checkpointed: bumping loses all 10 h it ran, and 30 h < 4 x (1 h + 10 h)
    assert cycle(job("long", 40, every=100 * HOUR), 10.0, job("short", 1)) == []


def test_a_job_never_bumps_one_of_a_more_important_class() -> None:
    assert cycle(job("prod", 100, cls=2), 10.0, job("short", 1)) == []


def test_the_bump_note_says_what_each_side_has_left() -> None:
    state, run = on_the_host(job("long", 100), 10.0)
    result = run_cycle(Snapshot(state, (job("short", 1),), (run,), NOW), BUMPING)
    [bind] = result.binds
    assert "long has ~90.0 h left; this job needs ~60 min" in bind.note
    assert "so it is bumped" in bind.note


@given(
    left=st.floats(min_value=1.0, max_value=1e7),
    need=st.floats(min_value=1.0, max_value=1e7),
    gain=st.floats(min_value=1.0, max_value=16.0),
)
def test_bumping_pays_exactly_when_the_victim_has_gain_times_need_plus_loss_left(
    left: float, need: float, gain: float
) -> None:
    victim = job("v", left / HOUR, every=None)
    _, run = on_the_host(victim, 0.0)
    worth, _ = worth_bumping([run], job("w", need / HOUR), NOW, BumpRule(gain))
    lost = run.lost_gpu_seconds(NOW) / 8  # restart only: it just started
    assert worth == (left / max(need + lost, 1.0) >= gain)


@given(st.floats(min_value=0.0, max_value=1e9), st.floats(min_value=0.0, max_value=1e9))
def test_more_time_left_never_stands_higher(a: float, b: float) -> None:
    low, high = sorted((a, b))
    assert tier(low) <= tier(high)


@given(st.floats(min_value=0.0, max_value=1e12))
def test_a_tier_is_the_power_of_two_at_or_below_the_time_left(left: float) -> None:
    t = tier(left)
    assert t == 0 or 2.0**t <= left
    assert t == TIERS - 1 or left < 2.0 ** (t + 1)
    assert int(tiers(np.array([left]))[0]) == t


maybe_hours = st.none() | st.floats(min_value=0.0, max_value=1000.0)
runs_of = st.lists(
    st.tuples(
        maybe_hours,  # time limit
        maybe_hours,  # learned estimate
        maybe_hours,  # typical runtime
        st.floats(min_value=0.0, max_value=500.0),  # hours attained before this run
        st.floats(min_value=-1.0, max_value=2000.0),  # hours since this run started
        st.sampled_from([1, 2, 4, 8, 16]),  # GPUs
    ),
    max_size=12,
)


@given(runs_of)
def test_margins_read_every_running_jobs_time_left_and_standing_as_one_by_one(
    specs: list[tuple[float | None, float | None, float | None, float, float, int]],
) -> None:
    runs = []
    for i, (limit, estimate, typical, attained, ran, gpus) in enumerate(specs):
        g = make_gang(f"j{i}", gpus=gpus, per_node=min(gpus, 8))
        hours = {"limit": limit, "estimate": estimate, "typical": typical}
        limit_s, estimate_s, typical_s = (None if h is None else h * HOUR for h in hours.values())
        j = Job(
            f"j{i}",
            Gang(g.name, g.roles, g.topology, "team", 2 + i % 3),
            "team",
            0.0,
            time_limit=limit_s,
            estimate=estimate_s,
            typical=typical_s,
            attained_gpu_seconds=attained * HOUR * gpus,
        )
        runs.append(Running(j, ALLOCATION, NOW - ran * HOUR))
    margins = Margins(runs, NOW, PreemptRules())
    assert list(margins.left.values()) == [time_left(r, NOW) for r in runs]
    assert margins.standing() == {r.job.id: standing(r.job, NOW, r.start_time) for r in runs}


def test_a_waiting_job_stands_by_its_class_and_the_tier_of_its_time_left() -> None:
    assert standing(job("a", 2), NOW) == (3, tier(2 * HOUR))
    assert standing(job("a", 2, attained_hours=1.5), NOW) == (3, tier(0.5 * HOUR))


WINDOWED = BUMPING.with_preempt_rules(PreemptRules(churn_fraction=1.0, peer_window_s=300.0))


def test_with_a_checkpoint_window_a_peer_is_bumped_only_just_after_its_checkpoint() -> None:
    # checkpoints every hour: 10 h 2 min in, its last one was 2 min ago
    assert cycle(job("long", 100), 10.0 + 2 / 60, job("short", 1), WINDOWED) == ["long"]
    # 10 h 30 min in: 30 min of work would be lost, so it keeps running
    assert cycle(job("long", 100), 10.5, job("short", 1), WINDOWED) == []
    # a job that never checkpoints is never bumped
    assert cycle(job("long", 100, every=1000 * HOUR), 10.0, job("short", 1), WINDOWED) == []


def test_the_checkpoint_window_says_why_a_peer_was_not_bumped() -> None:
    state, run = on_the_host(job("long", 100), 10.5)
    result = run_cycle(Snapshot(state, (job("short", 1),), (run,), NOW), WINDOWED, explain=True)
    [waiting] = result.waiting
    assert any(
        "1 job of class 3 has not checkpointed in the last 5 min" in line for line in waiting.detail
    )

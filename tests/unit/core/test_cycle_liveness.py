"""Liveness: with bounded arrivals every job eventually starts, under every named policy."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from boltforge.core.cycle import Snapshot, run_cycle
from boltforge.core.model.gang import Gang
from boltforge.core.model.state import Allocation, FleetState
from boltforge.core.model.workload import Job, Running
from boltforge.core.policy import POLICIES
from boltforge.testing.builders import make_fleet, make_gang

FLEET = make_fleet(racks=2, hosts=3)  # 48 GPUs


def make_job(i: int, gpus: int, runtime: float, submit: float, priority: int) -> Job:
    gang = make_gang(f"j{i}", gpus=gpus, per_node=min(8, gpus))
    team = f"team{i % 3}"
    return Job(
        f"j{i}",
        Gang(gang.name, gang.roles, gang.topology, team, priority),
        team,
        submit,
        time_limit=runtime,
    )


def replay(jobs: list[Job], policy_name: str, horizon: int = 400) -> dict[str, float]:
    """Drive the cycle on events (arrival, exit) until every job has started; start times."""
    policy = POLICIES[policy_name]
    state = FleetState(FLEET)
    running: dict[str, Running] = {}
    started: dict[str, float] = {}
    now = 0.0
    for _ in range(horizon):
        pending = tuple(j for j in jobs if j.submit_time <= now and j.id not in started)
        snap = Snapshot(state, pending, tuple(running.values()), now)
        result = run_cycle(snap, policy)
        for e in result.evictions:
            state.release(e.job)
            del running[e.job]
            started.pop(e.job)
        for b in result.binds:
            job = next(j for j in jobs if j.id == b.job)
            end = now + (job.time_limit or 0.0)
            state.allocate(Allocation(job.id, b.placement.grants, end, job.priority))
            running[job.id] = Running(job, state.allocations[job.id], now)
            started[job.id] = now
        if len(started) == len(jobs) and not pending:
            return started
        now = next_event(state, jobs, now)
        for job_id, run in list(running.items()):
            finish = run.expected_end()
            if finish is not None and finish <= now:
                state.release(job_id)
                del running[job_id]
    raise AssertionError(f"not every job started within {horizon} events: {len(started)}")


def next_event(state: FleetState, jobs: list[Job], now: float) -> float:
    """The next exit or arrival after ``now`` (or one second on when none is known)."""
    ends = [a.expected_end for a in state.allocations.values()]
    later = [t for t in ends if t is not None and t > now]
    later += [j.submit_time for j in jobs if j.submit_time > now]
    return min(later) if later else now + 1


JOBS = st.lists(
    st.tuples(
        st.sampled_from([1, 2, 4, 8, 8, 16, 24, 48]),
        st.sampled_from([60.0, 600.0, 3600.0, 7200.0]),
        st.floats(0, 5000),
        st.sampled_from([1, 2, 3]),
    ),
    min_size=1,
    max_size=14,
)


@settings(max_examples=40, deadline=None)
@given(JOBS, st.sampled_from(sorted(POLICIES)))
def test_no_job_starves_under_bounded_arrivals(
    specs: list[tuple[int, float, float, int]], policy: str
) -> None:
    jobs = [make_job(i, g, rt, round(t), p) for i, (g, rt, t, p) in enumerate(specs)]
    started = replay(jobs, policy)
    assert set(started) == {j.id for j in jobs}
    assert all(started[j.id] >= j.submit_time for j in jobs)


def test_a_big_job_is_not_starved_by_a_stream_of_small_ones() -> None:
    # A 48-GPU job (the whole fleet) waits behind a steady stream of 8-GPU jobs; reservations
    # make the stream drain around it instead of keeping the fleet busy forever.
    big = make_job(0, 48, 3600.0, 10.0, 3)
    small = [make_job(i, 8, 1800.0, float(i * 300), 3) for i in range(1, 40)]
    started = replay([big, *small], "default")
    latest_small = max(started[j.id] for j in small)
    assert started[big.id] < latest_small

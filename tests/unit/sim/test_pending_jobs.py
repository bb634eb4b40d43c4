"""``PendingJobs`` keeps its arrival order, and the waiting jobs' columns, across puts, pops
and updates exactly as sorting the waiting jobs and reading their columns from scratch would."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from boltforge.core.model.workload import Job
from boltforge.core.queueing.columns import QueueColumns
from boltforge.sim.pending import PendingJobs
from boltforge.testing.builders import make_gang

SUBMITS = (0.0, 5.0, 5.0, 7.5, 100.0)
Op = tuple[str, int, float]


def make_job(i: int, submit: float) -> Job:
    gang = make_gang(f"j{i}", gpus=1 + i % 4, per_node=1)
    deadline = None if i % 2 else submit + 3600.0 * i
    return Job(f"j{i:02d}", gang, f"team-{i % 3}", submit, time_limit=60.0 * i, deadline=deadline)


def assert_same_columns(got: QueueColumns, want: QueueColumns) -> None:
    """The same numbers (NaN where NaN) and the same queue for each job."""
    np.testing.assert_array_equal(got.table, want.table)
    assert [got.queues[c] for c in got.queue] == [want.queues[c] for c in want.queue]


ops = st.lists(
    st.tuples(
        st.sampled_from(("put", "pop", "update")),
        st.integers(0, 30),
        st.sampled_from(SUBMITS),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(ops)
def test_arrival_order_equals_a_sort_from_scratch(steps: list[Op]) -> None:
    pending = PendingJobs()
    plain: dict[str, Job] = {}  # what a dict of the waiting jobs holds
    for op, i, submit in steps:
        key = f"j{i:02d}"
        if op == "put" and key not in plain:
            job = make_job(i, submit)
            pending.put(job)
            plain[key] = job
        elif op == "pop" and key in plain:
            assert pending.pop(key) == plain.pop(key)
        elif op == "update":

            def attain(job: Job, key: str = key, attained: float = submit) -> Job:
                if job.id != key:
                    return job
                return dataclasses.replace(job, attained_gpu_seconds=attained)

            pending.update(attain)
            plain = {k: attain(j) for k, j in plain.items()}
        by_arrival = sorted(plain.values(), key=lambda j: (j.submit_time, j.id))
        assert pending.in_arrival_order() == tuple(by_arrival)
        assert_same_columns(pending.columns(), QueueColumns.of(by_arrival))
        assert pending.values() == list(plain.values())
        assert list(pending) == list(plain) and len(pending) == len(plain)
        assert all(k in pending and pending[k] == j for k, j in plain.items())


def test_a_job_already_waiting_is_not_put_again() -> None:
    pending = PendingJobs()
    pending.put(make_job(1, 0.0))
    with pytest.raises(ValueError, match="already waiting"):
        pending.put(make_job(1, 3.0))


def test_the_columns_grow_past_their_first_room_and_shrink_back() -> None:
    pending = PendingJobs()
    jobs = [make_job(i, float(500 - i)) for i in range(300)]  # each goes first on arrival
    for job in jobs:
        pending.put(job)
    assert_same_columns(pending.columns(), QueueColumns.of(pending.in_arrival_order()))
    for job in jobs[::2]:
        pending.pop(job.id)
    assert len(pending.columns()) == 150
    assert_same_columns(pending.columns(), QueueColumns.of(pending.in_arrival_order()))


def test_a_queue_served_at_its_front_and_fed_at_its_back_keeps_its_columns() -> None:
    """A strict order's queue: each new job goes last and the first one leaves, far more
    times than the columns have room for."""
    pending = PendingJobs()
    for i in range(40):
        pending.put(make_job(i, float(i)))
    for i in range(40, 1000):
        pending.pop(pending.in_arrival_order()[0].id)
        pending.put(make_job(i, float(i)))
        if i % 97 == 0:
            assert_same_columns(pending.columns(), QueueColumns.of(pending.in_arrival_order()))
    assert_same_columns(pending.columns(), QueueColumns.of(pending.in_arrival_order()))

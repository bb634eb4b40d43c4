"""Orders handed their jobs in arrival order (``Snapshot.in_arrival_order``) skip the sort by
arrival, and orders read off a queue's columns (``Snapshot.columns``) skip reading every job;
they must come out exactly as from any other order of the same jobs."""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from boltforge.core.cycle import promised_first
from boltforge.core.model.workload import Job
from boltforge.core.policy import SHORTEST_FIRST, Order, Ordering, Policy
from boltforge.core.queueing.columns import QueueColumns
from boltforge.core.queueing.ordering import las_queue, las_queues, order_jobs, order_positions
from boltforge.testing.builders import make_gang

NOW = 400_000.0


@st.composite
def queues(draw: st.DrawFn) -> list[Job]:
    """Jobs with unique ids and random class, submit time (often tied), attained service
    and hold-free state, in a random order."""
    out = []
    for i in range(draw(st.integers(0, 14))):
        gang = dataclasses.replace(make_gang(f"j{i}", gpus=8), priority=draw(st.integers(0, 3)))
        submit = float(draw(st.sampled_from((0.0, 10.0, 10.0, 50.0, 200_000.0))))
        attained = draw(st.sampled_from((0.0, 30_000.0, 1e9)))
        out.append(Job(f"j{i}", gang, "team", submit, attained_gpu_seconds=attained))
    return draw(st.permutations(out))


def arrival(jobs: list[Job]) -> list[Job]:
    return sorted(jobs, key=lambda j: (j.submit_time, j.id))


@settings(max_examples=200, deadline=None)
@given(queues(), st.sampled_from(list(Ordering)))
def test_an_order_given_arrival_order_is_the_order_of_any_permutation(
    jobs: list[Job], ordering: Ordering
) -> None:
    policy = Policy("p", order=Order(ordering))
    expected = order_jobs(list(jobs), policy, NOW, None)
    assert order_jobs(arrival(jobs), policy, NOW, None, arrived=True) == expected


@settings(max_examples=200, deadline=None)
@given(queues(), st.sampled_from(list(Ordering)), st.sampled_from((NOW, 10.0)))
def test_an_order_read_off_the_queues_columns_is_the_order_of_its_jobs(
    jobs: list[Job], ordering: Ordering, now: float
) -> None:
    """What a caller that keeps its queue's columns (the simulator) gets: the same order,
    and each job's LAS queue, as reading every job."""
    policy = Policy("p", order=Order(ordering))
    queue = arrival(jobs)
    columns = QueueColumns.of(queue)
    at = order_positions(columns, policy, now, None)
    assert [queue[i] for i in at] == order_jobs(queue, policy, now, None, arrived=True)
    assert las_queues(columns, policy, now).tolist() == [las_queue(j, policy, now) for j in queue]


@settings(max_examples=200, deadline=None)
@given(queues(), st.data())
def test_promised_jobs_go_first_in_their_class_as_the_plain_sort_puts_them(
    jobs: list[Job], data: st.DataObject
) -> None:
    promised = frozenset(data.draw(st.sets(st.sampled_from([j.id for j in jobs] or ["x"]))))
    policy = Policy("p", order=SHORTEST_FIRST)
    ordered = order_jobs(list(jobs), policy, NOW, None)  # in class order, as a pass has it
    expected = sorted(ordered, key=lambda j: (j.priority, j.id not in promised and j.held is None))
    assert promised_first(ordered, policy, promised) == expected

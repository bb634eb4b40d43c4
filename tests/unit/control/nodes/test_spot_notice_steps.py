"""Spot reclaim notices step by step (``control/nodes/spot.py``): the node is cordoned and
its jobs checkpoint at once within the time left, a later notice only brings the time
forward, the node goes at its time, and each job requeued by the reclaim carries the work
it lost on the entry that requeued it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sched_builders import Bench, event

from boltforge.control.nodes import spot
from boltforge.control.nodes.quarantine import UnknownNode
from boltforge.control.store.models import JobRow


@pytest.fixture
def bench(tmp_path: Path) -> Iterator[Bench]:
    with Bench(tmp_path, hosts=3) as b:
        b.settle()
        yield b


def notice(bench: Bench, node: str, in_s: float) -> spot.Notice:
    now = bench.clock()
    return bench.write(lambda s: spot.notice(s, node, in_s, now))


def running_job(bench: Bench, gpus: int = 8, **extra: Any) -> str:
    job = bench.place("train", gpus, **extra)
    bench.start_all()
    assert bench.job(job).state == "running"
    return job


def test_a_notice_for_a_node_never_registered_names_it(bench: Bench) -> None:
    with pytest.raises(UnknownNode) as missing:
        notice(bench, "host-9", 30.0)
    assert str(missing.value) == "host-9"


def test_a_notice_for_an_idle_node_cordons_it_and_moves_nothing(bench: Bench) -> None:
    out = notice(bench, "host-2", 30.0)
    assert out.reclaim_at == bench.clock() + 30.0
    assert out.jobs == {} and out.touched.nodes == {"host-2"}
    node = bench.node("host-2")
    assert (node.cordoned, node.reclaim_at, node.state) == (True, out.reclaim_at, "ready")


@pytest.mark.parametrize(
    ("grace", "in_s", "given"),
    [(None, 20.0, 20.0), ("5s", 20.0, 5.0), ("10m", 600.0, 600.0), ("10m", 601.0, 600.0)],
    ids=["default-grace-cut", "short-grace-kept", "cut-to-the-notice", "grace-shorter"],
)
def test_a_job_is_given_its_grace_or_the_time_left_whichever_is_shorter(
    bench: Bench, grace: str | None, in_s: float, given: float
) -> None:
    extra: dict[str, Any] = {} if grace is None else {"checkpoint": {"grace": grace}}
    job = running_job(bench, **extra)
    [rep] = bench.replicas(job)
    out = notice(bench, rep.node, in_s)
    assert out.jobs == {job: given}
    [after] = bench.replicas(job)
    assert after.state == "stopping" and after.spec["grace_s"] == given
    row = bench.job(job)
    assert row.state == "preempting" and row.preemptions == 1
    [entry] = bench.events(job, "reclaim")
    assert entry.message == (
        f"reclaim notice: node {rep.node} reclaimed in {in_s:.0f} s; checkpoint requested: "
        f"checkpointing (grace {given:.0f} s), then requeued"
    )
    assert entry.data == {"node": rep.node, "reclaim_at": out.reclaim_at, "epoch": 1}


def test_a_gang_on_a_reclaimed_node_checkpoints_everywhere_within_the_time_left(
    bench: Bench,
) -> None:
    job = running_job(bench, 16)
    reps = bench.replicas(job)
    out = notice(bench, reps[0].node, 15.0)
    assert out.jobs == {job: 15.0}
    assert [(r.state, r.spec["grace_s"]) for r in bench.replicas(job)] == [("stopping", 15.0)] * 2
    assert out.touched.nodes == {reps[0].node, reps[1].node}


@pytest.mark.parametrize(
    ("first", "second", "at"),
    [(120.0, 300.0, 120.0), (120.0, 30.0, 30.0), (60.0, 60.0, 60.0)],
    ids=["later-is-ignored", "earlier-brings-it-forward", "same-time"],
)
def test_a_second_notice_can_only_bring_the_reclaim_forward(
    bench: Bench, first: float, second: float, at: float
) -> None:
    t0 = bench.clock()
    notice(bench, "host-0", first)
    again = notice(bench, "host-0", second)
    assert again.reclaim_at == bench.node("host-0").reclaim_at == t0 + at


def test_a_second_notice_asks_nothing_more_of_jobs_already_leaving(bench: Bench) -> None:
    job = running_job(bench)
    [rep] = bench.replicas(job)
    notice(bench, rep.node, 120.0)
    again = notice(bench, rep.node, 30.0)
    assert again.jobs == {}
    assert len(bench.events(job, "reclaim")) == 1


# -- the node goes at its time ----------------------------------------------------------------


def test_the_node_goes_at_its_time_and_a_job_still_there_requeues_uncharged(bench: Bench) -> None:
    job = running_job(bench, max_restarts=0)
    [rep] = bench.replicas(job)
    bench.clock.advance(100.0)
    notice(bench, rep.node, 10.0)
    bench.clock.advance(9.0)
    early = bench.write(lambda s: spot.expire(s, bench.clock()))
    assert early.nodes == set() and bench.node(rep.node).state == "ready"
    bench.clock.advance(1.0)
    gone = bench.write(lambda s: spot.expire(s, bench.clock()))
    assert gone.nodes == {rep.node} and job in gone.jobs
    assert bench.node(rep.node).state == "dead"
    assert bench.replicas(job)[0].state == "lost"
    row = bench.job(job)
    assert (row.state, row.restarts) == ("requeued", 0)
    [lost] = bench.events(job, "lost")
    assert f"node {rep.node} was reclaimed" in lost.message
    assert lost.data["lost_s"] == 110.0  # it never checkpointed: all since it was bound


def test_a_dead_node_past_its_reclaim_time_is_not_reclaimed_again(bench: Bench) -> None:
    notice(bench, "host-1", 5.0)
    bench.clock.advance(6.0)
    assert bench.write(lambda s: spot.expire(s, bench.clock())).nodes == {"host-1"}
    bench.clock.advance(6.0)
    assert bench.write(lambda s: spot.expire(s, bench.clock())).nodes == set()


def test_a_job_that_checkpointed_out_in_time_lost_only_what_followed_its_checkpoint(
    bench: Bench,
) -> None:
    job = running_job(bench)
    [rep] = bench.replicas(job)
    bench.clock.advance(300.0)
    notice(bench, rep.node, 60.0)
    bench.clock.advance(5.0)
    checkpointed = bench.clock() - 2.0

    def mark(s: Any) -> None:
        row = s.get(JobRow, job)
        row.last_checkpoint_at = checkpointed

    bench.write(mark)
    [stopping] = bench.replicas(job)
    bench.report(stopping.node, [event(stopping, "exited", bench.clock(), exit_code=0)])
    bench.write(lambda s: spot.settle(s, [job]))
    [done] = bench.events(job, "checkpointed")
    assert done.data["lost_s"] == 2.0


# -- the lost work on the requeue entry -------------------------------------------------------


@pytest.mark.parametrize(
    ("checkpoint", "bound", "stopped", "lost"),
    [
        (None, 100.0, 160.0, 60.0),
        (150.0, 100.0, 160.0, 10.0),
        (90.0, 100.0, 160.0, 60.0),  # a checkpoint of an earlier allocation does not count
        (160.0, 100.0, 160.0, 0.0),
        (None, None, 160.0, 0.0),
        (170.0, 100.0, 160.0, 0.0),  # never negative
    ],
    ids=[
        "never-checkpointed",
        "since-its-checkpoint",
        "old-checkpoint",
        "checkpointed-as-it-stopped",
        "never-bound",
        "checkpoint-after-the-stop",
    ],
)
def test_lost_work_counts_from_the_latest_checkpoint_or_bind(
    checkpoint: float | None, bound: float | None, stopped: float, lost: float
) -> None:
    job = JobRow(id="1", last_checkpoint_at=checkpoint, bound_at=bound)
    assert spot.lost_work(job, stopped) == lost


def test_settle_leaves_jobs_not_requeued_by_a_notice_of_their_allocation(bench: Bench) -> None:
    job = running_job(bench)
    bench.write(lambda s: spot.settle(s, [job, "no-such-job"]))  # running: nothing to settle
    assert all("lost_s" not in e.data for e in bench.events(job))
    [rep] = bench.replicas(job)
    bench.clock.advance(16.0)
    bench.beat_all(but=[rep.node])
    bench.settle()  # its node died: requeued without a notice, placed again
    bench.write(lambda s: spot.settle(s, [job]))
    assert all("lost_s" not in e.data for e in bench.events(job))


def test_settle_recomputes_the_lost_work_when_a_late_checkpoint_arrives(bench: Bench) -> None:
    job = running_job(bench)
    [rep] = bench.replicas(job)
    t0 = bench.clock()
    bench.clock.advance(100.0)
    notice(bench, rep.node, 30.0)
    bench.clock.advance(30.0)
    bench.write(lambda s: spot.expire(s, bench.clock()))
    [lost] = bench.events(job, "lost")
    assert lost.data["lost_s"] == 130.0

    def late(s: Any) -> None:
        s.get(JobRow, job).last_checkpoint_at = t0 + 125.0

    bench.write(late)
    bench.write(lambda s: spot.settle(s, [job]))
    [lost] = bench.events(job, "lost")
    assert lost.data["lost_s"] == 5.0

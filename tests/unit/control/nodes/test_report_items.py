"""What agents report about replicas, item by item (``control/nodes/reports.py``): how a
replica's exit ends its job (and in which words), exits of an older epoch that only free
GPUs, replicas a node stopped on its own, cleanup notes, and rank progress."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sched_builders import Bench, event
from sqlalchemy import select

from boltforge.control.nodes.reports import STEP_WINDOW, apply_progress
from boltforge.control.store.models import RankProgressRow
from boltforge.wire.agent import Progress


@pytest.fixture
def bench(tmp_path: Path) -> Iterator[Bench]:
    with Bench(tmp_path, hosts=2) as b:
        b.settle()
        yield b


def gang(bench: Bench, gpus: int = 16, **extra: Any) -> str:
    job = bench.place("train", gpus, **extra)
    bench.start_all()
    assert bench.job(job).state == "running"
    return job


@dataclass(frozen=True)
class Ending:
    """Replica 0 of a running two-replica gang reports ``kind`` with ``fields``."""

    name: str
    kind: str
    fields: dict[str, Any]
    state: str
    exit_code: int | None
    message: str


ENDINGS = [
    Ending("non-zero-exit", "exited", {"exit_code": 3}, "failed", 3,
           "failed: replica 0 exited with code 3"),
    Ending("killed", "exited", {"signal": 9}, "failed", -9,
           "failed: replica 0 was killed by signal 9"),
    Ending("could-not-start", "failed", {"detail": "image not found"}, "failed", -1,
           "failed: replica 0 image not found"),
    Ending("failed-with-a-code", "failed", {"exit_code": 127}, "failed", 127,
           "failed: replica 0 exited with code 127"),
]  # fmt: skip


@pytest.mark.parametrize("case", ENDINGS, ids=[c.name for c in ENDINGS])
def test_a_replica_that_fails_fails_its_job_and_stops_its_peers(bench: Bench, case: Ending) -> None:
    job = gang(bench)
    first, second = bench.replicas(job)
    _, touched = bench.report(first.node, [event(first, case.kind, bench.clock(), **case.fields)])
    assert touched.jobs == {job} and touched.nodes == {second.node}
    row = bench.job(job)
    assert (row.state, row.exit_code, row.restarts) == (case.state, case.exit_code, 0)
    assert bench.events(job, "failed")[-1].message == case.message
    assert [r.state for r in bench.replicas(job)] == ["exited", "stopping"]


def test_a_gang_succeeds_once_every_replica_exited_zero(bench: Bench) -> None:
    job = gang(bench)
    first, second = bench.replicas(job)
    bench.report(first.node, [event(first, "exited", bench.clock(), exit_code=0)])
    assert bench.job(job).state == "running"
    bench.report(second.node, [event(second, "exited", bench.clock(), exit_code=0)])
    row = bench.job(job)
    assert (row.state, row.exit_code) == ("succeeded", 0)
    assert bench.events(job, "succeeded")[-1].message == "succeeded: every replica exited 0"


def test_an_exit_whose_start_was_never_heard_counts_as_started_when_dispatched(
    bench: Bench,
) -> None:
    job = bench.place("quick", 8)
    [rep] = bench.replicas(job)
    assert rep.state == "starting" and rep.dispatched_at is not None
    bench.clock.advance(3.0)
    bench.report(rep.node, [event(rep, "exited", bench.clock(), exit_code=0)])
    [after] = bench.replicas(job)
    assert after.started_at == rep.dispatched_at
    row = bench.job(job)
    assert row.state == "succeeded" and row.started_at == bench.clock()


def test_a_start_reported_for_a_replica_already_told_to_stop_changes_nothing(
    bench: Bench,
) -> None:
    from boltforge.control.nodes.quarantine import drain

    job = bench.place("train", 8)
    [rep] = bench.replicas(job)
    now = bench.clock()
    bench.write(lambda s: drain(s, rep.node, now))
    [stopping] = bench.replicas(job)
    assert stopping.state == "stopping"
    bench.report(rep.node, [event(stopping, "started", bench.clock(), pid=3)])
    [after] = bench.replicas(job)
    assert (after.state, after.pid, after.started_at) == ("stopping", None, None)


def test_an_event_naming_another_job_is_refused(bench: Bench) -> None:
    job = gang(bench, 8)
    [rep] = bench.replicas(job)
    wrong = event(rep, "exited", bench.clock(), exit_code=1).model_copy(update={"job": "other"})
    refused, touched = bench.report(rep.node, [wrong])
    assert refused == [rep.id] and touched.jobs == set()
    assert bench.job(job).state == "running"


def test_a_second_exit_of_the_same_replica_is_ignored(bench: Bench) -> None:
    job = gang(bench)
    first, _ = bench.replicas(job)
    bench.report(first.node, [event(first, "exited", bench.clock(), exit_code=0)])
    bench.report(first.node, [event(first, "exited", bench.clock(), exit_code=1)])  # retried
    assert bench.job(job).state == "running"
    assert bench.replicas(job)[0].exit_code == 0


def test_a_replica_its_node_stopped_on_its_own_requeues_the_job_and_makes_the_node_suspect(
    bench: Bench,
) -> None:
    job = gang(bench)
    first, _ = bench.replicas(job)
    ev = event(first, "exited", bench.clock(), signal=15, by_node=True)
    bench.report(first.node, [ev])
    row = bench.job(job)
    assert (row.state, row.restarts) == ("requeued", 1)
    assert bench.node(first.node).state == "suspect"
    assert bench.replicas(job)[1].state == "stopping"
    [lost] = bench.events(job, "lost")
    assert lost.message == (
        f"requeued: node {first.node} stopped replica 0 on its own (lease lost or shutting "
        "down); resumes from its last checkpoint"
    )


def test_a_preempted_gang_requeues_when_its_last_replica_checkpointed_and_exited(
    bench: Bench,
) -> None:
    from boltforge.control.nodes.quarantine import drain

    job = gang(bench)
    first, second = bench.replicas(job)
    now = bench.clock()
    bench.write(lambda s: drain(s, first.node, now))
    bench.report(first.node, [event(first, "exited", now + 1, exit_code=0, checkpoint_s=2.5)])
    assert bench.job(job).state == "preempting"
    bench.report(second.node, [event(second, "exited", now + 4, exit_code=0, checkpoint_s=4.25)])
    row = bench.job(job)
    assert row.state == "requeued"
    [done] = bench.events(job, "checkpointed")
    assert done.message == "checkpointed in 4.2 s and stopped; requeued"
    assert done.data == {"checkpoint_s": 4.25}


def test_the_exit_of_an_older_epochs_replica_only_frees_its_gpus(tmp_path: Path) -> None:
    with Bench(tmp_path, hosts=3) as b:
        b.settle()
        job = gang(b)
        dying, leaving = b.replicas(job)
        b.clock.advance(16.0)
        b.beat_all(but=[dying.node])
        b.settle()  # requeued, and bound again at once beside its leaving replica
        row = b.job(job)
        assert (row.state, row.epoch) == ("scheduled", 2)
        assert b.replicas(job)[1].state == "stopping"
        refused, _ = b.report(leaving.node, [event(leaving, "exited", b.clock(), exit_code=1)])
        assert refused == []
        assert b.job(job).state == "scheduled"  # its failure is not the new epoch's
        b.settle()
        assert {r.state for r in b.replicas(job) if r.epoch == 2} == {"starting"}


def test_a_lost_replicas_late_exit_is_refused(bench: Bench) -> None:
    job = gang(bench, 8)
    [rep] = bench.replicas(job)
    bench.clock.advance(16.0)
    bench.beat_all(but=[rep.node])
    bench.settle()
    refused, touched = bench.report(rep.node, [event(rep, "exited", bench.clock(), exit_code=1)])
    assert refused == [rep.id] and touched.jobs == set()
    row = bench.job(job)
    assert (row.state, row.epoch) == ("scheduled", 2)  # placed on the other host, not failed


def test_what_a_node_cleaned_up_after_a_replica_lands_on_the_timeline(bench: Bench) -> None:
    job = gang(bench, 8)
    [rep] = bench.replicas(job)
    note = "killed 2 leftover process(es); removed /dev/shm/nccl-1"
    bench.report(rep.node, [event(rep, "exited", bench.clock(), exit_code=0, cleanup=note)])
    [entry] = bench.events(job, "cleanup")
    assert entry.message == f"node {rep.node}: {note}"
    assert entry.data == {"node": rep.node, "replica": rep.id, "epoch": 1, "cleanup": note}
    assert bench.job(job).state == "succeeded"


# -- rank progress ----------------------------------------------------------------------------


def progress(rep: Any, step: int, at: float, **extra: Any) -> Progress:
    values: dict[str, Any] = {
        "replica": rep.id,
        "job": rep.job_id,
        "epoch": rep.epoch,
        "rank": rep.rank,
        "step": step,
        "at": at,
    }
    values.update(extra)
    return Progress.model_validate(values)


def rank_row(bench: Bench, job: str, rank: int) -> RankProgressRow:
    with bench.db.session() as s:
        row = s.scalar(
            select(RankProgressRow).where(
                RankProgressRow.job_id == job, RankProgressRow.rank == rank
            )
        )
        assert row is not None
        s.expunge(row)
        return row


def test_a_ranks_recent_step_times_are_kept_up_to_the_window(bench: Bench) -> None:
    job = gang(bench, 8)
    [rep] = bench.replicas(job)
    t0 = bench.clock()
    items = [progress(rep, i, t0 + i, step_time_s=float(i)) for i in range(STEP_WINDOW + 5)]
    items.append(progress(rep, 99, t0 + 99))  # a report without a step time keeps them
    refused = bench.write(lambda s: apply_progress(s, rep.node, items))
    assert refused == []
    row = rank_row(bench, job, 0)
    assert row.step_times == [float(i) for i in range(5, STEP_WINDOW + 5)]
    assert (row.step, row.at, row.node, row.epoch) == (99, t0 + 99, rep.node, 1)
    assert bench.job(job).last_step == 99


def test_metrics_are_the_latest_reported(bench: Bench) -> None:
    job = gang(bench, 8)
    [rep] = bench.replicas(job)
    t = bench.clock()
    bench.write(lambda s: apply_progress(s, rep.node, [progress(rep, 1, t, metrics={"loss": 2.0})]))
    bench.write(lambda s: apply_progress(s, rep.node, [progress(rep, 2, t, metrics={"lr": 0.1})]))
    assert rank_row(bench, job, 0).metrics == {"lr": 0.1}


def test_step_times_start_afresh_in_a_new_allocation(bench: Bench) -> None:
    job = gang(bench, 8)
    [rep] = bench.replicas(job)
    t = bench.clock()
    first = [progress(rep, i, t, step_time_s=0.5) for i in range(3)]
    bench.write(lambda s: apply_progress(s, rep.node, first))
    bench.clock.advance(16.0)
    bench.beat_all(but=[rep.node])
    bench.settle()  # its node died: it resumes in epoch 2 elsewhere
    bench.start_all()
    [new] = [r for r in bench.replicas(job) if r.epoch == 2]
    later = [progress(new, 10, bench.clock(), step_time_s=0.25)]
    bench.write(lambda s: apply_progress(s, new.node, later))
    row = rank_row(bench, job, 0)
    assert (row.epoch, row.step_times, row.node) == (2, [0.25], new.node)


def test_progress_of_an_epoch_the_job_left_is_refused(bench: Bench) -> None:
    job = gang(bench, 8)
    [rep] = bench.replicas(job)
    stale = progress(rep, 5, bench.clock()).model_copy(update={"epoch": 0})
    refused = bench.write(lambda s: apply_progress(s, rep.node, [stale]))
    assert refused == [rep.id]
    assert bench.job(job).last_step is None

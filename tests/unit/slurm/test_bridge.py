"""The Slurm bridge's decisions, pass by pass, against an in-memory Slurm and server: what it
asks Slurm to do for a given queue and desired state, and what it reports back. (The real
slurmctld runs in tests/integration/test_slurm.py; these pin the rules down one by one.)"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Sequence
from contextlib import suppress
from pathlib import Path
from typing import Any, cast

from slurm_fakes import NODES, FakeServer, FakeSlurm, bridge, clear, run, wants

from boltforge.client import ApiFailure
from boltforge.slurm.bridge import MAKE_RETRY_S, SlurmBridge
from boltforge.slurm.commands import SlurmError
from boltforge.slurm.model import SlurmJob


def test_every_slurm_node_registers_with_its_gpus_and_a_held_job_is_submitted_once() -> None:
    slurm, server = FakeSlurm(), FakeServer()
    sid = slurm.submit(job_id=7, node_count=2)
    b = bridge(slurm, server)
    run(b, passes=3)
    assert [r.inventory.name for r in server.registered] == list(NODES)
    assert {r.inventory.gpus for r in server.registered} == {8}
    assert len(server.submitted) == 1 and server.submitted[0]["gpus"] == 16
    assert slurm.queue[sid].admin_comment == "boltforge job=1"


def test_a_job_held_by_its_user_is_left_alone() -> None:
    slurm, server = FakeSlurm(), FakeServer()
    slurm.submit(job_id=7, comment="")  # held, but not by Boltforge's plugin
    run(bridge(slurm, server))
    assert server.submitted == []


def test_a_gang_starts_only_once_every_replica_is_bound_and_then_never_again() -> None:
    slurm, server = FakeSlurm(), FakeServer()
    sid = slurm.submit(job_id=7, node_count=2)
    b = bridge(slurm, server)
    run(b)
    wants(b, "run", "1", 1, ["n2"])  # half the gang: nothing yet
    run(b)
    assert slurm.commands("start_on") == []
    clear(b)
    wants(b, "run", "1", 1, ["n2", "n1"])
    run(b)
    assert slurm.commands("start_on") == [("start_on", sid, "n2,n1")]
    slurm.set(sid, state="RUNNING")
    run(b)
    assert server.kinds("1.1.0") == ["started"]
    slurm.set(sid, state="COMPLETED")
    run(b, passes=2)  # the desired state still says run until the server hears of the exit
    assert len(slurm.commands("start_on")) == 1
    assert server.kinds("1.1.1") == ["started", "exited"]


def test_a_stop_signals_the_job_then_requeues_it_held_once_it_exits() -> None:
    slurm, server = FakeSlurm(), FakeServer()
    sid = slurm.submit(job_id=7, node_count=1)
    b = bridge(slurm, server)
    run(b)
    wants(b, "run", "1", 1, ["n1"])
    run(b)
    slurm.set(sid, state="RUNNING")
    run(b)
    clear(b)
    wants(b, "stop", "1", 1, ["n1"])
    run(b)
    assert slurm.commands("signal", "requeue_held") == [("signal", sid)]
    slurm.set(sid, state="COMPLETED", exit_status=0)  # checkpointed and exited
    run(b)
    assert slurm.commands("requeue_held") == [("requeue_held", sid)]
    [exited] = [e for e in server.events if e.kind == "exited"]
    assert exited.exit_code == 0 and exited.checkpoint_s is not None
    clear(b)
    wants(b, "run", "1", 2, ["n2"])  # placed again: the next epoch starts
    run(b)
    assert slurm.commands("start_on")[-1] == ("start_on", sid, "n2")


def test_a_gang_stopped_before_slurm_started_it_is_reported_stopped_at_once() -> None:
    slurm, server = FakeSlurm(), FakeServer()
    slurm.submit(job_id=7, node_count=1)
    b = bridge(slurm, server)
    run(b)
    wants(b, "stop", "1", 1, ["n1"])
    run(b, passes=2)
    assert server.kinds("1.1.0") == ["exited"]
    assert slurm.commands("signal", "requeue_held", "start_on") == []


def test_a_job_cancelled_with_scancel_is_cancelled_in_boltforge_once() -> None:
    slurm, server = FakeSlurm(), FakeServer()
    sid = slurm.submit(job_id=7)
    b = bridge(slurm, server)
    run(b)
    slurm.set(sid, state="CANCELLED")
    run(b, passes=2)
    assert server.cancelled == ["1"]


def test_a_held_job_cancelled_in_boltforge_is_cancelled_in_slurm() -> None:
    slurm, server = FakeSlurm(), FakeServer()
    sid = slurm.submit(job_id=7)
    b = bridge(slurm, server)
    run(b)
    server.states["1"] = "cancelled"
    b._next_comments = 0.0
    run(b)
    assert slurm.commands("cancel") == [("cancel", sid)]


def test_every_job_gets_its_comment_however_many_the_server_lists_at_once() -> None:
    """The bridge asks for its own jobs by id: a listing of everyone's first jobs would
    leave the rest of its jobs without a word (and each would look ended)."""
    slurm, server = FakeSlurm(), FakeServer()
    server.shown = 1
    sids = [slurm.submit(job_id=7 + i) for i in range(3)]
    b = bridge(slurm, server)
    run(b)
    b._next_comments = 0.0
    run(b)
    for sid in sids:
        assert slurm.queue[sid].comment.startswith("boltforge: waiting"), slurm.queue[sid]


def test_a_job_the_server_refuses_gets_the_reason_in_its_comment_and_is_not_retried() -> None:
    slurm, server = FakeSlurm(), FakeServer()
    sid = slurm.submit(job_id=7, account="ghosts")
    server.refuse_with = ApiFailure(422, "bad job spec")
    b = bridge(slurm, server)
    run(b, passes=3)
    assert slurm.queue[sid].comment.startswith("boltforge: refused: bad job spec")
    assert sid in b.state.refused and server.submitted == []


def test_a_restarted_bridge_adopts_a_running_gang_from_its_admin_comment() -> None:
    slurm, server = FakeSlurm(), FakeServer()
    sid = slurm.submit(job_id=7, node_count=2, job_state="RUNNING", priority=1)
    slurm.set(sid, admin_comment="boltforge job=4 epoch=2 replicas=4.2.0@n1,4.2.1@n2")
    b = bridge(slurm, server)
    wants(b, "run", "4", 2, ["n1", "n2"])
    run(b)
    running = [(s.replica, s.state) for r in server.registered for s in r.running]
    assert running == [("4.2.0", "running"), ("4.2.1", "running")]
    assert server.submitted == [] and slurm.commands("start_on") == []


# -- jobs sent with bolt submit: the bridge makes their Slurm jobs ------------------------------

TRAIN = ("python", "train.py")


def test_a_bolt_submit_job_gets_a_held_slurm_job_pinned_to_its_nodes_and_released() -> None:
    slurm, server = FakeSlurm(), FakeServer()
    b = bridge(slurm, server)
    run(b)
    wants(b, "run", "9", 1, ["n2", "n1"], command=TRAIN)
    run(b, passes=2)
    [made] = slurm.commands("submit_held")
    assert made == ("submit_held", "bolt", "2", "8", "bolt-9")
    [sid] = [j for j in slurm.queue if b.state.bf_of.get(j) == "9"]
    assert slurm.commands("start_on") == [("start_on", sid, "n2,n1")]
    assert slurm.queue[sid].admin_comment.endswith("made=1")
    assert server.submitted == []  # held by the plugin, but never sent back to the server
    assert "n1) export RANK=1" in slurm.scripts[0] and "n2) export RANK=0" in slurm.scripts[0]


def made_and_stopping() -> tuple[FakeSlurm, FakeServer, SlurmBridge, str]:
    """A ``bolt submit`` job (9) running in the Slurm job the bridge made for it, which the
    server now wants stopped; the Slurm job's id."""
    slurm, server = FakeSlurm(), FakeServer()
    server.states["9"] = "running"
    b = bridge(slurm, server)
    run(b)
    wants(b, "run", "9", 1, ["n1"], command=TRAIN)
    run(b)
    [sid] = list(slurm.queue)
    slurm.set(sid, state="RUNNING")
    run(b)
    clear(b)
    wants(b, "stop", "9", 1, ["n1"], command=TRAIN)
    run(b)
    return slurm, server, b, sid


def test_a_made_job_stopped_gets_its_steps_signalled_and_its_next_epoch_a_new_slurm_job() -> None:
    slurm, server, b, first = made_and_stopping()
    assert slurm.commands("signal") == [("signal", first, "steps only")]
    slurm.set(first, state="COMPLETED", exit_status=0)
    run(b)
    assert slurm.commands("requeue_held", "cancel") == []  # ended: nothing to requeue
    clear(b)
    wants(b, "run", "9", 2, ["n2"], command=TRAIN)
    run(b)
    second = [j for j in slurm.queue if j != first]
    assert len(second) == 1 and slurm.commands("start_on")[-1] == ("start_on", second[0], "n2")
    assert server.cancelled == []  # the Boltforge job carries on


def test_a_made_job_still_running_when_its_grace_ends_is_cancelled_not_requeued() -> None:
    slurm, server, b, sid = made_and_stopping()
    b.state.gangs[sid].stop_by = 0.0  # its grace is over
    run(b, passes=2)
    assert slurm.commands("cancel") == [("cancel", sid)]
    assert slurm.commands("requeue_held") == [] and server.cancelled == []


def test_a_restarted_bridge_knows_the_slurm_jobs_it_made() -> None:
    slurm, server = FakeSlurm(), FakeServer()
    sid = slurm.submit(job_id=7, node_count=1, job_state="RUNNING", priority=1)
    slurm.set(sid, admin_comment="boltforge job=4 epoch=1 replicas=4.1.0@n1 made=1")
    b = bridge(slurm, server)
    wants(b, "run", "4", 1, ["n1"], command=TRAIN)
    run(b, passes=2)
    assert b.state.made == {sid: ("4", 1)}
    assert slurm.commands("submit_held", "start_on") == []  # not made, nor started, twice


def test_replicas_sharing_a_node_cannot_run_as_a_slurm_job_and_say_why() -> None:
    slurm, server = FakeSlurm(), FakeServer()
    b = bridge(slurm, server)
    run(b)
    wants(b, "run", "9", 1, ["n1", "n1"], command=TRAIN)
    run(b, passes=2)
    assert slurm.commands("submit_held") == []
    [failed, _] = [e for e in server.events if e.kind == "failed"]
    assert "a node of its own" in (failed.detail or "")


def test_a_made_job_slurm_refuses_is_tried_again_then_fails_with_slurms_words() -> None:
    slurm, server = FakeSlurm(), FakeServer()
    slurm.sbatch_fails = SlurmError("sbatch: error: Invalid account or account/partition")
    b = bridge(slurm, server)
    run(b)
    wants(b, "run", "9", 1, ["n1"], command=TRAIN)
    run(b, passes=3)  # the controller may be restarting: nothing fails yet, nor is rushed
    assert len(slurm.commands("submit_held")) == 1 and server.events == []
    since, _ = b._make_failing[("9", 1)]
    b._make_failing[("9", 1)] = (since - MAKE_RETRY_S, 0.0)  # its time to retry is over
    run(b, passes=3)
    [failed] = [e for e in server.events if e.kind == "failed"]
    assert "as bolt-research" in failed.detail and "Invalid account" in failed.detail
    assert slurm.queue == {}  # nothing was made


class CountingSlurm(FakeSlurm):
    """A FakeSlurm that counts the bridge's reads of the queue (one per pass)."""

    def __init__(self) -> None:
        super().__init__()
        self.reads = 0

    async def jobs(self, partitions: Sequence[str]) -> list[SlurmJob]:
        self.reads += 1
        return await super().jobs(partitions)


async def until(check: Callable[[], bool], timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while not check():
            await asyncio.sleep(0.01)


def test_a_touch_of_the_wake_file_starts_a_pass_at_once(tmp_path: Path) -> None:
    """``job_submit.lua`` touches the wake file for every job it holds: the bridge reads the
    queue then, not at its next poll (a minute away here); a missing file wakes nothing."""
    slurm, server, wake = CountingSlurm(), FakeServer(), tmp_path / "wake"
    b = SlurmBridge(
        cast(Any, slurm), cast(Any, server), cast(Any, server), ["bolt"], poll_s=60.0,
        wake_file=wake,
    )  # fmt: skip

    async def go() -> None:
        task = asyncio.create_task(b.run())
        await until(lambda: slurm.reads == 1)
        await asyncio.sleep(0.2)
        assert slurm.reads == 1  # no file yet: nothing to wake the bridge
        wake.touch()
        await until(lambda: slurm.reads == 2)
        os.utime(wake, ns=(0, wake.stat().st_mtime_ns + 1_000_000))
        await until(lambda: slurm.reads == 3)
        task.cancel()
        with suppress(asyncio.CancelledError):
            await task

    asyncio.run(go())


def test_the_bridge_reads_squeue_often_only_while_a_start_or_a_stop_is_under_way() -> None:
    slurm, server = FakeSlurm(), FakeServer()
    sid = slurm.submit(job_id=7)
    b = bridge(slurm, server)
    run(b)
    assert b._next_read_s() == b.poll_s == 2.0  # a held job submitted: nothing under way
    wants(b, "run", "1", 1, ["n1"])
    run(b)
    assert b._next_read_s() == b.busy_poll_s == 0.1  # started, not yet seen running
    slurm.set(sid, state="RUNNING")
    run(b)
    assert b._next_read_s() == 2.0
    wants(b, "stop", "1", 1, ["n1"])
    run(b)
    assert b._next_read_s() == 0.1  # signalled, its job not ended yet


def test_a_long_poll_never_delays_the_leases_renewal() -> None:
    slurm, server = FakeSlurm(), FakeServer()
    b = bridge(slurm, server)
    b.poll_s = 3600.0
    run(b)  # registers the nodes
    assert b.state.leases

    async def wait() -> bool:
        b.heartbeats.next_at = time.monotonic() + 0.01  # renewal due long before the read
        async with asyncio.timeout(30):  # a sleep until the read would fail here
            return await b._sleep_until(time.monotonic() + b.poll_s)

    assert asyncio.run(wait()) is False  # not woken: the heartbeat is due


def test_a_woken_pass_puts_off_sinfo_and_comments_and_a_polled_one_does_both() -> None:
    b = bridge(FakeSlurm(), FakeServer())
    run(b)  # registers the nodes
    overdue = time.monotonic() - 1.0
    b._next_nodes = b._next_comments = overdue
    asyncio.run(b.step(woken=True))
    assert (b._next_nodes, b._next_comments) == (overdue, overdue)  # put off
    asyncio.run(b.step())
    assert min(b._next_nodes, b._next_comments) > time.monotonic()  # done, next ones ahead


def test_a_decision_of_the_server_is_acted_on_without_a_read_of_its_own_while_the_last_is_fresh(
    tmp_path: Path,
) -> None:
    """A preemption is signalled in the pass the server's decision wakes, on the ``squeue``
    read the new job's wake called for a moment before; a wake of the file, a stale read or
    no wake file at all read it again."""
    slurm, server = CountingSlurm(), FakeServer()
    sid = slurm.submit(job_id=7)
    b = bridge(slurm, server)
    b.wake_file = tmp_path / "wake"
    run(b)
    wants(b, "run", "1", 1, ["n1"])
    run(b)
    slurm.set(sid, state="RUNNING")
    run(b)
    reads = slurm.reads
    wants(b, "stop", "1", 1, ["n1"])
    asyncio.run(b.step(woken=True))  # woken by the decision alone, just after a read
    assert slurm.reads == reads
    assert slurm.commands("signal")  # SIGTERM sent on what the last read said

    b._file_woke = True  # a job was held (or ended) since
    asyncio.run(b.step(woken=True))
    assert slurm.reads == reads + 1
    b._read_at -= 10.0  # the last read is old
    asyncio.run(b.step(woken=True))
    assert slurm.reads == reads + 2
    b.wake_file = None  # nothing tells the bridge of jobs held or ended: every pass reads
    asyncio.run(b.step(woken=True))
    assert slurm.reads == reads + 3


def test_a_wake_of_the_file_during_a_read_calls_for_another_read(tmp_path: Path) -> None:
    """The job ``job_submit.lua`` held as the bridge was reading may not be in that read:
    the next pass reads again, even when the server's decision woke it a moment later."""
    slurm, server = CountingSlurm(), FakeServer()
    b = bridge(slurm, server)
    b.wake_file = tmp_path / "wake"
    run(b)
    read = slurm.jobs

    async def touched_meanwhile(partitions: Sequence[str]) -> list[SlurmJob]:
        b._file_woke = True  # as the watcher does when the file changes
        return await read(partitions)

    slurm.jobs = touched_meanwhile  # type: ignore[method-assign]
    asyncio.run(b.step())  # a read on the poll, the file touched meanwhile
    reads = slurm.reads
    slurm.jobs = read  # type: ignore[method-assign]
    asyncio.run(b.step(woken=True))
    assert slurm.reads == reads + 1

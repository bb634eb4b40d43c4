"""The Slurm bridge's decisions, pass by pass, against an in-memory Slurm and server: what it
asks Slurm to do for a given queue and desired state, and what it reports back. (The real
slurmctld runs in tests/integration/test_slurm.py; these pin the rules down one by one.)"""

from __future__ import annotations

import asyncio
import dataclasses
import os
from collections.abc import Callable, Sequence
from contextlib import suppress
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

from slurm_builders import sinfo_node, squeue_job

from boltforge.client import ApiFailure
from boltforge.slurm.bridge import SlurmBridge
from boltforge.slurm.model import SlurmJob, SlurmNode, parse_jobs, parse_nodes
from boltforge.wire.agent import (
    AgentReport,
    Lease,
    Registration,
    ReplicaEvent,
    ReplicaSpec,
    ReportsReply,
)

NODES = ("n1", "n2")
HELD = {"state_reason": "JobHeldUser", "priority": 0, "comment": "boltforge: held for placement"}


class FakeSlurm:
    """A queue of jobs and the commands the bridge ran against it."""

    def __init__(self) -> None:
        self.queue: dict[str, SlurmJob] = {}
        self.nodes_: list[SlurmNode] = parse_nodes({"nodes": [sinfo_node(name=n) for n in NODES]})
        self.ran: list[tuple[str, ...]] = []
        self.scripts: list[str] = []

    def submit(self, **fields: Any) -> str:
        (job,) = parse_jobs({"jobs": [squeue_job(**{**HELD, **fields})]})
        self.queue[job.id] = job
        return job.id

    def set(self, job: str, **fields: Any) -> None:
        self.queue[job] = dataclasses.replace(self.queue[job], **fields)

    async def jobs(self, partitions: Sequence[str]) -> list[SlurmJob]:
        return list(self.queue.values())

    async def nodes(self, partitions: Sequence[str]) -> list[SlurmNode]:
        return self.nodes_

    async def start_on(self, job: str, nodes: Sequence[str]) -> None:
        self.ran.append(("start_on", job, ",".join(nodes)))
        self.set(job, priority=1, reason="None")

    async def signal(self, job: str, signal: str = "TERM", full: bool = True) -> None:
        self.ran.append(("signal", job) if full else ("signal", job, "steps only"))

    async def submit_held(
        self, partition: str, nodes: int, gpus: int, name: str, script: str, cwd: str | None
    ) -> str:
        self.ran.append(("submit_held", partition, str(nodes), str(gpus), name))
        self.scripts.append(script)
        return self.submit(job_id=100 + len(self.scripts), node_count=nodes, name=name)

    async def requeue_held(self, job: str) -> None:
        self.ran.append(("requeue_held", job))
        self.set(job, state="PENDING", priority=0, reason="JobHeldUser")

    async def hold(self, job: str) -> None:
        self.ran.append(("hold", job))

    async def cancel(self, job: str) -> None:
        self.ran.append(("cancel", job))

    async def comment(self, job: str, text: str) -> None:
        self.set(job, comment=text)

    async def admin_comment(self, job: str, text: str) -> None:
        self.set(job, admin_comment=text)

    def commands(self, *kinds: str) -> list[tuple[str, ...]]:
        return [c for c in self.ran if c[0] in kinds]


class FakeServer:
    """The agent protocol and the job API as the bridge uses them."""

    def __init__(self) -> None:
        self.registered: list[Registration] = []
        self.events: list[ReplicaEvent] = []
        self.submitted: list[dict[str, Any]] = []
        self.states: dict[str, str] = {}
        self.cancelled: list[str] = []
        self.refuse_with: ApiFailure | None = None
        self.shown = 1000  # the live jobs a listing without ids shows

    async def register(self, body: Registration) -> Lease:
        self.registered.append(body)
        name = body.inventory.name
        return Lease(node=name, session=f"s-{name}", lease_s=15, heartbeat_s=5)

    async def heartbeat(self, node: str, body: Any, timeout_s: float) -> Lease:
        return Lease(node=node, session=f"s-{node}", lease_s=15, heartbeat_s=5)

    async def desired(self, node: str, since: int, wait_s: float) -> Any:
        await asyncio.Event().wait()  # the tests set desired states themselves

    async def reports(self, batch: dict[str, AgentReport]) -> ReportsReply:
        for body in batch.values():
            self.events += body.events
        return ReportsReply()

    def submit(self, req: Any, key: str | None = None) -> Any:
        if self.refuse_with is not None:
            raise self.refuse_with
        job = str(len(self.submitted) + 1)
        self.submitted.append(req.spec)
        self.states[job] = "pending"
        return SimpleNamespace(job=SimpleNamespace(id=job))

    def job(self, job: str) -> Any:
        return SimpleNamespace(id=job, state=self.states[job])

    def jobs(self, ids: Sequence[str] = ()) -> Any:
        """Live jobs: the first ``shown`` of them, as the real listing shows its first
        thousand, or those in ``ids``."""
        live = [j for j, s in self.states.items() if s not in ("succeeded", "failed", "cancelled")]
        live = [j for j in live if j in ids] if ids else live[: self.shown]
        summaries = [
            SimpleNamespace(id=j, state=self.states[j], reason="capacity", nodes="", position=0)
            for j in live
        ]
        return SimpleNamespace(jobs=summaries)

    def cancel(self, job: str) -> Any:
        self.cancelled.append(job)
        self.states[job] = "cancelled"

    def kinds(self, replica: str) -> list[str]:
        return [e.kind for e in self.events if e.replica == replica]


def bridge(slurm: FakeSlurm, server: FakeServer) -> SlurmBridge:
    return SlurmBridge(
        cast(Any, slurm), cast(Any, server), cast(Any, server), ["bolt"], grace_s=30.0
    )


def run(b: SlurmBridge, passes: int = 1) -> None:
    async def go() -> None:
        for _ in range(passes):
            await b.step()
        for task in b._polls.values():
            task.cancel()

    asyncio.run(go())


def wants(
    b: SlurmBridge,
    action: str,
    job: str,
    epoch: int,
    on: Sequence[str],
    command: Sequence[str] = ("slurm-job", "x"),
) -> None:
    """The server's desired states: replica ``job.epoch.r`` on the ``r``-th node (a Slurm
    job's gang unless ``command`` says otherwise)."""
    for rank, node in enumerate(on):
        spec = ReplicaSpec(
            replica=f"{job}.{epoch}.{rank}",
            job=job,
            epoch=epoch,
            action=action,  # type: ignore[arg-type]
            command=list(command),
            gpus=list(range(8)),
            env={"RANK": str(rank)},
            grace_s=20.0,
        )
        b.state.desired.setdefault(node, []).append(spec)


def clear(b: SlurmBridge) -> None:
    b.state.desired = {}


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

"""The Slurm bridge at its edges, pass by pass against an in-memory Slurm and server: nodes
that drain, go down or lose their session; a server that fails or refuses; gangs the server
moves past, jobs Slurm requeues on its own, reports that cannot be delivered yet; and the
comment each job shows in ``squeue``."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any, cast

import pytest
from slurm_builders import sinfo_node, squeue_job

from boltforge.client import ApiFailure
from boltforge.slurm.bridge import SlurmBridge
from boltforge.slurm.model import SlurmJob, SlurmNode, parse_jobs, parse_nodes
from boltforge.wire.agent import (
    AgentReport,
    DesiredChanges,
    DesiredState,
    Heartbeat,
    HeartbeatsReply,
    Lease,
    Registration,
    ReplicaEvent,
    ReplicaSpec,
    ReportsReply,
)
from boltforge.wire.jobs import Problem

HELD = {"state_reason": "JobHeldUser", "priority": 0, "comment": "boltforge: held for placement"}


class Slurm:
    """A queue of jobs and nodes, and every command the bridge ran against them."""

    def __init__(self, *nodes: dict[str, Any]) -> None:
        self.queue: dict[str, SlurmJob] = {}
        self.node_list: list[SlurmNode] = parse_nodes({"nodes": list(nodes)})
        self.ran: list[tuple[str, ...]] = []
        self.others: list[SlurmJob] = []  # other partitions' jobs squeue lists

    def submit(self, **fields: Any) -> str:
        (job,) = parse_jobs({"jobs": [squeue_job(**{**HELD, **fields})]})
        self.queue[job.id] = job
        return job.id

    def set(self, job: str, **fields: Any) -> None:
        self.queue[job] = dataclasses.replace(self.queue[job], **fields)

    def set_node(self, name: str, **fields: Any) -> None:
        self.node_list = [
            dataclasses.replace(n, **fields) if n.name == name else n for n in self.node_list
        ]

    async def jobs(self, partitions: Sequence[str]) -> list[SlurmJob]:
        return list(self.queue.values())

    async def jobs_and_others(
        self, partitions: Sequence[str]
    ) -> tuple[list[SlurmJob], list[SlurmJob]]:
        return await self.jobs(partitions), self.others

    async def nodes(self, partitions: Sequence[str]) -> list[SlurmNode]:
        return self.node_list

    async def start_on(self, job: str, nodes: Sequence[str]) -> None:
        self.ran.append(("start_on", job, ",".join(nodes)))
        self.set(job, priority=1, reason="None")

    async def signal(self, job: str, signal: str = "TERM", full: bool = True) -> None:
        self.ran.append(("signal", job))

    async def requeue_held(self, job: str) -> None:
        self.ran.append(("requeue_held", job))
        self.set(job, state="PENDING", priority=0, reason="JobHeldUser")

    async def hold(self, job: str) -> None:
        self.ran.append(("hold", job))
        self.set(job, priority=0, reason="JobHeldUser")

    async def cancel(self, job: str) -> None:
        self.ran.append(("cancel", job))

    async def comment(self, job: str, text: str) -> None:
        self.set(job, comment=text)

    async def admin_comment(self, job: str, text: str) -> None:
        self.set(job, admin_comment=text)

    def commands(self, *kinds: str) -> list[tuple[str, ...]]:
        return [c for c in self.ran if c[0] in kinds]


class Server:
    """The agent protocol and job API as the bridge uses them, with switches for failures."""

    def __init__(self) -> None:
        self.registered: list[str] = []
        self.events: list[ReplicaEvent] = []
        self.states: dict[str, str] = {}
        self.cordons: list[tuple[str, str]] = []
        self.cancelled: list[str] = []
        self.submitted = 0
        self.submit_fails: ApiFailure | None = None
        self.cancel_fails: ApiFailure | None = None
        self.heartbeat_s = 5.0
        self.heartbeat_lost = False
        self.report_lost = False
        self.stop: list[str] = []
        self.desired_once: dict[str, DesiredState] = {}
        self.health: dict[str, dict[str, str]] = {}  # each node's, as the last heartbeats said

    def lease(self, node: str) -> Lease:
        return Lease(node=node, session=f"s-{node}", lease_s=15, heartbeat_s=self.heartbeat_s,
                     stop=self.stop)  # fmt: skip

    async def register(self, body: Registration) -> Lease:
        self.registered.append(body.inventory.name)
        return self.lease(body.inventory.name)

    async def heartbeats(self, beats: dict[str, Heartbeat], timeout_s: float) -> HeartbeatsReply:
        self.health = {n: b.health for n, b in beats.items()}
        if self.heartbeat_lost:
            return HeartbeatsReply(lost=list(beats))
        return HeartbeatsReply(leases={n: self.lease(n) for n in beats})

    async def desired_changes(self, since: int, wait_s: float) -> DesiredChanges:
        if not self.desired_once:
            await asyncio.Event().wait()  # nothing changes after the first answer
        states, self.desired_once = list(self.desired_once.values()), {}
        return DesiredChanges(seq=since + 1, nodes=states)

    async def reports(self, batch: dict[str, AgentReport]) -> ReportsReply:
        if self.report_lost:
            return ReportsReply(lost=list(batch))
        refused = {}
        for node, body in batch.items():
            self.events += body.events
            refused[node] = [e.replica for e in body.events if e.epoch < 1]
        return ReportsReply(refused={n: r for n, r in refused.items() if r})

    def submit(self, req: Any, key: str | None = None) -> Any:
        if self.submit_fails is not None:
            raise self.submit_fails
        self.submitted += 1
        job = str(self.submitted)
        self.states[job] = "pending"
        return SimpleNamespace(job=SimpleNamespace(id=job))

    def job(self, job: str) -> Any:
        return SimpleNamespace(id=job, state=self.states[job])

    def jobs(self, ids: Sequence[str] = ()) -> Any:
        return SimpleNamespace(jobs=[])

    def cancel(self, job: str) -> None:
        self.cancelled.append(job)
        if self.cancel_fails is not None:
            raise self.cancel_fails

    def cordon(self, node: str) -> None:
        self.cordons.append(("cordon", node))

    def uncordon(self, node: str) -> None:
        self.cordons.append(("uncordon", node))

    def kinds(self, replica: str) -> list[str]:
        return [e.kind for e in self.events if e.replica == replica]


def bridge(slurm: Slurm, server: Server) -> SlurmBridge:
    return SlurmBridge(
        cast(Any, slurm), cast(Any, server), cast(Any, server), ["bolt"], nodes_every_s=0.0
    )


def run(b: SlurmBridge, passes: int = 1) -> None:
    async def go() -> None:
        for _ in range(passes):
            await b.step()
        if b._following is not None:
            b._following.cancel()
        b._following = None

    asyncio.run(go())


def wants(b: SlurmBridge, action: str, job: str, epoch: int, on: Sequence[str]) -> None:
    """The server's desired states for a Slurm job's gang: replica ``job.epoch.r`` on the
    ``r``-th node."""
    for rank, node in enumerate(on):
        spec = ReplicaSpec(
            replica=f"{job}.{epoch}.{rank}",
            job=job,
            epoch=epoch,
            action=action,  # type: ignore[arg-type]
            command=["slurm-job", "x"],
            grace_s=20.0,
        )
        b.state.desired.setdefault(node, []).append(spec)


def running_gang(heartbeat_s: float = 5.0) -> tuple[Slurm, Server, SlurmBridge, str]:
    """Slurm job 7 held, submitted as Boltforge job 1, started on n1 and running; its nodes
    heartbeat every ``heartbeat_s`` (0: every pass)."""
    slurm, server = Slurm(sinfo_node(name="n1"), sinfo_node(name="n2")), Server()
    server.heartbeat_s = heartbeat_s
    sid = slurm.submit(job_id=7)
    b = bridge(slurm, server)
    run(b)
    wants(b, "run", "1", 1, ["n1"])
    run(b)
    slurm.set(sid, state="RUNNING")
    server.states["1"] = "running"
    run(b)
    assert server.kinds("1.1.0") == ["started"]
    return slurm, server, b, sid


# --- nodes --------------------------------------------------------------------------------


def test_a_draining_node_is_cordoned_once_and_uncordoned_when_it_returns() -> None:
    slurm, server = Slurm(sinfo_node(name="n1"), sinfo_node(name="n2")), Server()
    b = bridge(slurm, server)
    run(b)
    slurm.set_node("n2", flags=("DRAIN",))
    run(b, passes=2)
    assert server.cordons == [("cordon", "n2")]
    slurm.set_node("n2", flags=())
    run(b, passes=2)
    assert server.cordons == [("cordon", "n2"), ("uncordon", "n2")]


def test_a_node_slurm_says_is_down_loses_its_lease_and_registers_again_when_back() -> None:
    slurm, server = Slurm(sinfo_node(name="n1"), sinfo_node(name="n2")), Server()
    b = bridge(slurm, server)
    run(b)
    slurm.set_node("n2", state="down*")
    run(b)
    assert set(b.state.leases) == {"n1"}  # no heartbeat keeps n2's lease: it runs out
    slurm.set_node("n2", state="idle")
    run(b)
    assert server.registered == ["n1", "n2", "n2"]


def test_a_node_whose_session_is_lost_registers_again() -> None:
    slurm, server = Slurm(sinfo_node(name="n1")), Server()
    server.heartbeat_s = 0.0  # a heartbeat is due every pass
    b = bridge(slurm, server)
    run(b)
    server.heartbeat_lost = True
    run(b)
    assert "n1" not in b.state.leases
    server.heartbeat_lost = False
    run(b)
    assert server.registered == ["n1", "n1"] and "n1" in b.state.leases


def test_the_desired_state_the_server_sends_is_kept_and_wakes_the_bridge() -> None:
    slurm, server = Slurm(sinfo_node(name="n1")), Server()
    spec = ReplicaSpec(replica="4.1.0", job="4", epoch=1, action="run", command=["x"])
    server.desired_once["n1"] = DesiredState(node="n1", version=3, replicas=[spec])
    b = bridge(slurm, server)

    async def go() -> None:
        await b.step()
        for _ in range(5):  # let the long-poll task take its answer
            await asyncio.sleep(0)
        if b._following is not None:
            b._following.cancel()

    asyncio.run(go())
    assert b.state.desired == {"n1": [spec]}
    assert b._wake.is_set()


# --- jobs in ------------------------------------------------------------------------------


def test_a_server_error_fails_the_pass_and_the_job_is_sent_again_later() -> None:
    slurm, server = Slurm(sinfo_node(name="n1")), Server()
    sid = slurm.submit(job_id=7)
    server.submit_fails = ApiFailure(503, "database unavailable")
    b = bridge(slurm, server)
    with pytest.raises(ApiFailure):
        run(b)
    assert sid not in b.state.refused and slurm.queue[sid].comment == HELD["comment"]
    server.submit_fails = None
    run(b)
    assert b.state.bf_of == {sid: "1"}


def test_a_refusal_names_each_problem_and_its_field_in_the_comment() -> None:
    slurm, server = Slurm(sinfo_node(name="n1")), Server()
    sid = slurm.submit(job_id=7, account="ghosts")
    problems = [Problem(field="team", message="is not a team here. To fix: use research")]
    server.submit_fails = ApiFailure(422, "bad job spec", problems)
    b = bridge(slurm, server)
    run(b, passes=2)
    assert slurm.queue[sid].comment == (
        "boltforge: refused: bad job spec (team: is not a team here. To fix: use research)"
    )
    assert server.submitted == 0


def test_a_multi_node_job_on_part_of_each_node_is_refused_before_the_server_sees_it() -> None:
    slurm, server = Slurm(sinfo_node(name="n1"), sinfo_node(name="n2")), Server()
    sid = slurm.submit(job_id=7, node_count=2, tres_per_node="gres:gpu:4")
    run(bridge(slurm, server))
    assert slurm.queue[sid].comment.startswith("boltforge: refused: a 2-node job must take whole")
    assert server.submitted == 0


# --- stopping and what Slurm does on its own ------------------------------------------------


def test_a_replica_the_server_moved_past_is_stopped_without_grace() -> None:
    slurm, server, b, sid = running_gang(heartbeat_s=0.0)
    server.stop = ["1.1.0"]
    run(b)  # the heartbeat's lease names the replica: its gang is to stop now
    run(b)
    assert slurm.commands("signal", "requeue_held") == [("signal", sid), ("requeue_held", sid)]
    assert server.kinds("1.1.0") == ["started", "exited"]


def test_a_gang_whose_job_was_cancelled_in_boltforge_is_cancelled_not_requeued() -> None:
    slurm, server, b, sid = running_gang()
    server.states["1"] = "cancelled"
    b.state.desired = {}
    wants(b, "stop", "1", 1, ["n1"])
    b.state.gangs[sid].stop_by = 0.0  # its grace is over while the job still runs
    run(b)
    assert slurm.commands("cancel") == [("cancel", sid)]
    assert slurm.commands("requeue_held") == []
    [exited] = [e for e in server.events if e.kind == "exited"]
    assert exited.signal == 15 and exited.exit_code is None


def test_a_gang_released_but_not_yet_started_by_slurm_is_held_again() -> None:
    slurm, _, b, sid = running_gang()
    slurm.set(sid, state="PENDING", reason="Resources", priority=5)
    b.state.desired = {}
    wants(b, "stop", "1", 1, ["n1"])
    run(b)
    assert set(slurm.commands("hold")) == {("hold", sid)}
    assert slurm.commands("requeue_held", "cancel") == []
    assert slurm.queue[sid].held and sid not in b.state.gangs


def test_a_job_slurm_requeued_on_its_own_is_held_for_boltforge_to_place() -> None:
    slurm, server = Slurm(sinfo_node(name="n1")), Server()
    sid = slurm.submit(job_id=7)
    b = bridge(slurm, server)
    run(b)
    slurm.set(sid, reason="BeginTime", priority=10)  # pending, no longer held, no gang
    run(b)
    assert slurm.commands("hold") == [("hold", sid)]


def test_a_node_failure_reports_the_start_it_missed_and_an_exit_by_the_node() -> None:
    slurm, server = Slurm(sinfo_node(name="n1")), Server()
    sid = slurm.submit(job_id=7)
    b = bridge(slurm, server)
    run(b)
    wants(b, "run", "1", 1, ["n1"])
    run(b)
    slurm.set(sid, state="NODE_FAIL", exit_status=0)  # ended before a pass saw it running
    run(b)
    assert server.kinds("1.1.0") == ["started", "exited"]
    [exited] = [e for e in server.events if e.kind == "exited"]
    assert exited.by_node and exited.exit_code == 0
    assert sid not in b.state.gangs


def test_a_cancel_the_server_refuses_is_tried_once_and_the_bridge_goes_on() -> None:
    slurm, server = Slurm(sinfo_node(name="n1")), Server()
    sid = slurm.submit(job_id=7)
    b = bridge(slurm, server)
    run(b)
    server.cancel_fails = ApiFailure(409, "job 1 already ended")
    slurm.set(sid, state="CANCELLED")
    run(b, passes=3)
    assert server.cancelled == ["1"]


def test_events_wait_in_the_outbox_until_the_node_has_a_session_again() -> None:
    slurm, server, b, sid = running_gang()
    server.report_lost = True
    slurm.set(sid, state="COMPLETED", exit_status=3 << 8)
    run(b)
    assert "n1" not in b.state.leases
    assert [e.kind for e in b.state.outbox["n1"]] == ["exited"]
    server.report_lost = False
    run(b)  # registers again, then delivers what waited
    assert server.kinds("1.1.0") == ["started", "exited"]
    assert [e.exit_code for e in server.events if e.kind == "exited"] == [3]
    assert b.state.outbox["n1"] == []


def test_what_jobs_not_boltforges_hold_on_a_node_goes_with_its_heartbeats() -> None:
    slurm = Slurm(
        sinfo_node(name="n1", gres_used="gpu:h100:3(IDX:0-2)", alloc_cpus=6),
        sinfo_node(name="n2"),
    )
    server = Server()
    b = bridge(slurm, server)
    ours = slurm.submit(job_id=7, job_state="RUNNING", nodes="n1", tres_per_node="gres:gpu:1",
                        tres_alloc_str="cpu=2,node=1")  # fmt: skip
    b.state.bf_of[ours] = "1"
    run(b)
    # Slurm gave 3 GPUs and 6 CPUs there; the bridge's own job holds 1 and 2 of them
    assert server.health == {"n1": {"held_by_others": "gpus=2,cpus=4,memory_gb=0"}, "n2": {}}

    # a job of another partition squeue lists counts at once, before sinfo is read again
    alloc = {"tres_per_node": "gres:gpu:4", "tres_alloc_str": "cpu=8,mem=16G,node=1"}
    listed = squeue_job(job_id=9, job_state="RUNNING", nodes="n2", partition="cpu", **alloc)
    (other,) = parse_jobs({"jobs": [listed]})
    slurm.others = [other]
    b.nodes_every_s = 3600.0
    run(b)
    assert server.health["n2"] == {"held_by_others": "gpus=4,cpus=8,memory_gb=16"}

    # once it ends and sinfo says so, nothing is held there
    slurm.others = []
    b._next_nodes = 0.0
    run(b)
    assert server.health["n2"] == {}

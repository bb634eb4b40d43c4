"""An in-memory Slurm and server for the Slurm bridge's tests (``tests/unit/slurm``,
``tests/security``): the bridge's decisions pass by pass, what it asks Slurm to do for a
given queue and desired state, and what it reports back."""

from __future__ import annotations

import asyncio
import dataclasses
import pwd
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any, cast

from slurm_builders import sinfo_node, squeue_job

from boltforge.client import ApiFailure
from boltforge.slurm.bridge import SlurmBridge
from boltforge.slurm.identity import TeamUsers
from boltforge.slurm.model import SlurmJob, SlurmNode, parse_jobs, parse_nodes
from boltforge.wire.agent import (
    AgentReport,
    Heartbeat,
    HeartbeatsReply,
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
        self.submitters: list[tuple[tuple[str, ...], str | None]] = []  # (as_user, cwd)
        self.sbatch_fails: Exception | None = None  # what sbatch raises, when set

    def submit(self, **fields: Any) -> str:
        (job,) = parse_jobs({"jobs": [squeue_job(**{**HELD, **fields})]})
        self.queue[job.id] = job
        return job.id

    def set(self, job: str, **fields: Any) -> None:
        self.queue[job] = dataclasses.replace(self.queue[job], **fields)

    async def jobs(self, partitions: Sequence[str]) -> list[SlurmJob]:
        return list(self.queue.values())

    async def jobs_and_others(
        self, partitions: Sequence[str]
    ) -> tuple[list[SlurmJob], list[SlurmJob]]:
        return await self.jobs(partitions), []

    async def config(self) -> str:
        return "AccountingStorageType = accounting_storage/none\n"

    async def nodes(self, partitions: Sequence[str]) -> list[SlurmNode]:
        return self.nodes_

    async def start_on(self, job: str, nodes: Sequence[str]) -> None:
        self.ran.append(("start_on", job, ",".join(nodes)))
        self.set(job, priority=1, reason="None")

    async def signal(self, job: str, signal: str = "TERM", full: bool = True) -> None:
        self.ran.append(("signal", job) if full else ("signal", job, "steps only"))

    async def submit_held(
        self,
        partition: str,
        nodes: int,
        gpus: int,
        name: str,
        script: str,
        cwd: str | None,
        as_user: Sequence[str] = (),
    ) -> str:
        self.ran.append(("submit_held", partition, str(nodes), str(gpus), name))
        if self.sbatch_fails is not None:
            raise self.sbatch_fails
        self.scripts.append(script)
        self.submitters.append((tuple(as_user), cwd))
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
        self.teams: dict[str, str] = {}  # a job's team; research when not named here
        self.refuse_with: ApiFailure | None = None
        self.shown = 1000  # the live jobs a listing without ids shows
        self.waiting: dict[str, list[str]] = {}  # a job's waiting detail (bolt explain's lines)
        self.detail_reads = 0  # how many times a job's detail was read
        self.nodes: dict[str, str] = {}  # where a job's listing says it sits

    async def register(self, body: Registration) -> Lease:
        self.registered.append(body)
        name = body.inventory.name
        return Lease(node=name, session=f"s-{name}", lease_s=15, heartbeat_s=5)

    async def heartbeats(self, beats: dict[str, Heartbeat], timeout_s: float) -> HeartbeatsReply:
        leases = {n: Lease(node=n, session=f"s-{n}", lease_s=15, heartbeat_s=5) for n in beats}
        return HeartbeatsReply(leases=leases)

    async def desired_changes(self, since: int, wait_s: float) -> Any:
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
        state = self.states.get(job, "running")
        self.detail_reads += 1
        team, waiting = self.teams.get(job, "research"), self.waiting.get(job, [])
        return SimpleNamespace(id=job, state=state, team=team, waiting=waiting)

    def jobs(self, ids: Sequence[str] = ()) -> Any:
        """Live jobs: the first ``shown`` of them, as the real listing shows its first
        thousand, or those in ``ids``."""
        live = [j for j, s in self.states.items() if s not in ("succeeded", "failed", "cancelled")]
        live = [j for j in live if j in ids] if ids else live[: self.shown]
        summaries = [
            SimpleNamespace(
                id=j,
                state=self.states[j],
                reason="capacity",
                nodes=self.nodes.get(j, ""),
                position=0,
            )
            for j in live
        ]
        return SimpleNamespace(jobs=summaries)

    def cancel(self, job: str) -> Any:
        self.cancelled.append(job)
        self.states[job] = "cancelled"

    def kinds(self, replica: str) -> list[str]:
        return [e.kind for e in self.events if e.replica == replica]


# The user database the tests' bridge sees: two team users, and root.
USERS = {
    "bolt-research": pwd.struct_passwd(
        ("bolt-research", "x", 1001, 1001, "", "/home/r", "/bin/sh")
    ),
    "bolt-batch": pwd.struct_passwd(("bolt-batch", "x", 1002, 1002, "", "/home/b", "/bin/sh")),
    "root": pwd.struct_passwd(("root", "x", 0, 0, "", "/root", "/bin/sh")),
}


def team_users(users: dict[str, str] | None = None, pattern: str | None = None) -> TeamUsers:
    """The bridge's team -> user map, as root would see it with ``USERS``."""
    mapped = {"research": "bolt-research"} if users is None else users
    return TeamUsers(mapped, pattern, lookup=USERS.__getitem__, euid=0)


def bridge(slurm: FakeSlurm, server: FakeServer, users: TeamUsers | None = None) -> SlurmBridge:
    return SlurmBridge(
        cast(Any, slurm), cast(Any, server), cast(Any, server), ["bolt"], grace_s=30.0,
        team_users=users or team_users(),
    )  # fmt: skip


def run(b: SlurmBridge, passes: int = 1) -> None:
    async def go() -> None:
        for _ in range(passes):
            await b.step()
        if b._following is not None:
            b._following.cancel()

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

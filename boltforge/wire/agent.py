"""The agent protocol: a node registers its inventory, holds a lease by heartbeating, long-polls
the replicas it should run, and reports what happened to them.

The server owns the desired state of every node (``DesiredState``: the replicas to run or stop,
with a version that grows on every change); the agent converges on it and reports back
(``AgentReport``). Every replica carries its job's allocation ``epoch``: a report for an epoch
the server has moved past is refused, so a partitioned node cannot act on a stale allocation.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$"
INT32 = 2**31 - 1  # what every store keeps in an integer column (PostgreSQL's ``integer``)
MAX_CPUS = 100_000
Int32 = Annotated[int, Field(ge=-INT32 - 1, le=INT32)]


class _Wire(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class Inventory(_Wire):
    """What a node has and where it sits. GPUs come from NVML where present (``source:
    nvml``), else from a declared inventory file (``declared``), so any machine can stand in
    for a GPU host. ``address`` is where the node's peers reach it (``MASTER_ADDR``).
    ``node_class`` (gpu, cpu or storage; by default by its GPUs), ``storage_gb`` and
    ``storage_gbps`` (a storage node's local capacity) and ``price_per_vcpu_hour`` are its
    pool's, as in the fleet spec, and so are ``mig`` (its GPUs may be cut into MIG instances)
    and ``mig_layout`` (how each idle GPU is cut: profile names, from NVML where present).
    ``replicas_outlive_lease``: a workload manager (Slurm) runs the node's replicas, not the
    process that speaks for it, so they keep running while that process is away: when the
    node's lease runs out the server marks it dead (no new work) but writes off nothing, and
    takes back the replicas it lists when it registers again (default: an agent, whose
    replicas end with it, so they are lost with its lease)."""

    name: str = Field(pattern=NAME)
    pool: str = Field("default", pattern=NAME)
    gpu: str = "none"
    gpu_memory_gb: float = Field(0, ge=0)
    gpus: int = Field(0, ge=0, le=64)
    nvlink_island: int | None = Field(None, ge=1, le=64)
    cpus: int = Field(1, ge=1, le=MAX_CPUS)
    memory_gb: float = Field(1, gt=0)
    rails: int | None = Field(None, ge=1, le=64)
    pod: str = Field("pod0", pattern=NAME)
    rack: str = Field("rack0", pattern=NAME)
    tier: Literal["reserved", "on-demand", "spot"] = "reserved"
    price_per_gpu_hour: float = Field(0, ge=0)
    price_per_vcpu_hour: float = Field(0, ge=0)
    node_class: Literal["gpu", "cpu", "storage"] | None = None
    storage_gb: float = Field(0, ge=0)
    storage_gbps: float = Field(0, ge=0)
    mig: bool = False
    mig_layout: list[str] = Field([], max_length=7)
    address: str = "127.0.0.1"
    source: Literal["nvml", "declared"] = "declared"
    replicas_outlive_lease: bool = False


class ReplicaStatus(_Wire):
    """A replica the agent has: running (``pid``) or exited since its last report."""

    replica: str
    job: str
    epoch: Int32
    state: Literal["running", "stopping", "exited"]
    pid: Int32 | None = None


class Registration(_Wire):
    """``POST /v1/agents/register``: the node's inventory and whatever it still runs (after
    an agent or server restart, so the two can reconcile)."""

    inventory: Inventory
    running: list[ReplicaStatus] = []
    agent_version: str = ""


class Lease(_Wire):
    """The server's answer to a registration or heartbeat. The agent must heartbeat every
    ``heartbeat_s``; if no heartbeat is answered for ``lease_s`` it must stop every replica
    (fencing), unless its replicas outlive the lease (``Inventory.replicas_outlive_lease``).
    ``stop`` lists replicas the server does not know or has moved past."""

    node: str
    session: str
    lease_s: float
    heartbeat_s: float
    stop: list[str] = []
    desired_version: int = 0


class GpuActivity(_Wire):
    """One GPU's activity as NVML sampled it: compute utilization (percent of the last sample
    period a kernel ran) and device memory in use."""

    index: int = Field(ge=0, le=INT32)
    util_pct: float = Field(ge=0, le=100)
    memory_used_mib: float = Field(ge=0)


class Heartbeat(_Wire):
    """``POST /v1/agents/{node}/heartbeat``: renew the lease, say what runs, and how the node
    feels (``health``: free-form facts such as a failed preflight check; ``gpus``: each GPU's
    activity, where NVML is present). ``leaving``: the agent is shutting down; the node keeps
    its lease while its replicas stop, but is to get no new work (it stays ``suspect``)."""

    session: str
    running: list[ReplicaStatus] = []
    health: dict[str, str] = {}
    gpus: list[GpuActivity] = []
    leaving: bool = False


class GpuShare(_Wire):
    """Part of one GPU a replica holds: a MIG instance (``profile`` at memory slice
    ``start``) or a ``fraction`` of its time with at most ``memory_gb`` of its memory."""

    gpu: int = Field(ge=0)
    profile: str = ""
    start: int = -1
    fraction: float = Field(0.0, ge=0, le=1)
    memory_gb: float = Field(0.0, ge=0)
    weight: float = Field(0.0, ge=0, le=1)


class ReplicaSpec(_Wire):
    """One replica the node should run (``action: run``) or stop (``stop``: checkpoint signal,
    then kill after ``grace_s``). ``gpus`` are the node's GPU indices; the agent maps them to
    ``CUDA_VISIBLE_DEVICES``. ``env`` holds the rank variables a distributed job expects.
    ``image``: run it as a container of that image (``agent/containers.py``), limited to
    ``cpus`` and ``memory_gb`` where they are above 0. ``outputs``: the paths collected after
    it as the job's artifacts (``agent/artifacts.py``). ``share``: the replica holds part of
    GPU ``share.gpu`` only (a MIG instance or a fraction; ``gpus`` is then empty). ``team``:
    the job's team; a node runs a bare-process replica as that team's Unix user
    (``agent/identity.py``)."""

    replica: str
    job: str
    team: str = ""
    epoch: int
    action: Literal["run", "stop"]
    command: list[str] = []
    cwd: str | None = None
    env: dict[str, str] = {}
    gpus: list[int] = []
    grace_s: float = 30.0
    checkpoint_dir: str | None = None
    image: str | None = None
    cpus: float = Field(0, ge=0)
    memory_gb: float = Field(0, ge=0)
    outputs: list[str] = []
    share: GpuShare | None = None


class DesiredState(_Wire):
    """``GET /v1/agents/{node}/desired?since=V&wait=S``: answered as soon as the node's
    version passes ``V`` (or after ``S`` seconds with the same version)."""

    node: str
    version: int
    replicas: list[ReplicaSpec] = []


class DesiredChanges(_Wire):
    """``GET /v1/agents/desired?since=SEQ&wait=S``: the desired states of every node whose
    intent may have changed after change number ``SEQ`` (all nodes when ``full``: ``SEQ`` was
    -1 or too far behind), answered as soon as there is one or after ``S`` seconds. A backend
    that speaks for many nodes (the Slurm and Kubernetes bridges) follows them all with one
    long-poll; it passes the ``seq`` it got to the next call."""

    seq: int
    full: bool = False
    nodes: list[DesiredState] = []


class Heartbeats(_Wire):
    """``POST /v1/agents/heartbeats``: many nodes' heartbeats in one call, by node name."""

    beats: dict[str, Heartbeat]


class HeartbeatsReply(_Wire):
    """Each renewed node's lease; ``lost``: the nodes whose session is not current (each must
    register again)."""

    leases: dict[str, Lease] = {}
    lost: list[str] = []


class ReplicaEvent(_Wire):
    """Something that happened to a replica. ``started``: the process is up (``pid``).
    ``exited``: it ended (``exit_code``, or ``signal`` when killed); ``checkpoint_s`` is how
    long it took to exit after the checkpoint signal. ``failed``: it could not be started.
    ``by_node``: the agent stopped it on its own (its lease ran out, or the agent is shutting
    down), not because the server asked: the job did not finish, and is to run again.
    ``preflight`` (with ``failed``): the node's checks before the start failed, so it was never
    started; ``detail`` is the evidence: the node is unfit, not the job. ``cleanup`` (with
    ``exited``): what the node cleaned up after it (leftover processes, shared memory files,
    a failed epilog), empty when there was nothing to clean."""

    replica: str
    job: str
    epoch: Int32
    kind: Literal["started", "exited", "failed"]
    at: float
    pid: Int32 | None = None
    exit_code: Int32 | None = None
    signal: Int32 | None = None
    checkpoint_s: float | None = None
    detail: str = ""
    by_node: bool = False
    preflight: bool = False
    cleanup: str = ""


class LogChunk(_Wire):
    """A piece of a replica's output (stdout and stderr together), numbered per replica."""

    replica: str
    job: str
    epoch: Int32
    seq: int = Field(ge=0, le=INT32)
    data: str


class Progress(_Wire):
    """A training step reported through the SDK: step number, seconds the step took on this
    rank, whether a checkpoint was written at this step, and any metrics."""

    replica: str
    job: str
    epoch: Int32
    rank: int = Field(ge=0, le=INT32)
    step: int = Field(ge=0, le=INT32)
    at: float
    step_time_s: float | None = Field(None, ge=0)
    checkpoint: bool = False
    metrics: dict[str, float] = {}


class AgentReport(_Wire):
    """``POST /v1/agents/{node}/report``: events, log chunks and progress, batched."""

    session: str
    events: list[ReplicaEvent] = []
    logs: list[LogChunk] = []
    progress: list[Progress] = []


class ReportReply(_Wire):
    """Which of the report's items were refused because their epoch is stale."""

    refused: list[str] = []


class Reports(_Wire):
    """``POST /v1/agents/reports``: many nodes' reports in one call, by node name."""

    reports: dict[str, AgentReport]


class ReportsReply(_Wire):
    """Per node, the items refused because their epoch is stale; ``lost``: the nodes whose
    session is not current (nothing of theirs was applied: each must register again and
    send its report anew)."""

    refused: dict[str, list[str]] = {}
    lost: list[str] = []

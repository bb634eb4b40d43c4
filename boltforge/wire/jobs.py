"""The job API: submitting, listing, inspecting, explaining and cancelling jobs."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

JobState = Literal[
    "pending",
    "scheduled",
    "running",
    "preempting",
    "requeued",
    "succeeded",
    "failed",
    "cancelled",
]
TERMINAL: frozenset[str] = frozenset({"succeeded", "failed", "cancelled"})


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class _Reply(BaseModel):
    model_config = ConfigDict(extra="ignore")


class SubmitRequest(_Request):
    """``POST /v1/jobs``: a job spec (as JSON in ``spec`` or YAML text in ``yaml``) and the
    command line's overrides. ``workdir`` applies only when the spec names none and runs no
    container (``bolt submit`` sends the directory it runs in). ``array`` makes it an array
    job (``0-99``, ``0-99:2``, ``1,3,5``): one queued object whose tasks see their index in
    ``BOLT_ARRAY_INDEX``. A retry with the same ``idempotency_key`` (or ``Idempotency-Key``
    header) returns the job already made."""

    spec: dict[str, Any] | None = None
    yaml: str | None = Field(None, max_length=1_000_000)
    source: str = Field("job", max_length=200)
    gpus: str | None = Field(None, max_length=40)
    priority: str | None = Field(None, max_length=20)
    team: str | None = Field(None, max_length=63)
    array: str | None = Field(None, max_length=200)
    workdir: str | None = Field(None, max_length=4096)
    idempotency_key: str | None = Field(None, max_length=200)


class Problem(_Reply):
    """One thing wrong with a request: the field, what was given, and the fix."""

    field: str
    value: Any = None
    message: str


class ErrorReply(_Reply):
    """Every 4xx reply: a one-line ``error`` and, for bad input, each ``problem`` with its fix."""

    error: str
    problems: list[Problem] = []


class ReplicaOut(_Reply):
    """Where one replica runs (or ran): node, GPUs, and its process state."""

    replica: str
    role: str
    rank: int
    node: str
    gpus: list[int]
    state: str
    pid: int | None = None
    exit_code: int | None = None


class EventOut(_Reply):
    """One entry of a job's timeline."""

    seq: int
    at: float
    kind: str
    message: str
    data: dict[str, Any] = {}


class JobSummary(_Reply):
    """A row of ``bolt queue``. ``position`` is the place in line (pending jobs only),
    ``reason`` why it waits (quota, topology, capacity, reservation-ahead, ...) and
    ``estimated_start`` when it should start (seconds since the epoch), where known.
    ``gpu_part``: each replica's part of one GPU when it asks for part of one instead of
    whole ones (``gpus`` is then 0): the fraction (``0.25``) or the MIG profile
    (``1g.10gb``); see ``wire.gpuamount``."""

    id: str
    name: str
    team: str
    project: str | None = None
    user: str = ""
    priority: int
    priority_name: str
    state: JobState
    gpus: int
    gpu_part: str = ""
    replicas: int
    submitted_at: float
    started_at: float | None = None
    finished_at: float | None = None
    position: int | None = None
    reason: str = ""
    estimated_start: float | None = None
    nodes: str = ""
    array: str | None = None
    array_task: int | None = None
    preemptions: int = 0
    restarts: int = 0
    exit_code: int | None = None
    last_step: int | None = None


Verdict = Literal["reachable", "not reachable", "unknown"]


class DeadlineOutlook(_Reply):
    """Whether a live job looks like finishing by its ``deadline``, judged at ``at`` from the
    fleet the server holds then, if nothing else arrives. ``expected_start``: a waiting job's
    earliest start by the when-and-where search (never before ``estimated_start``), a
    running job's bind time; ``expected_finish``: that start plus its ``time_limit``. All
    times are seconds since the epoch. ``verdict`` is None when the job has no deadline;
    ``slack_s`` is the deadline minus the finish (positive: to spare, negative: late);
    ``note`` says what is unknown, and why, when the start or finish is."""

    at: float
    verdict: Verdict | None = None
    deadline: float | None = None
    expected_start: float | None = None
    expected_finish: float | None = None
    slack_s: float | None = None
    note: str = ""


class JobDetail(JobSummary):
    """``GET /v1/jobs/{id}``: the summary plus the spec, where each replica runs, why (the
    placement explanation), why not (the waiting diagnosis), the timeline and the meter.
    ``outlook``: its deadline outlook while it waits or runs, when it has a deadline or a
    time limit (None otherwise)."""

    spec: dict[str, Any] = {}
    epoch: int = 0
    placement: list[ReplicaOut] = []
    explanation: list[str] = []
    waiting: list[str] = []
    events: list[EventOut] = []
    last_checkpoint_at: float | None = None
    gpu_hours: float = 0.0
    dollars: float = 0.0
    productive_gpu_hours: float = 0.0
    productive_dollars: float = 0.0
    outlook: DeadlineOutlook | None = None


class SubmitReply(_Reply):
    """The job made (or found, for a repeated idempotency key), and the tasks of an array.
    ``warnings`` are things the submitter should know, such as a team past its soft budget."""

    job: JobSummary
    tasks: list[str] = []
    created: bool = True
    warnings: list[str] = []


class TeamLoad(_Reply):
    """Another team's work in aggregate (what a member sees of teams not their own)."""

    team: str
    pending: int
    running: int
    gpus: int


class JobList(_Reply):
    jobs: list[JobSummary]
    others: list[TeamLoad] = []


class EventPage(_Reply):
    """``GET /v1/jobs/{id}/events?after=N&wait=S``: the events after ``N``, long-polled."""

    job: str
    state: JobState
    events: list[EventOut]


class LogPage(_Reply):
    """``GET /v1/jobs/{id}/logs?after=N&wait=S``: log lines after sequence ``N``."""

    job: str
    state: JobState
    next: int
    lines: list[str]


class Artifact(_Reply):
    """A file a job declared as an output, kept by the server: ``name`` is
    ``<rank>/<path>``; ``sha256`` was checked on arrival; ``at`` when it arrived."""

    name: str
    size: int
    sha256: str
    replica: str
    epoch: int
    at: float


class ArtifactList(_Reply):
    """``GET /v1/jobs/{id}/artifacts``: the job's artifacts, by name."""

    job: str
    artifacts: list[Artifact]


class NodeOut(_Reply):
    """A row of ``bolt nodes``. ``reclaim_at``: when a spot reclaim notice says the node goes
    (None: no notice pending). ``degraded``: it takes single-host work only (a straggler was
    found there lately, or its agent reports it degraded)."""

    name: str
    pool: str
    gpu: str
    gpus: int
    gpus_used: int
    pod: str
    rack: str
    state: Literal["ready", "suspect", "dead", "cordoned", "draining"]
    last_heartbeat: float | None = None
    jobs: list[str] = []
    source: str = "declared"
    address: str = ""
    reclaim_at: float | None = None
    degraded: bool = False


class NodeList(_Reply):
    nodes: list[NodeOut]


class Spread(_Reply):
    """The median and 99th percentile of the last (up to 1,000) samples, in milliseconds."""

    p50: float | None = None
    p99: float | None = None
    count: int = 0


class LoopOut(_Reply):
    """What the scheduling loop has been doing: its full passes (over every waiting job)
    and all its passes (incremental ones for arrivals included)."""

    full_pass_ms: Spread = Spread()
    pass_ms: Spread = Spread()
    world_read_ms: Spread = Spread()  # reading an incremental pass's world whole from memory
    world_refresh_ms: Spread = Spread()  # bringing it up to date by the mirror's changes
    full_passes: int = 0
    binds: int = 0
    evictions: int = 0


class FleetOut(_Reply):
    """``GET /v1/fleet``: what ``bolt top`` shows: capacity, use and the queue at a glance."""

    nodes: int
    nodes_ready: int
    gpus: int
    gpus_used: int
    jobs_running: int
    jobs_pending: int
    fragmentation: float
    by_team: dict[str, int] = {}
    by_state: dict[str, int] = {}
    last_cycle_ms: float | None = None
    cycles: int = 0
    loop: LoopOut = LoopOut()


NODE_PATTERN = r"^[A-Za-z0-9_.*?\[\]!-]{1,63}$"  # a node name, or an fnmatch glob of names
MAX_TOKEN_S = 10 * 365 * 86400.0  # the longest a token may be made to last


class TokenRequest(_Request):
    """``POST /v1/tokens`` (admins): a token for a person or an agent. ``nodes``: an agent
    token's node names or glob patterns (``*``: every node, for a bridge); without them it
    claims the nodes it is the first to act for. ``expires_in_s``: it stops working that many
    seconds from now (None: when revoked)."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,62}$")
    role: Literal["admin", "member", "viewer", "agent"]
    team: str | None = Field(None, pattern=r"^[a-z0-9][a-z0-9_.-]{0,62}$")
    nodes: list[str] | None = Field(None, min_length=1, max_length=1000)
    expires_in_s: float | None = Field(None, gt=0, le=MAX_TOKEN_S)

    @field_validator("nodes")
    @classmethod
    def _node_patterns(cls, nodes: list[str] | None) -> list[str] | None:
        for n in nodes or ():
            if not re.match(NODE_PATTERN, n):
                raise ValueError(
                    f"{n!r} is not a node name or pattern (letters, digits, _.- and the glob "
                    "characters *?[]!, at most 63)"
                )
        return nodes


class TokenReply(_Reply):
    """The token made (its secret shown this once), and how it is bound."""

    name: str
    role: str
    team: str | None = None
    token: str
    id: int | None = None
    nodes: list[str] | None = None
    expires_at: float | None = None


class TokenOut(_Reply):
    """``GET /v1/tokens`` (admins): one token, never its secret. ``nodes``: the names or
    patterns an agent token is bound to (None: it claims nodes on first use); ``claimed``:
    the nodes it claimed. ``state``: ``active``, ``expired`` or ``revoked``."""

    id: int
    name: str
    role: str
    team: str | None = None
    nodes: list[str] | None = None
    claimed: list[str] = []
    created_at: float
    expires_at: float | None = None
    last_used_at: float | None = None
    revoked_at: float | None = None
    state: str = "active"


class TokenList(_Reply):
    """``GET /v1/tokens``: every token, oldest first."""

    tokens: list[TokenOut] = []


class WhoAmI(_Reply):
    name: str
    role: str
    team: str | None = None

"""The console's replies: the fleet map, one host, rank progress, teams, utilization and
simulation reports (``/v1/console/*``, ``/v1/jobs/{id}/ranks``)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from boltforge.wire.jobs import JobSummary, NodeOut


class _Reply(BaseModel):
    model_config = ConfigDict(extra="ignore")


class Owner(_Reply):
    """Who holds GPUs on the map. ``job`` is None for a job the caller may see only in
    aggregate (another team's, for a member): then only its team is given."""

    job: str | None = None
    team: str
    name: str | None = None
    state: str | None = None
    priority_name: str | None = None


class MapHost(_Reply):
    """A host on the map; ``gpus[i]`` is an index into the map's ``owners`` (-1: free)."""

    name: str
    pool: str
    gpu: str
    state: str
    degraded: bool = False
    reclaim_at: float | None = None
    gpus: list[int]


class MapRack(_Reply):
    name: str
    hosts: list[MapHost]


class MapPod(_Reply):
    name: str
    racks: list[MapRack]


class FleetMap(_Reply):
    """``GET /v1/console/map``: every host by pod and rack, with who holds each GPU, and the
    fleet's totals: GPUs and GPUs held, fragmentation index, nodes (ready: taking work) and
    live jobs holding GPUs (``jobs_running``) or waiting."""

    gpus: int
    gpus_used: int
    fragmentation: float
    nodes: int = 0
    nodes_ready: int = 0
    jobs_running: int = 0
    jobs_pending: int = 0
    owners: list[Owner]
    pods: list[MapPod]


class GpuSlot(_Reply):
    """One GPU of a host: who holds it and, where the agent samples NVML, what it does."""

    index: int
    job: str | None = None
    team: str | None = None
    rank: int | None = None
    utilization: float | None = None
    memory_used_gb: float | None = None


class HostDetail(NodeOut):
    """``GET /v1/console/hosts/{name}``: a host's GPUs, jobs, health and cordon state."""

    cordoned: bool = False
    health: list[str] = Field(default_factory=list)
    slots: list[GpuSlot] = Field(default_factory=list)
    job_list: list[JobSummary] = Field(default_factory=list)


class RankOut(_Reply):
    rank: int
    node: str
    step: int
    at: float
    step_times: list[float]
    median_s: float | None = None
    straggler: bool = False


class RankPage(_Reply):
    """``GET /v1/jobs/{id}/ranks``: each rank's progress in the current allocation;
    ``peer_median_s`` is the median of the ranks' median step times."""

    job: str
    epoch: int
    peer_median_s: float | None = None
    ranks: list[RankOut] = []


class TeamStanding(_Reply):
    """A team's quota against its use, its fair-share standing and its spend this month.

    ``guaranteed``/``burst``: GPUs summed over pools (None: no quota configured); ``lent``:
    its unused guarantee is lent to others now; ``borrowing``: GPUs it holds past its
    guarantee. ``share``: its fair-share weight over all teams'; ``usage_gpu_h``: its decayed
    usage; ``factor``: ``2 ** (-usage/share)`` over the fleet's usage (0.5 at its share);
    ``standing``: 1 for the most deserving team. ``budget``/``soft``: this month's limits."""

    team: str
    guaranteed: int | None = None
    burst: int | None = None
    lent: bool = False
    using: int = 0
    borrowing: int = 0
    pending: int = 0
    running: int = 0
    share: float | None = None
    usage_gpu_h: float = 0.0
    factor: float | None = None
    standing: int = 0
    spend: float = 0.0
    budget: float | None = None
    soft: float | None = None
    budget_state: str | None = None


class TeamsOut(_Reply):
    teams: list[TeamStanding]


class UtilSample(_Reply):
    """GPUs at one moment: on live nodes, held by replicas (allocated), held by replicas whose
    processes run (compute), and of those the jobs that reported progress lately
    (productive); with the fragmentation index (0 to 1)."""

    at: float
    gpus: int
    allocated: int
    compute: int
    productive: int
    fragmentation: float


class UtilSeries(_Reply):
    """``GET /v1/console/utilization``: samples every ``step_s`` seconds since the server
    started, at most the requested window."""

    step_s: float
    samples: list[UtilSample]


class ReportEntry(_Reply):
    name: str
    title: str
    policies: list[str]
    created_at: float


class ReportList(_Reply):
    reports: list[ReportEntry]


class ReportOut(_Reply):
    """One simulation report: its comparison table (display strings) and plot files."""

    name: str
    title: str
    command: str
    columns: list[tuple[str, str]]
    rows: list[dict[str, str]]
    files: list[str]

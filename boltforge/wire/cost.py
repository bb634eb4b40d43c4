"""The cost API: ``GET /v1/cost`` meters grouped by team, project or job, and team budgets."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

CostBy = Literal["team", "project", "job"]
BudgetState = Literal["ok", "warn", "over"]


class _Reply(BaseModel):
    model_config = ConfigDict(extra="ignore")


class CostRow(_Reply):
    """One group's meter over the window: allocated and productive GPU-hours, vCPU-hours and
    dollars.
    ``key`` is the group (a team, ``team/project``, or a job id); ``project`` and ``job``
    (with its ``name``) are set when grouping by them; ``jobs`` counts the jobs in the group."""

    key: str
    team: str
    project: str | None = None
    job: str | None = None
    name: str | None = None
    jobs: int = 0
    gpu_hours: float = 0.0
    dollars: float = 0.0
    productive_gpu_hours: float = 0.0
    productive_dollars: float = 0.0
    vcpu_hours: float = 0.0
    productive_vcpu_hours: float = 0.0


class BudgetOut(_Reply):
    """A team's budget this calendar month (UTC): the limits, the spend so far (allocated
    dollars, running jobs up to now) and where it stands."""

    team: str
    month: str
    monthly: float
    soft: float
    spent: float
    state: BudgetState


class SavingsOut(_Reply):
    """What sharing the fleet saved over the window against static team pools (docs/cost.md):
    ``static_dollars`` is every team owning its peak concurrent GPUs per pool (``peaks``, by
    team then pool) for the whole window; ``shared_dollars`` what the live nodes cost, idle
    or busy; ``saved_dollars`` the difference, negative when the fleet is oversized. The
    comparison runs over ``hours`` from ``since``: the window, cut to begin with the first
    node."""

    since: float
    hours: float
    static_dollars: float
    shared_dollars: float
    saved_dollars: float
    peaks: dict[str, dict[str, int]] = {}


class CostReply(_Reply):
    """``GET /v1/cost``. ``rows`` are the groups the caller may see in detail; ``others`` are
    the other teams' totals (one row per team) for a member asking by project or job; ``total``
    sums both. The window is ``[since, until]`` in seconds since the epoch. ``savings``: the
    fleet's cost against static team pools over the window."""

    by: CostBy
    since: float
    until: float
    rows: list[CostRow] = []
    others: list[CostRow] = []
    total: CostRow
    budgets: list[BudgetOut] = []
    savings: SavingsOut | None = None

"""Cost: GPU-hours and dollars by team, project or job over a window, and team budgets."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from boltforge.control.api.deps import People, Rt
from boltforge.control.api.errors import ERRORS, ApiError
from boltforge.control.jobs.budgets import statuses
from boltforge.control.views.billing import job_meters, total, visible
from boltforge.control.views.savings import fleet_savings
from boltforge.spec import units
from boltforge.wire.cost import CostBy, CostReply
from boltforge.wire.jobs import Problem

router = APIRouter(prefix="/v1", tags=["cost"], responses=ERRORS)


@router.get("/cost")
def cost(
    who: People,
    rt: Rt,
    by: CostBy = "team",
    since: Annotated[
        str,
        Query(max_length=40, description="How far back: seconds, or a duration such as 30d."),
    ] = "30d",
) -> CostReply:
    """Allocated and productive GPU-hours and dollars over the last ``since``, one row per
    team, project or job, with every budgeted team's standing this month and what sharing the
    fleet saved against static team pools over the window. A member sees
    projects and jobs of their own team only; other teams appear as totals in ``others``."""
    window = _window(since)
    now = rt.clock()
    start = now - window
    with rt.db.session() as s:
        meters = job_meters(s, start, now)
        budgets = statuses(s, rt.config.budgets, now)
        saved = fleet_savings(s, start, now)
    rows, others = visible(meters, who, by)
    return CostReply(
        by=by,
        since=start,
        until=now,
        rows=rows,
        others=others,
        total=total(rows + others),
        budgets=budgets,
        savings=saved,
    )


def _window(since: str) -> float:
    try:
        return units.seconds(since)
    except ValueError as e:
        fix = f"{e}. To fix: e.g. since=30d or since=3600"
        problem = Problem(field="since", value=since, message=fix)
        raise ApiError(422, "invalid request: 1 problem(s)", [problem]) from None

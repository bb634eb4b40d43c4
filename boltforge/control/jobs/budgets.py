"""Team budgets: each team's spend this calendar month (UTC) against its soft and hard limits,
and what that means for a submission.

Spend is allocated dollars (``boltforge.core.billing.meter``) over ``[start of month,
now]``: running jobs count up to now, and a run that began last month counts from midnight
on the 1st. Past the soft limit a submission is accepted with a warning; at or past the hard
limit (``monthly``) non-production work (priority class 2, ``normal``, or 3, ``low``) is refused and
production work (``serving``, ``high``) is still admitted.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy.orm import Session

from boltforge.control.views.billing import runs_in
from boltforge.core.billing.meter import overlap
from boltforge.spec.teams import Budget
from boltforge.wire.cost import BudgetOut, BudgetState

PRODUCTION = (0, 1)  # serving, production training


@dataclass(frozen=True, slots=True)
class Admission:
    """A budget's word on one submission: ``refusal`` (None: admitted) and ``warning``."""

    refusal: str | None = None
    warning: str | None = None


def month_start(now: float) -> float:
    """Midnight UTC on the first day of ``now``'s month, in seconds since the epoch."""
    t = datetime.fromtimestamp(now, UTC)
    return t.replace(day=1, hour=0, minute=0, second=0, microsecond=0).timestamp()


def month_name(now: float) -> str:
    """``now``'s month as ``2026-11``."""
    return datetime.fromtimestamp(now, UTC).strftime("%Y-%m")


def spend(s: Session, now: float, team: str | None = None) -> dict[str, float]:
    """Dollars each team (or just ``team``) has been allocated this month, up to ``now``."""
    since = month_start(now)
    out: dict[str, float] = defaultdict(float)
    for run in runs_in(s, since, now, team):
        end = run.ended_at if run.ended_at is not None else now
        out[run.team] += run.dollars_per_hour * overlap(run.started_at, end, since, now) / 3600.0
    return dict(out)


def state(budget: Budget, spent: float) -> BudgetState:
    """``over`` at or past the hard limit, ``warn`` past the soft one, else ``ok``."""
    if spent >= budget.monthly:
        return "over"
    return "warn" if spent >= budget.soft_dollars else "ok"


def statuses(s: Session, budgets: Mapping[str, Budget], now: float) -> list[BudgetOut]:
    """Every budgeted team's standing this month, by team name."""
    spent = spend(s, now) if budgets else {}
    return [
        BudgetOut(
            team=team,
            month=month_name(now),
            monthly=b.monthly,
            soft=b.soft_dollars,
            spent=spent.get(team, 0.0),
            state=state(b, spent.get(team, 0.0)),
        )
        for team, b in sorted(budgets.items())
    ]


def admission(team: str, priority: int, budget: Budget, spent: float, now: float) -> Admission:
    """Whether a submission of ``priority`` for ``team`` passes its budget (see the module)."""
    month = month_name(now)
    used = f"team {team} has spent ${spent:,.2f} of its ${budget.monthly:,.2f} budget for {month}"
    standing = state(budget, spent)
    if standing == "over" and priority not in PRODUCTION:
        return Admission(
            refusal=f"{used}: the hard limit admits only production work (priority serving "
            "or high) until the month ends. To fix: ask an admin to raise "
            f"teams.{team}.budget.monthly in the server's teams file, or wait for next month"
        )
    if standing == "over":
        return Admission(warning=f"{used}: past the hard limit; admitted as production work")
    if standing == "warn":
        return Admission(
            warning=f"{used}: past the soft limit of ${budget.soft_dollars:,.2f}; non-production "
            f"work will be refused once it reaches ${budget.monthly:,.2f}"
        )
    return Admission()


def check(s: Session, team: str, priority: int, budget: Budget, now: float) -> Admission:
    """``admission`` with the team's spend read from the store."""
    return admission(team, priority, budget, spend(s, now, team).get(team, 0.0), now)

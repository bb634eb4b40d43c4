"""Each team's standing for the console: quota against use, fair share, spend against budget.

Contract: the fair-share figures come from the same formula and tree the scheduler orders
jobs by (``core.fairshare``: the teams file's queues, or one flat tree without one), so the
standing shown is the order the scheduler would serve the teams in: highest factor first,
then fewest GPUs held (the dominant share). Teams listed: every team of the teams file or with a
budget, and every team with live jobs or fair-share usage.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

from sqlalchemy import select
from sqlalchemy.orm import Session

from boltforge.control.jobs import budgets
from boltforge.control.scheduling.lifecycle import WAITING
from boltforge.control.scheduling.world import usage
from boltforge.control.store.models import JobRow
from boltforge.core.model.workload import Usage
from boltforge.core.queueing.fairshare import fair_share_factor, normalized_share
from boltforge.core.queueing.quota import QuotaTree
from boltforge.spec.teams import Budget, TeamsSpec
from boltforge.wire.console import TeamStanding

HOLDS_GPUS = ("scheduled", "running", "preempting")


def standings(
    s: Session,
    teams: TeamsSpec | None,
    budget_of: Mapping[str, Budget],
    lent: set[str],
    capacity_gpus: int,
    half_life_s: float,
    now: float,
) -> list[TeamStanding]:
    """Every team's standing at ``now``, in fair-share order (``standing`` 1 first)."""
    specs = {q.path: q for q in teams.queues()} if teams else {}
    tree = QuotaTree.build(specs.values())
    used = usage(s, now, half_life_s)
    holding, pending, running = _counts(s)
    configured = set(teams.teams) if teams else set()
    names = configured | set(budget_of) | set(holding) | set(pending) | set(running)
    names |= {q.split("/")[0] for q in used.by_queue if q}
    spent = budgets.spend(s, now)
    out = []
    for team in sorted(names):
        spec = specs.get(team)
        guaranteed = sum(spec.guaranteed.values()) if spec and spec.guaranteed else None
        burst = sum(spec.burst.values()) if spec and spec.burst else None
        budget = budget_of.get(team)
        out.append(
            TeamStanding(
                team=team,
                guaranteed=guaranteed,
                burst=burst,
                lent=team in lent,
                using=holding[team],
                borrowing=max(holding[team] - (guaranteed or 0), 0) if guaranteed else 0,
                pending=pending[team],
                running=running[team],
                share=round(normalized_share(tree, team), 4) if team in tree else None,
                usage_gpu_h=round(used.by_queue.get(team, 0.0) / 3600.0, 3),
                factor=_factor(tree, used, team, capacity_gpus, half_life_s),
                spend=round(spent.get(team, 0.0), 2),
                budget=budget.monthly if budget else None,
                soft=budget.soft_dollars if budget else None,
                budget_state=budgets.state(budget, spent.get(team, 0.0)) if budget else None,
            )
        )
    shared = fair_share_factor(tree, used, "", capacity_gpus, half_life_s)
    out.sort(key=lambda t: (-(shared if t.factor is None else t.factor), t.using, t.team))
    for i, t in enumerate(out, 1):
        t.standing = i
    return out


def _factor(
    tree: QuotaTree, used: Usage, team: str, capacity_gpus: int, half_life_s: float
) -> float | None:
    """The team's fair-share factor, None when it has no queue of its own in ``tree``."""
    if team not in tree:
        return None
    return round(fair_share_factor(tree, used, team, capacity_gpus, half_life_s), 4)


def _counts(s: Session) -> tuple[Counter[str], Counter[str], Counter[str]]:
    """Per team: GPUs held, jobs waiting, jobs holding GPUs."""
    holding: Counter[str] = Counter()
    pending: Counter[str] = Counter()
    running: Counter[str] = Counter()
    q = select(JobRow.team, JobRow.state, JobRow.gpus).where(
        JobRow.state.in_((*WAITING, *HOLDS_GPUS))
    )
    for team, state, gpus in s.execute(q):
        if state in WAITING:
            pending[team] += 1
        else:
            running[team] += 1
            holding[team] += gpus
    return holding, pending, running

"""The server's GPU quotas: the queue tree of the teams file (``bolt server --teams``), with
each guarantee that went unused lent to the shared pool until its team wants it back.

A team's use over time is read from its runs in the store; whether its guarantee is lent, and
since when, from the audit log, where every lend and restore is written by ``system`` with its
figures. So a restarted server carries on where it stopped. The rule itself is pure
(``core/queueing/lending.py``); this module feeds it and turns its answers into the pass's tree.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from boltforge.control.audit import audit
from boltforge.control.auth import Caller
from boltforge.control.store.models import AuditRow, RunRow
from boltforge.core.model.workload import Job
from boltforge.core.queueing.lending import GuaranteeChange, LendRule, decide, effective, idle_since
from boltforge.core.queueing.quota import Holdings, QueueSpec, QuotaTree, held_by
from boltforge.spec.teams import TeamsSpec

SYSTEM = Caller("system", "system", source="scheduler")
LEND, RESTORE = "quota.lend", "quota.restore"


@dataclass
class TeamQuotas:
    """The configured queues and lending rules, and which guarantees are lent (team -> since).

    ``floors``: per team, the time before which its idleness does not count (the server's start,
    or its last restore, so a restored guarantee is not lent again at once)."""

    specs: dict[str, QueueSpec]
    rules: dict[str, LendRule]
    started: float
    lent: dict[str, float] = field(default_factory=dict)
    floors: dict[str, float] = field(default_factory=dict)

    @classmethod
    def of(cls, teams: TeamsSpec, started: float) -> TeamQuotas:
        return cls({q.path: q for q in teams.queues()}, teams.lend_rules(), started)


def quota_tree(quotas: TeamQuotas | None, s: Session, world: Any, full: bool) -> QuotaTree | None:
    """The tree for a pass over ``world`` (a ``control.world.World``) at ``world.now``, None
    without quotas. Full passes first read the lent guarantees from the audit log, then lend
    or restore; incremental passes reuse that state and only restore, for the waiting jobs
    they were given. Lends and restores write their audit entries in ``s``."""
    if quotas is None or not quotas.specs:
        return None
    holdings = {q: dict(pools) for q, pools in world.holdings().items()}  # kept by the world
    if full:
        _load(quotas, s)
    _step(quotas, s, world.now, holdings, world.pending, full)
    specs = [
        QueueSpec(q.path, effective(q.guaranteed, held_by(holdings, q.path)), q.burst, q.weight)
        if q.path in quotas.lent
        else q
        for q in quotas.specs.values()
    ]
    return QuotaTree.build(specs)


def _load(quotas: TeamQuotas, s: Session) -> None:
    """Which guarantees are lent, and the last restores, from the audit log."""
    quotas.lent.clear()
    quotas.floors.clear()
    rows = s.scalars(
        select(AuditRow).where(AuditRow.action.in_((LEND, RESTORE))).order_by(AuditRow.id)
    )
    for row in rows:
        if row.action == LEND:
            quotas.lent[row.target] = row.at
        else:
            quotas.lent.pop(row.target, None)
            quotas.floors[row.target] = row.at


def _step(
    quotas: TeamQuotas,
    s: Session,
    now: float,
    holdings: Holdings,
    pending: list[Job],
    full: bool,
) -> None:
    """Lend or restore each team's guarantee as ``core.lending.decide`` says (only restore
    guarantees that waiting work wants unless ``full``)."""
    if not quotas.rules:
        return
    oldest = now - max(r.after_s for r in quotas.rules.values())
    runs = _runs(s, oldest) if full else {}
    for team, rule in sorted(quotas.rules.items()):
        g = quotas.specs[team].guaranteed
        total, held = sum(g.values()), sum(held_by(holdings, team).values())
        wanted = any(_of(j.queue, team) and 0 < j.gpus <= total - held for j in pending)
        if not full and not (wanted and team in quotas.lent):
            continue
        floor = max(quotas.started, quotas.floors.get(team, quotas.started), now - rule.after_s)
        since = idle_since(runs.get(team, []), rule.below * total, floor, now)
        change = decide(rule, total, since, team in quotas.lent, wanted, now)
        if change is GuaranteeChange.LEND:
            lent = total - sum(effective(g, held_by(holdings, team)).values())
            _record(s, LEND, team, now, total, held, lent, since)
            quotas.lent[team] = now
        elif change is GuaranteeChange.RESTORE:
            lent = total - sum(effective(g, held_by(holdings, team)).values())
            _record(s, RESTORE, team, now, total, held, lent, quotas.lent.pop(team))
            quotas.floors[team] = now


def _runs(s: Session, after: float) -> dict[str, list[tuple[float, float | None, int]]]:
    """Each team's runs still going or ended after ``after``: (start, end, GPUs)."""
    columns = select(RunRow.queue, RunRow.started_at, RunRow.ended_at, RunRow.gpus)
    rows = s.execute(columns.where((RunRow.ended_at.is_(None)) | (RunRow.ended_at > after)))
    out: dict[str, list[tuple[float, float | None, int]]] = {}
    for queue, started, ended, gpus in rows:
        out.setdefault(queue.split("/")[0], []).append((started, ended, gpus))
    return out


def _of(queue: str, team: str) -> bool:
    return queue == team or queue.startswith(team + "/")


def _record(
    s: Session,
    action: str,
    team: str,
    now: float,
    guaranteed: int,
    used: int,
    lent: int,
    since: float | None,
) -> None:
    """An audit entry by ``system`` with the figures of a lend or a restore."""
    audit(
        s,
        SYSTEM,
        action,
        team,
        now,
        team=team,
        guaranteed=guaranteed,
        used=used,
        lent=lent,
        since=since,
    )

"""Views read straight from a store written by the test: teams' standings without a teams
file (``teams.standings``), savings for runs whose hosts are gone (``savings``), a job's
queue row (``jobs.summary``) and a node's row (``jobs.node_out``)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.orm import Session

from boltforge.control.store.db import Database
from boltforge.control.store.models import JobRow, NodeRow, RunRow
from boltforge.control.views.jobs import node_out, summary
from boltforge.control.views.savings import fleet_savings
from boltforge.control.views.teams import standings
from boltforge.spec.teams import Budget

NOW = 1_800_000_000.0  # mid-January 2027
HOUR = 3600.0
HALF_LIFE = 7 * 24 * HOUR
_ids = itertools.count(1)


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Database]:
    store = Database(f"sqlite:///{tmp_path / 'views.db'}")
    store.migrate()
    yield store
    store.close()


def job(s: Session, team: str, state: str, gpus: int = 8, **extra: Any) -> JobRow:
    n = next(_ids)
    values: dict[str, Any] = {
        "id": f"v{n}",
        "num": n,
        "name": f"job-{n}",
        "team": team,
        "queue": team,
        "priority": 2,
        "state": state,
        "spec": {},
        "gpus": gpus,
        "replicas": 1,
        "submitted_at": NOW - 10 * HOUR,
    }
    values.update(extra)
    row = JobRow(**values)
    s.add(row)
    s.flush()
    return row


def run(s: Session, row: JobRow, start: float, end: float | None, per_hour: float) -> None:
    s.add(
        RunRow(
            job_id=row.id,
            epoch=1,
            queue=row.queue,
            team=row.team,
            gpus=row.gpus,
            dollars_per_hour=per_hour,
            started_at=start,
            ended_at=end,
        )
    )


def node(s: Session, name: str, **extra: Any) -> NodeRow:
    values: dict[str, Any] = {
        "name": name,
        "inventory": {"gpu": "H100-80GB", "price_per_gpu_hour": 2.0},
        "pool": "h100",
        "pod": "p0",
        "rack": "r0",
        "gpus": 8,
        "state": "ready",
        "registered_at": NOW - 10 * HOUR,
        "last_heartbeat": NOW - 1.0,
    }
    values.update(extra)
    row = NodeRow(**values)
    s.add(row)
    return row


# -- standings without a teams file ----------------------------------------------------------


def test_without_a_teams_file_fewer_gpus_held_stands_first(db: Database) -> None:
    with db.session() as s:
        job(s, "big", "running", 8)
        job(s, "small", "running", 4)
        job(s, "small", "pending", 2)
        job(s, "small", "requeued", 2)
        job(s, "done", "succeeded", 8)  # finished: no standing from it
    with db.session() as s:
        out = standings(s, None, {"saver": Budget(monthly=100.0)}, set(), 16, HALF_LIFE, NOW)
    rows = {t.team: t for t in out}
    assert [t.team for t in out] == ["saver", "small", "big"]
    assert [t.standing for t in out] == [1, 2, 3]
    assert (rows["small"].using, rows["small"].running, rows["small"].pending) == (4, 1, 2)
    assert (rows["big"].using, rows["big"].running, rows["big"].pending) == (8, 1, 0)
    for t in out:  # no queue of its own: no share, no factor, no quota
        assert (t.share, t.factor, t.guaranteed, t.burst, t.borrowing) == (
            None,
            None,
            None,
            None,
            0,
        )


def test_a_budgeted_team_shows_its_spend_and_state(db: Database) -> None:
    with db.session() as s:
        spender = job(s, "spender", "running", 8)
        run(s, spender, NOW - 2 * HOUR, None, per_hour=40.0)
    with db.session() as s:
        budgets = {"spender": Budget(monthly=100.0, soft=0.5), "idle": Budget(monthly=10.0)}
        out = {t.team: t for t in standings(s, None, budgets, set(), 16, HALF_LIFE, NOW)}
    assert (out["spender"].spend, out["spender"].budget, out["spender"].soft) == (80.0, 100.0, 50.0)
    assert out["spender"].budget_state == "warn"
    assert (out["idle"].spend, out["idle"].budget_state) == (0.0, "ok")
    assert 15.5 < out["spender"].usage_gpu_h < 16.0  # 16 GPU-hours, decayed a little


def test_a_team_known_only_by_its_past_use_is_listed(db: Database) -> None:
    with db.session() as s:
        old = job(s, "bygone", "succeeded", 8)
        run(s, old, NOW - 5 * HOUR, NOW - 4 * HOUR, per_hour=0.0)
    with db.session() as s:
        [t] = standings(s, None, {}, set(), 16, HALF_LIFE, NOW)
    assert t.team == "bygone" and t.using == 0 and t.running == 0
    assert 7.7 < t.usage_gpu_h < 8.0  # 8 GPU-hours, decayed a little
    assert (t.budget, t.budget_state, t.standing) == (None, None, 1)


# -- savings for runs whose hosts are gone ---------------------------------------------------


def test_a_run_whose_hosts_are_unknown_counts_in_a_pool_named_by_its_price(
    db: Database,
) -> None:
    with db.session() as s:
        node(s, "gpu-1", registered_at=NOW - 4 * HOUR)
        lost = job(s, "research", "succeeded", 8)
        run(s, lost, NOW - 2 * HOUR, NOW - HOUR, per_hour=20.0)  # no replica rows kept
    with db.session() as s:
        out = fleet_savings(s, NOW - 4 * HOUR, NOW)
    assert out.peaks == {"research": {"$2.5/GPU-h": 8}}
    assert out.hours == pytest.approx(4.0)
    assert out.static_dollars == pytest.approx(8 * 2.5 * 4)  # its peak, all window long
    assert out.shared_dollars == pytest.approx(8 * 2.0 * 4)  # the one live node
    assert out.saved_dollars == pytest.approx(out.static_dollars - out.shared_dollars)


def test_with_no_node_ever_there_is_no_window_to_compare(db: Database) -> None:
    with db.session() as s:
        out = fleet_savings(s, NOW - 4 * HOUR, NOW)
    assert (out.hours, out.static_dollars, out.shared_dollars, out.peaks) == (0.0, 0.0, 0.0, {})


# -- rows as replies -------------------------------------------------------------------------


def test_a_queue_row_names_its_hosts_as_a_range_and_defaults_what_is_unset(
    db: Database,
) -> None:
    with db.session() as s:
        row = job(s, "t", "running", 32, priority=7, reason=None, preemptions=None)
        out = summary(row, ["gpu-3", "gpu-1", "gpu-2", "gpu-10"])
    assert out.nodes == "gpu-[1-3,10]"
    assert out.priority_name == "7"  # no name for a class past 3
    assert (out.reason, out.preemptions, out.restarts) == ("", 0, 0)


@pytest.mark.parametrize(
    ("inventory", "source", "address"),
    [
        ({"gpu": "H100-80GB"}, "declared", ""),
        ({"gpu": "A100", "source": "slurm", "address": "10.0.0.7"}, "slurm", "10.0.0.7"),
        ({}, "declared", ""),
    ],
)
def test_a_node_row_reads_its_inventory_with_defaults(
    db: Database, inventory: dict[str, Any], source: str, address: str
) -> None:
    with db.session() as s:
        row = node(s, "gpu-9", inventory=inventory, cordoned=True)
        out = node_out(row, 3, ["j1"], NOW)
    assert (out.gpu, out.source, out.address) == (inventory.get("gpu", ""), source, address)
    assert (out.state, out.gpus_used, out.jobs, out.degraded) == ("draining", 3, ["j1"], False)


def test_a_node_flagged_by_its_agent_or_a_recent_straggler_is_degraded(db: Database) -> None:
    with db.session() as s:
        flagged = node(s, "a", health={"degraded": "yes"})
        straggling = node(s, "b", degraded_until=NOW + 60)
        expired = node(s, "c", degraded_until=NOW - 60, health={"degraded": "no"})
        assert node_out(flagged, 0, [], NOW).degraded is True
        assert node_out(straggling, 0, [], NOW).degraded is True
        assert node_out(expired, 0, [], NOW).degraded is False

"""Team quotas on the live server: guaranteed work reclaims from borrowers, burst limits hold,
and an unused guarantee is lent to the shared pool and restored when its team wants it, every
change in the audit log."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from control_kit import ADMIN, Fleet, make_spec

from boltforge.control.nodes.agents import LeaseTerms
from boltforge.spec.teams import parse_teams

HOUR = 3600.0
DAY = 24 * HOUR


def quota_fleet(tmp: Path, teams: dict[str, Any], lending: dict[str, Any] | None = None) -> Fleet:
    """Four 8-GPU hosts with ``teams`` quotas, whose leases outlast the hours tests skip."""
    doc: dict[str, Any] = {"teams": teams}
    if lending is not None:
        doc["lending"] = lending
    return Fleet(tmp, teams=parse_teams(doc), terms=LeaseTerms(2.0, DAY, DAY))


def tick(fleet: Fleet, seconds: float) -> None:
    """Time passes; every node heartbeats (so none is lost) and the loop runs a full pass."""
    fleet.clock.advance(seconds)
    for node in fleet.nodes.values():
        node.heartbeat()
    fleet.settle()


def lending_log(fleet: Fleet) -> list[dict[str, Any]]:
    log = fleet.http.get("/v1/audit", headers=ADMIN).json()
    return [e for e in reversed(log) if e["action"].startswith("quota.")]


TWO_TEAMS = {
    "nlp": {"quota": {"guaranteed": 16, "burst": 32}},
    "cv": {"quota": {"guaranteed": 16, "burst": 32}},
}


def test_guaranteed_work_reclaims_from_a_borrower_its_borrowed_job_first(tmp_path: Path) -> None:
    with quota_fleet(tmp_path, TWO_TEAMS) as fleet:
        own = [fleet.submit(make_spec(f"own{i}", 8, team="cv")) for i in range(2)]
        fleet.start_everything()
        borrowed = [fleet.submit(make_spec(f"lent{i}", 8, team="cv")) for i in range(2)]
        fleet.start_everything()
        assert [fleet.job(j).state for j in own + borrowed] == ["running"] * 4
        tick(fleet, 60.0)
        mine = fleet.submit(make_spec("mine", 8, team="nlp"))
        states = [fleet.job(j).state for j in own + borrowed]
        assert states[:2] == ["running", "running"]
        assert sorted(states[2:]) == ["preempting", "running"]
        fleet.stop_everything()
        fleet.start_everything()
        assert fleet.job(mine).state == "running"


def test_a_burst_limit_holds_on_the_server(tmp_path: Path) -> None:
    teams = {"cv": {"quota": {"guaranteed": 8, "burst": 16}}}
    with quota_fleet(tmp_path, teams) as fleet:
        jobs = [fleet.submit(make_spec(f"j{i}", 8, team="cv")) for i in range(3)]
        fleet.settle()
        assert [fleet.job(j).state for j in jobs] == ["scheduled", "scheduled", "pending"]
        assert "burst limit of 16" in " ".join(fleet.job(jobs[2]).waiting)


def test_a_burst_limit_holds_for_arrivals_scheduled_together(tmp_path: Path) -> None:
    teams = {"cv": {"quota": {"guaranteed": 8, "burst": 16}}}
    with quota_fleet(tmp_path, teams) as fleet:
        for i in range(3):
            assert fleet.post("/v1/jobs", {"spec": make_spec(f"j{i}", 8, team="cv")}).is_success
        fleet.settle()
        states = sorted(fleet.job(j).state for j in ("1", "2", "3"))
        assert states == ["pending", "scheduled", "scheduled"]


def test_an_unused_guarantee_is_lent_then_restored_when_its_team_wants_it(tmp_path: Path) -> None:
    teams = {
        "nlp": {"quota": {"guaranteed": 16, "burst": 32}},
        "cv": {"quota": {"burst": 32}},
    }
    with quota_fleet(tmp_path, teams, {"below": 0.5, "after": "2h"}) as fleet:
        start = fleet.clock.now
        tick(fleet, 2 * HOUR - 20)
        assert lending_log(fleet) == []
        tick(fleet, 20)
        [lend] = lending_log(fleet)
        assert (lend["who"], lend["target"]) == ("system", "nlp")
        assert lend["detail"] == {
            "team": "nlp",
            "guaranteed": 16,
            "used": 0,
            "lent": 16,
            "since": start,
        }

        cv = [fleet.submit(make_spec(f"cv{i}", 8, team="cv")) for i in range(4)]
        fleet.start_everything()
        tick(fleet, 60.0)
        assert [fleet.job(j).state for j in cv] == ["running"] * 4
        assert len(lending_log(fleet)) == 1

        tick(fleet, 60.0)
        mine = fleet.submit(make_spec("mine", 8, team="nlp"))
        restore = lending_log(fleet)[-1]
        assert restore["action"] == "quota.restore"
        assert restore["detail"] == {
            "team": "nlp",
            "guaranteed": 16,
            "used": 0,
            "lent": 16,
            "since": start + 2 * HOUR,
        }
        assert sum(fleet.job(j).state == "preempting" for j in cv) == 1
        fleet.stop_everything()
        fleet.start_everything()
        assert fleet.job(mine).state == "running"


def test_a_lent_guarantee_survives_a_restart_of_the_scheduler_state(tmp_path: Path) -> None:
    teams = {"nlp": {"quota": {"guaranteed": 16}}}
    with quota_fleet(tmp_path, teams, {"after": "1h"}) as fleet:
        tick(fleet, HOUR)
        quotas = fleet.rt.scheduler.quotas
        assert quotas is not None and set(quotas.lent) == {"nlp"}
        quotas.lent.clear()
        tick(fleet, 60.0)
        assert set(quotas.lent) == {"nlp"}
        assert [e["action"] for e in lending_log(fleet)] == ["quota.lend"]


def test_a_team_using_half_its_guarantee_keeps_it(tmp_path: Path) -> None:
    with quota_fleet(tmp_path, TWO_TEAMS, {"after": "1h"}) as fleet:
        fleet.submit(make_spec("half", 8, team="nlp"))
        fleet.start_everything()
        tick(fleet, 3 * HOUR)
        assert [e["target"] for e in lending_log(fleet)] == ["cv"]

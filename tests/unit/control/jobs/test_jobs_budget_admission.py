"""Team budgets (``jobs/budgets.py``): the calendar month in UTC, a team's spend this month
from the store's runs (running ones up to now, last month's from midnight on the 1st), and
what the soft and hard limits mean for a submission of each priority."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy.orm import Session
from store_builders import a_job, a_run, migrated

from boltforge.control.jobs.budgets import (
    admission,
    check,
    month_name,
    month_start,
    spend,
    state,
    statuses,
)
from boltforge.control.store.db import Database
from boltforge.spec.teams import Budget

H = 3600.0


def at(year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0) -> float:
    return datetime(year, month, day, hour, minute, second, tzinfo=UTC).timestamp()


NOW = at(2027, 3, 10, 12)
MARCH = at(2027, 3, 1)


# -- the month -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("now", "start", "name"),
    [
        (at(2027, 3, 10, 12), at(2027, 3, 1), "2027-03"),
        (at(2027, 3, 1), at(2027, 3, 1), "2027-03"),  # midnight on the 1st starts it
        (at(2027, 3, 1) - 1, at(2027, 2, 1), "2027-02"),  # a second before is last month
        (at(2027, 12, 31, 23, 59, 59), at(2027, 12, 1), "2027-12"),
        (at(2028, 2, 29, 6), at(2028, 2, 1), "2028-02"),
        (at(2028, 1, 1), at(2028, 1, 1), "2028-01"),
    ],
    ids=[
        "mid-month",
        "midnight on the 1st",
        "a second before",
        "new year's eve",
        "leap day",
        "new year",
    ],
)
def test_the_month_is_the_utc_calendar_month(now: float, start: float, name: str) -> None:
    assert month_start(now) == start
    assert month_name(now) == name


# -- a team's spend --------------------------------------------------------------------------


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Database]:
    with migrated(tmp_path / "budgets.db") as store:
        yield store


def run_of(s: Session, team: str, start: float, end: float | None, per_hour: float) -> None:
    job = a_job(s, "running" if end is None else "succeeded", team=team, queue=team)
    a_run(s, job, started_at=start, ended_at=end, dollars_per_hour=per_hour)


def test_spend_counts_this_months_part_of_every_run_up_to_now(db: Database) -> None:
    with db.session() as s:
        run_of(s, "vision", MARCH + 2 * H, MARCH + 4 * H, 36.0)  # 2 h this month: $72
        run_of(s, "vision", MARCH - 5 * H, MARCH + 1 * H, 10.0)  # 1 h of it this month: $10
        run_of(s, "vision", NOW - 3 * H, None, 20.0)  # running for 3 h: $60
        run_of(s, "vision", MARCH - 9 * H, MARCH - 1 * H, 99.0)  # all last month
        run_of(s, "nlp", MARCH, MARCH + 1 * H, 8.0)
    with db.session() as s:
        spent = spend(s, NOW)
    assert spent == {"vision": pytest.approx(142.0), "nlp": pytest.approx(8.0)}


def test_spend_of_one_team_leaves_the_others_out(db: Database) -> None:
    with db.session() as s:
        run_of(s, "vision", MARCH, MARCH + H, 10.0)
        run_of(s, "nlp", MARCH, MARCH + H, 8.0)
    with db.session() as s:
        assert spend(s, NOW, "nlp") == {"nlp": pytest.approx(8.0)}
        assert spend(s, NOW, "audio") == {}


def test_a_run_that_starts_after_now_costs_nothing_yet(db: Database) -> None:
    with db.session() as s:
        run_of(s, "vision", NOW + H, None, 50.0)
    with db.session() as s:
        assert spend(s, NOW) == {}


# -- limits ----------------------------------------------------------------------------------

BUDGET = Budget(monthly=1000.0, soft=0.8)  # warn from $800, refuse from $1,000


@pytest.mark.parametrize(
    ("spent", "standing"),
    [
        (0.0, "ok"),
        (799.99, "ok"),
        (800.0, "warn"),
        (999.99, "warn"),
        (1000.0, "over"),
        (5e6, "over"),
    ],
)
def test_a_budgets_standing_at_each_threshold(spent: float, standing: str) -> None:
    assert state(BUDGET, spent) == standing


@pytest.mark.parametrize(
    ("spent", "priority", "refused", "warned"),
    [
        (100.0, 2, None, None),
        (
            850.0,
            3,
            None,
            "past the soft limit of $800.00; non-production work will be refused once it "
            "reaches $1,000.00",
        ),
        (850.0, 0, None, "past the soft limit"),
        (1000.0, 2, "the hard limit admits only production work", None),
        (1200.0, 3, "the hard limit admits only production work", None),
        (1200.0, 1, None, "past the hard limit; admitted as production work"),
        (1200.0, 0, None, "past the hard limit; admitted as production work"),
    ],
    ids=[
        "under",
        "soft, low",
        "soft, serving",
        "hard, normal",
        "hard, low",
        "hard, high",
        "hard, serving",
    ],
)
def test_what_a_budget_says_to_a_submission(
    spent: float, priority: int, refused: str | None, warned: str | None
) -> None:
    word = admission("vision", priority, BUDGET, spent, NOW)
    if refused is None:
        assert word.refusal is None
    else:
        assert word.refusal is not None and refused in word.refusal
        assert word.refusal.startswith(
            f"team vision has spent ${spent:,.2f} of its $1,000.00 budget for 2027-03"
        )
        assert "To fix: ask an admin to raise teams.vision.budget.monthly" in word.refusal
    if warned is None:
        assert word.warning is None
    else:
        assert word.warning is not None and warned in word.warning
        assert word.warning.startswith("team vision has spent $")


def test_checking_a_submission_reads_the_teams_spend_from_the_store(db: Database) -> None:
    with db.session() as s:
        run_of(s, "vision", MARCH, MARCH + 10 * H, 100.0)  # $1,000: at the hard limit
        run_of(s, "nlp", MARCH, MARCH + 10 * H, 1.0)
    with db.session() as s:
        assert check(s, "vision", 2, BUDGET, NOW).refusal is not None
        assert check(s, "vision", 1, BUDGET, NOW).refusal is None
        assert check(s, "nlp", 2, BUDGET, NOW) == admission("nlp", 2, BUDGET, 0.0, NOW)
        assert check(s, "nlp", 2, BUDGET, NOW).warning is None


def test_statuses_list_every_budgeted_team_by_name_with_its_standing(db: Database) -> None:
    with db.session() as s:
        run_of(s, "vision", MARCH, MARCH + 9 * H, 100.0)
        run_of(s, "unbudgeted", MARCH, MARCH + 9 * H, 100.0)
    budgets = {"vision": BUDGET, "audio": Budget(monthly=50.0)}
    with db.session() as s:
        out = statuses(s, budgets, NOW)
    assert [(b.team, b.month, b.spent, b.state) for b in out] == [
        ("audio", "2027-03", 0.0, "ok"),
        ("vision", "2027-03", pytest.approx(900.0), "warn"),
    ]
    assert out[1].monthly == 1000.0 and out[1].soft == pytest.approx(800.0)
    assert out[0].soft == pytest.approx(40.0)  # the default soft share is 80%


def test_no_budgets_make_no_statuses(db: Database) -> None:
    with db.session() as s:
        assert statuses(s, {}, NOW) == []

"""Use it or lose it, the rule: when an unused guarantee is lent and restored; and the quotas
and lending rules of the teams file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from boltforge.core.queueing.lending import GuaranteeChange, LendRule, decide, effective, idle_since
from boltforge.spec.errors import SpecError
from boltforge.spec.teams import TeamsSpec, load_teams, parse_teams

HOUR = 3600.0


# The rule, pure.


@pytest.mark.parametrize(
    ("runs", "floor", "now", "since"),
    [
        ([], 0.0, 100.0, 0.0),
        ([(10.0, None, 8)], 0.0, 100.0, None),
        ([(10.0, 50.0, 8)], 0.0, 100.0, 50.0),
        ([(10.0, 50.0, 8), (40.0, 70.0, 4)], 0.0, 100.0, 50.0),
        ([(10.0, 50.0, 4), (40.0, 70.0, 4)], 0.0, 100.0, 50.0),
        ([(10.0, 50.0, 4), (60.0, 70.0, 4)], 0.0, 100.0, 0.0),
        ([(10.0, 50.0, 8)], 80.0, 100.0, 80.0),
        ([(10.0, None, 4), (20.0, None, 4)], 0.0, 100.0, None),
    ],
    ids=[
        "nothing-ever-ran-idle-since-the-floor",
        "a-run-at-the-threshold-is-still-going",
        "idle-since-the-last-busy-run-ended",
        "overlapping-runs-count-together",
        "two-runs-reach-the-threshold-only-while-they-overlap",
        "runs-that-never-reach-the-threshold-leave-it-idle-since-the-floor",
        "idleness-counts-from-the-floor-at-the-earliest",
        "two-running-halves-make-the-threshold",
    ],
)
def test_idle_since(
    runs: list[tuple[float, float | None, int]], floor: float, now: float, since: float | None
) -> None:
    assert idle_since(runs, 8.0, floor, now) == since


def test_a_lent_guarantee_drops_to_what_the_team_holds() -> None:
    assert effective({"*": 64}, {"h100": 10}) == {"*": 10}
    assert effective({"h100": 16, "*": 8}, {"h100": 20, "a100": 2}) == {"h100": 16, "*": 6}
    assert effective({"h100": 16}, {}) == {"h100": 0}


@pytest.mark.parametrize(
    ("since", "lent", "wanted", "now", "change"),
    [
        (0.0, False, False, 24 * HOUR, GuaranteeChange.LEND),
        (0.0, False, False, 24 * HOUR - 1, None),
        (0.0, False, True, 48 * HOUR, None),
        (None, False, False, 48 * HOUR, None),
        (0.0, True, True, 48 * HOUR, GuaranteeChange.RESTORE),
        (None, True, False, 48 * HOUR, GuaranteeChange.RESTORE),
        (0.0, True, False, 48 * HOUR, None),
    ],
    ids=[
        "unused-for-a-day-is-lent",
        "unused-for-less-is-kept",
        "wanted-is-never-lent",
        "used-is-never-lent",
        "wanted-again-is-restored",
        "used-again-is-restored",
        "still-unused-stays-lent",
    ],
)
def test_decide(
    since: float | None, lent: bool, wanted: bool, now: float, change: GuaranteeChange | None
) -> None:
    assert decide(LendRule(), 64, since, lent, wanted, now) is change


def test_below_zero_never_lends() -> None:
    assert decide(LendRule(below=0.0), 64, 0.0, False, False, 99 * HOUR) is None


# The teams file.


def test_quotas_and_lending_are_read_from_the_teams_file() -> None:
    spec = parse_teams(
        {
            "lending": {"below": 0.25, "after": "12h"},
            "teams": {
                "nlp": {"quota": {"guaranteed": 64, "burst": 128}},
                "cv": {"quota": {"guaranteed": {"h100": 8}}, "lending": {"after": "1h"}},
                "ops": {"quota": {"burst": 16}},
            },
        }
    )
    assert [(q.path, q.guaranteed, q.burst) for q in spec.queues()] == [
        ("cv", {"h100": 8}, {}),
        ("nlp", {"*": 64}, {"*": 128}),
        ("ops", {}, {"*": 16}),
    ]
    assert spec.lend_rules() == {
        "cv": LendRule(0.5, HOUR),
        "nlp": LendRule(0.25, 12 * HOUR),
    }


@pytest.mark.parametrize(
    ("teams", "field", "words"),
    [
        ({"nlp": {"quota": {"guaranteed": 64, "burst": 32}}}, "teams.nlp.quota", "burst limit"),
        ({"nlp": {"quota": {"guaranteed": -1}}}, "teams.nlp.quota", "negative guarantee"),
        ({"nlp": {"quota": {"guaranted": 1}}}, "teams.nlp.quota.guaranted", ""),
        ({"nlp": {"lending": {"below": 2}}}, "teams.nlp.lending.below", ""),
        ({"nlp": {"lending": {"after": "soon"}}}, "teams.nlp.lending.after", "duration"),
        ({"NLP/x": {}}, "teams.NLP/x.[key]", ""),
    ],
)
def test_a_bad_quota_names_its_field(teams: dict[str, Any], field: str, words: str) -> None:
    with pytest.raises(SpecError) as e:
        parse_teams({"teams": teams}, "teams.yaml")
    [problem] = e.value.problems
    assert problem.field == field and words in problem.message
    assert "queue team" not in problem.message


def test_no_teams_file_means_no_quotas() -> None:
    assert TeamsSpec().queues() == [] and TeamsSpec().lend_rules() == {}


def test_the_example_teams_file_is_valid() -> None:
    path = Path(__file__).resolve().parents[3] / "examples" / "teams.yaml"
    spec = load_teams(path)
    assert [(q.path, q.guaranteed, q.burst) for q in spec.queues()] == [
        ("nlp", {"*": 8}, {"*": 24}),
        ("research", {"*": 16}, {"*": 32}),
    ]
    assert sorted(spec.budgets()) == ["nlp", "research"]

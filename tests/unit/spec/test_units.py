"""Durations in specs: plain seconds or a number with ``s``, ``m``, ``h`` or ``d``; anything
else is refused with the accepted forms, and specs name the field that held it."""

from __future__ import annotations

import math
import re
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from boltforge.spec.errors import SpecError
from boltforge.spec.fleet import parse_fleet
from boltforge.spec.job import parse_job
from boltforge.spec.teams import parse_teams
from boltforge.spec.units import seconds

UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
ACCEPTED_FORMS = "must be a duration such as 90, '90s', '40m' or '2h'"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param(90, 90.0, id="a bare integer is seconds"),
        pytest.param(0, 0.0, id="zero is allowed"),
        pytest.param(2.5, 2.5, id="a bare float is seconds"),
        pytest.param("90", 90.0, id="a number in a string is seconds"),
        pytest.param("90s", 90.0, id="seconds"),
        pytest.param("40m", 2400.0, id="minutes"),
        pytest.param("2h", 7200.0, id="hours"),
        pytest.param("1d", 86400.0, id="days"),
        pytest.param("1.5h", 5400.0, id="a fractional count of hours"),
        pytest.param("0.5m", 30.0, id="a fraction below one"),
        pytest.param(" 2h ", 7200.0, id="surrounding spaces are ignored"),
        pytest.param("90 s", 90.0, id="a space between number and unit"),
        pytest.param("0s", 0.0, id="zero with a unit"),
    ],
)
def test_accepted_duration_forms_become_seconds(value: object, expected: float) -> None:
    assert seconds(value) == expected


@pytest.mark.parametrize(
    "value",
    [
        pytest.param("2H", id="units are lowercase only"),
        pytest.param("1w", id="weeks are not a unit"),
        pytest.param("-5s", id="a negative duration in a string"),
        pytest.param("1e3", id="scientific notation"),
        pytest.param(".5m", id="a fraction without a leading digit"),
        pytest.param("", id="an empty string"),
        pytest.param("soon", id="a word"),
        pytest.param("1h30m", id="two units together"),
        pytest.param(None, id="nothing"),
        pytest.param(True, id="true is not a number of seconds"),
        pytest.param(False, id="false is not zero seconds"),
    ],
)
def test_bad_durations_are_refused_with_the_accepted_forms(value: object) -> None:
    with pytest.raises(ValueError, match="^" + re.escape(ACCEPTED_FORMS) + "$"):
        seconds(value)


@pytest.mark.parametrize("value", [-1, -0.5])
def test_negative_numbers_are_refused(value: float) -> None:
    with pytest.raises(ValueError, match="must not be negative"):
        seconds(value)


@given(count=st.integers(min_value=0, max_value=10**7), unit=st.sampled_from("smhd"))
def test_a_whole_count_with_a_unit_parses_to_count_times_the_unit(count: int, unit: str) -> None:
    assert seconds(f"{count}{unit}") == count * UNIT_SECONDS[unit]


@given(
    value=st.floats(min_value=0, max_value=1e9, allow_nan=False, allow_infinity=False),
    unit=st.sampled_from("smhd"),
)
def test_a_formatted_duration_parses_back_to_the_same_seconds(value: float, unit: str) -> None:
    # A duration written with six decimals and a unit comes back as those seconds.
    text = f"{value:.6f}{unit}"
    assert math.isclose(seconds(text), float(f"{value:.6f}") * UNIT_SECONDS[unit])


@given(value=st.floats(min_value=0, max_value=1e12, allow_nan=False, allow_infinity=False))
def test_a_non_negative_number_is_already_seconds(value: float) -> None:
    assert seconds(value) == value


@given(count=st.integers(min_value=0, max_value=999), unit=st.sampled_from("wyMSHDx"))
def test_an_unknown_unit_is_refused(count: int, unit: str) -> None:
    with pytest.raises(ValueError, match="such as 90"):
        seconds(f"{count}{unit}")


def _job(**fields: object) -> dict[str, object]:
    return {"name": "train", "team": "nlp", "gpus": 8, **fields}


def _spot_fleet(reclaim: dict[str, object]) -> dict[str, object]:
    pool = {
        "name": "spot",
        "gpu": "H100-80GB",
        "gpu_memory_gb": 80,
        "tier": "spot",
        "reclaim": {"rate_per_host_day": 0.1, **reclaim},
    }
    return {"name": "f", "pools": [pool]}


BAD_DURATION_FIELDS = [
    pytest.param(
        lambda: parse_job(_job(time_limit="an hour")), "job.time_limit", id="job time limit"
    ),
    pytest.param(
        lambda: parse_job(_job(checkpoint={"grace": "2 mins"})),
        "job.checkpoint.grace",
        id="checkpoint grace",
    ),
    pytest.param(
        lambda: parse_job(_job(checkpoint={"interval": "hourly"})),
        "job.checkpoint.interval",
        id="checkpoint interval",
    ),
    pytest.param(
        lambda: parse_fleet(_spot_fleet({"notice": "2min"})),
        "fleet.pools[0].reclaim.notice",
        id="spot reclaim notice",
    ),
    pytest.param(
        lambda: parse_teams({"lending": {"after": "1 day"}}), "lending.after", id="lending delay"
    ),
    pytest.param(
        lambda: parse_teams({"teams": {"nlp": {"lending": {"after": "a week"}}}}),
        "teams.nlp.lending.after",
        id="a team's own lending delay",
    ),
]


@pytest.mark.parametrize(("parse", "field"), BAD_DURATION_FIELDS)
def test_a_bad_duration_in_a_spec_names_the_field_and_shows_how_to_write_one(
    parse: Callable[[], object], field: str
) -> None:
    with pytest.raises(SpecError) as caught:
        parse()
    (problem,) = caught.value.problems
    assert problem.field == field
    assert problem.message == ACCEPTED_FORMS
    assert "'40m'" in caught.value.render()


def test_a_negative_duration_in_a_spec_names_the_field() -> None:
    with pytest.raises(SpecError) as caught:
        parse_job(_job(time_limit=-30))
    assert [(p.field, p.message, p.value) for p in caught.value.problems] == [
        ("job.time_limit", "must not be negative", -30)
    ]


def test_durations_in_specs_are_stored_as_seconds() -> None:
    spec = parse_job(_job(time_limit="1d", checkpoint={"grace": "90s", "interval": "30m"}))
    assert (spec.time_limit, spec.checkpoint.grace, spec.checkpoint.interval) == (
        86400.0,
        90.0,
        1800.0,
    )
    teams = parse_teams({"lending": {"after": "12h"}})
    assert teams.lending.rule().after_s == 43200.0


def test_sizes_are_plain_numbers_of_gigabytes_not_unit_strings() -> None:
    # Memory sizes are numbers of GB; a unit suffix is refused with the field named.
    assert parse_job(_job(memory_gb=64)).memory_gb == 64.0
    with pytest.raises(SpecError) as caught:
        parse_job(_job(memory_gb="64GB"))
    (problem,) = caught.value.problems
    assert (problem.field, problem.message, problem.value) == (
        "job.memory_gb",
        "must be a number",
        "64GB",
    )


def test_not_a_number_is_not_a_duration() -> None:
    with pytest.raises(ValueError):
        seconds(float("nan"))

"""The health verdicts: which ranks straggle (robust statistics over their step times), which
jobs are judged for progress and when one counts as stalled, and the cordon allowance."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from boltforge.core.health import (
    HealthRules,
    RankTimes,
    Stall,
    Straggler,
    confirm,
    gpus_idle_for,
    may_cordon,
    median,
    progress_timeout,
    stalled,
    stragglers,
)

RULES = HealthRules()


def ranks(*medians: float, samples: int = 20, jitter: float = 0.02) -> list[RankTimes]:
    """One rank per median, on host-<rank>, with ``samples`` step times spread around it."""
    out = []
    for rank, m in enumerate(medians):
        times = tuple(m * (1 + jitter * ((i % 5) - 2) / 2) for i in range(samples))
        out.append(RankTimes(rank, f"host-{rank}", times))
    return out


def flagged(found: list[Straggler]) -> list[int]:
    return [f.rank for f in found]


SCENARIOS = [
    pytest.param(ranks(0.05, 0.15), [1], id="one of two ranks three times slower is flagged"),
    pytest.param(ranks(0.05, 0.05, 0.05, 0.2), [3], id="one slow rank of four is flagged"),
    pytest.param(ranks(0.05, 0.07), [], id="a rank 1.4x its peer is within the ratio"),
    pytest.param(ranks(*[0.05] * 8), [], id="equal ranks have no straggler"),
    pytest.param(ranks(0.05, 0.05, 0.2, 0.2, 0.2), [], id="a slow majority flags nobody"),
    pytest.param(ranks(0.05, 0.2, samples=9), [], id="too few samples to judge"),
    pytest.param(ranks(0.05), [], id="a single rank has no peers"),
    pytest.param(
        ranks(0.05, 0.08, 0.11, 0.14, 0.17, 0.2),
        [],
        id="ranks naturally spread wide are not flagged (MAD)",
    ),
    pytest.param(ranks(0.0, 0.0, 0.2), [], id="zero step times give no reference"),
]


@pytest.mark.parametrize(("given_ranks", "expected"), SCENARIOS)
def test_straggler_scenarios(given_ranks: list[RankTimes], expected: list[int]) -> None:
    assert flagged(stragglers(given_ranks, RULES)) == expected


def test_the_evidence_names_rank_node_medians_ratio_and_samples() -> None:
    [found] = stragglers(ranks(0.05, 0.05, 0.15), RULES)
    assert (found.rank, found.node, found.samples, found.peers) == (2, "host-2", 20, 2)
    assert found.median_s == pytest.approx(0.15)
    assert found.peer_median_s == pytest.approx(0.05)
    assert found.ratio == pytest.approx(3.0)
    assert found.evidence()["node"] == "host-2"
    assert "rank 2 on host-2" in found.describe() and "3.0x" in found.describe()


def test_one_slow_spike_does_not_make_a_straggler_but_a_slow_window_does() -> None:
    steady = RankTimes(0, "a", (0.05,) * 20)
    spiky = RankTimes(1, "b", (0.05,) * 15 + (5.0,) * 4 + (0.05,))
    assert stragglers([steady, spiky], RULES) == []
    slowed = RankTimes(1, "b", (0.05,) * 30 + (0.2,) * 20)
    assert flagged(stragglers([steady, slowed], RULES)) == [1]  # only the last window counts


# -- properties -------------------------------------------------------------------------

times = st.floats(0.01, 10.0, allow_nan=False)
jobs = st.lists(st.lists(times, min_size=0, max_size=30), min_size=0, max_size=12)


def as_ranks(job: list[list[float]]) -> list[RankTimes]:
    return [RankTimes(i, f"host-{i % 3}", tuple(t)) for i, t in enumerate(job)]


@given(jobs)
def test_at_most_half_the_judged_ranks_are_flagged_each_with_enough_evidence(
    job: list[list[float]],
) -> None:
    given_ranks = as_ranks(job)
    judged = [r for r in given_ranks if len(r.step_times) >= RULES.min_samples]
    found = stragglers(given_ranks, RULES)
    assert 2 * len(found) <= len(judged)
    for f in found:
        assert f.samples >= RULES.min_samples
        assert f.median_s >= RULES.straggler_ratio * f.peer_median_s
        assert f.median_s - f.peer_median_s > RULES.straggler_mads * f.peer_mad_s


@given(jobs, st.randoms(use_true_random=False))
def test_the_verdict_does_not_depend_on_the_order_ranks_are_given_in(
    job: list[list[float]], rng: random.Random
) -> None:
    given_ranks = as_ranks(job)
    shuffled = list(given_ranks)
    rng.shuffle(shuffled)
    assert stragglers(shuffled, RULES) == stragglers(given_ranks, RULES)


@given(st.integers(2, 16), st.floats(0.01, 1.0), st.floats(1.6, 20.0), st.data())
def test_one_rank_slowed_past_the_ratio_among_equal_peers_is_the_one_flagged(
    n: int, base: float, factor: float, data: st.DataObject
) -> None:
    slow = data.draw(st.integers(0, n - 1))
    medians = [base * factor if r == slow else base for r in range(n)]
    assert flagged(stragglers(ranks(*medians, jitter=0.0), RULES)) == [slow]


@given(st.integers(2, 16), st.floats(0.01, 1.0), st.floats(1.0, 1.45))
def test_a_rank_under_the_ratio_is_never_flagged(n: int, base: float, factor: float) -> None:
    medians = [base] * (n - 1) + [base * factor]
    assert stragglers(ranks(*medians, jitter=0.0), RULES) == []


@given(jobs, st.sampled_from([1 / 1024, 0.5, 4.0, 1024.0]))
def test_the_unit_of_time_does_not_matter(job: list[list[float]], scale: float) -> None:
    """Scaled by powers of two, so the times scale exactly."""
    given_ranks = as_ranks(job)
    scaled = [replace(r, step_times=tuple(t * scale for t in r.step_times)) for r in given_ranks]
    assert flagged(stragglers(scaled, RULES)) == flagged(stragglers(given_ranks, RULES))


@given(st.lists(times, min_size=1, max_size=50))
def test_the_median_has_as_many_values_on_each_side(values: list[float]) -> None:
    m = median(values)
    assert sum(v < m for v in values) <= len(values) // 2
    assert sum(v > m for v in values) <= len(values) // 2


# -- progress ---------------------------------------------------------------------------

TIMEOUTS = [
    pytest.param(None, True, 1800.0, id="a job that reported gets the server default"),
    pytest.param(None, False, None, id="a job that never reported is not judged"),
    pytest.param(600.0, False, 600.0, id="a job's own timeout applies before any report"),
    pytest.param(600.0, True, 600.0, id="a job's own timeout beats the server default"),
    pytest.param(0.0, True, None, id="a job's timeout of 0 turns judging off"),
]


@pytest.mark.parametrize(("own", "reported", "expected"), TIMEOUTS)
def test_which_timeout_a_job_is_judged_by(
    own: float | None, reported: bool, expected: float | None
) -> None:
    assert progress_timeout(own, reported, RULES) == expected


def test_no_server_default_judges_only_jobs_that_opted_in() -> None:
    off = replace(RULES, progress_timeout_s=None)
    assert progress_timeout(None, True, off) is None
    assert progress_timeout(60.0, False, off) == 60.0


STALLS = [
    pytest.param(1000.0, 900.0, 1061.0, 60.0, True, id="silent past the timeout since a report"),
    pytest.param(1000.0, 900.0, 1060.0, 60.0, False, id="silent exactly the timeout is not yet"),
    pytest.param(None, 900.0, 961.0, 60.0, True, id="never reported, started past the timeout"),
    pytest.param(None, None, 5000.0, 60.0, False, id="not started is not judged"),
    pytest.param(1000.0, 900.0, 9000.0, None, False, id="no timeout is never stalled"),
]


@pytest.mark.parametrize(("last", "started", "now", "timeout", "stall"), STALLS)
def test_when_a_job_counts_as_stalled(
    last: float | None, started: float | None, now: float, timeout: float | None, stall: bool
) -> None:
    verdict = stalled(last, started, now, timeout)
    assert (verdict is not None) == stall
    if verdict is not None:
        assert verdict.idle_s > verdict.timeout_s
        assert f"no progress for {verdict.idle_s:.0f} s" in verdict.describe()


@given(st.floats(0, 1e6), st.floats(0, 1e6), st.floats(1, 1e4))
def test_a_report_after_the_start_only_postpones_the_verdict(
    started: float, gap: float, timeout: float
) -> None:
    last = started + gap
    for now in (last + timeout / 2, last + timeout * 2):
        with_report = stalled(last, started, now, timeout)
        without = stalled(None, started, now, timeout)
        assert with_report is None or without is not None


CORDONS = [
    pytest.param(0, 3, True, id="a small fleet may always cordon one node"),
    pytest.param(1, 3, False, id="but not a second"),
    pytest.param(9, 100, True, id="up to a tenth of a large fleet"),
    pytest.param(10, 100, False, id="and no more"),
]


@pytest.mark.parametrize(("cordoned", "nodes", "allowed"), CORDONS)
def test_the_cordon_allowance(cordoned: int, nodes: int, allowed: bool) -> None:
    assert may_cordon(cordoned, nodes, RULES) is allowed


# GPU activity (NVML): silent but computing is busy, silent and idle with memory held is hung

STALL = Stall(idle_s=700.0, timeout_s=600.0, since=300.0, reported=True)


@pytest.mark.parametrize(
    ("idle_since", "now", "expected"),
    [
        pytest.param([100.0, 250.0], 1000.0, 750.0, id="idle since the last GPU went idle"),
        pytest.param([100.0, None], 1000.0, None, id="one GPU computes"),
        pytest.param([], 1000.0, None, id="no GPU sampled"),
    ],
)
def test_how_long_a_jobs_gpus_have_sat_idle(
    idle_since: list[float | None], now: float, expected: float | None
) -> None:
    assert gpus_idle_for(idle_since, now) == expected


@pytest.mark.parametrize(
    ("sampled", "gpu_idle_s", "zombie"),
    [
        pytest.param(False, None, True, id="no NVML: progress alone decides"),
        pytest.param(True, None, False, id="a GPU computes: busy, not hung"),
        pytest.param(True, 600.0, False, id="idle, but not past the timeout"),
        pytest.param(True, 601.0, True, id="idle with memory held past the timeout"),
    ],
)
def test_nvml_confirms_a_stall(sampled: bool, gpu_idle_s: float | None, zombie: bool) -> None:
    verdict = confirm(STALL, sampled, gpu_idle_s)
    assert (verdict is not None) == zombie
    if verdict is not None and sampled:
        assert verdict.gpu_idle_s == gpu_idle_s
        assert "computed nothing for 601 s" in verdict.describe()


def test_no_stall_is_never_confirmed() -> None:
    assert confirm(None, True, 10_000.0) is None

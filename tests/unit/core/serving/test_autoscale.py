"""The service autoscaler: up at once, down only after a calm window (no flapping), to zero
when idle and back on the first request, and ahead of the daily peak from its own history."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from boltforge.core.serving.autoscale import (
    DAY_S,
    Autoscale,
    Load,
    RateHistory,
    ScaleState,
    decide,
)

CHAT = Autoscale(
    min_replicas=1,
    max_replicas=10,
    rps_per_replica=10.0,
    target_utilization=0.5,
    latency_slo_ms=500,
    scale_down_window_s=300,
    predictive=False,
)


def run(rules: Autoscale, loads: list[Load], replicas: int = 1) -> list[int]:
    """The count after each load, starting at ``replicas``."""
    state, out = ScaleState(replicas), []
    for load in loads:
        scale = decide(rules, state, load)
        state = scale.state
        out.append(scale.replicas)
    return out


def every_minute(rates: Sequence[float], start: float = 0.0, **signals: float) -> list[Load]:
    return [Load(start + 60.0 * i, rate, **signals) for i, rate in enumerate(rates)]


def test_a_rising_rate_scales_up_at_once_and_caps_at_the_maximum() -> None:
    assert run(CHAT, every_minute([5, 20, 40, 500])) == [1, 4, 8, 10]


def test_a_falling_rate_scales_down_only_after_the_window_is_calm() -> None:
    counts = run(CHAT, every_minute([40] + [10] * 8), replicas=8)
    assert counts[:5] == [8] * 5  # within 300 s of the 40 rps sample
    assert counts[5:] == [2] * 4


def test_a_high_p99_or_a_full_kv_cache_adds_a_replica() -> None:
    assert run(CHAT, [Load(0, 10, p99_ms=900)], replicas=2) == [3]
    assert run(CHAT, [Load(0, 10, kv_cache=0.97)], replicas=2) == [3]
    assert run(CHAT, [Load(0, 10, p99_ms=520)], replicas=2) == [2]  # within tolerance


def test_a_queue_asks_for_a_replica_per_target_queue() -> None:
    rules = Autoscale(min_replicas=1, max_replicas=8, target_queue=4)
    assert run(rules, [Load(0, 0, queued=18)]) == [5]


def test_an_idle_service_goes_to_zero_and_a_request_wakes_it() -> None:
    rules = Autoscale(min_replicas=0, max_replicas=4, idle_to_zero_s=600, rps_per_replica=10)
    loads = [*every_minute([3] + [0] * 11), Load(720, 0, queued=1)]
    counts = run(rules, loads)
    assert counts[:10] == [1] * 10 and counts[10:12] == [0, 0] and counts[12] == 1
    woke = decide(rules, ScaleState(0, last_busy=0), Load(720, 0, queued=1))
    assert "cold start" in woke.reason


def test_the_forecast_warms_replicas_before_the_daily_peak() -> None:
    rules = Autoscale(max_replicas=10, rps_per_replica=10, target_utilization=0.5, cold_start_s=600)
    history = RateHistory()
    for day in range(3):  # 12:00 is busy, every other hour quiet
        history = history.observe(day * DAY_S + 12 * 3600, 40).observe(day * DAY_S + 11 * 3600, 5)
    before_peak = 3 * DAY_S + 12 * 3600 - 600  # 11:50 on day four, still quiet
    scale = decide(rules, ScaleState(1, history=history), Load(before_peak, 5))
    assert scale.replicas == 8 and "forecast" in scale.reason
    reactive = replace(rules, predictive=False)
    assert decide(reactive, ScaleState(1, history=history), Load(before_peak, 5)).replicas == 1


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0, 60), min_size=2, max_size=120), st.integers(1, 10))
def test_a_scale_up_is_never_undone_within_the_window(rates: list[float], start: int) -> None:
    """Whatever the rate does, replicas added at ``t`` stay until ``t + window``: the count
    never goes up and then down again inside one window (no flapping)."""
    counts = run(CHAT, every_minute(rates), replicas=start)
    ups = [60.0 * i for i in range(1, len(counts)) if counts[i] > counts[i - 1]]
    downs = [60.0 * i for i in range(1, len(counts)) if counts[i] < counts[i - 1]]
    assert all(not 0 < d - u < CHAT.scale_down_window_s for u in ups for d in downs)


@settings(max_examples=100, deadline=None)
@given(st.floats(0, 60), st.integers(1, 10))
def test_a_steady_rate_settles_on_one_count(rate: float, start: int) -> None:
    counts = run(CHAT, every_minute([rate] * 20), replicas=start)
    assert len(set(counts[6:])) == 1


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 200), st.floats(0, 50)), min_size=1, max_size=60))
def test_the_count_stays_within_min_and_max(samples: list[tuple[float, float]]) -> None:
    rules = Autoscale(min_replicas=2, max_replicas=7, rps_per_replica=10)
    loads = [Load(60.0 * i, r, queued=q) for i, (r, q) in enumerate(samples)]
    assert all(2 <= c <= 7 for c in run(rules, loads, replicas=2))


def test_the_history_averages_a_quarter_hour_then_weighs_the_days() -> None:
    history = RateHistory()
    for i in range(10):  # ten samples in 09:00-09:15 of day one
        history = history.observe(9 * 3600 + 60 * i, float(i))
    assert history.expect(9 * 3600) is None  # the quarter hour is not over yet
    history = history.observe(9 * 3600 + 900, 0.0)
    assert history.expect(DAY_S + 9 * 3600 + 120) == 4.5
    for i in range(10):  # day two: 20 requests/s throughout
        history = history.observe(DAY_S + 9 * 3600 + 60 * i, 20.0)
    history = history.observe(DAY_S + 9 * 3600 + 900, 0.0)
    assert history.expect(2 * DAY_S + 9 * 3600) == 4.5 + 0.3 * (20.0 - 4.5)


def test_load_just_over_the_target_keeps_the_count() -> None:
    """Two replicas meant to carry 10 requests/s: 10.5 is within the 10% tolerance, 11.5 is
    not (and needs a third replica)."""
    assert run(CHAT, [Load(0, 10.5)], replicas=2) == [2]
    assert run(CHAT, [Load(0, 11.5)], replicas=2) == [3]

"""The execution model's segments (finish time, finished, evacuated and interrupted accounting,
placement slowdowns) and the spot reclaim clock (seeded, rate-true, only on reclaiming pools)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from boltforge.core.placement.patience import widest as _widest
from boltforge.sim.execution import (
    OFF_RAIL,
    SPEED,
    Segment,
    SegmentOutcome,
    _factor,
    evacuated,
    finished,
    interrupted,
    warmup_gpu_s,
)
from boltforge.sim.spot import DAY_S, Reclaim, ReclaimClock, reclaims_of
from boltforge.spec.fleet import FleetSpec, parse_fleet

# --- segments -----------------------------------------------------------------------------

gpus_st = st.integers(min_value=1, max_value=64)
slow_st = st.floats(min_value=1.0, max_value=3.0)
warm_st = st.floats(min_value=0.0, max_value=600.0)
size_st = st.sampled_from([0.25, 0.5, 1.0, 2.0, 4.0])
start_st = st.floats(min_value=0.0, max_value=1e6)
ran_st = st.floats(min_value=0.0, max_value=1e5)
interval_st = st.one_of(st.none(), st.floats(min_value=1.0, max_value=5000.0))


@st.composite
def segments(draw: Any) -> Segment:
    return Segment(
        start=draw(start_st),
        gpus=draw(gpus_st),
        slowdown=draw(slow_st),
        warmup=draw(warm_st),
        size=draw(size_st),
    )


def total(o: SegmentOutcome) -> float:
    """GPU-seconds accounted for: useful, thrown away, and held beyond both by a slow placement."""
    return o.productive_gpu_s + o.lost_gpu_s


def test_finish_time_is_start_plus_warmup_plus_work_scaled_by_slowdown_over_size() -> None:
    assert Segment(100.0, 8, 1.0, 30.0).finish_time(1000.0) == 1130.0
    assert Segment(100.0, 8, 1.5, 30.0).finish_time(1000.0) == 1630.0
    # Half the replicas: half as fast, twice the wall time.
    assert Segment(0.0, 4, 1.0, 0.0, size=0.5).finish_time(1000.0) == 2000.0
    # Twice the replicas and a 2x slower placement cancel out.
    assert Segment(0.0, 16, 2.0, 0.0, size=2.0).finish_time(1000.0) == 1000.0


def test_finished_on_an_ideal_placement_splits_held_time_into_warmup_and_work() -> None:
    seg = Segment(start=10.0, gpus=4, slowdown=1.0, warmup=60.0)
    end = seg.finish_time(500.0)
    out = finished(seg, end, 500.0)
    assert out == SegmentOutcome(4 * 560.0, 4 * 500.0, 4 * 60.0, 500.0)
    assert out.allocated_gpu_s == total(out)


def test_finished_on_a_slow_placement_holds_more_than_it_uses_or_loses() -> None:
    seg = Segment(start=0.0, gpus=2, slowdown=1.5, warmup=0.0)
    out = finished(seg, seg.finish_time(100.0), 100.0)
    assert out.productive_gpu_s == 200.0
    assert out.lost_gpu_s == 0.0
    assert out.allocated_gpu_s == 300.0  # the extra 100 is slowed time, neither useful nor lost


def test_finished_elastic_segment_counts_useful_work_at_the_requested_size() -> None:
    # Asked for 8 GPUs, ran on 4 (size 0.5): 1000 s of work takes 2000 s on 4 GPUs.
    seg = Segment(start=0.0, gpus=4, slowdown=1.0, warmup=0.0, size=0.5)
    out = finished(seg, seg.finish_time(1000.0), 1000.0)
    assert out.productive_gpu_s == 8 * 1000.0
    assert out.allocated_gpu_s == 4 * 2000.0
    assert out.work_s == 1000.0


@settings(max_examples=150, deadline=None)
@given(segments(), st.floats(min_value=0.0, max_value=1e5))
def test_finished_at_its_finish_time_holds_exactly_what_it_used_lost_and_slowed(
    seg: Segment, remaining: float
) -> None:
    end = seg.finish_time(remaining)
    out = finished(seg, end, remaining)
    assert out.work_s == remaining
    assert out.lost_gpu_s == pytest.approx(seg.gpus * seg.warmup, rel=1e-9, abs=1e-6)
    slowed = seg.gpus * remaining / seg.size * (seg.slowdown - 1.0)
    assert out.allocated_gpu_s == pytest.approx(total(out) + slowed, rel=1e-9, abs=1e-6)
    if seg.slowdown == 1.0:
        assert out.allocated_gpu_s == pytest.approx(total(out), rel=1e-9, abs=1e-6)


@settings(max_examples=150, deadline=None)
@given(segments(), st.floats(min_value=0.0, max_value=1e5))
def test_evacuated_at_the_finish_time_agrees_with_finished(seg: Segment, remaining: float) -> None:
    end = seg.finish_time(remaining)
    a, b = evacuated(seg, end), finished(seg, end, remaining)
    assert a.allocated_gpu_s == pytest.approx(b.allocated_gpu_s)
    assert a.productive_gpu_s == pytest.approx(b.productive_gpu_s, rel=1e-9, abs=1e-6)
    assert a.lost_gpu_s == pytest.approx(b.lost_gpu_s)
    assert a.work_s == pytest.approx(remaining, rel=1e-9, abs=1e-6)


def test_evacuated_during_warmup_keeps_nothing_and_loses_all_it_held() -> None:
    seg = Segment(start=100.0, gpus=8, slowdown=1.0, warmup=120.0)
    out = evacuated(seg, 160.0)
    assert out == SegmentOutcome(8 * 60.0, 0.0, 8 * 60.0, 0.0)


def test_evacuated_keeps_every_second_after_warmup() -> None:
    seg = Segment(start=0.0, gpus=2, slowdown=2.0, warmup=100.0, size=1.0)
    out = evacuated(seg, 1100.0)
    assert out.work_s == 500.0  # 1000 s of wall time at half speed
    assert out.productive_gpu_s == 2 * 500.0
    assert out.lost_gpu_s == 2 * 100.0
    assert out.allocated_gpu_s == 2 * 1100.0


def test_a_segment_stopped_before_it_started_holds_nothing() -> None:
    seg = Segment(start=500.0, gpus=4, slowdown=1.0, warmup=30.0)
    empty = SegmentOutcome(0.0, 0.0, 0.0, 0.0)
    assert evacuated(seg, 400.0) == empty
    assert interrupted(seg, 400.0, 60.0) == empty
    assert warmup_gpu_s(seg, 400.0) == 0.0


def test_interrupted_keeps_progress_up_to_the_last_checkpoint_from_the_segment_start() -> None:
    # Checkpoints at 100, 200, 300 s after the start; warm-up ends at 50 s; stopped at 350 s.
    seg = Segment(start=1000.0, gpus=4, slowdown=1.0, warmup=50.0)
    out = interrupted(seg, 1350.0, 100.0)
    assert out.work_s == 250.0  # 300 - 50
    assert out.productive_gpu_s == 4 * 250.0
    assert out.lost_gpu_s == 4 * (50.0 + 50.0)  # warm-up plus the 50 s since the checkpoint
    assert out.allocated_gpu_s == 4 * 350.0
    assert out.allocated_gpu_s == total(out)


def test_interrupted_without_a_checkpoint_interval_loses_everything() -> None:
    seg = Segment(start=0.0, gpus=8, slowdown=1.0, warmup=20.0)
    for interval in (None, 0.0):
        out = interrupted(seg, 1000.0, interval)
        assert out.work_s == 0.0 and out.productive_gpu_s == 0.0
        assert out.lost_gpu_s == out.allocated_gpu_s == 8 * 1000.0


def test_interrupted_before_the_first_checkpoint_after_warmup_keeps_nothing() -> None:
    # The first checkpoint (at 100 s) falls inside the 150 s warm-up: nothing to save yet.
    seg = Segment(start=0.0, gpus=1, slowdown=1.0, warmup=150.0)
    out = interrupted(seg, 190.0, 100.0)
    assert out.work_s == 0.0
    assert out.lost_gpu_s == 190.0


def test_interrupted_on_a_checkpoint_tick_keeps_as_much_as_an_evacuation() -> None:
    seg = Segment(start=0.0, gpus=3, slowdown=1.25, warmup=40.0, size=0.5)
    assert interrupted(seg, 600.0, 200.0) == evacuated(seg, 600.0)


@settings(max_examples=200, deadline=None)
@given(segments(), ran_st, interval_st)
def test_interrupted_accounting_adds_up_and_never_keeps_more_than_was_done(
    seg: Segment, ran: float, interval: float | None
) -> None:
    end = seg.start + ran
    cut = interrupted(seg, end, interval)
    done = evacuated(seg, end)
    # Held time is the same however the segment stops.
    assert cut.allocated_gpu_s == pytest.approx(seg.gpus * (end - seg.start))
    assert cut.allocated_gpu_s == pytest.approx(done.allocated_gpu_s)
    # Work kept never exceeds work done, and the difference is counted as lost.
    assert 0.0 <= cut.work_s <= done.work_s + 1e-9
    assert cut.productive_gpu_s <= done.productive_gpu_s + 1e-6
    assert cut.lost_gpu_s >= done.lost_gpu_s - 1e-6
    # Warm-up is always charged as lost.
    assert cut.lost_gpu_s >= warmup_gpu_s(seg, end) - 1e-6
    assert done.lost_gpu_s == pytest.approx(warmup_gpu_s(seg, end))
    # allocated = productive + lost, plus the slowed share of the kept work.
    kept_wall = cut.work_s * seg.slowdown / seg.size
    slowed = seg.gpus * kept_wall * (1.0 - 1.0 / seg.slowdown)
    assert cut.allocated_gpu_s == pytest.approx(total(cut) + slowed, rel=1e-9, abs=1e-6)
    for o in (cut, done):
        assert min(o.allocated_gpu_s, o.productive_gpu_s, o.lost_gpu_s, o.work_s) >= 0.0


@settings(max_examples=100, deadline=None)
@given(segments(), ran_st, ran_st, st.floats(min_value=1.0, max_value=5000.0))
def test_work_kept_never_shrinks_as_the_interruption_comes_later(
    seg: Segment, a: float, b: float, interval: float
) -> None:
    early, late = sorted((a, b))
    first = interrupted(seg, seg.start + early, interval)
    second = interrupted(seg, seg.start + late, interval)
    assert first.work_s <= second.work_s + 1e-9
    assert first.allocated_gpu_s <= second.allocated_gpu_s + 1e-9


@settings(max_examples=100, deadline=None)
@given(segments(), ran_st, interval_st)
def test_ideal_full_size_segments_use_or_lose_every_gpu_second(
    seg: Segment, ran: float, interval: float | None
) -> None:
    ideal = Segment(seg.start, seg.gpus, 1.0, seg.warmup, 1.0)
    end = ideal.start + ran
    for out in (interrupted(ideal, end, interval), evacuated(ideal, end)):
        assert out.allocated_gpu_s == pytest.approx(total(out), rel=1e-9, abs=1e-6)
        assert out.productive_gpu_s == pytest.approx(ideal.gpus * out.work_s)


def test_warmup_gpu_s_caps_at_the_warmup_and_at_the_time_run() -> None:
    seg = Segment(start=10.0, gpus=4, slowdown=1.0, warmup=30.0)
    assert warmup_gpu_s(seg, 20.0) == 40.0
    assert warmup_gpu_s(seg, 40.0) == 120.0
    assert warmup_gpu_s(seg, 1e9) == 120.0


# --- slowdowns ----------------------------------------------------------------------------

LEVELS = ("host", "rack", "pod", "spine")


def test_widest_is_the_widest_level_with_a_crossing() -> None:
    assert _widest({}) == "host"
    assert _widest({"rail": 3}) == "host"
    assert _widest({"rack": 2}) == "rack"
    assert _widest({"rack": 5, "pod": 1}) == "pod"
    assert _widest({"rack": 1, "pod": 0, "spine": 1}) == "spine"


def test_speed_table_grows_with_the_level_crossed() -> None:
    assert [SPEED[level] for level in LEVELS] == sorted(SPEED[level] for level in LEVELS)
    assert SPEED["host"] == SPEED["rack"] == 1.0


def test_factor_of_a_cross_pod_ring_without_an_ideal_is_the_pod_speed() -> None:
    assert _factor({"pod": 1}, 4, None) == SPEED["pod"]
    assert _factor({"spine": 2}, 4, None) == SPEED["spine"]
    assert _factor({}, 4, None) == 1.0


def test_off_rail_replicas_add_their_share() -> None:
    # Two of four replicas off their rail: 1 + 0.1 * 2 / 4.
    assert _factor({"rail": 2}, 4, None) == pytest.approx(1.0 + OFF_RAIL * 0.5)
    # A single replica has no ring, so the rail does not matter.
    assert _factor({"rail": 1}, 1, None) == 1.0


@settings(max_examples=100, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(["rack", "pod", "spine", "rail"]), st.integers(0, 8), max_size=4
    ),
    st.integers(1, 16),
)
def test_slowdown_is_never_below_one_and_grows_with_rail_misses(
    hops: dict[str, int], replicas: int
) -> None:
    base = _factor(hops, replicas, None)
    assert base >= 1.0
    worse = _factor({**hops, "rail": hops.get("rail", 0) + 1}, replicas, None)
    assert worse >= base
    if replicas > 1:
        assert worse > base


# --- spot reclaims ------------------------------------------------------------------------


def pool(name: str, hosts: int, tier: str = "on-demand", **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "gpu": "H100-80GB",
        "gpu_memory_gb": 80,
        "tier": tier,
        "price_per_gpu_hour": 4.0 if tier != "spot" else 1.8,
        "layout": {"hosts": hosts, "hosts_per_rack": 4},
        **extra,
    }


def mixed(rate_a: float = 2.0, rate_b: float = 0.5) -> FleetSpec:
    """An on-demand pool between two spot pools of different rates."""
    return parse_fleet(
        {
            "name": "mixed",
            "pools": [
                pool("spot-a", 4, "spot", reclaim={"rate_per_host_day": rate_a}),
                pool("od", 6),
                pool("spot-b", 8, "spot", reclaim={"rate_per_host_day": rate_b}),
            ],
        }
    )


def clock(spec: FleetSpec, seed: int) -> ReclaimClock:
    return ReclaimClock(spec.to_tree(), reclaims_of(spec), seed)


def draws(c: ReclaimClock, pool_name: str, n: int) -> list[float]:
    t, out = 0.0, []
    for _ in range(n):
        t = c.next_after(pool_name, t)
        out.append(t)
    return out


def test_on_demand_pools_have_no_reclaim_process() -> None:
    c = clock(mixed(), 0)
    assert set(c.processes) == {"spot-a", "spot-b"}
    with pytest.raises(KeyError):
        c.next_after("od", 0.0)


def test_a_pool_with_rate_zero_is_left_out() -> None:
    spec = mixed(rate_a=0.0)
    assert set(reclaims_of(spec)) == {"spot-b"}
    tree = spec.to_tree()
    forced = ReclaimClock(tree, {"spot-a": Reclaim(0.0), "spot-b": Reclaim(1.0)}, 0)
    assert set(forced.processes) == {"spot-b"}


def test_a_reclaim_for_a_pool_the_tree_lacks_is_ignored() -> None:
    spec = mixed()
    c = ReclaimClock(spec.to_tree(), {**reclaims_of(spec), "ghost": Reclaim(5.0)}, 0)
    assert "ghost" not in c.processes


def test_picks_are_hosts_of_the_reclaiming_pool_only() -> None:
    spec = mixed()
    tree = spec.to_tree()
    c = clock(spec, 3)
    index = {p.name: i for i, p in enumerate(tree.pools)}
    for name in ("spot-a", "spot-b"):
        picked = {c.pick(name) for _ in range(400)}
        assert all(int(tree.host_pool[h]) == index[name] for h in picked)
        assert all(tree.host_gpus[h] > 0 for h in picked)
        assert len(picked) == int(c.hosts[name].size)  # every host gets picked eventually


def test_the_same_seed_gives_the_same_reclaims_and_another_seed_different_ones() -> None:
    spec = mixed()
    a, b, other = clock(spec, 11), clock(spec, 11), clock(spec, 12)
    first = draws(a, "spot-a", 50)
    assert first == draws(b, "spot-a", 50)
    assert first != draws(other, "spot-a", 50)
    assert [a.pick("spot-b") for _ in range(30)] == [b.pick("spot-b") for _ in range(30)]


def test_each_pool_draws_from_its_own_stream() -> None:
    spec = mixed()
    busy, quiet = clock(spec, 5), clock(spec, 5)
    draws(busy, "spot-a", 200)  # lots of activity on the other pool
    for _ in range(50):
        busy.pick("spot-a")
    assert draws(busy, "spot-b", 20) == draws(quiet, "spot-b", 20)


def test_next_after_is_always_later_than_now() -> None:
    c = clock(mixed(), 1)
    for now in (0.0, 1.0, 1e6, 3.5e7):
        assert c.next_after("spot-a", now) > now


@pytest.mark.parametrize(("pool_name", "rate", "hosts"), [("spot-a", 2.0, 4), ("spot-b", 0.5, 8)])
def test_reclaim_counts_over_many_seeds_match_the_pool_rate(
    pool_name: str, rate: float, hosts: int
) -> None:
    # Reclaims in a 10-day window per seed: Poisson with mean rate * hosts * 10.
    spec, window = mixed(), 10 * DAY_S
    counts = []
    for seed in range(200):
        c, t, n = clock(spec, seed), 0.0, 0
        while (t := c.next_after(pool_name, t)) <= window:
            n += 1
        counts.append(n)
    expected = rate * hosts * window / DAY_S
    mean = float(np.mean(counts))
    # Standard error of the mean of 200 Poisson draws is sqrt(expected / 200); allow 5 of them.
    assert abs(mean - expected) < 5 * math.sqrt(expected / 200)
    # A Poisson count's variance equals its mean; a loose bound on the ratio.
    assert 0.6 < float(np.var(counts)) / expected < 1.5


def test_a_faster_pool_is_reclaimed_more_often() -> None:
    c = clock(mixed(rate_a=4.0, rate_b=0.25), 2)
    horizon_a, horizon_b = draws(c, "spot-a", 300)[-1], draws(c, "spot-b", 300)[-1]
    # Total rates are 16/day vs 2/day: the same number of reclaims takes ~8x longer on b.
    assert horizon_b / horizon_a == pytest.approx(8.0, rel=0.3)

"""The cost meter and savings over windows, queue ordering, and capacity start estimates."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from boltforge.core.billing.meter import (
    Meter,
    Stretch,
    dollars_per_hour,
    grant_dollars,
    held_by_pool,
    hourly_price,
    interrupted,
    last_checkpoint,
    meter_job,
    meter_stretch,
    overlap,
    pool_dollars,
)
from boltforge.core.billing.savings import Life, Use, peak, savings
from boltforge.core.decisions import Waiting, WaitReason
from boltforge.core.model.state import Allocation, FleetState, Grant
from boltforge.core.model.workload import Job
from boltforge.core.policy import Order, Ordering, Policy
from boltforge.core.queueing.estimates import CAPACITY_BASIS, fill_estimates
from boltforge.core.queueing.ordering import las_queue, order_jobs
from boltforge.core.sharing.share import Share
from boltforge.testing.builders import make_fleet, make_gang, make_pool

TIMES = st.integers(0, 10_000).map(float)


@st.composite
def stretches(draw: st.DrawFn) -> Stretch:
    start = draw(TIMES)
    ended = draw(st.none() | st.integers(int(start), 12_000).map(float))
    end = ended if ended is not None else start + 2_000
    checkpoint = draw(st.none() | st.integers(int(start) - 100, int(end) + 100).map(float))
    return Stretch(
        gpus=draw(st.integers(0, 64)),
        dollars_per_hour=draw(st.sampled_from([0.0, 2.5, 19.2, 160.0])),
        started_at=start,
        ended_at=ended,
        checkpoint_at=checkpoint,
        interrupted=draw(st.booleans()),
    )


def close(a: Meter, b: Meter) -> bool:
    fields = ("gpu_s", "dollars", "productive_gpu_s", "productive_dollars")
    return all(getattr(a, f) == pytest.approx(getattr(b, f), abs=1e-6) for f in fields)


# --- meter ---------------------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(s=stretches(), cuts=st.lists(TIMES, min_size=3, max_size=3))
def test_meter_windows_add_up(s: Stretch, cuts: list[float]) -> None:
    """[a, b] plus [b, c] is [a, c], each window read at its own end (an open stretch runs
    up to the window's end)."""
    a, b, c = sorted(cuts)
    whole = meter_stretch(s, a, c)
    assert close(whole, meter_stretch(s, a, b) + meter_stretch(s, b, c))
    assert close(whole, meter_job([s, dataclasses.replace(s, gpus=0, dollars_per_hour=0)], a, c))


@settings(max_examples=200, deadline=None)
@given(s=stretches(), window=st.lists(TIMES, min_size=2, max_size=2))
def test_productive_plus_lost_is_allocated(s: Stretch, window: list[float]) -> None:
    since, now = sorted(window)
    m = meter_stretch(s, since, now)
    end = s.ended_at if s.ended_at is not None else now
    held = overlap(s.started_at, end, since, now)
    assert m.gpu_s == pytest.approx(s.gpus * held)
    lost_s = 0.0
    if s.interrupted and s.ended_at is not None:
        kept_until = min(max(s.checkpoint_at or s.started_at, s.started_at), end)
        lost_s = overlap(kept_until, end, since, now)
    assert m.productive_gpu_s + s.gpus * lost_s == pytest.approx(m.gpu_s)
    assert 0.0 <= m.productive_gpu_s <= m.gpu_s + 1e-9
    assert 0.0 <= m.productive_dollars <= m.dollars + 1e-9
    assert m.dollars == pytest.approx(s.dollars_per_hour * held / 3600)
    if not s.interrupted or s.ended_at is None:
        assert m.productive_gpu_s == m.gpu_s


@pytest.mark.parametrize(
    ("stretch", "since", "now", "gpu_h", "productive_h"),
    [
        (Stretch(8, 20.0, 0, 3600), 0, 7200, 8.0, 8.0),
        (Stretch(8, 20.0, 0, 3600, checkpoint_at=1800, interrupted=True), 0, 7200, 8.0, 4.0),
        (Stretch(8, 20.0, 0, 3600, interrupted=True), 0, 7200, 8.0, 0.0),
        (Stretch(8, 20.0, 0, 3600, checkpoint_at=1800, interrupted=True), 2700, 7200, 2.0, 0.0),
        (Stretch(8, 20.0, 0, 3600, checkpoint_at=1800, interrupted=True), 0, 900, 2.0, 2.0),
        (Stretch(4, 10.0, 0, None, checkpoint_at=100, interrupted=True), 0, 3600, 4.0, 4.0),
        (Stretch(4, 10.0, 3600, 7200), 0, 3600, 0.0, 0.0),
        (Stretch(2, 5.0, 0, 3600, checkpoint_at=-50, interrupted=True), 0, 3600, 2.0, 0.0),
        (Stretch(2, 5.0, 0, 3600, checkpoint_at=9999, interrupted=True), 0, 3600, 2.0, 2.0),
    ],
    ids=[
        "clean",
        "lost-after-checkpoint",
        "lost-all-without-checkpoint",
        "window-after-checkpoint",
        "window-before-checkpoint",
        "open-loses-nothing-yet",
        "outside-window",
        "checkpoint-before-start",
        "checkpoint-after-end",
    ],
)
def test_meter_scenarios(
    stretch: Stretch, since: float, now: float, gpu_h: float, productive_h: float
) -> None:
    m = meter_stretch(stretch, since, now)
    assert m.gpu_hours == pytest.approx(gpu_h)
    assert m.productive_gpu_hours == pytest.approx(productive_h)
    rate = stretch.dollars_per_hour / max(stretch.gpus, 1)
    assert m.dollars == pytest.approx(gpu_h * rate)
    assert m.productive_dollars == pytest.approx(productive_h * rate)


def test_meter_job_sums_stretches() -> None:
    parts = [
        Stretch(8, 20.0, 0, 1000, checkpoint_at=600, interrupted=True),
        Stretch(8, 20.0, 1200, None),
    ]
    total = meter_job(parts, 0, 2000)
    assert total == meter_stretch(parts[0], 0, 2000) + meter_stretch(parts[1], 0, 2000)
    assert total.gpu_s == 8 * (1000 + 800)
    assert total.productive_gpu_s == 8 * (600 + 800)
    assert meter_job([], 0, 10) == Meter()


@settings(max_examples=100, deadline=None)
@given(
    gpus=st.dictionaries(st.sampled_from(["a", "b", "c"]), st.integers(0, 64), max_size=3),
    start=TIMES,
    length=TIMES,
)
def test_pool_dollars_add_up_to_one_stretch(
    gpus: dict[str, int], start: float, length: float
) -> None:
    prices = {"a": 2.5, "b": 1.1, "c": 0.4}
    rate = dollars_per_hour(gpus, prices)
    assert rate == pytest.approx(sum(n * prices[p] for p, n in gpus.items()))
    per_pool = pool_dollars(gpus, prices, start, start + length)
    assert set(per_pool) == set(gpus)
    whole = meter_stretch(Stretch(sum(gpus.values()), rate, start, start + length), start, 1e9)
    assert sum(per_pool.values()) == pytest.approx(whole.dollars)


def test_a_pool_without_a_price_is_an_error() -> None:
    with pytest.raises(KeyError):
        dollars_per_hour({"mystery": 8}, {"a": 1.0})


@pytest.mark.parametrize(
    ("epoch", "ended", "job_epoch", "state", "finished", "lost"),
    [
        (1, None, 1, "running", None, False),
        (1, 100.0, 1, "succeeded", 100.0, False),
        (1, 100.0, 1, "cancelled", 90.0, False),
        (1, 80.0, 1, "cancelled", 90.0, True),
        (1, 100.0, 2, "succeeded", 200.0, True),
        (2, 200.0, 2, "failed", 200.0, True),
        (1, 100.0, 1, "pending", None, True),
        (1, 100.0, 1, "succeeded", None, True),
    ],
)
def test_interrupted_scenarios(
    epoch: int,
    ended: float | None,
    job_epoch: int,
    state: str,
    finished: float | None,
    lost: bool,
) -> None:
    assert interrupted(epoch, ended, job_epoch, state, finished) is lost


@pytest.mark.parametrize(
    ("stored", "latest", "start", "end", "found"),
    [
        (None, None, 0.0, 100.0, None),
        (50.0, None, 0.0, 100.0, 50.0),
        (None, 60.0, 0.0, 100.0, 60.0),
        (50.0, 60.0, 0.0, 100.0, 60.0),
        (70.0, 60.0, 0.0, 100.0, 70.0),
        (None, 150.0, 0.0, 100.0, None),
        (None, -5.0, 0.0, 100.0, None),
        (None, 150.0, 0.0, None, 150.0),
    ],
)
def test_last_checkpoint_scenarios(
    stored: float | None,
    latest: float | None,
    start: float,
    end: float | None,
    found: float | None,
) -> None:
    assert last_checkpoint(stored, latest, start, end) == found


# --- savings -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("uses", "since", "until", "most"),
    [
        ([], 0, 100, 0),
        ([Use("t", "p", 4, 0, 50), Use("t", "p", 4, 50, 100)], 0, 100, 4),
        ([Use("t", "p", 4, 0, 60), Use("t", "p", 4, 50, 100)], 0, 100, 8),
        ([Use("t", "p", 4, 0, 60), Use("t", "p", 4, 50, 100)], 70, 100, 4),
        ([Use("t", "p", 8, 0, None), Use("t", "p", 2, 10, 20)], 0, 100, 10),
        ([Use("t", "p", 8, 200, None)], 0, 100, 0),
    ],
)
def test_peak_scenarios(uses: list[Use], since: float, until: float, most: int) -> None:
    assert peak(uses, since, until) == most


def test_savings_compares_static_peaks_with_the_live_fleet() -> None:
    hour = 3600.0
    uses = [
        Use("a", "h100", 8, 0, hour),
        Use("b", "h100", 8, hour, 2 * hour),
        Use("b", "a100", 4, 0, None),
    ]
    lives = [Life("h100", 8, 2.0, 0, None), Life("a100", 4, 1.0, 0, None)]
    prices = {"h100": 2.0, "a100": 1.0}
    result = savings(uses, lives, prices, 0, 2 * hour)
    assert result.hours == 2.0
    assert result.peaks == {"a": {"h100": 8}, "b": {"a100": 4, "h100": 8}}
    assert result.static_dollars == pytest.approx((8 * 2.0 + 8 * 2.0 + 4 * 1.0) * 2)
    assert result.shared_dollars == pytest.approx((8 * 2.0 + 4 * 1.0) * 2)
    assert result.saved_dollars == pytest.approx(result.static_dollars - result.shared_dollars)
    assert result.saved_dollars > 0


def test_savings_window_starts_at_the_first_node() -> None:
    lives = [Life("p", 8, 1.0, 1800.0, None)]
    result = savings([Use("t", "p", 8, 0, None)], lives, {"p": 1.0}, 0, 3600)
    assert result.since == 1800.0 and result.hours == 0.5
    assert result.static_dollars == pytest.approx(4.0)
    assert result.shared_dollars == pytest.approx(4.0)


def test_savings_of_an_oversized_fleet_are_negative() -> None:
    lives = [Life("p", 64, 1.0, 0, None)]
    result = savings([Use("t", "p", 8, 0, None)], lives, {"p": 1.0}, 0, 3600)
    assert result.saved_dollars == pytest.approx(8.0 - 64.0)


# --- ordering ------------------------------------------------------------------------------------


def job(name: str, submit: float, priority: int = 3, gpus: int = 8, attained: float = 0.0) -> Job:
    gang = dataclasses.replace(make_gang(name, gpus=gpus), priority=priority)
    return Job(name, gang, "research", submit, attained_gpu_seconds=attained)


JOBS = [
    job("e", 50.0, priority=1, attained=10.0),
    job("a", 10.0, priority=3, attained=100_000.0),
    job("c", 10.0, priority=0, attained=40_000.0),
    job("b", 10.0, priority=3, attained=0.0),
    job("d", 30.0, priority=1, attained=1e9),
]


@pytest.mark.parametrize(
    ("ordering", "expected"),
    [
        (Ordering.FIFO, ["a", "b", "c", "d", "e"]),
        (Ordering.PRIORITY, ["c", "d", "e", "a", "b"]),
        (Ordering.FAIR, ["c", "d", "e", "a", "b"]),  # without a fair order: by priority
        (Ordering.LAS, ["b", "e", "a", "c", "d"]),  # queues 0, 0, 1, 1, 2
    ],
)
def test_order_jobs_by_policy(ordering: Ordering, expected: list[str]) -> None:
    policy = Policy("p", order=Order(ordering))
    got = [j.id for j in order_jobs(list(JOBS), policy, now=100.0, fair=None)]
    assert got == expected


def test_fair_ordering_defers_to_the_fair_order_given() -> None:
    policy = Policy("p", order=Order(Ordering.FAIR))
    got = order_jobs(list(JOBS), policy, 100.0, fair=lambda js: sorted(js, key=lambda j: j.id))
    assert [j.id for j in got] == ["a", "b", "c", "d", "e"]


@settings(max_examples=50, deadline=None)
@given(st.permutations(JOBS), st.sampled_from(list(Ordering)))
def test_order_does_not_depend_on_input_order(jobs: list[Job], ordering: Ordering) -> None:
    policy = Policy("p", order=Order(ordering))
    first = [j.id for j in order_jobs(list(jobs), policy, 100.0, None)]
    assert first == [j.id for j in order_jobs(list(JOBS), policy, 100.0, None)]
    assert sorted(first) == sorted(j.id for j in JOBS)


@pytest.mark.parametrize(
    ("attained", "started", "now", "queue"),
    [
        (0.0, None, 100.0, 0),
        (28_800.0, None, 100.0, 1),
        (28_799.0, None, 100.0, 0),
        (691_200.0, None, 100.0, 2),
        (1e9, None, 3 * 86400.0 + 5, 0),  # starved: promoted
        (1e9, 0.0, 3 * 86400.0 + 5, 2),  # running jobs are never promoted
        (0.0, 0.0, 3600.0, 1),  # 8 GPUs for an hour pass the first threshold
        (0.0, 0.0, 3599.0, 0),
        (0.0, 5000.0, 100.0, 0),  # a start in the future attains nothing
    ],
)
def test_las_queue(attained: float, started: float | None, now: float, queue: int) -> None:
    policy = Policy("p", order=Order(Ordering.LAS))
    j = job("x", 0.0, gpus=8, attained=attained)
    assert las_queue(j, policy, now, started) == queue


# --- capacity estimates --------------------------------------------------------------------------


def estimate_state() -> FleetState:
    """Two 8-GPU hosts: 8 free, jobs of 4 GPUs ending at 100 and 200, one with no known end."""
    state = FleetState(make_fleet(racks=1, hosts=2))
    state.allocate(Allocation("r1", (Grant("w", 0, 0, (0, 1, 2, 3)),), expected_end=200.0))
    state.allocate(Allocation("r2", (Grant("w", 0, 0, (4, 5, 6, 7)),), expected_end=100.0))
    return state


@pytest.mark.parametrize(
    ("sizes", "starts"),
    [
        ([8], [100.0]),  # fits now by capacity but must still wait for the next end
        ([12], [100.0]),
        ([16], [200.0]),
        ([8, 4], [100.0, 100.0]),
        ([8, 8], [100.0, 200.0]),
        ([8, 8, 4], [100.0, 200.0, None]),
        ([24], [None]),
    ],
)
def test_capacity_estimates_in_queue_order(sizes: list[int], starts: list[float | None]) -> None:
    state = estimate_state()
    jobs = {f"j{i}": job(f"j{i}", 0.0, gpus=n) for i, n in enumerate(sizes)}
    waiting = [Waiting(f"j{i}", i, WaitReason.CAPACITY) for i in reversed(range(len(sizes)))]
    out = fill_estimates(waiting, jobs, state, now=50.0)
    assert [w.job for w in out] == list(jobs)
    assert [w.estimated_start for w in out] == starts
    for w in out:
        assert w.estimate_basis == (CAPACITY_BASIS if w.estimated_start is not None else "")


def test_capacity_estimates_keep_existing_ones_and_skip_never() -> None:
    state = estimate_state()
    jobs = {n: job(n, 0.0, gpus=8) for n in ("kept", "never", "next")}
    waiting = [
        Waiting("kept", 0, WaitReason.RESERVED, estimated_start=70.0, estimate_basis="reservation"),
        Waiting("never", 1, WaitReason.NEVER),
        Waiting("next", 2, WaitReason.CAPACITY),
    ]
    out = fill_estimates(waiting, jobs, state, now=50.0)
    assert (out[0].estimated_start, out[0].estimate_basis) == (70.0, "reservation")
    assert out[1].estimated_start is None
    # Jobs ahead count even when they keep their own estimate or can never run.
    assert out[2].estimated_start is None


def test_capacity_estimates_ignore_past_ends_and_cordoned_free_gpus() -> None:
    state = estimate_state()
    state.cordoned[1] = True
    jobs = {"j": job("j", 0.0, gpus=4)}
    out = fill_estimates([Waiting("j", 0, WaitReason.CAPACITY)], jobs, state, now=150.0)
    assert out[0].estimated_start == 200.0
    assert (
        fill_estimates([Waiting("j", 0, WaitReason.CAPACITY)], jobs, state, now=250.0)[
            0
        ].estimated_start
        is None
    )


def test_the_server_rate_and_the_simulator_charge_price_the_same_grants_alike() -> None:
    """A whole-GPU replica with vCPUs on one pool and a quarter of a GPU on a CPU-priced
    pool: the hourly rate the server stores and what the simulator charges for an hour
    agree, a share costs its part of its GPU, and vCPUs cost their pool's price."""
    gpu = make_pool("h100", price=4.0)
    cheap = dataclasses.replace(make_pool("l4", price=1.0), price_per_vcpu_hour=0.05)
    tree = make_fleet(pools=[gpu, cheap], racks=1, hosts=1)
    l4_host = tree.host_lists.pool_name.index("l4")
    grants = [
        Grant("worker", 0, 0, (0, 1), cpus=16.0),
        Grant("worker", 1, l4_host, (), cpus=4.0, share=Share(gpu=0, fraction=0.25, weight=0.25)),
    ]
    gpus, cpus = held_by_pool(tree, grants)
    assert gpus == {"h100": 2.0, "l4": 0.25} and cpus == {"h100": 16.0, "l4": 4.0}
    rate = hourly_price(tree, grants)
    assert rate == pytest.approx(2 * 4.0 + 0.25 * 1.0 + 4 * 0.05)
    charged = grant_dollars(tree, grants, 0.0, 3600.0)
    assert charged == pytest.approx({"h100": 8.0, "l4": 0.25 + 0.2})
    assert sum(charged.values()) == pytest.approx(rate)

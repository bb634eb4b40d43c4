"""How many replicas an inference service should run: reactive signals, a forecast from its
own history, hysteresis, and scale to zero.

Each decision takes the service's latest ``Load`` (requests per second, requests queued,
p99 latency, KV-cache use, as its replicas report them through the SDK) and recommends a
count, the largest of:

* **queue**: enough replicas that each has at most ``target_queue`` requests waiting;
* **throughput**: enough that each serves at most ``target_utilization`` of
  ``rps_per_replica`` (when the capacity is declared);
* **latency and KV cache**: one more than now while p99 is above the SLO or the KV cache is
  fuller than ``kv_cache_high`` (pressure the other signals miss: long prompts, big batches);
* **forecast**: the rate the service's own history expects one cold start from now
  (``RateHistory``: the same quarter hour of earlier days), at the throughput target, so
  replicas are warm when the daily peak comes.

Scaling up follows the recommendation at once. Scaling down takes the largest recommendation
of the last ``scale_down_window_s`` (as Kubernetes' HPA stabilizes), so a signal that dips
and comes back never takes replicas away and brings them again: no flapping. Ratios within
``tolerance`` of the target change nothing. With ``min_replicas`` 0 a service that has had
no request and no queue for ``idle_to_zero_s`` goes to zero; the first queued request wakes
it, and its replicas serve only after ``cold_start_s`` (the caller counts that wait).

Pure: the same inputs give the same decision; the carried ``ScaleState`` is returned anew.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

DAY_S = 86_400.0
BUCKET_S = 900.0  # the history's resolution: a quarter hour of the day


@dataclass(frozen=True, slots=True)
class Autoscale:
    """A service's scaling rules (see the module docstring)."""

    min_replicas: int = 1
    max_replicas: int = 1
    target_queue: float = 4.0
    rps_per_replica: float | None = None
    target_utilization: float = 0.7
    latency_slo_ms: float | None = None
    kv_cache_high: float = 0.9
    tolerance: float = 0.1
    scale_down_window_s: float = 300.0
    idle_to_zero_s: float = 900.0
    cold_start_s: float = 60.0
    predictive: bool = True


@dataclass(frozen=True, slots=True)
class Load:
    """What a service's replicas reported at ``at``: requests per second served, requests
    waiting, p99 latency (ms) and KV-cache use (0-1, the fullest replica's); None: not given."""

    at: float
    requests_per_s: float = 0.0
    queued: float = 0.0
    p99_ms: float | None = None
    kv_cache: float | None = None


@dataclass(frozen=True, slots=True)
class RateHistory:
    """A service's request rate by quarter hour of the day, learned online. The quarter hour
    under way is averaged over its samples (``current``: its index since the epoch, the sum
    and the count); when it is over, its mean joins that quarter hour's history as an
    exponentially weighted mean over days (``weight`` for the newest day)."""

    weight: float = 0.3
    buckets: tuple[tuple[int, float], ...] = ()  # (quarter hour of the day, mean rate)
    current: tuple[int, float, int] = (-1, 0.0, 0)

    def observe(self, at: float, rate: float) -> RateHistory:
        index = int(at // BUCKET_S)
        open_index, total, count = self.current
        if index == open_index:
            return replace(self, current=(index, total + rate, count + 1))
        buckets = self.buckets
        if count:
            key = int((open_index * BUCKET_S % DAY_S) // BUCKET_S)
            known = dict(buckets)
            mean, old = total / count, known.get(key)
            known[key] = mean if old is None else old + self.weight * (mean - old)
            buckets = tuple(sorted(known.items()))
        return RateHistory(self.weight, buckets, (index, rate, 1))

    def expect(self, at: float) -> float | None:
        """The rate earlier days saw at this time of day (None: no finished day has)."""
        return dict(self.buckets).get(_bucket(at))


def _bucket(at: float) -> int:
    return int((at % DAY_S) // BUCKET_S)


@dataclass(frozen=True, slots=True)
class ScaleState:
    """What a service's scaler carries between decisions: the replicas it asked for, its
    recent recommendations ``(at, count)``, when it last saw work, and its rate history."""

    replicas: int
    recent: tuple[tuple[float, int], ...] = ()
    last_busy: float = 0.0
    history: RateHistory = field(default_factory=RateHistory)


@dataclass(frozen=True, slots=True)
class Scale:
    """One decision: the replica count to run and why (the signal that set it)."""

    replicas: int
    reason: str
    state: ScaleState


def decide(rules: Autoscale, state: ScaleState, load: Load) -> Scale:
    """The count ``rules`` ask for after ``load`` (see the module docstring)."""
    now, current = load.at, state.replicas
    busy = load.requests_per_s > 0 or load.queued > 0
    last_busy = now if busy else state.last_busy
    history = state.history.observe(now, load.requests_per_s)
    wanted, why = _recommend(rules, state, load, current)
    if rules.min_replicas == 0 and not busy and now - last_busy >= rules.idle_to_zero_s:
        wanted, why = 0, f"no requests for {now - last_busy:.0f} s: scale to zero"
    elif current == 0 and busy:
        wanted, why = max(wanted, 1), "a request came to a service at zero (cold start)"
    elif current > 0 and wanted == 0:  # zero only once idle for ``idle_to_zero_s``
        wanted = 1
    wanted = min(max(wanted, rules.min_replicas), rules.max_replicas)
    window = [(t, n) for t, n in state.recent if now - t < rules.scale_down_window_s]
    window.append((now, wanted))
    if wanted < current and wanted > 0:
        held = max(n for _, n in window)
        if held > wanted:
            wanted, why = min(held, current), "holding: load was higher within the window"
    new = ScaleState(wanted, tuple(window), last_busy, history)
    return Scale(wanted, why if wanted != current else "steady", new)


def _recommend(rules: Autoscale, state: ScaleState, load: Load, current: int) -> tuple[int, str]:
    """The largest count any signal asks for, and the signal."""
    candidates = [(rules.min_replicas, "minimum")]
    if load.queued > 0 or current > 0:
        need = load.queued / rules.target_queue if rules.target_queue > 0 else 0.0
        candidates.append((_within_tolerance(need, current, rules), "queue depth"))
    per = rules.rps_per_replica
    if per:
        need = load.requests_per_s / (per * rules.target_utilization)
        candidates.append((_within_tolerance(need, current, rules), "request rate"))
        expected = state.history.expect(load.at + rules.cold_start_s) if rules.predictive else None
        if expected is not None:
            ahead = math.ceil(expected / (per * rules.target_utilization))
            candidates.append((ahead, "forecast from this time of day"))
    slo = rules.latency_slo_ms
    if slo is not None and load.p99_ms is not None and load.p99_ms > slo * (1 + rules.tolerance):
        candidates.append((current + 1, f"p99 {load.p99_ms:.0f} ms above the {slo:g} ms SLO"))
    if load.kv_cache is not None and load.kv_cache > rules.kv_cache_high:
        candidates.append((current + 1, f"KV cache {load.kv_cache:.0%} full"))
    return max(candidates, key=lambda c: c[0])


def _within_tolerance(need: float, current: int, rules: Autoscale) -> int:
    """The replicas a signal asks for: ``need`` (replicas' worth of load, fractional) rounded
    up, or ``current`` when the load is within ``tolerance`` of what ``current`` replicas
    are meant to carry (so noise around the target changes nothing)."""
    if current > 0 and abs(need / current - 1.0) <= rules.tolerance:
        return current
    return math.ceil(need)

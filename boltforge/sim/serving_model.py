"""How well a service's ready replicas serve one step of its request trace: a fluid queue.

The model, per service and per step of ``dt`` seconds (the request trace's step):

* **Capacity.** ``ready`` replicas (counted in replica-seconds over the step / ``dt``, so a
  replica ready for half the step counts half) serve at most ``ready x rps_per_replica``
  requests per second: ``capacity = ready x rps_per_replica x dt`` requests in the step.
  Load is spread evenly over the ready replicas.
* **Demand.** ``offered = rate x dt`` requests arrive; ``backlog`` requests still wait from
  earlier steps. ``utilization = min((offered + backlog) / capacity, 1)`` (1 with no
  capacity).
* **Latency.** Each replica behaves as an M/M/1 queue: its response time is exponential with
  a p99 of ``base_latency_ms / (1 - utilization)`` (``base_latency_ms`` the p99 at light
  load), so p99 grows without bound as utilization nears 1. The share of requests within the
  SLO is then ``1 - 100 ** (-slo / p99)`` (0.99 when p99 equals the SLO, 0 at utilization 1).
* **Who is served, and who meets the SLO.** New arrivals go first, up to the capacity
  (``fresh = min(offered, capacity)``); the share above of them meets the SLO. Capacity left
  over drains the backlog. Requests beyond the capacity wait for a later step: a step is
  minutes, an SLO is milliseconds to seconds, so a request that waited a step has missed its
  SLO when it is served. ``backlog`` at the end is what is still waiting.
* **What the replicas report.** The arrival rate over the step (what the router counts), the
  backlog as the queue, and the p99 above (with utilization capped at ``RHO_CAP`` so it stays
  finite). No KV-cache figure.

Pure arithmetic: no clock, no randomness.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

LN_100 = math.log(100.0)  # an exponential's p99 is ln(100) times its mean
RHO_CAP = 0.999  # the reported p99 at or above capacity: base / (1 - RHO_CAP), 1,000x base


@dataclass(frozen=True, slots=True)
class Served:
    """One step's outcome for one service (requests counted over the step)."""

    offered: float
    served: float
    in_slo: float
    backlog: float
    utilization: float
    p99_ms: float


def p99_ms(utilization: float, base_ms: float) -> float:
    """The p99 latency at ``utilization`` (capped at ``RHO_CAP``)."""
    return base_ms / (1.0 - min(max(utilization, 0.0), RHO_CAP))


def within_slo(utilization: float, base_ms: float, slo_ms: float) -> float:
    """The share of requests served within ``slo_ms`` at ``utilization`` (0 at 1 and above)."""
    if utilization >= 1.0:
        return 0.0
    p99 = base_ms / (1.0 - max(utilization, 0.0))
    return 1.0 - math.exp(-LN_100 * slo_ms / p99)


def serve_step(
    rate: float,
    ready: float,
    backlog: float,
    dt: float,
    rps_per_replica: float,
    base_ms: float,
    slo_ms: float,
) -> Served:
    """Serve one step of ``dt`` seconds at ``rate`` requests/s with ``ready`` replicas (a
    replica-average over the step) and ``backlog`` requests already waiting (see the module
    docstring). ``ready``, ``backlog``, ``rate`` and ``dt`` are at least 0."""
    offered = rate * dt
    capacity = ready * rps_per_replica * dt
    demand = offered + backlog
    if capacity <= 0.0:
        utilization = 1.0 if demand > 0 else 0.0
        return Served(offered, 0.0, 0.0, demand, utilization, p99_ms(utilization, base_ms))
    utilization = min(demand / capacity, 1.0)
    fresh = min(offered, capacity)
    drained = min(backlog, capacity - fresh)
    in_slo = fresh * within_slo(utilization, base_ms, slo_ms)
    left = max(demand - fresh - drained, 0.0)
    return Served(offered, fresh + drained, in_slo, left, utilization, p99_ms(utilization, base_ms))

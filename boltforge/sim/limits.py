"""Time limits as users give them, for the simulator's ``--limit-model``.

Two models give a trace job without a limit of its own (the Boltforge CSV's ``time_limit_s``)
one:

- ``derived`` (the default): the first of ``sim.jobs.LIMIT_HOURS`` covering 1.2 times the
  runtime (``sim.jobs.time_limit``), applied by ``sim.jobs.to_job``. Nearly an oracle: always
  above the runtime and within a factor of 2.4 of it.
- ``user``: a model of the estimates real users give, after Tsafrir, Etsion and Feitelson,
  "Modeling User Runtime Estimates" (JSSPP 2005), and Mu'alem and Feitelson's f-model
  ("Utilization, predictability, workloads, and user runtime estimates in scheduling the IBM
  SP2 with backfilling", IEEE TPDS 12(6), 2001). A seeded share ``MAX_SHARE`` of the jobs asks
  for the maximum, ``MAX_LIMIT_S``. Every other job overestimates its runtime by a factor drawn
  uniformly from ``[1, OVERESTIMATE_F + 1]`` (the f-model) and rounds the product up to the
  next of the ``POPULAR_HOURS`` (the modal estimates); a product above the largest asks for the
  maximum.

A user's limit is never below the job's runtime: the simulator does not kill a job at its
limit, and a real job killed there would have been resubmitted with a longer one, so the run
the trace records is the one whose limit covered it. A job longer than ``MAX_LIMIT_S`` (a
site would have had to grant it more) gets its runtime as its limit.

The draws come from ``numpy``'s PCG64 seeded with ``[seed, SEED_SALT]``, two per job in trace
order, drawn for every job whether or not it has its own limit: the same trace and seed give
the same limits on every machine, and a limit in the CSV does not change any other job's.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from boltforge.sim.records import TraceJob

__all__ = [
    "LIMIT_MODELS",
    "MAX_LIMIT_S",
    "MAX_SHARE",
    "OVERESTIMATE_F",
    "POPULAR_HOURS",
    "chosen_limits",
    "user_limits",
]

LIMIT_MODELS = ("derived", "user")

# The largest limit a user may ask for: 720 h (30 days), the top of ``sim.jobs.LIMIT_HOURS``
# and of the synthetic traces' runtimes. A choice: the papers take the maximum from each
# site's configuration, and GPU clusters publish none for these traces.
MAX_LIMIT_S = 720 * 3600.0

# The share of jobs that ask for the maximum. Tsafrir, Etsion and Feitelson (2005) find the
# maximum allowed estimate to be the most popular value in every log they studied and make
# its share one of their model's two inputs ("the maximal allowed estimate value, along with
# the percentage of jobs that have used it"); the percentages per log were not found in the
# sources at hand, so 15% is a choice.
MAX_SHARE = 0.15

# The popular values below the maximum, in hours. Tsafrir, Etsion and Feitelson (2005): "only
# 20 different values are used as estimates for about 90% of the jobs", round values of
# minutes and hours. The count (19 here plus the maximum: 20) is theirs; which round values
# is a choice, stretched to the hours-to-weeks runtimes of GPU training jobs.
POPULAR_HOURS = (
    0.25,
    0.5,
    1,
    2,
    3,
    4,
    6,
    8,
    10,
    12,
    16,
    24,
    36,
    48,
    72,
    96,
    120,
    168,
    336,
)

# Mu'alem and Feitelson's f-model (2001), as Tsafrir and Feitelson restate it ("The Dynamics
# of Backfilling", IPDPS 2006): given a runtime r, the estimate is uniformly distributed in
# [r, (f + 1) r]. Mu'alem and Feitelson found backfilling works better "when users
# overestimate the runtime by a substantial factor"; f = 3 (estimates 1 to 4 times the
# runtime, 2.5 times on average, before rounding up) is a choice.
OVERESTIMATE_F = 3.0

# Mixed into the seed so these draws differ from the other seeded draws of one replay.
SEED_SALT = 30011

_POPULAR_S = np.array([h * 3600.0 for h in POPULAR_HOURS])


def user_limits(trace: Sequence[TraceJob], seed: int) -> list[float]:
    """The ``user`` model's limit for each job of ``trace``, in order (seconds; see the module
    docstring). Jobs' own ``time_limit_s`` is not looked at here."""
    rng = np.random.default_rng([seed, SEED_SALT])
    n = len(trace)
    at_max = rng.random(n) < MAX_SHARE
    factors = rng.uniform(1.0, OVERESTIMATE_F + 1.0, n)
    runtimes = np.array([t.duration_s for t in trace], dtype=np.float64)
    need = runtimes * factors
    index = np.searchsorted(_POPULAR_S, need, side="left")
    rounded = np.where(
        index < len(_POPULAR_S), _POPULAR_S[np.minimum(index, len(_POPULAR_S) - 1)], MAX_LIMIT_S
    )
    limits = np.where(at_max, MAX_LIMIT_S, rounded)
    out: list[float] = np.maximum(limits, runtimes).tolist()
    return out


def chosen_limits(trace: Sequence[TraceJob], model: str, seed: int) -> dict[str, float]:
    """The limits that replace ``sim.jobs.to_job``'s (the ``derived`` rule), by job id: each
    job's own ``time_limit_s``, and under ``user`` the model's limit for every other job.
    Raises ``ValueError`` for a model not in ``LIMIT_MODELS``."""
    if model not in LIMIT_MODELS:
        raise ValueError(f"unknown limit model {model!r}; known: {', '.join(LIMIT_MODELS)}")
    out: dict[str, float] = {}
    if model == "user":
        out = dict(zip((t.id for t in trace), user_limits(trace, seed), strict=True))
    for t in trace:
        if t.time_limit_s is not None:
            out[t.id] = t.time_limit_s
    return out

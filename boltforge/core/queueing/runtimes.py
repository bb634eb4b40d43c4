"""Runtime estimates learned online from jobs that finished.

A job sent with no time limit (``sbatch`` without ``-t``, a spec without ``time_limit``)
gives backfill and patience nothing to weigh: its expected end is unknown. Yet its user
usually runs it again and again: the same team, the same name, the same size. The history
keeps the runtimes of recent successful jobs under three keys, from the most specific to the
least: ``(team, name, GPUs)``, ``(team, GPUs)`` and ``team``. A job's estimate comes from the
most specific key whose last ``KEEP`` runtimes are at least ``MIN_RUNS`` and agree, as their
``QUANTILE``.

They agree when that quantile is at most ``SPREAD`` times their (lower) median. A job run
again and again (the same training script, the same evaluation) takes about as long each
time; a key whose jobs range from minutes to days predicts nothing, and an estimate drawn from
it would only mislead: its high quantile would keep most jobs out of the gaps backfill could
give them, where no estimate leaves the job to be judged as one of unknown length.

A high quantile rather than the mean, because the cycle relies on expected ends the way it
relies on time limits: backfill lets a job into a gap when it ends before the reservation, so
an estimate that comes up short delays the job at the head of the line. Most runs then end
before their estimate, as most end before their time limit.

It also keeps what jobs *typically* took, for ranking rather than for backfill
(``RuntimeHistory.typical``): the median of the recent runtimes of jobs that made the same
claim. A job that states a time limit is judged by what jobs of its team (and name) that asked
for that same limit took, then by what any job asking for it took: users round their limits to
a few popular values and many ask for the maximum, so the limit names a class of jobs whose
real runtimes the history measures (how right such limits were). A job with no limit is
judged by jobs of its size. The median needs no agreement: it orders jobs, it promises
nothing, and the time limit still bounds what the cycle relies on.

The history learns only from what already happened (successful runs, in the order they
ended), so a simulator replaying a trace learns exactly as a live server would. Pure and
deterministic: the caller feeds it what finished and asks it for estimates.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field
from math import ceil

QUANTILE = 0.9
KEEP = 32  # runtimes kept per key: recent behaviour, not the whole past
MIN_RUNS = 3  # runs a key needs before it is trusted
SPREAD = 2.0  # the quantile may be at most this many times the median


@dataclass(frozen=True, slots=True)
class Finished:
    """One successful job: who ran it, how big, and its runtime (seconds of work at its full
    size: its GPU-seconds over its GPUs, so a job interrupted and resumed counts whole)."""

    team: str
    name: str
    gpus: int
    runtime_s: float
    limit_s: float | None = None  # the time limit it asked for, if any


def keys(team: str, name: str, gpus: int) -> tuple[Hashable, ...]:
    """The history's keys for a job, most specific first."""
    return ((team, name, gpus), (team, gpus), team)


def claim_keys(team: str, name: str, gpus: int, limit_s: float | None) -> tuple[Hashable, ...]:
    """The keys of what jobs like this one typically took, most specific first: by the time
    limit it asked for when it has one, else by its size."""
    if limit_s is None:
        return (("size", team, name, gpus), ("size", team, gpus), ("size", gpus))
    return (("limit", team, name, limit_s), ("limit", team, limit_s), ("limit", limit_s))


@dataclass
class RuntimeHistory:
    """Recent runtimes by key, and the estimates they give (cached until the key learns)."""

    runs: dict[Hashable, deque[float]] = field(default_factory=dict)
    _estimates: dict[Hashable, float | None] = field(default_factory=dict)
    claims: dict[Hashable, deque[float]] = field(default_factory=dict)
    _typical: dict[Hashable, float | None] = field(default_factory=dict)

    def learn(self, done: Finished) -> None:
        """Add one successful job's runtime under each of its keys (runtimes of zero or less,
        a job that never ran, teach nothing)."""
        if done.runtime_s <= 0:
            return
        for key in keys(done.team, done.name, done.gpus):
            self.runs.setdefault(key, deque(maxlen=KEEP)).append(done.runtime_s)
            self._estimates.pop(key, None)
        for key in claim_keys(done.team, done.name, done.gpus, done.limit_s):
            self.claims.setdefault(key, deque(maxlen=KEEP)).append(done.runtime_s)
            self._typical.pop(key, None)

    def learn_all(self, done: Iterable[Finished]) -> None:
        """``learn`` each, in the order they finished (oldest first)."""
        for d in done:
            self.learn(d)

    def estimate(self, team: str, name: str, gpus: int) -> float | None:
        """The runtime to expect of a job of ``team`` named ``name`` on ``gpus`` GPUs, from
        the most specific key whose runs agree (None: no key has enough runs that agree)."""
        for key in keys(team, name, gpus):
            if key not in self._estimates:
                self._estimates[key] = _quantile(self.runs.get(key))
            found = self._estimates[key]
            if found is not None:
                return found
        return None

    def typical(self, team: str, name: str, gpus: int, limit_s: float | None) -> float | None:
        """What a job of ``team`` named ``name`` on ``gpus`` GPUs asking for ``limit_s`` (None:
        no limit) typically takes: the median of the most specific claim key with at least
        ``MIN_RUNS`` runs, never above the limit (None: no key has enough runs)."""
        for key in claim_keys(team, name, gpus, limit_s):
            if key not in self._typical:
                self._typical[key] = _median(self.claims.get(key))
            found = self._typical[key]
            if found is not None:
                return found if limit_s is None else min(found, limit_s)
        return None


def _median(runs: deque[float] | None) -> float | None:
    """The lower median of ``runs``, or None for fewer than ``MIN_RUNS``."""
    if runs is None or len(runs) < MIN_RUNS:
        return None
    return sorted(runs)[(len(runs) - 1) // 2]


def _quantile(runs: deque[float] | None) -> float | None:
    """The ``QUANTILE`` of ``runs`` (nearest rank), or None for fewer than ``MIN_RUNS`` or
    runs that do not agree (the quantile above ``SPREAD`` times the median)."""
    if runs is None or len(runs) < MIN_RUNS:
        return None
    ordered = sorted(runs)
    found = ordered[min(len(ordered), ceil(QUANTILE * len(ordered))) - 1]
    middle = ordered[(len(ordered) - 1) // 2]  # the lower median
    return found if found <= SPREAD * middle else None

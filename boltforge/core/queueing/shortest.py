"""Shortest work first inside a class, aged so that nothing waits for ever.

A waiting job's *work* is its GPUs times its runtime left (``runtime_left``): its expected
runtime (the learned estimate, else its time limit) less what it already ran before a
preemption or failure. A job that ran past its estimate, or has none, is expected to run about
as long again as it already has, and at least ``UNKNOWN_RUNTIME_S``: runtimes are heavy
tailed, so the longer a job has run the longer it is likely to go on.

Serving the least work first minimizes the average completion time (SRPT); aging bounds how long
a big job can be passed over: its work counts half for every ``aging_s`` it has waited, so a job
a thousand times bigger than the newest arrival overtakes it after about ten half-lives (2 ** 10
= 1,024). ``fair_weight`` folds in the queue's fair share: the work is multiplied by ``(0.5 / F)
** fair_weight``, F the queue's fair-share factor, so a queue at its share (F = 0.5) is neither
helped nor held back, one that used twice its share (F = 0.25) has its work count ``2 **
fair_weight`` times more, and an idle one (F = 1) ``2 ** fair_weight`` times less.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from boltforge.core.model.topology import FloatArray
from boltforge.core.model.workload import Job

# A job that states neither an estimate nor a time limit is taken to run this long.
UNKNOWN_RUNTIME_S = 86400.0


@dataclass(frozen=True, slots=True)
class SizeRule:
    """How work, age and fair share combine into one rank (smaller goes first)."""

    aging_s: float
    fair_weight: float = 0.0

    def __post_init__(self) -> None:
        if not self.aging_s > 0:
            raise ValueError(f"aging_s must be positive (got {self.aging_s})")
        if self.fair_weight < 0:
            raise ValueError(f"fair_weight must not be negative (got {self.fair_weight})")


def runtime_left(job: Job, ran_s: float) -> float:
    """Seconds ``job`` still needs at its full size after running ``ran_s``.

    What it is expected to run is what jobs like it typically took (``Job.typical``), else
    its estimate or time limit; less ``ran_s`` while that is positive. Past it, or with no
    expectation at all, as long again as it ran (at least ``UNKNOWN_RUNTIME_S`` with none).
    Never more than its estimate or limit leaves, never under one second."""
    bound = job.expected_runtime()
    expect = job.typical if job.typical is not None else bound
    if expect is None:
        left = max(UNKNOWN_RUNTIME_S, ran_s)
    else:
        left = expect - ran_s if ran_s < expect else ran_s
    if bound is not None and ran_s < bound:
        left = min(left, bound - ran_s)
    return max(left, 1.0)


def runtimes_left(typical: FloatArray, bound: FloatArray, ran_s: FloatArray) -> FloatArray:
    """``runtime_left`` of many jobs at once, figure for figure: each job's ``typical``
    runtime and its ``bound`` (``Job.expected_runtime``), NaN where it has none, and the
    seconds it ran (arrays in step)."""
    expect = np.where(np.isnan(typical), bound, typical)
    past = np.where(ran_s < expect, expect - ran_s, ran_s)
    left = np.where(np.isnan(expect), np.maximum(UNKNOWN_RUNTIME_S, ran_s), past)
    capped = ran_s < bound  # False where there is no bound
    left = np.where(capped, np.minimum(left, bound - ran_s), left)
    out: FloatArray = np.maximum(left, 1.0)
    return out


def work_left(job: Job) -> float:
    """GPU-seconds ``job`` still needs: its GPUs times its ``runtime_left`` after the service
    it attained before."""
    gpus = job.gpus
    return gpus * runtime_left(job, job.attained_gpu_seconds / max(gpus, 1))


def rank(job: Job, factor: float, now: float, rule: SizeRule) -> float:
    """``job``'s rank at ``now`` (smaller first): its work left, halved per ``aging_s``
    waited since submission, scaled by its queue's fair-share ``factor`` (in (0, 1]); the
    product of ``aged_work`` and ``fair_weight``."""
    return aged_work(job, now, rule) * fair_weight(factor, rule)


def aged_work(job: Job, now: float, rule: SizeRule) -> float:
    """``job``'s work left, halved per ``aging_s`` waited since submission by ``now``."""
    return aged_works([job], now, rule)[0]


def aged_works(jobs: list[Job], now: float, rule: SizeRule) -> list[float]:
    """``aged_work`` of each of ``jobs`` in turn, for a whole queue at once."""
    works = np.fromiter(map(work_left, jobs), np.float64, len(jobs))
    submits = np.fromiter((j.submit_time for j in jobs), np.float64, len(jobs))
    aged: list[float] = aged_works_of(works, submits, now, rule).tolist()
    return aged


def aged_works_of(work: FloatArray, submit: FloatArray, now: float, rule: SizeRule) -> FloatArray:
    """Each job's ``work`` left halved per ``aging_s`` waited since its ``submit`` time by
    ``now`` (arrays in step, as ``QueueColumns`` has them). The halvings are raised to
    powers of two one by one, as Python does it, so every figure is the same on every
    machine whatever vector instructions its NumPy uses."""
    halvings = -np.maximum(now - submit, 0.0) / rule.aging_s
    return work * np.array([2.0**x for x in halvings.tolist()], dtype=np.float64)


def fair_weight(factor: float, rule: SizeRule) -> float:
    """What a queue's fair-share ``factor`` (in (0, 1]) scales its jobs' aged work by."""
    weight: float = (0.5 / max(factor, 1e-12)) ** rule.fair_weight
    return weight

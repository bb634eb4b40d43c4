"""The tail of the queue: when a pass nobody reads the reasons of can stop early.

Contract. ``Tail`` reads the ordered jobs (or their columns) and the pass's free GPUs,
reservations, preemption budget and running jobs' standing; it changes nothing in the pass.
``none_can_start(p, i)`` is true only when no job from position ``i`` on can start in this pass
(strict order is blocked, or none fits by size, reserves, takes a path of its own or can bump
anyone); the pass then ends and those jobs count as ``unseen``.
"""

from __future__ import annotations

from operator import attrgetter

import numpy as np

from boltforge.core.cycle.order import JOB_CLASS
from boltforge.core.cycle.preempt import bump_rule, bumps_none_of, finer_levels, own_standing
from boltforge.core.cycle.reserve import reservation_left
from boltforge.core.cycle.state import PassState, count_open_gpus
from boltforge.core.cycle.wait import cannot_start, has_own_path
from boltforge.core.model.topology import IntArray
from boltforge.core.model.workload import Job
from boltforge.core.policy import Ordering, Policy
from boltforge.core.preempt.bump import tier
from boltforge.core.queueing.columns import QueueColumns
from boltforge.core.queueing.ordering import las_queues

_HELD, _ELASTIC = attrgetter("held"), attrgetter("elastic")


_JOB_GPUS = attrgetter("gang.total_gpus")


class Tail:
    """What the jobs from each queue position to the end need at least, so that a pass
    nobody reads the reasons of can stop once none of them can start: the fewest GPUs any of
    them wants, the most important class and standing among them, and whether any is
    elastic or has GPUs held for its restart (those take paths of their own).

    The suffixes are built (once each, vectorized, from the first position that needs them
    on) only when a job too big for the free GPUs is reached and no reservation is left to
    give: while the job at a position can start by size or takes a path of its own, no job
    from there on is ruled out, and most passes end before the suffixes are ever needed. The
    classes and standings are built only under a preempting policy, the one that reads them.
    Under strict order a job of whole GPUs needs none: when it cannot start, it holds back
    every job behind it.
    """

    def __init__(
        self,
        ordered: list[Job],
        policy: Policy,
        now: float,
        columns: QueueColumns | None,
        at: IntArray | None,
    ) -> None:
        self.ordered, self.policy, self.now = ordered, policy, now
        # the snapshot's columns, if any, and the position in them of each of ``ordered``
        # (None: in step with it)
        self.columns, self.at = columns, at
        self._base: int | None = None  # the position the suffixes start at
        self._fits: tuple[np.ndarray, np.ndarray] | None = None  # fewest GPUs, own path
        self._ranks: tuple[np.ndarray, np.ndarray] | None = None  # class, standing code
        self._tail: QueueColumns | None = None  # ``_columns``, once taken

    def none_can_start(self, p: PassState, i: int) -> bool:
        """Whether no job from position ``i`` on can start in this pass: strict order is
        blocked, or none of them can start by size, reserve, take a path of its own or bump
        a running job (``bumps_none_of``)."""
        if p.head_blocked is not None:
            return True
        job = self.ordered[i]
        if job.gpus <= count_open_gpus(p) or has_own_path(self.policy, job):
            return False  # this one may start, so the rest are not ruled out
        if self.policy.order.strict and not job.gang.shared:  # it waits, and all behind it
            return cannot_start(p, job.gpus, job.priority, False, True)
        if reservation_left(p):
            return False
        k = i - self._start(i)
        min_gpus, own_path = self._fit_suffixes()
        if own_path[k] or min_gpus[k] <= count_open_gpus(p):
            return False
        if p.policy.preemption is None:
            return True
        min_class, min_mark = self._rank_suffixes()
        return bumps_none_of(p, int(min_class[k]), self._mark(int(min_mark[k])))

    def _mark(self, code: int) -> tuple[int, ...]:
        """The standing a ``_standing_code`` stands for."""
        finer = finer_levels(self.policy)
        return (code,) if finer is None else divmod(code, finer)

    def _start(self, i: int) -> int:
        """The position the suffixes start at: ``i`` at the first call."""
        if self._base is None:
            self._base = i
        return self._base

    def _columns(self) -> QueueColumns | None:
        """The columns of the jobs from the base on, when the snapshot has them (taken once,
        for both suffixes)."""
        if self.columns is None or self._tail is not None:
            return self._tail
        base = self._base or 0
        at = self.at
        self._tail = self.columns.since(base) if at is None else self.columns.take(at[base:])
        return self._tail

    def _fit_suffixes(self) -> tuple[np.ndarray, np.ndarray]:
        """From the base on: the fewest GPUs any job from each position wants, and whether
        any of them takes a path of its own."""
        if self._fits is None:
            jobs, columns = self.ordered[self._base :], self._columns()
            if columns is None:
                gpus = np.fromiter(map(_JOB_GPUS, jobs), np.int64, len(jobs))[::-1]
                own = _own_paths(jobs, self.policy)[::-1]
            else:
                gpus = columns.gpus[::-1]
                elastic = self.policy.elastic is not None
                own = (columns.held | (elastic & columns.elastic))[::-1]
            self._fits = (
                np.minimum.accumulate(gpus)[::-1],
                np.logical_or.accumulate(own)[::-1],
            )
        return self._fits

    def _rank_suffixes(self) -> tuple[np.ndarray, np.ndarray]:
        """From the base on: the most important class and standing (``_standing_codes``)
        of any job from each position."""
        if self._ranks is None:
            jobs, columns = self.ordered[self._base :], self._columns()
            if columns is None:
                klass = np.fromiter(map(JOB_CLASS, jobs), np.int64, len(jobs))
                queues = None
            else:
                klass = columns.priority
                queues = _sublevels(columns, self.policy, self.now)
            marks = _standing_codes(jobs, self.policy, self.now, klass, queues)[::-1]
            self._ranks = (
                np.minimum.accumulate(klass[::-1])[::-1],
                np.minimum.accumulate(marks)[::-1],
            )
        return self._ranks


def _own_paths(jobs: list[Job], policy: Policy) -> np.ndarray:
    """``has_own_path`` of each of ``jobs``, as booleans (no job is looked at one by one when
    none has a hold and none is elastic or the policy uses no elasticity)."""
    n = len(jobs)
    no_holds = not any(map(_HELD, jobs))  # a ``Hold`` is always true
    if no_holds and (policy.elastic is None or list(map(_ELASTIC, jobs)).count(None) == n):
        return np.zeros(n, dtype=np.bool_)
    return np.fromiter((has_own_path(policy, j) for j in jobs), np.bool_, n)


def _sublevels(columns: QueueColumns, policy: Policy, now: float) -> IntArray | None:
    """Each waiting job's level inside its class (``finer_levels``), read off its ``columns``."""
    if policy.order.by == Ordering.LAS:
        return las_queues(columns, policy, now)
    if bump_rule(policy) is None:
        return None
    left = columns.work / np.maximum(columns.gpus, 1)
    return np.fromiter(map(tier, left.tolist()), np.int64, len(columns))


def _standing_codes(
    jobs: list[Job], policy: Policy, now: float, klass: IntArray, levels: IntArray | None
) -> IntArray:
    """Each waiting job's standing (``_standing``) as one integer ordered as the standings
    are: its class, or under a finer standing (``finer_levels``) its class times the number of
    levels plus its level (``Tail._mark`` turns a code back). ``levels``: the jobs' levels,
    when the caller has them."""
    finer = finer_levels(policy)
    if finer is None:
        return klass
    if levels is None:
        levels = np.fromiter((own_standing(policy, j, now)[1] for j in jobs), np.int64, len(jobs))
    return klass * finer + levels

"""Admission: a placement against its queue's guaranteed and burst quota.

Contract. ``admit_placement`` reads the pass's ``quota`` and ``holdings`` and returns a ``Verdict``
(always yes without quotas); it changes nothing. ``charge`` adds a bound job's GPUs to
``holdings``; every bind and every growth goes through it.
"""

from __future__ import annotations

from boltforge.core.cycle.snapshot import gpus_by_pool
from boltforge.core.cycle.state import PassState
from boltforge.core.model.state import Grant
from boltforge.core.model.workload import Job
from boltforge.core.placement.answers import Placement
from boltforge.core.queueing.quota import Verdict, admit

_NO_QUOTA = Verdict(True, 0, "")  # every job's verdict where there are no quotas


def admit_placement(p: PassState, job: Job, placement: Placement) -> Verdict:
    """Check the placement's GPUs per pool against the job's queue's burst limits."""
    if p.quota is None:
        return _NO_QUOTA
    return admit(p.quota, p.holdings, job.queue, _demand(p, placement))


def _demand(p: PassState, placement: Placement) -> dict[str, int]:
    return gpus_by_pool(p.work.tree, placement.grants)


def charge(p: PassState, job: Job, grants: tuple[Grant, ...]) -> None:
    """Count ``grants``' GPUs per pool in what ``job``'s queue holds."""
    held = p.holdings.setdefault(job.queue, {})
    for pool, gpus in gpus_by_pool(p.work.tree, grants).items():
        held[pool] = held.get(pool, 0) + gpus

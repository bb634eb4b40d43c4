"""The three questions a placement can answer, as in Slurm: now, ever, and when and where."""

from __future__ import annotations

from boltforge.core.explain import diagnose
from boltforge.core.gang import Gang
from boltforge.core.placement import Decision, Outcome, place_gang
from boltforge.core.state import FleetState
from boltforge.core.topology import TopologyTree


def place_now(state: FleetState, gang: Gang) -> Decision:
    """Where ``gang`` would go on ``state`` right now; ``state`` is not changed."""
    placement, failed = place_gang(state, gang)
    if placement is not None:
        return Decision(Outcome.NOW, placement)
    assert failed is not None
    return diagnose(state, gang, failed, never=False)


def could_ever_fit(tree: TopologyTree, gang: Gang) -> Decision:
    """Whether ``gang`` fits the empty fleet; NEVER means reject it at submit."""
    empty = FleetState(tree)
    placement, failed = place_gang(empty, gang)
    if placement is not None:
        return Decision(Outcome.NOW, placement)
    assert failed is not None
    return diagnose(empty, gang, failed, never=True)


def when_and_where(state: FleetState, gang: Gang, now: float) -> Decision:
    """When and where ``gang`` would start if running jobs end as expected and nothing else comes.

    Releases running allocations in order of expected end and finds, by bisection over that
    order (more free capacity never makes a gang unplaceable), the earliest end after which the
    gang fits. Jobs without an expected end are assumed to run forever. ``waits_for`` names the
    running jobs on the hosts the placement uses (their GPUs, CPUs or memory are needed).
    """
    current = place_now(state, gang)
    if current.placed:
        return Decision(Outcome.NOW, current.placement, start_time=now)
    ever = could_ever_fit(state.tree, gang)
    if ever.outcome == Outcome.NEVER:
        return ever
    ending = sorted(
        (a for a in state.allocations.values() if a.expected_end is not None),
        key=lambda a: (a.expected_end, a.job),
    )
    lo, hi = 0, len(ending)
    found = None
    while lo < hi:
        mid = (lo + hi) // 2
        trial = state.copy()
        trial.release_many([a.job for a in ending[: mid + 1]])
        placement, _ = place_gang(trial, gang)
        if placement is not None:
            found, hi = (mid, placement), mid
        else:
            lo = mid + 1
    if found is None:
        reasons = (*current.reasons, "it does not fit even after every job with a known end ends")
        return Decision(Outcome.NOT_NOW, reasons=reasons, fixes=current.fixes)
    k, placement = found
    end = ending[k].expected_end
    assert end is not None
    hosts = {g.host for g in placement.grants}
    waits = tuple(a.job for a in ending[: k + 1] if any(g.host in hosts for g in a.grants))
    fixes = tuple(f for f in current.fixes if not f.startswith("wait"))
    return Decision(Outcome.LATER, placement, current.reasons, fixes, max(end, now), waits)

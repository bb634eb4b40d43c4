"""The three questions a placement can answer, as in Slurm: now, ever, and when and where."""

from __future__ import annotations

from itertools import chain

import numpy as np

from boltforge.core.model.gang import Gang, Role
from boltforge.core.model.state import Allocation, FleetState
from boltforge.core.model.topology import TopologyTree
from boltforge.core.placement.explain import diagnose
from boltforge.core.placement.hostfit import eligible_hosts
from boltforge.core.placement.place import Decision, Outcome, Placement, place_gang
from boltforge.core.sharing.place import decide, is_shared


def place_now(state: FleetState, gang: Gang, explain: bool = True) -> Decision:
    """Where ``gang`` would go on ``state`` right now; ``state`` is not changed.

    ``explain=False`` leaves a failure's reasons and fixes empty (the outcome is the same:
    NEVER when no pool matches the gang's capability, else NOT_NOW), for callers that act on
    the outcome alone."""
    if is_shared(gang):
        return decide(state, gang)
    placement, failed = place_gang(state, gang)
    if placement is not None:
        return Decision(Outcome.NOW, placement)
    assert failed is not None
    if not explain:
        matched = eligible_hosts(state, failed).any()
        return Decision(Outcome.NOT_NOW if matched else Outcome.NEVER)
    return diagnose(state, gang, failed, never=False)


def could_ever_fit(tree: TopologyTree, gang: Gang) -> Decision:
    """Whether ``gang`` fits the empty fleet; NEVER means reject it at submit."""
    empty = FleetState(tree)
    if is_shared(gang):
        return decide(empty, gang)
    placement, failed = place_gang(empty, gang)
    if placement is not None:
        return Decision(Outcome.NOW, placement)
    assert failed is not None
    return diagnose(empty, gang, failed, never=True)


def fits_empty(tree: TopologyTree, gang: Gang) -> bool:
    """Whether a gang of this shape fits the empty fleet (remembered per fleet and shape)."""
    key = ("fits-empty", gang.shape)
    known = tree.answer_cache.get(key)
    if known is None:
        known = could_ever_fit(tree, gang).outcome != Outcome.NEVER
        tree.answer_cache[key] = known
    return bool(known)


def when_and_where(state: FleetState, gang: Gang, now: float, explain: bool = True) -> Decision:
    """When and where ``gang`` would start if running jobs end as expected and nothing else comes.

    Releases running allocations in order of expected end and finds the earliest end after
    which the gang fits: the search starts where enough GPUs would be free at all, gallops
    forward and then bisects (more free capacity never makes a gang unplaceable). Jobs without
    an expected end are assumed to run forever. ``waits_for`` names the running jobs on the
    hosts the placement uses (their GPUs, CPUs or memory are needed). ``explain`` as in
    ``place_now``.
    """
    current = place_now(state, gang, explain)
    if current.placed:
        return Decision(Outcome.NOW, current.placement, start_time=now)
    if is_shared(gang):
        return current  # shares are not promised a time (``core/sharing``)
    if not fits_empty(state.tree, gang):
        return could_ever_fit(state.tree, gang)
    ends = _ending(state)
    ending = ends.allocations
    found = _earliest(state, gang, ends)
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


def _earliest(state: FleetState, gang: Gang, ends: _Ending) -> tuple[int, Placement] | None:
    """Smallest ``k`` such that ``gang`` fits once ``ending[: k + 1]`` (``ends``) are
    released, with the placement then; None if it never does. Before the first ``k`` at which
    enough GPUs are free in total nothing can fit, so the search starts there, doubles its
    step until the gang fits and bisects the last step."""
    ending = ends.allocations
    short = gang.total_gpus - int(state.free[~state.cordoned].sum())
    first = int(np.searchsorted(ends.freed(), short)) if short > 0 else 0
    first = max(first, _replica_bound(state, gang, ends))
    if first >= len(ending):
        return None
    done, step = first - 1, 1  # the gang does not fit once ending[: done + 1] are released
    while done + 1 < len(ending):
        k = min(done + step, len(ending) - 1)
        placement, _ = place_gang(ends.released_to(state, k), gang)
        if placement is not None:
            return _bisect(state, gang, ends, done, (k, placement))
        done, step = k, step * 2
    return None


def _replica_bound(state: FleetState, gang: Gang, ends: _Ending) -> int:
    """Smallest ``k`` at which, counting free GPUs alone, the open hosts that may take each
    role could hold all its replicas once ``ending[: k + 1]`` (``ends``) are released
    (``len(ending)``: never). Each replica sits on one host, so a host with ``f`` free GPUs
    holds at most ``f // gpus`` of them; islands, CPUs and memory can only lower that, so
    before this ``k`` the gang cannot fit and the search may skip it."""
    bound = 0
    for role in gang.roles:
        if not role.gpus:
            continue
        open_hosts = eligible_hosts(state, role) & ~state.cordoned
        have = int((state.host_free[open_hosts] // role.gpus).sum())
        if have < role.replicas:
            released = ends.released()
            if not released[0].size:
                return 0  # nothing with GPUs ends: the search itself finds it never fits
            k = _slots_reached(state.host_free, open_hosts, released, role)
            bound = max(bound, len(ends.allocations) if k is None else k)
    return bound


def _slots_reached(
    free: np.ndarray,
    open_hosts: np.ndarray,
    released: Released,
    role: Role,
) -> int | None:
    """The first ``k`` at which the open hosts' replica slots (``free // gpus``), as the
    released grants come back, add up to ``role.replicas``; None if they never do.

    The grants are in the order they come back, each with what its host got back up to and
    including it (``Released``), so a host's free GPUs after each grant are its free GPUs
    now plus that, and the slots the grant adds are read off directly."""
    ks, hosts, counts, since = released
    mine = open_hosts[hosts]
    if not mine.any():
        return None
    ks, hosts, counts, since = ks[mine], hosts[mine], counts[mine], since[mine]
    after = free[hosts] + since
    gained = after // role.gpus - (after - counts) // role.gpus
    slots = int((free[open_hosts] // role.gpus).sum()) + np.cumsum(gained)
    i = int(np.searchsorted(slots, role.replicas))
    return int(ks[i]) if i < len(slots) else None


def _bisect(
    state: FleetState,
    gang: Gang,
    ends: _Ending,
    done: int,
    found: tuple[int, Placement],
) -> tuple[int, Placement]:
    """Narrow ``found`` (the gang fits at its ``k``, not at ``done``) to the smallest ``k``."""
    while found[0] - done > 1:
        mid = (done + found[0]) // 2
        placement, _ = place_gang(ends.released_to(state, mid), gang)
        if placement is not None:
            found = (mid, placement)
        else:
            done = mid
    return found


def by_end(state: FleetState) -> list[Allocation]:
    """Running allocations with a known end, soonest first (ties in allocation order).
    Remembered in ``state.memo`` until the allocations change; callers must not change it."""
    return _ending(state).allocations


# Every grant with GPUs of the allocations by end, in the order they end: its position in
# the list, its host, its GPUs, and the GPUs its host got back up to and including it.
Released = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


class _Ending:
    """``by_end``'s allocations, with what ``when_and_where`` derives from them, each made
    when first asked for: the GPUs freed as they end (cumulative), every grant with GPUs
    (``Released``), and the states with the first of them released (``released_to``). It
    belongs to one state of the allocations (``_ending``)."""

    __slots__ = ("_freed", "_released", "_states", "allocations")

    def __init__(self, allocations: list[Allocation]) -> None:
        self.allocations = allocations
        self._freed: np.ndarray | None = None
        self._released: Released | None = None
        self._states: dict[int, FleetState] = {}  # ``released_to`` by ``k``

    def released_to(self, state: FleetState, k: int) -> FleetState:
        """``state`` (whose allocations these are) with ``allocations[: k + 1]`` released,
        its cordons and degraded hosts as ``state``'s now; read it, never change it.

        Made once per ``k`` and shared by every search on this state of the allocations:
        from the nearest ``k`` made below it (or ``state``), releasing the rest in order, so
        each host's counts take the same additions in the same order, and hold the same
        numbers, as releasing them all at once or in any other steps."""
        made = self._states.get(k)
        if made is None:
            below = max((j for j in self._states if j < k), default=-1)
            made = (self._states[below] if below >= 0 else state).copy()
            made.memo = {}  # what it remembers is stale once it releases
            made.release_many([a.job for a in self.allocations[below + 1 : k + 1]])
            self._states[k] = made
        made.cordoned = state.cordoned.copy()
        made.degraded = state.degraded.copy()
        return made

    def freed(self) -> np.ndarray:
        if self._freed is None:
            self._freed = np.cumsum([a.gpus for a in self.allocations], dtype=np.int64)
        return self._freed

    def released(self) -> Released:
        if self._released is None:
            ending = self.allocations
            sizes = np.fromiter(map(len, (a.spread for a in ending)), np.int64, len(ending))
            pairs = chain.from_iterable(chain.from_iterable(a.spread for a in ending))
            hosts_counts = np.fromiter(pairs, np.int64).reshape(-1, 2)
            ks = np.repeat(np.arange(len(ending), dtype=np.int64), sizes)
            hosts, counts = hosts_counts[:, 0], hosts_counts[:, 1]
            self._released = (ks, hosts, counts, _running_by_group(hosts, counts))
        return self._released


def _ending(state: FleetState) -> _Ending:
    """The running allocations by end for ``state``, made once per state of its allocations
    (``state.memo``)."""
    memo = state.memo.get("ending")
    if memo is not None and memo[0] == state.changes:
        found: _Ending = memo[1]
        return found
    known = [a for a in state.allocations.values() if a.expected_end is not None]
    ends = np.fromiter((a.expected_end for a in known), dtype=np.float64, count=len(known))
    made = _Ending([known[i] for i in np.argsort(ends, kind="stable")])
    state.memo["ending"] = (state.changes, made)
    return made


def _running_by_group(groups: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """For each entry, the sum of ``counts`` over the entries of its group up to and
    including it, in the order given."""
    if not groups.size:
        return counts.copy()
    by_group = np.argsort(groups, kind="stable")
    sorted_counts = counts[by_group]
    total = np.cumsum(sorted_counts)
    g = groups[by_group]
    starts = np.flatnonzero(np.r_[True, g[1:] != g[:-1]])
    before = np.repeat(total[starts] - sorted_counts[starts], np.diff(np.r_[starts, len(g)]))
    out = np.empty_like(counts)
    out[by_group] = total - before
    return out

"""Lookahead placement: place a gang so that the jobs queued right behind it still fit.

The engine places one gang at a time on its cheapest placement. That can strand the next job:
a two-host gang takes half of the only rack with four free hosts because the other rack's free
GPUs are fragmented (its replicas would leave their rail there), and the four-host
``required: rack`` job behind it no longer fits anywhere. ``place_with_lookahead`` plans the
gang together with the next ``depth`` pending jobs.

Contract. For a gang, the ``window`` (``upcoming[:depth]``, in order) and a *choice* (a
placement of the gang, or none), *the jobs placed after the choice* are those the engine places
when the choice is allocated on a scratch copy of ``state`` and every window job is then offered
to ``place_gang`` in order, each allocated as soon as it places; a job that does not place is
skipped and the next is offered (as the cycle does with backfill). The engine's choice
*strands* a window job when that job is placed with the gang left out but not after the choice.

- ``place_with_lookahead`` returns None exactly when ``place_gang`` does, and the engine's own
  placement whenever that strands nothing (in particular when ``depth <= 0`` or the window is
  empty). Otherwise it tries at most ``max_alternatives`` alternative placements of the gang,
  each the engine's placement with some hosts fenced off on a scratch copy, and returns the one
  after which the most window jobs are placed, the lowest total cost (the gang's cost plus that
  of the placed window jobs) on equal counts, the earliest tried on equal costs. An
  alternative must place strictly more window jobs than the engine's choice to replace it.
  Whatever it returns is valid on ``state`` (only free, uncordoned capacity, every topology
  rule of the gang kept); ``state`` is never changed; the same inputs give the same answer.

Alternatives are the engine's own placement of the gang on a scratch copy with some hosts
fenced off (cordoned), tried in this order until the budget is spent:

1. every host the window jobs take when the gang is left out;
2. only the hosts of the stranded jobs;
3. the hosts the engine chose for the gang;
4. the whole racks of the stranded jobs' hosts;
5. everything outside one rack (or, for a gang the engine spread over racks, one pod), for each
   rack or pod whose free GPUs could hold the gang, the tightest first (best fit: the roomiest
   domains are the ones bigger jobs behind it need), skipping those the engine chose.

A fence that cordons nothing new is skipped; identical placements are priced once.

Cost. When nothing is stranded: one ``place_gang`` per window job (plus one for the gang itself
unless the caller passes ``engine``) and, when some window job does not place, one more per
window job for the run without the gang. When something is stranded: up to ``max_alternatives``
more ``place_gang`` calls for the alternatives and up to one window run of ``depth`` calls for
each distinct alternative (cut short once it can no longer win). Lookahead is only worth
calling when ``upcoming`` is non-empty and the gang spans more than one host or the fleet is
tight; the cycle calls it only for the first ``policy.placement.lookahead`` jobs of its order.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from boltforge.core.model.gang import Gang
from boltforge.core.model.levels import Level
from boltforge.core.model.state import Allocation, FleetState
from boltforge.core.model.topology import BoolArray, IntArray
from boltforge.core.placement.answers import Placement
from boltforge.core.placement.place import domain_column, place_gang

# How many alternative placements of the gang may be searched per call.
DEFAULT_ALTERNATIVES = 6
# Allocation names for scratch placements; no real job id starts with a NUL character.
_SCRATCH = "\x00lookahead"

__all__ = ["DEFAULT_ALTERNATIVES", "place_with_lookahead"]


@dataclass(frozen=True, slots=True)
class _Run:
    """What follows one choice: the window jobs placed (by index, with their hosts) and the
    total cost of the choice and those jobs."""

    placed: dict[int, frozenset[int]]
    cost: float


def place_with_lookahead(
    state: FleetState,
    gang: Gang,
    upcoming: Sequence[Gang],
    depth: int,
    *,
    max_alternatives: int = DEFAULT_ALTERNATIVES,
    engine: Placement | None = None,
) -> Placement | None:
    """A placement of ``gang`` on ``state`` that strands as few of ``upcoming[:depth]`` as it
    can find (see the module docstring for the exact contract); ``state`` is not changed.

    ``engine`` is ``place_gang(state, gang)``'s placement when the caller already has it (for
    example from ``place_now``); it is computed when None.
    """
    own = engine if engine is not None else place_gang(state, gang)[0]
    window = tuple(upcoming[: max(depth, 0)])
    if own is None or not window:
        return own
    return _choose(state, gang, own, window, max_alternatives)[0]


def _choose(
    state: FleetState, gang: Gang, own: Placement, window: tuple[Gang, ...], budget: int
) -> tuple[Placement, _Run]:
    """The lookahead's choice and what follows it, starting from the engine's ``own``."""
    mine = _run(state, own, window)
    assert mine is not None
    if len(mine.placed) == len(window):
        return own, mine
    without = _run(state, None, window)
    assert without is not None
    stranded = [i for i in sorted(without.placed) if i not in mine.placed]
    if not stranded:
        return own, mine
    best, best_run = own, mine
    for alt in _alternatives(state, gang, own, without, stranded, budget):
        if best is own:  # to replace the engine's choice an alternative must place more
            run = _run(state, alt, window, len(mine.placed) + 1)
        else:  # to replace another alternative: as many, for less
            run = _run(state, alt, window, len(best_run.placed), best_run.cost)
        if run is not None:
            best, best_run = alt, run
    return best, best_run


def _run(
    state: FleetState,
    choice: Placement | None,
    window: tuple[Gang, ...],
    need: int = 0,
    dearer: float = math.inf,
) -> _Run | None:
    """Place ``choice`` then the window in order on a scratch copy (see the module docstring).

    Returns None as soon as the run cannot beat ``need`` placed jobs at a total cost below
    ``dearer``: a run wins with more than ``need`` jobs, or with ``need`` for less than
    ``dearer`` (costs only grow as jobs are added, so the run is cut short either way).
    """
    work = state.copy()
    cost = 0.0
    if choice is not None:
        work.allocate(Allocation(f"{_SCRATCH}/choice", choice.grants))
        cost = choice.cost.total
    placed: dict[int, frozenset[int]] = {}
    for i, job in enumerate(window):
        if _hopeless(len(placed) + len(window) - i, cost, need, dearer):
            return None
        placement, _ = place_gang(work, job)
        if placement is None:
            continue
        work.allocate(Allocation(f"{_SCRATCH}/{i}", placement.grants))
        placed[i] = frozenset(g.host for g in placement.grants)
        cost += placement.cost.total
    return None if _hopeless(len(placed), cost, need, dearer) else _Run(placed, cost)


def _hopeless(most: int, cost: float, need: int, dearer: float) -> bool:
    """Whether a run that can place at most ``most`` jobs and already costs ``cost`` loses."""
    return most < need or (most == need and cost >= dearer - 1e-9)


def _alternatives(
    state: FleetState,
    gang: Gang,
    own: Placement,
    without: _Run,
    stranded: list[int],
    budget: int,
) -> Iterator[Placement]:
    """Distinct placements of ``gang``, other than ``own``, from at most ``budget`` searches."""
    seen = {own.grants}
    tried: set[bytes] = set()
    for fence in _fences(state, gang, own, without, stranded):
        key = np.packbits(fence).tobytes()
        if key in tried or not (fence & ~state.cordoned).any():
            continue
        if budget <= 0:
            return
        budget -= 1
        tried.add(key)
        scratch = state.copy()
        scratch.cordoned |= fence
        alt, _ = place_gang(scratch, gang)
        if alt is not None and alt.grants not in seen:
            seen.add(alt.grants)
            yield alt


def _fences(
    state: FleetState, gang: Gang, own: Placement, without: _Run, stranded: list[int]
) -> Iterator[BoolArray]:
    """Host masks to fence off before searching again, most targeted first."""
    tree = state.tree
    n = len(tree.hosts)
    wanted = sorted(frozenset[int]().union(*without.placed.values()))
    yield _mask(n, wanted)
    needed = sorted(frozenset[int]().union(*(without.placed[i] for i in stranded)))
    yield _mask(n, needed)
    hosts = sorted({g.host for g in own.grants})
    yield _mask(n, hosts)
    yield np.isin(tree.host_rack, tree.host_rack[needed])
    level = Level.RACK if len(set(tree.host_rack[hosts].tolist())) == 1 else Level.POD
    column = domain_column(tree, level)
    for domain in _roomy(state, gang, column, set(column[hosts].tolist())):
        yield column != domain


def _roomy(state: FleetState, gang: Gang, column: IntArray, skip: set[int]) -> list[int]:
    """Domains (by ``column``) whose free, uncordoned GPUs could hold the gang, tightest first."""
    free = np.where(state.cordoned, 0, state.free_gpus_per_host())
    per_domain = np.bincount(column, weights=free, minlength=int(column.max()) + 1)
    fits = [int(d) for d in np.flatnonzero(per_domain >= gang.total_gpus) if int(d) not in skip]
    return sorted(fits, key=lambda d: (per_domain[d], d))


def _mask(n: int, hosts: list[int]) -> BoolArray:
    out = np.zeros(n, dtype=np.bool_)
    out[hosts] = True
    return out

"""Start now on a wide placement, or soon on a tight one.

A gang whose best free placement crosses a wider level than the empty fleet would give it
(racks where one rack would hold it, pods where one pod would) runs its collectives over the
slower links for its whole run. Its step time, by the widest level its rings cross, is
``STEP_FACTOR`` times that of a gang inside one rack: the published step times of
data-parallel training (about 1.5x across racks through the spine, 2.2x across pods); the
simulator charges the same (``boltforge/sim/execution.py`` reads them from here).

With ``T`` the gang's expected runtime on a tight placement, starting wide now finishes at
``now + T * factor``, and waiting for the earliest tight placement at ``start + T``. Waiting
pays when ``start + T < now + T * factor``, so a gang waits at most ``T * (factor - 1)``: half
its runtime across racks, more across pods. A gang with no expected runtime starts now: there
is nothing to weigh.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from boltforge.core.model.gang import Gang
from boltforge.core.model.levels import Level
from boltforge.core.model.state import FleetState
from boltforge.core.model.topology import TopologyTree
from boltforge.core.placement.answers import Placement
from boltforge.core.placement.place import place_gang

STEP_FACTOR = {"host": 1.0, "rack": 1.0, "pod": 1.5, "spine": 2.2}
_LEVEL = {"rack": Level.RACK, "pod": Level.POD, "spine": Level.SPINE}


def widest(hops: Mapping[str, int]) -> str:
    """The widest level a placement's rings cross (``placement.cost.hops``): host (one
    host), rack (hosts of one rack), pod (racks of one pod) or spine (pods)."""
    for level in ("spine", "pod", "rack"):
        if hops.get(level, 0) > 0:
            return level
    return "host"


@dataclass(frozen=True, slots=True)
class Tighter:
    """A tighter placement worth asking for: ``gang`` required inside one domain of the level
    the empty fleet places it in, and how many times slower the wide placement would run."""

    gang: Gang
    factor: float
    level: str


def tighter(tree: TopologyTree, gang: Gang, placement: Placement) -> Tighter | None:
    """The tight form of ``gang`` when ``placement`` runs slower than the empty fleet's
    placement of it would (None: it is as tight as the fleet allows, or the gang already
    requires a domain)."""
    now = widest(placement.cost.hops)
    if STEP_FACTOR[now] <= 1.0 or gang.topology.required is not None:
        return None  # full speed already, or inside the domain the gang asked for
    ideal = ideal_widest(tree, gang)
    factor = STEP_FACTOR[now] / STEP_FACTOR[ideal]
    if factor <= 1.0 or ideal == "host":
        return None
    rule = replace(gang.topology, required=_LEVEL[ideal])
    return Tighter(replace(gang, topology=rule), factor, ideal)


def ideal_widest(tree: TopologyTree, gang: Gang) -> str:
    """The widest level the empty fleet's placement of ``gang`` crosses (remembered per fleet
    and shape); ``spine`` when it does not fit at all."""
    key = ("ideal-widest", gang.shape)
    known = tree.answer_cache.get(key)
    if known is None:
        placement, _ = place_gang(FleetState(tree), gang)
        known = "spine" if placement is None else widest(placement.cost.hops)
        tree.answer_cache[key] = known
    return str(known)


def worth_waiting(runtime: float, factor: float, start: float, now: float) -> bool:
    """Whether starting tight at ``start`` finishes before starting ``factor`` times slower
    now, for a gang of expected ``runtime``."""
    return start + runtime < now + runtime * factor

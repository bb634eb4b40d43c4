"""Restart one host, not the whole job: place a gang that lost hosts on the GPUs it kept,
replacing only the lost replicas with the closest healthy hosts.

A job whose host failed requeues with a ``Hold`` (``workload.Hold``): the GPUs its replicas
held on the healthy hosts, kept from other jobs for a short while. ``recover`` answers where
it restarts:

1. **Keep** each held replica on its host and GPUs (its rank too), unless that host is now
   cordoned, or degraded while the role talks to peers.
2. **Replace** each role's missing replicas with a placement of just those replicas, searched
   by the ordinary engine (``plan_role``) on the hosts near the kept ones: first the kept
   hosts' racks, then their pods, then anywhere the gang's topology rule allows. Inside that
   scope the engine's own cost and best fit choose, so the replacement is the closest
   healthy host with room.
3. **Price** the combined placement exactly (``cost.role_cost``) and explain it: "replaced
   host-3 by host-5 (same rack), kept host-0..2".

The caller (the cycle) releases the hold into its scratch state first, and falls back to a
fresh placement when ``recover`` finds none.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from boltforge.core.model.gang import Gang, Role
from boltforge.core.model.levels import Level
from boltforge.core.model.state import Allocation, Conflict, FleetState, Grant
from boltforge.core.model.topology import TopologyTree
from boltforge.core.model.workload import Hold
from boltforge.core.placement import crossing as costs
from boltforge.core.placement.answers import Placement, RolePlan
from boltforge.core.placement.hostfit import eligible_hosts, talks
from boltforge.core.placement.place import domain_column, role_order
from boltforge.core.placement.roleplan import plan_role

# Where replacements are looked for, nearest first.
_SCOPES = (Level.RACK, Level.POD, Level.SPINE)


def recover(state: FleetState, gang: Gang, hold: Hold) -> Placement | None:
    """The gang's placement on its held GPUs plus the closest replacements for the rest, or
    None (nothing kept is usable, the hold does not match the gang's shape, or no
    replacement fits near enough for the gang's topology rule). ``state`` has the hold
    released and is not changed."""
    tree = state.tree
    kept = _usable(state, gang, hold.allocation.grants)
    if not kept:
        return None
    work = state.copy()
    try:
        work.allocate(Allocation("recovering", tuple(g for gs in kept.values() for g in gs)))
    except Conflict:
        return None
    anchors = sorted({g.host for gs in kept.values() for g in gs})
    plans: list[RolePlan] = []
    added: list[Grant] = []
    for role in role_order(gang):  # the engine's order, so ranks keep their numbers
        mine = kept.get(role.name, [])
        new = _replace(work, gang, role, mine, anchors)
        if new is None:
            return None
        if new:
            work.allocate(Allocation(f"recovering/{role.name}", tuple(new)))
            added += new
        grants = sorted([*mine, *new], key=lambda g: g.replica)
        plans.append(_role_plan(tree, role, grants))
    total = costs.ZERO
    for p in plans:
        total = costs.add(total, p.cost)
    note = describe(tree, [g for gs in kept.values() for g in gs], added, hold.lost)
    return Placement(gang.name, tuple(plans), total, (note,))


def _usable(state: FleetState, gang: Gang, grants: tuple[Grant, ...]) -> dict[str, list[Grant]]:
    """Held grants per role that may be kept: their role exists with that size, ranks are in
    range and distinct, and the host still takes the role's work. Empty when the hold does
    not fit the gang at all."""
    roles = {r.name: r for r in gang.roles}
    out: dict[str, list[Grant]] = {}
    for g in grants:
        role = roles.get(g.role)
        if role is None or len(g.gpus) != role.gpus or not 0 <= g.replica < role.replicas:
            return {}
        if state.cordoned[g.host] or (talks(role) and state.degraded[g.host]):
            continue
        out.setdefault(g.role, []).append(g)
    for gs in out.values():
        if len({g.replica for g in gs}) != len(gs):
            return {}
    return out


def _replace(
    work: FleetState, gang: Gang, role: Role, kept: list[Grant], anchors: list[int]
) -> list[Grant] | None:
    """Grants for ``role``'s replicas missing from ``kept``, on the nearest scope around
    ``anchors`` that holds them (numbered with the missing ranks), or None."""
    missing = sorted(set(range(role.replicas)) - {g.replica for g in kept})
    if not missing:
        return []
    eligible = eligible_hosts(work, role)  # the whole role's rule (degraded hosts, pools)
    if kept and role.gpus:  # GPU models never mix inside a role
        eligible &= work.tree.hosts_of_type[work.tree.pool_of(kept[0].host).gpu_type]
    part = replace(role, replicas=len(missing))
    cap = gang.topology.required or Level.SPINE
    hosts = np.array(anchors, dtype=np.int64)
    for scope in _SCOPES:
        if scope > cap:
            break
        column = domain_column(work.tree, scope)
        plan = plan_role(work, part, eligible & np.isin(column, column[hosts]), cap)
        if plan is not None:
            ordered = sorted(plan.grants, key=lambda g: g.replica)
            return [replace(g, replica=r) for g, r in zip(ordered, missing, strict=True)]
    return None


def _role_plan(tree: TopologyTree, role: Role, grants: list[Grant]) -> RolePlan:
    """A ``RolePlan`` for ``grants``: the smallest domain holding them, the exact cost."""
    hosts = sorted({g.host for g in grants})
    level = Level.HOST if len(hosts) <= 1 else Level.SPINE
    for scope in (Level.RACK, Level.POD):
        if level == Level.SPINE and len(set(domain_column(tree, scope)[hosts].tolist())) == 1:
            level = scope
    domain = tree.domain_name(level, tree.domain_of(hosts[0], level)) if hosts else ""
    gpu_type = tree.pool_of(hosts[0]).gpu_type if role.gpus and hosts else ""
    cost = costs.role_cost(tree, grants)
    return RolePlan(role.name, level, domain, tuple(grants), cost, (), gpu_type)


def describe(
    tree: TopologyTree, kept: list[Grant], added: list[Grant], lost: tuple[int, ...]
) -> str:
    """In words: "replaced host-3 by host-5 (same rack), kept host-0..2"."""
    names = tree.hosts
    new_hosts = list(dict.fromkeys(g.host for g in added))
    kept_names = span([names[h].name for h in sorted({g.host for g in kept})])
    if not new_hosts:
        return f"restarted on the hosts it kept ({kept_names})"
    parts = []
    for i, h in enumerate(new_hosts):
        old = lost[i] if i < len(lost) else (lost[-1] if lost else None)
        where = f" ({_nearness(tree, old, h)})" if old is not None else ""
        gone = names[old].name if old is not None else "a lost host"
        parts.append(f"{gone} by {names[h].name}{where}")
    return f"replaced {', '.join(parts)}, kept {kept_names}"


def _nearness(tree: TopologyTree, old: int, new: int) -> str:
    if tree.host_rack[old] == tree.host_rack[new]:
        return "same rack"
    if tree.host_pod[old] == tree.host_pod[new]:
        return "same pod"
    return "another pod"


def _numbered(name: str) -> tuple[str, str] | None:
    """``host-12`` as (``host-``, ``12``); None when the name ends in no number."""
    stem = name.rstrip("0123456789")
    return (stem, name[len(stem) :]) if len(stem) < len(name) else None


def span(names: list[str]) -> str:
    """Host names with runs of one prefix folded: ``host-0, host-1, host-2`` as ``host-0..2``
    (two in a row stay listed)."""
    runs: list[list[str]] = []
    last: tuple[str, int] | None = None
    for name in names:
        m = _numbered(name)
        key = (m[0], int(m[1])) if m else None
        if runs and key and last and key == (last[0], last[1] + 1):
            runs[-1].append(name)
        else:
            runs.append([name])
        last = key
    out: list[str] = []
    for run in runs:
        if len(run) > 2:
            m = _numbered(run[-1])
            out.append(f"{run[0]}..{m[1] if m else run[-1]}")
        else:
            out += run
    return ", ".join(out)

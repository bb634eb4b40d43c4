"""Placing replicas that ask for part of a GPU: MIG instances and fractional shares.

Each replica gets one share on one GPU, chosen in this order of preference:

1. a GPU already cut the right way: an idle MIG instance of the asked profile (declared by
   the pool's ``mig_layout`` or left by earlier work), or a fraction-mode GPU with room;
2. a MIG GPU with work on it that has unused slices where the instance can be added without
   touching a running instance;
3. an idle whole GPU, cut afresh (a re-carve, only ever on a GPU with no work) or opened for
   fractions, on the host with the fewest free GPUs so whole hosts stay whole.

Within a step, the GPU that already holds the most work wins (shares pack onto few GPUs).
Shares never sit beside an exclusive job: a shared GPU is taken whole in the fleet state.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

import numpy as np

from boltforge.core.model.gang import Gang, Role
from boltforge.core.model.levels import Level
from boltforge.core.model.state import Allocation, FleetState, Grant
from boltforge.core.model.topology import Pool, TopologyTree
from boltforge.core.placement.answers import Decision, Outcome, Placement, RolePlan
from boltforge.core.placement.crossing import LEVEL_KEYS, CostBreakdown
from boltforge.core.sharing import mig
from boltforge.core.sharing.share import FRACTION, MIG, GpuUse, Share, ShareAsk, room_for


@dataclass(frozen=True, slots=True)
class SharePlan:
    """Where a gang's shares go (``grants``, None when they do not all fit now), why
    (``notes``, one per replica), and ``never`` when no GPU of the fleet could ever hold one."""

    grants: tuple[Grant, ...] | None
    notes: tuple[str, ...] = ()
    never: bool = False


def is_shared(gang: Gang) -> bool:
    """Whether ``gang`` asks for parts of GPUs (every role then does; see the spec)."""
    return gang.shared


def model_of(pool: Pool) -> str | None:
    """The MIG model of ``pool``'s GPUs, None when the pool is not MIG-capable."""
    return mig.model_of(pool.gpu_type, pool.gpu_memory_gb) if pool.mig else None


def carve_now(pool: Pool, use: GpuUse | None) -> mig.Carve:
    """How a GPU of ``pool`` is cut now: the instances in use, plus the declared ones
    (``mig_layout``) that none of them overlaps."""
    model = model_of(pool)
    if model is None:
        return ()
    busy = use.instances if use is not None and use.mode == MIG else ()
    taken = mig.used_slices(model, busy)
    declared = _declared(model, pool.mig_layout) if pool.mig_layout else ()
    idle = tuple(i for i in declared if not taken & frozenset(i.slices(model)))
    return tuple(sorted((*busy, *idle)))


@lru_cache(maxsize=256)
def _declared(model: str, names: tuple[str, ...]) -> mig.Carve:
    """A pool's declared layout as a carve (made once per model and layout)."""
    return mig.layout(model, names)


def never_reason(state: FleetState, role: Role) -> str | None:
    """Why no GPU of the fleet could ever hold one replica of ``role``, or None."""
    ask = role.share
    assert ask is not None
    if any(_could_give(p, role, ask) for p in state.tree.pools):
        return None
    if ask.profile:
        return f"no MIG-capable pool{_with(role)} offers {ask.profile}"
    return f"no pool{_with(role)} has a GPU with {ask.memory_gb:g} GB of memory"


def _with(role: Role) -> str:
    described = role.capability.describe()
    return "" if described == "any GPU" else f" with {described}"


def place_shares(state: FleetState, gang: Gang) -> SharePlan:
    """A share for every replica of every role of ``gang`` on ``state`` (left unchanged)."""
    for role in gang.roles:
        why = never_reason(state, role)
        if why is not None:
            return SharePlan(None, (why,), never=True)
    work = state.copy()
    grants: list[Grant] = []
    notes: list[str] = []
    for role in gang.roles:
        for replica in range(role.replicas):
            found = _one(work, role, replica)
            if found is None:
                assert role.share is not None
                return SharePlan(None, (f"no GPU has room for {role.share.describe()} now",))
            grant, note = found
            work.allocate(Allocation(f"{gang.name}#{len(grants)}", (grant,)))
            grants.append(grant)
            notes.append(note)
    return SharePlan(tuple(grants), tuple(notes))


def _one(state: FleetState, role: Role, replica: int) -> tuple[Grant, str] | None:
    ask = role.share
    assert ask is not None
    if ask.profile:
        return _in_use(state, role, replica, MIG) or _idle(state, role, replica)
    return _in_use(state, role, replica, FRACTION) or _idle(state, role, replica)


def _hosts_ok(state: FleetState, role: Role, host: int) -> bool:
    pool = state.tree.pool_of(host)
    return (
        not state.cordoned[host]
        and role.capability.accepts(pool, True)
        and state.free_cpus[host] + 1e-9 >= role.cpus
        and state.free_memory[host] + 1e-9 >= role.memory_gb
    )


def _in_use(state: FleetState, role: Role, replica: int, mode: str) -> tuple[Grant, str] | None:
    """Steps 1 and 2 on GPUs that already hold shares of ``mode``, fullest GPU first."""
    ask = role.share
    assert ask is not None
    ranked = sorted(
        (k for k, use in state.shared.items() if use.mode == mode),
        key=lambda k: (-_load(state.shared[k]), k),
    )
    extend: tuple[Grant, str] | None = None
    for host, gpu in ranked:
        if not _hosts_ok(state, role, host):
            continue
        pool = state.tree.pool_of(host)
        use = state.shared[(host, gpu)]
        name = state.tree.hosts[host].name
        if mode == FRACTION:
            share = _fraction_share(pool, ask, gpu)
            if room_for(use, share, None, pool.gpu_memory_gb) is None:
                note = f"{share.describe()} on {name}, beside {len(use.shares)} other share(s)"
                return _grant(role, replica, host, share), note
            continue
        model = model_of(pool)
        if model is None or ask.profile not in mig.MODELS[model]:
            continue
        carve = carve_now(pool, use)
        idle = _idle_instance(carve, use, ask.profile)
        if idle is not None:
            share = _mig_share(model, gpu, idle)
            return _grant(role, replica, host, share), f"{share.describe()} on {name}: " + (
                "an idle instance already cut that way"
            )
        if extend is None:
            inst = mig.add(model, carve, ask.profile)
            if inst is not None:
                share = _mig_share(model, gpu, inst)
                note = (
                    f"{share.describe()} on {name}: a new instance in unused slices beside "
                    f"{mig.describe(use.instances)}; running instances untouched"
                )
                extend = (_grant(role, replica, host, share), note)
    return extend


def _idle(state: FleetState, role: Role, replica: int) -> tuple[Grant, str] | None:
    """Step 3 (and step 1 for idle GPUs cut as the pool declares): an idle whole GPU on the
    host with the fewest free GPUs, preferring a pool already cut the right way."""
    ask = role.share
    assert ask is not None
    best: tuple[tuple[int, int, int], int, Share, str] | None = None
    for p, pool in enumerate(state.tree.pools):
        if not _could_give(pool, role, ask):
            continue
        found = _idle_in_pool(state, role, ask, p, pool)
        if found is not None and (best is None or found[0] < best[0]):
            best = found
    if best is None:
        return None
    _, host, share, note = best
    return _grant(role, replica, host, share), note


def _idle_in_pool(
    state: FleetState, role: Role, ask: ShareAsk, p: int, pool: Pool
) -> tuple[tuple[int, int, int], int, Share, str] | None:
    model = model_of(pool)  # the caller checked that the pool could give the share
    ok = (
        (state.tree.host_pool == p)
        & ~state.cordoned
        & (state.host_free > 0)
        & (state.free_cpus + 1e-9 >= role.cpus)
        & (state.free_memory + 1e-9 >= role.memory_gb)
    )
    hosts = np.flatnonzero(ok)
    if not hosts.size:
        return None
    host = int(hosts[np.argmin(state.host_free[hosts])])
    gpu = _quietest_gpu(state, host)
    name = state.tree.hosts[host].name
    if not ask.profile:
        share = _fraction_share(pool, ask, gpu)
        rank = 1 if pool.mig_layout else 0  # a GPU cut for MIG would have to be made whole
        return (
            (rank, int(state.host_free[host]), host),
            host,
            share,
            (f"{share.describe()} on {name}: an idle GPU opened for fractional shares"),
        )
    assert model is not None
    carve = carve_now(pool, None)
    inst = _idle_instance(carve, None, ask.profile)
    if inst is not None:
        how, rank = "an idle instance already cut that way", 0
    elif (inst := mig.add(model, carve, ask.profile)) is not None:
        how, rank = "a new instance in the idle GPU's unused slices", 1
    else:
        inst = mig.add(model, (), ask.profile)
        assert inst is not None
        was = mig.describe(carve) if carve else "whole"
        how, rank = f"re-carves the idle GPU (was {was}; no work on it)", 2
    share = _mig_share(model, gpu, inst)
    return (
        (rank, int(state.host_free[host]), host),
        host,
        share,
        (f"{share.describe()} on {name}: {how}"),
    )


def _idle_instance(carve: mig.Carve, use: GpuUse | None, profile: str) -> mig.Instance | None:
    busy = set(use.instances) if use is not None else set()
    return next((i for i in carve if i.profile == profile and i not in busy), None)


def _quietest_gpu(state: FleetState, host: int) -> int:
    """A free GPU of ``host`` in its fullest NVLink island (whole islands stay whole)."""
    free = np.flatnonzero(state.free[host])
    islands = state.tree.gpu_island[host, free]
    counts = state.island_free[host, islands]
    return int(free[np.argmin(counts)])


def _load(use: GpuUse) -> float:
    return sum(s.weight for _, s in use.shares)


def _mig_share(model: str, gpu: int, inst: mig.Instance) -> Share:
    prof = mig.profile(model, inst.profile)
    return Share(gpu, inst.profile, inst.start, 0.0, prof.memory_gb, prof.compute / 7)


def _fraction_share(pool: Pool, ask: ShareAsk, gpu: int) -> Share:
    memory = ask.memory_gb or ask.fraction * pool.gpu_memory_gb
    return Share(gpu, fraction=ask.fraction, memory_gb=memory, weight=ask.fraction)


def _grant(role: Role, replica: int, host: int, share: Share) -> Grant:
    return Grant(role.name, replica, host, (), role.cpus, role.memory_gb, role.storage_gb, share)


def as_placement(state: FleetState, job: str, gang: Gang, plan: SharePlan) -> Placement:
    """``plan`` (which fits) as a gang placement: one role plan per role, each inside a host
    or on several, at no crossing cost (replicas of shares do not talk over the fabric)."""
    assert plan.grants is not None
    tree = state.tree
    roles = []
    for role in gang.roles:
        grants = tuple(g for g in plan.grants if g.role == role.name)
        hosts = {g.host for g in grants}
        level = Level.HOST if len(hosts) == 1 else Level.SPINE
        domain = tree.hosts[grants[0].host].name if len(hosts) == 1 else "fleet"
        cost = CostBreakdown(dict.fromkeys(LEVEL_KEYS, 0), 0.0)
        gpu_type = tree.pool_of(grants[0].host).gpu_type
        roles.append(RolePlan(role.name, level, domain, grants, cost, (), gpu_type))
    zero = CostBreakdown(dict.fromkeys(LEVEL_KEYS, 0), 0.0)
    return Placement(job, tuple(roles), zero, plan.notes)


def decide(state: FleetState, gang: Gang) -> Decision:
    """``place_shares`` as a placement answer: NOW with the placement, NOT_NOW or NEVER with
    the reason (``core/placement/modes.py`` asks this for shared gangs)."""
    plan = place_shares(state, gang)
    if plan.grants is not None:
        return Decision(Outcome.NOW, as_placement(state, gang.name, gang, plan))
    if plan.never:
        fix = "ask for a profile or memory that a pool's GPUs offer, or add such a pool"
        return Decision(Outcome.NEVER, reasons=plan.notes, fixes=(fix,))
    return Decision(Outcome.NOT_NOW, reasons=plan.notes, fixes=("wait for shares to end",))


def whole_gpu_gang(tree: TopologyTree, gang: Gang) -> Gang:
    """``gang`` with each share made one whole GPU on the pools that could give the share:
    what a job of shares needs freed when it preempts (one idle GPU per replica holds any
    share)."""
    roles = []
    for role in gang.roles:
        ask = role.share
        assert ask is not None
        pools = frozenset(p.name for p in tree.pools if _could_give(p, role, ask))
        capability = replace(role.capability, pools=pools)
        roles.append(replace(role, gpus=1, share=None, capability=capability))
    return replace(gang, roles=tuple(roles))


def _could_give(pool: Pool, role: Role, ask: ShareAsk) -> bool:
    """Whether an idle GPU of ``pool`` could hold one replica of ``role`` (its ``ask``)."""
    if not role.capability.accepts(pool, True):
        return False
    if ask.profile:
        model = model_of(pool)
        return model is not None and ask.profile in mig.MODELS[model]
    return _fraction_share(pool, ask, 0).memory_gb <= pool.gpu_memory_gb

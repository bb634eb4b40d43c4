"""Why a gang landed where it did, or why it cannot start, in words a user can act on."""

from __future__ import annotations

import numpy as np

from boltforge.core.model.gang import Gang, Role
from boltforge.core.model.levels import Level
from boltforge.core.model.state import FleetState, Grant
from boltforge.core.model.topology import BoolArray, IntArray, TopologyTree
from boltforge.core.placement.hostfit import eligible_hosts, host_fit, talks
from boltforge.core.placement.place import Decision, Outcome, Placement


def describe(tree: TopologyTree, placement: Placement) -> list[str]:
    """Lines that say where each role went (and, on a fleet of several node classes, to which
    class and why), what it cost by level, and what it beat."""
    lines: list[str] = []
    w = tree.weights
    for plan in placement.roles:
        hosts = {g.host for g in plan.grants}
        gpus = sum(len(g.gpus) for g in plan.grants)
        what = f"{len(plan.grants)} replica(s)"
        if gpus:
            what += f", {gpus} x {plan.gpu_type}"
        lines.append(
            f"{plan.role}: {what} on {len(hosts)} host(s) inside {plan.level.label} {plan.domain}"
        )
        if plan.grants and len({p.kind for p in tree.pools}) > 1:
            lines.append("  " + node_class_words(tree, plan.grants[0]))
        parts = [f"{k} {n} x {getattr(w, k):g}" for k, n in plan.cost.hops.items() if n]
        lines.append(f"  cost {plan.cost.total:g} (" + (", ".join(parts) or "no hops") + ")")
        for alt in plan.alternatives:
            extra = alt.cost - plan.cost.total
            why = (
                f"costlier by {extra:g}"
                if extra > 1e-9
                else "equal cost; ties go to the tighter fit"
            )
            lines.append(
                f"  beat {alt.level.label} {alt.domain}: cost {alt.cost:g} on {alt.hosts} host(s)"
                f" ({why})"
            )
    lines.extend(placement.notes)
    if not placement.rail_aligned:
        lines.append(f"  {placement.cost.hops['rail']} replica(s) sit off their network rail")
    return lines


def need(role: Role) -> str:
    """What one replica of ``role`` needs, in a user's words."""
    parts = [
        f"{role.replicas} replica(s) of {role.gpus} GPU(s)"
        if role.gpus
        else f"{role.replicas} CPU-only replica(s)"
    ]
    if role.tensor_parallel > 1:
        parts.append(f"tensor-parallel groups of {role.tensor_parallel} inside one NVLink island")
    if role.cpus:
        parts.append(f"{role.cpus:g} CPUs each")
    if role.memory_gb:
        parts.append(f"{role.memory_gb:g} GB memory each")
    if role.storage_gb:
        parts.append(f"{role.storage_gb:g} GB local storage each")
    return "; ".join(parts)


def node_class_words(tree: TopologyTree, grant: Grant) -> str:
    """Which node class a replica went to, and why: what it asks for decides (GPUs: gpu;
    local storage: storage; else cpu, on GPU nodes' spare CPUs when no CPU node could)."""
    pool = tree.pools[tree.hosts[grant.host].pool]
    if grant.gpus:
        why = "it asks for GPUs"
    elif grant.storage_gb:
        why = f"it asks for {grant.storage_gb:g} GB of local storage"
    elif pool.kind == "cpu":
        why = "it asks for no GPUs and no local storage"
    else:
        why = "it asks for no GPUs; no CPU node could take it, so it uses spare CPUs here"
    return f"node class {pool.kind} (pool {pool.name}): {why}"


def diagnose(state: FleetState, gang: Gang, role: Role, never: bool) -> Decision:
    """Explain why ``role`` of ``gang`` cannot be placed on ``state``.

    ``never`` says the question was "could it ever fit" (``state`` is then the empty fleet), so
    the outcome is NEVER; otherwise NOT_NOW unless the capability matches nothing at all.
    """
    tree = state.tree
    eligible = eligible_hosts(state, role)
    if not eligible.any():
        reasons, fixes = _capability(tree, role)
        return Decision(Outcome.NEVER, reasons=tuple(reasons), fixes=tuple(fixes))
    fit = host_fit(state, role, eligible, role.replicas)
    reasons = [f"role {role.name} needs {need(role)}"]
    reasons += _levels(state, role, eligible, fit.slots, gang.topology.required)
    fixes = _fixes(state, role, gang, fit.slots, never)
    return Decision(
        Outcome.NEVER if never else Outcome.NOT_NOW, reasons=tuple(reasons), fixes=tuple(fixes)
    )


def _capability(tree: TopologyTree, role: Role) -> tuple[list[str], list[str]]:
    cap = role.capability
    pools = ", ".join(
        f"{p.name} ({p.gpu_type}, {p.gpu_memory_gb:g} GB, {p.gpus_per_host}/host, "
        f"islands of {p.island_size}, {p.tier})"
        for p in tree.pools
        if p.gpus_per_host or not role.gpus
    )
    reasons = [
        f"role {role.name} asks for {cap.describe()} with {need(role)}; no pool offers it",
        f"pools: {pools}",
    ]
    fixes = []
    matching = [p for p in tree.pools if cap.accepts(p, role.gpus > 0)]
    if role.node_class == "storage" and not any(p.kind == "storage" for p in matching):
        fixes.append(
            "storage_gb sends a role to storage nodes and this fleet has none: add a pool "
            "with `class: storage`, or drop storage_gb"
        )
    if role.gpus and not matching:
        best = max((p.gpu_memory_gb for p in tree.pools), default=0)
        if cap.min_gpu_memory_gb > best:
            fixes.append(f"lower min_gpu_memory_gb to {best:g} or less")
        if cap.gpu_types:
            types = sorted({p.gpu_type for p in tree.pools if p.gpus_per_host})
            fixes.append("ask for one of the fleet's GPU types: " + ", ".join(types))
    for p in matching:
        if p.gpus_per_host < role.gpus:
            fixes.append(
                f"pool {p.name} has {p.gpus_per_host} GPUs per host: set per_node to "
                f"{p.gpus_per_host} or less"
            )
        if p.island_size < role.tensor_parallel:
            fixes.append(
                f"pool {p.name} has NVLink islands of {p.island_size}: lower tensor parallelism "
                f"to {p.island_size}"
            )
    return reasons, fixes or ["change the job's capability or add a matching pool to the fleet"]


def _degraded(state: FleetState, role: Role) -> list[str]:
    """Names of the hosts that would take ``role`` but for being degraded (none unless its
    replicas talk to peers)."""
    if not talks(role) or not state.degraded.any():
        return []
    pools = state.tree.eligible_cache.get((role.capability, role.gpus, role.tensor_parallel))
    usable = state.degraded & ~state.cordoned
    if pools is not None:
        usable &= pools
    return [state.tree.hosts[int(h)].name for h in np.flatnonzero(usable)]


def _sums(tree: TopologyTree, slots: IntArray) -> tuple[IntArray, IntArray]:
    racks = np.append(slots, 0)[tree.rack_hosts].sum(axis=1)
    pods = np.append(racks, 0)[tree.pod_racks].sum(axis=1)
    return racks, pods


def _levels(
    state: FleetState,
    role: Role,
    eligible: BoolArray,
    slots: IntArray,
    required: Level | None,
) -> list[str]:
    tree = state.tree
    R = role.replicas
    lines = []
    cordoned = int((eligible & state.cordoned).sum())
    if cordoned:
        lines.append(
            f"{cordoned} matching host(s) take no new work now (cordoned, not ready, or kept "
            "for another job's reserved start)"
        )
    degraded = _degraded(state, role)
    if degraded:
        lines.append(
            f"{len(degraded)} matching host(s) are degraded and take no multi-replica or "
            f"tensor-parallel work: {', '.join(degraded[:5])}{' ...' if len(degraded) > 5 else ''}"
        )
    if role.gpus:
        free = state.free_gpus_per_host()
        isl = state.free_per_island().max(axis=1)
        h = int(np.argmax(np.where(eligible & ~state.cordoned, free * 100 + isl, -1)))
        pool = tree.pool_of(h).name
        lines.append(
            f"host: the best matching host ({tree.hosts[h].name}, pool {pool}) has {free[h]} free "
            f"GPU(s), {isl[h]} in its largest free NVLink island; "
            f"{int((slots > 0).sum())} host(s) can take a replica now"
        )
    racks, pods = _sums(tree, slots)
    lines.append(f"rack: the best rack can take {int(racks.max())} of {R} replica(s)")
    lines.append(f"pod: the best pod can take {int(pods.max())} of {R} replica(s)")
    lines.append(f"fleet: {int(min(slots.sum(), R))} of {R} replica(s) fit across the fleet")
    if required is not None:
        lines.append(f"the job requires a single {required.label}")
    return lines


def _fixes(state: FleetState, role: Role, gang: Gang, slots: IntArray, never: bool) -> list[str]:
    tree = state.tree
    R = role.replicas
    racks, pods = _sums(tree, slots)
    total = int(slots.sum())
    fixes = []
    required = gang.topology.required
    if required is not None:
        best = {
            Level.HOST: int(slots.max()),
            Level.RACK: int(racks.max()),
            Level.POD: int(pods.max()),
        }.get(required, total)
        if total >= R > best:
            fixes.append(
                f"allow spreading with `topology: {{preferred: {required.name.lower()}}}` "
                f"instead of `required`"
            )
        elif best:
            fixes.append(f"ask for {best} replica(s) to fit inside one {required.label}")
    elif 0 < total < R:
        fixes.append(f"ask for {total} replica(s) ({total * role.gpus} GPUs), which fit now")
    if never:
        fixes.append("add capacity to the fleet; as specified the job can never start")
    else:
        fixes.append("wait: `bolt place --mode when --state STATE` shows when it would start")
    return fixes

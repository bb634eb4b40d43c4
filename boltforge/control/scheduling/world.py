"""What one scheduling pass sees, read from the in-memory mirror of the store (``mirror``):
the fleet, who holds which GPUs, and the jobs waiting, turned into the core's ``Snapshot``.

GPUs are held by replicas that are ``waiting``, ``starting``, ``running`` or ``stopping``. A job
being preempted still holds its GPUs until its replicas exit; the GPUs a newly bound job was
given out of them count as that job's, and the rest as a short-lived ``draining`` allocation
that ends when the grace period does. A waiting job that lost a host keeps the GPUs its
replicas had on the healthy hosts for ``--recovery-hold`` seconds (``held:<job>``, its
``Job.held``), and hosts that are degraded are flagged for the core (``degraded``). What
work the server does not run holds on a node (another Slurm partition's jobs on a shared
node), as its backend reports it in the node's health (``OTHERS``), is taken out of what is
free there (``others:<node>``, which no pass preempts).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from pydantic import ValidationError
from sqlalchemy import select
from sqlalchemy.orm import Session

from boltforge.control.nodes.launch import Ports
from boltforge.control.scheduling.fleet import Fleet, build_fleet
from boltforge.control.scheduling.interruptions import routing_facts
from boltforge.control.scheduling.lifecycle import HOLDING, WAITING
from boltforge.control.store.mirror import LiveJob, LiveNode, LiveReplica, Mirror
from boltforge.control.store.models import JobRow, NodeRow, RunRow
from boltforge.core.cycle import Snapshot, count_holding, holdings_of
from boltforge.core.model.gang import Gang
from boltforge.core.model.state import Allocation, Conflict, FleetState, Grant
from boltforge.core.model.workload import Hold, Job, Running, Usage
from boltforge.core.placement.routing import RoutingFacts
from boltforge.core.queueing.quota import QuotaTree
from boltforge.core.queueing.usage import Holding, usage_of
from boltforge.core.sharing.share import Share
from boltforge.spec.errors import SpecError
from boltforge.spec.job import JobSpec
from boltforge.spec.resolve import to_gang
from boltforge.wire.agent import Inventory

USABLE_NODES = ("ready", "suspect")  # live: they hold their jobs
PLACEABLE_NODES = ("ready",)  # suspect nodes keep their jobs but get no new ones
RECOVERY_HOLD_S = 60.0  # how long a job that lost a host keeps its healthy hosts' GPUs
ROUTING_REFRESH_S = 60.0  # how often interruption rates are re-read from the store
REFRESH_MOST = 1000  # jobs changed beyond this (and beyond those running): a whole read
# A node's health fact: what work the server does not run holds there, as
# ``gpus=2,cpus=4,memory_gb=8`` (a backend that shares its nodes with others reports it).
OTHERS = "held_by_others"


@dataclass
class Caches:
    """What passes may reuse: the fleet per node set (by the mirror's ``fleet_version``, or
    by the nodes' inventories when read from the store), each node's parsed inventory, and
    each live job as the core sees it on that fleet (or, for a job the core cannot take,
    the reason why: see ``resolve``). Specs never change after submit, so a job is built once
    per fleet; jobs that ended are dropped by full passes."""

    fleets: dict[tuple[object, ...], Fleet] = field(default_factory=dict)
    jobs: dict[str, Job | str] = field(default_factory=dict)
    routing: tuple[float, RoutingFacts | None] | None = None
    inventories: dict[str, tuple[object, Inventory]] = field(default_factory=dict)


@dataclass
class World:
    """One pass's view, read from the mirror. ``rows`` holds every job the pass may change,
    by id; ``replicas`` the replicas holding GPUs, by job."""

    fleet: Fleet
    state: FleetState
    nodes: dict[str, LiveNode]
    rows: dict[str, LiveJob]
    pending: list[Job]
    running: list[Running]
    replicas: dict[str, list[LiveReplica]]
    unresolved: dict[str, str]
    now: float
    routing: RoutingFacts | None = None
    holds: dict[str, Hold] = field(default_factory=dict)
    quota: QuotaTree | None = None
    ports: Ports = field(default_factory=dict)  # rendezvous ports in use, by address
    changes: int = 0  # binds counted in since it was read (incremental passes)
    estimate: Callable[[str, str, int], float | None] | None = None  # Mirror.estimate
    typical: Callable[[str, str, int, float | None], float | None] | None = None  # Mirror.typical
    held: dict[str, dict[str, int]] | None = field(default=None, repr=False)
    stale_at: float = float("inf")  # when a flag it derived from time runs out (degraded)

    def copy(self) -> World:
        """A world to change without changing this one: its state, lists and tables copied
        (the records in them are never changed in place), with no jobs pending."""
        return replace(
            self,
            state=self.state.copy(),
            nodes=dict(self.nodes),
            rows=dict(self.rows),
            pending=[],
            running=list(self.running),
            replicas=dict(self.replicas),
            unresolved={},
            holds=dict(self.holds),
            ports={addr: set(ports) for addr, ports in self.ports.items()},
            held=None if self.held is None else {q: dict(p) for q, p in self.held.items()},
        )

    def holdings(self) -> dict[str, dict[str, int]]:
        """GPUs held per leaf queue and pool by ``running`` (counted once, then kept up to
        date by ``add_running``)."""
        if self.held is None:
            self.held = holdings_of(self.fleet.tree, self.running)
        return self.held

    def add_running(self, run: Running, counted: bool = True) -> None:
        """Count a job as running (its allocation is in ``state`` already); ``counted``: as
        a change an incremental pass made (a bind)."""
        self.running.append(run)
        self.changes += int(counted)
        if self.held is not None:
            count_holding(self.held, self.fleet.tree, run)

    def snapshot(
        self,
        usage: Usage,
        recent: tuple[tuple[float, int], ...],
        promised: frozenset[str] = frozenset(),
    ) -> Snapshot:
        """What a pass sees; ``promised``: the jobs the last full pass reserved a start for."""
        return Snapshot(
            self.state,
            tuple(self.pending),
            tuple(self.running),
            self.now,
            usage=usage,
            recent_preemptions=recent,
            routing=self.routing,
            quota=self.quota,
            known_held=self.holdings(),
            promised=promised,
        )


def load_fleet(s: Session, caches: Caches) -> tuple[Fleet, dict[str, NodeRow]]:
    """The fleet over every registered node, read from the store (reused while no node's
    inventory changes). Passes use ``fleet_of`` on the mirror instead."""
    nodes = {n.name: n for n in s.scalars(select(NodeRow))}
    key = tuple(sorted((n.name, repr(sorted(n.inventory.items()))) for n in nodes.values()))
    fleet = caches.fleets.get(key)
    if fleet is None:
        fleet = _build(caches, key, [(n.name, n.inventory) for n in nodes.values()])
    return fleet, nodes


def fleet_of(mirror: Mirror, caches: Caches) -> Fleet:
    """The fleet over every node the mirror holds (rebuilt only when an inventory changed)."""
    key: tuple[object, ...] = ("mirror", mirror.fleet_version)
    fleet = caches.fleets.get(key)
    if fleet is None:
        with mirror.reading():
            inventories = [(n.name, n.inventory) for n in mirror.nodes.values()]
        fleet = _build(caches, key, inventories)
    return fleet


def _build(
    caches: Caches, key: tuple[object, ...], inventories: list[tuple[str, dict[str, Any]]]
) -> Fleet:
    parsed = []
    for name, data in inventories:
        known = caches.inventories.get(name)
        if known is None or known[0] is not data:
            known = (data, Inventory.model_validate(data))
            caches.inventories[name] = known
        parsed.append(known[1])
    fleet = build_fleet("boltforge", parsed)
    caches.fleets.clear()
    caches.fleets[key] = fleet
    caches.jobs.clear()
    caches.routing = None  # the rates are the new fleet's to read
    return fleet


def load_world(
    mirror: Mirror,
    now: float,
    caches: Caches,
    waiting: Iterable[str] | None = None,
    hold_s: float = RECOVERY_HOLD_S,
) -> World:
    """The mirror as a ``World`` for one pass at time ``now``: every job holding GPUs, the
    GPUs held for waiting jobs' restarts after a host failure (for ``hold_s`` seconds), and
    the waiting jobs (only those named in ``waiting`` when given, for incremental passes,
    which do not need the whole queue). Reads memory only: the interruption rates of
    cost-aware routing are the ones ``refresh_routing`` last read."""
    fleet = fleet_of(mirror, caches)
    with mirror.reading():
        nodes = dict(mirror.nodes)
        by_job = mirror.held_by_job()
        if waiting is None:
            rows = dict(mirror.jobs)
        else:
            wanted = {*waiting, *by_job}
            rows = {j: mirror.jobs[j] for j in wanted if j in mirror.jobs}
            rows |= {j.id: j for j in mirror.jobs.values() if j.recovery_hold is not None}
    state = FleetState(fleet.tree)
    stale_at = float("inf")
    for name, node in nodes.items():
        if name not in fleet.index:
            continue
        if node.state not in PLACEABLE_NODES or node.cordoned:
            state.cordoned[fleet.index[name]] = True
        if degraded(node, now):
            state.degraded[fleet.index[name]] = True
        if node.degraded_until is not None and node.degraded_until > now:
            stale_at = min(stale_at, node.degraded_until)
    if waiting is None:
        kept = set(rows)
        caches.jobs = {k: v for k, v in caches.jobs.items() if k in kept}
    routing = _routing(fleet, caches)
    world = World(fleet, state, nodes, rows, [], [], by_job, {}, now, routing)
    world.estimate, world.typical = mirror.estimate, mirror.typical
    world.stale_at = stale_at
    world.ports = _ports(by_job.values())
    recovering = [r for r in rows.values() if r.state in WAITING and r.recovery_hold is not None]
    _hold(world, caches, lambda: _recovery_holds(world, recovering, hold_s))
    _others(world)
    _add_pending(
        world, sorted(rows) if waiting is None else sorted(set(waiting) & set(rows)), caches
    )
    return world


def refresh_world(
    world: World, mirror: Mirror, caches: Caches, since: int, hold_s: float = RECOVERY_HOLD_S
) -> int | None:
    """Bring ``world``, which shows the mirror at ``version`` ``since``, up to the mirror as it
    is now by what changed since (``Mirror.changed_since``), instead of reading it whole.
    Each changed job's allocations (its own, ``draining:`` and ``held:``), running entry,
    replicas and recovery hold are taken out, then put back as the mirror has them, in the
    order a whole read takes them (holders first, then recovery holds, then leaving
    replicas, on what is left); each changed node's flags and what others hold there are
    read again, and so are the rendezvous ports in use (the binds of the world's own passes
    add theirs without their replicas). The jobs waiting in ``world.pending`` are left to
    the caller (``add_waiting``).

    Returns the version ``world`` shows now. None when this cannot stand in for a whole read:
    the fleet changed, the change log does not reach back, more jobs changed than
    ``REFRESH_MOST`` and than run (a whole read is quicker then), a node's ``degraded`` flag ran
    out (``world.stale_at``, with ``world.now`` the time now), a holder's GPUs are given to
    another in ``world``, or a leaving replica holds a share of a GPU; ``world`` is then
    half-changed, and the caller reads the world whole."""
    if fleet_of(mirror, caches) is not world.fleet or world.now >= world.stale_at:
        return None
    with mirror.reading():
        version = mirror.version
        changed = mirror.changed_since(since)
        if changed is None:
            return None
        jobs, names = changed
        rows = {j: mirror.jobs.get(j) for j in jobs}
        reps = {j: mirror.replicas_of(j) for j in jobs}
        nodes = {n: mirror.nodes.get(n) for n in names}
        world.ports = _ports([list(mirror.replicas.values())])
    if len(jobs) > max(REFRESH_MOST, len(world.running)):
        return None  # so much changed that a whole read is quicker
    _forget(world, jobs)
    for job_id in sorted(jobs):
        _remember(world, rows[job_id], job_id, reps[job_id])
    held = sorted((r for r in rows.values() if r is not None and r.state in HOLDING), key=_id)
    if not all(_hold_current(world, caches, r, reps[r.id]) for r in held):
        return None
    recovering = [r for r in rows.values() if r is not None and r.recovery_hold is not None]
    waiting = [r for r in recovering if r.state in WAITING]
    claimed = _recovery_holds(world, waiting, hold_s) | _taken(world, reps)
    for job_id in sorted(jobs):
        if any(r.spec.get("share") for r in reps[job_id]):
            return None
        _hold_leaving(world, rows[job_id], job_id, reps[job_id], claimed)
    for name, node in nodes.items():
        if node is None or name not in world.fleet.index:
            return None
        _renode(world, name, node)
    world.routing = _routing(world.fleet, caches)
    return version


def _id(row: LiveJob) -> str:
    return row.id


def _forget(world: World, jobs: set[str]) -> None:
    """Take ``jobs`` out of ``world``: their allocations, running entries, replicas, rows and
    recovery holds."""
    state = world.state
    for job_id in sorted(jobs):
        for key in (job_id, f"draining:{job_id}", f"held:{job_id}"):
            if key in state.allocations:
                state.release(key)
        world.replicas.pop(job_id, None)
        world.rows.pop(job_id, None)
        world.holds.pop(job_id, None)
    gone = [r for r in world.running if r.job.id in jobs]
    if gone:
        world.running = [r for r in world.running if r.job.id not in jobs]
        for run in gone:
            if world.held is not None:
                count_holding(world.held, world.fleet.tree, run, -1)


def _remember(world: World, row: LiveJob | None, job_id: str, reps: list[LiveReplica]) -> None:
    """Put ``job_id``'s row and replicas back into ``world``."""
    if row is not None:
        world.rows[job_id] = row
    if reps:
        world.replicas[job_id] = reps


def _taken(world: World, reps: dict[str, list[LiveReplica]]) -> set[tuple[str, int]]:
    """The GPUs of ``reps``' nodes that ``world`` gives to someone now (what a leaving
    replica may not count as its own)."""
    state, index = world.state, world.fleet.index
    return {
        (r.node, g)
        for group in reps.values()
        for r in group
        if r.node in index
        for g in r.gpus
        if not state.free[index[r.node], g]
    }


def _renode(world: World, name: str, node: LiveNode) -> None:
    """Read ``node``'s flags again, and what others hold on it."""
    world.nodes[name] = node
    host, state = world.fleet.index[name], world.state
    state.cordoned[host] = node.state not in PLACEABLE_NODES or node.cordoned
    state.degraded[host] = degraded(node, world.now)
    if node.degraded_until is not None and node.degraded_until > world.now:
        world.stale_at = min(world.stale_at, node.degraded_until)
    if f"others:{name}" in state.allocations:
        state.release(f"others:{name}")
    _other(world, name, node)


def with_queue(world: World, mirror: Mirror, caches: Caches) -> World:
    """A copy of ``world`` (current, with no jobs pending) with every live job's row and the
    whole queue pending: what a full pass reads, without reading the holdings again."""
    full = world.copy()
    with mirror.reading():
        full.rows = dict(mirror.jobs)
    kept = set(full.rows)
    caches.jobs = {k: v for k, v in caches.jobs.items() if k in kept}
    _add_pending(full, sorted(full.rows), caches)
    return full


def add_waiting(world: World, mirror: Mirror, job_ids: Iterable[str], caches: Caches) -> None:
    """Make ``world.pending`` the jobs of ``job_ids`` that wait now, read from ``mirror``
    (an incremental pass reusing the world of the one before)."""
    ids = sorted(set(job_ids))
    with mirror.reading():
        world.rows |= {j: mirror.jobs[j] for j in ids if j in mirror.jobs}
    world.pending = []
    _add_pending(world, [j for j in ids if j in world.rows], caches)


def _add_pending(world: World, ids: list[str], caches: Caches) -> None:
    for job_id in ids:
        row = world.rows[job_id]
        if row.state not in WAITING:
            continue
        job = _job(world, row, caches)
        if job is not None:
            held = world.holds.get(row.id)
            world.pending.append(job if held is None else replace(job, held=held))


def _ports(groups: Iterable[list[LiveReplica]]) -> Ports:
    """The rendezvous ports the replicas' gangs hold, by master address."""
    ports: Ports = {}
    for reps in groups:
        for r in reps:
            if (held := r.rendezvous) is not None:
                ports.setdefault(held[0], set()).add(held[1])
    return ports


def degraded(node: NodeRow | LiveNode, now: float) -> bool:
    """Whether ``node`` takes no multi-replica or tensor-parallel work now: a straggler was
    found on it lately (``degraded_until``), or its agent reports ``health: {degraded: ...}``
    (any value but empty, 0, false or no)."""
    return degraded_by(node.degraded_until, (node.health or {}).get("degraded"), now)


def degraded_by(until: float | None, flag: object, now: float) -> bool:
    """``degraded`` from its two inputs: the straggler evidence's end and the agent's flag."""
    if until is not None and until > now:
        return True
    return str(flag if flag is not None else "").strip().lower() not in ("", "0", "false", "no")


def _recovery_holds(world: World, rows: list[LiveJob], hold_s: float) -> set[tuple[str, int]]:
    """Hold, for each waiting job that lost a host less than ``hold_s`` ago, the GPUs its
    replicas had on the healthy hosts (an allocation ``held:<job>`` ending with the hold),
    unless a holding job has them. Returns the GPUs held."""
    claimed: set[tuple[str, int]] = set()
    fleet = world.fleet
    for row in sorted(rows, key=lambda r: r.id):
        data = row.recovery_hold or {}
        until = float(data.get("at", 0.0)) + hold_s
        names = [g["node"] for g in data.get("grants", [])]
        if until <= world.now:
            continue  # ran out: ``restarts.end_holds`` clears it
        grants = tuple(
            Grant(
                g["role"],
                int(g["replica"]),
                fleet.index[g["node"]],
                tuple(g["gpus"]),
                float(g.get("cpus", 0.0)),
                float(g.get("memory_gb", 0.0)),
                float(g.get("storage_gb", 0.0)),
            )
            for g in data.get("grants", [])
            if g["node"] in fleet.index
            and all(world.state.free[fleet.index[g["node"]], gpu] for gpu in g["gpus"])
        )
        allocation = Allocation(f"held:{row.id}", grants, until, row.priority)
        if not grants or not _allocate(world.state, allocation):
            continue
        lost = tuple(fleet.index[n] for n in data.get("lost", []) if n in fleet.index)
        world.holds[row.id] = Hold(allocation, lost)
        claimed |= {
            (n, gpu) for n, g in zip(names, data["grants"], strict=True) for gpu in g["gpus"]
        }
    return claimed


def _routing(fleet: Fleet, caches: Caches) -> RoutingFacts | None:
    """Observed interruption rates for cost-aware routing
    (``control/scheduling/interruptions.py``), as last read by ``refresh_routing``; None when
    the fleet has no priced choice to make."""
    if not _priced(fleet) or caches.routing is None:
        return None
    return caches.routing[1]


def routing_stale(caches: Caches, now: float) -> bool:
    """Whether the interruption rates in ``caches`` are due to be read again."""
    return caches.routing is None or now - caches.routing[0] >= ROUTING_REFRESH_S


def refresh_routing(s: Session, fleet: Fleet, now: float, caches: Caches) -> None:
    """Read the interruption rates for ``fleet`` from the store into ``caches`` (none to
    read when the fleet has no priced choice; the time of the look is kept either way)."""
    facts = None
    if _priced(fleet):
        nodes = {n.name: n for n in s.scalars(select(NodeRow))}
        facts = routing_facts(s, fleet.tree, nodes, now)
    caches.routing = (now, facts)


def _priced(fleet: Fleet) -> bool:
    pools = fleet.tree.pools
    return len(pools) >= 2 and any(p.price_per_gpu_hour > 0 for p in pools)


def _hold(
    world: World, caches: Caches, recovery: Callable[[], set[tuple[str, int]]] | None = None
) -> None:
    """Allocate the GPUs of holding jobs' current epochs first, then those held for restarts
    (``recovery``), then what leaving replicas still occupy (those of jobs that no longer
    hold GPUs, and the older epoch of a job resized in place)."""
    claimed: set[tuple[str, int]] = set()
    for job_id, reps in sorted(world.replicas.items()):
        row = world.rows.get(job_id)
        if row is not None and row.state in HOLDING and _hold_current(world, caches, row, reps):
            claimed |= {(r.node, g) for r in reps if r.epoch == row.epoch for g in r.gpus}
    if recovery is not None:
        claimed |= recovery()
    for job_id, reps in sorted(world.replicas.items()):
        _hold_leaving(world, world.rows.get(job_id), job_id, reps, claimed)


def _hold_current(world: World, caches: Caches, row: LiveJob, reps: list[LiveReplica]) -> bool:
    """Allocate the GPUs of holding ``row``'s current epoch (``reps`` of it), and count it
    running; False when they clash with what the world gives others."""
    job = _job(world, row, caches)
    grants = _grants(world.fleet, [r for r in reps if r.epoch == row.epoch])
    runtime = job.expected_runtime() if job is not None else None
    end = row.bound_at + runtime if row.bound_at is not None and runtime else None
    if not _allocate(world.state, Allocation(row.id, grants, end, row.priority)):
        return False
    if job is not None:
        world.add_running(_running(job, world.state.allocations[row.id], row), counted=False)
    return True


def _hold_leaving(
    world: World,
    row: LiveJob | None,
    job_id: str,
    reps: list[LiveReplica],
    claimed: set[tuple[str, int]],
) -> None:
    """Allocate, as ``draining:<job>``, what ``job_id``'s leaving replicas (all of them once
    it holds no GPUs, else those of older epochs) still occupy, but for the GPUs in
    ``claimed``."""
    if row is not None and row.state in HOLDING:
        reps = [r for r in reps if r.epoch != row.epoch]
    left = [_without(r, claimed) for r in reps]
    grants = _grants(world.fleet, [r for r in left if r.gpus])
    ends = [(r.stop_requested_at or world.now) + r.grace_s for r in reps]
    if grants:
        _allocate(world.state, Allocation(f"draining:{job_id}", grants, max(ends), 0))


def held_by_others(text: object) -> tuple[int, float, float]:
    """The GPUs, CPUs and memory (GB) of an ``OTHERS`` fact (``gpus=2,cpus=4,memory_gb=8``);
    what it does not name, or names badly, is 0."""
    out = {"gpus": 0.0, "cpus": 0.0, "memory_gb": 0.0}
    for part in str(text or "").split(","):
        key, _, value = part.strip().partition("=")
        if key in out:
            try:
                out[key] = max(float(value), 0.0)
            except ValueError:
                continue
    return int(out["gpus"]), out["cpus"], out["memory_gb"]


def _others(world: World) -> None:
    """Take out of each node's free GPUs, CPUs and memory what its backend says work the
    server does not run holds there (``OTHERS``), up to what is free: an allocation
    ``others:<node>`` with no end, held by no job, so no pass preempts it."""
    for name, node in world.nodes.items():
        _other(world, name, node)


def _other(world: World, name: str, node: LiveNode) -> None:
    """``_others`` for one node."""
    state = world.state
    gpus, cpus, memory = held_by_others((node.health or {}).get(OTHERS))
    host = world.fleet.index.get(name)
    if host is None or not (gpus or cpus or memory):
        return
    free = [int(g) for g in state.free[host].nonzero()[0]][:gpus]
    cpus = min(cpus, float(state.free_cpus[host]))
    memory = min(memory, float(state.free_memory[host]))
    grant = Grant("others", 0, host, tuple(free), cpus, memory)
    _allocate(state, Allocation(f"others:{name}", (grant,), None, 0))


def _without(rep: LiveReplica, claimed: set[tuple[str, int]]) -> LiveReplica:
    free = [g for g in rep.gpus if (rep.node, g) not in claimed]
    return LiveReplica(
        id=rep.id,
        role=rep.role,
        rank=rep.rank,
        node=rep.node,
        gpus=free,
        cpus=rep.cpus if free else 0.0,
        memory_gb=rep.memory_gb if free else 0.0,
        spec=rep.spec if free else {},
    )


def _grants(fleet: Fleet, reps: Iterable[LiveReplica]) -> tuple[Grant, ...]:
    return tuple(
        Grant(
            r.role,
            r.rank,
            fleet.index[r.node],
            tuple(r.gpus),
            r.cpus,
            r.memory_gb,
            float(r.spec.get("storage_gb", 0.0)),
            Share.from_json(r.spec["share"]) if r.spec.get("share") else None,
        )
        for r in reps
        if r.node in fleet.index
    )


def _allocate(state: FleetState, allocation: Allocation) -> bool:
    try:
        state.allocate(allocation)
    except Conflict:
        return False
    return True


def _job(world: World, row: LiveJob, caches: Caches) -> Job | None:
    """The core's view of ``row`` (built from its spec once per fleet), with the runtime
    learned from jobs like it when it has no time limit (``world.estimate``) and what jobs
    like it typically took (``world.typical``). None for a job the core cannot take: it is
    set aside in ``world.unresolved`` with the reason, which the pass records as the job's
    waiting reason, and the pass goes on for every other job."""
    if row.id not in caches.jobs:
        caches.jobs[row.id] = resolve(row, world.fleet)
    job = caches.jobs[row.id]
    if isinstance(job, str):
        world.unresolved[row.id] = job
        return None
    name = str(row.spec.get("name", ""))
    if job.time_limit is None and world.estimate is not None:
        learned = world.estimate(row.team, name, row.gpus)
        if learned != job.estimate:
            job = caches.jobs[row.id] = replace(job, estimate=learned)
    if world.typical is not None:
        typical = world.typical(row.team, name, row.gpus, job.time_limit)
        if typical != job.typical:
            job = caches.jobs[row.id] = replace(job, typical=typical)
    if job.attained_gpu_seconds != row.attained_gpu_s:
        job = replace(job, attained_gpu_seconds=row.attained_gpu_s)
    return job


def job_of(row: JobRow | LiveJob, fleet: Fleet) -> Job | None:
    """The core ``Job`` for ``row`` on ``fleet``; None when the core cannot take it (see
    ``resolve`` for why)."""
    job = resolve(row, fleet)
    return job if isinstance(job, Job) else None


def resolve(row: JobRow | LiveJob, fleet: Fleet) -> Job | str:
    """The core ``Job`` for ``row`` on ``fleet``, or the reason it cannot be one, ending
    with the fix: its spec names hardware the fleet lacks, or the stored spec is one this
    version does not accept (a row written by an older version or straight into the store,
    say with a deadline outside the dates intake allows). Never raises for a bad spec."""
    try:
        spec = JobSpec.model_validate(row.spec)
    except ValidationError as e:
        first = e.errors(include_url=False)[0]
        where = ".".join(str(p) for p in first["loc"]) or "spec"
        why = str(first["msg"]).removeprefix("Value error, ")
        return (
            f"its stored spec is not valid here ({where}: {why}). To fix: cancel it "
            "and submit it again"
        )
    try:
        gang = to_gang(spec, fleet.tree, row.id)
    except SpecError:
        return "its spec names GPUs this fleet does not have"
    try:
        return _core_job(row, gang)
    except (ValueError, TypeError, KeyError, OverflowError) as e:
        return f"its spec cannot be scheduled ({e}). To fix: cancel it and submit it again"


def _core_job(row: JobRow | LiveJob, gang: Gang) -> Job:
    """``row`` as the core's ``Job`` with ``gang``; raises ValueError (and its kin) for a
    stored spec whose values the core cannot order by."""
    spec = row.spec
    elastic = spec.get("elastic")
    deadline = spec.get("deadline")
    limit = spec.get("time_limit")
    return Job(
        row.id,
        gang,
        row.queue,
        row.submitted_at,
        time_limit=float(limit) if limit is not None else None,
        deadline=datetime.fromisoformat(deadline).timestamp() if deadline else None,
        preemptible=bool(spec.get("preemptible", True)),
        elastic=(int(elastic["min"]), int(elastic["max"])) if elastic else None,
        checkpoint_interval=(spec.get("checkpoint") or {}).get("interval"),
        attained_gpu_seconds=row.attained_gpu_s,
        spread=f"service {row.service}" if row.service else "",
    )


def _running(job: Job, allocation: Allocation, row: LiveJob) -> Running:
    return Running(
        job,
        allocation,
        row.bound_at or 0.0,
        last_checkpoint=row.last_checkpoint_at,
        last_preempted=row.last_preempted_at,
        borrowed=row.borrowed,
        last_resized=row.resized_at,
    )


def usage(s: Session, now: float, half_life_s: float) -> Usage:
    """Fair-share usage per queue (and every queue above it) at ``now``: each run's GPU-seconds,
    decayed exactly with ``half_life_s`` (``core.usage.usage_of``, the computation the
    simulator shares). Runs that ended more than 20 half-lives ago (weight under 2**-20) are
    not read."""
    horizon = now - 20 * half_life_s
    columns = (RunRow.queue, RunRow.gpus, RunRow.gpu_share, RunRow.started_at, RunRow.ended_at)
    runs = s.execute(
        select(*columns).where((RunRow.ended_at.is_(None)) | (RunRow.ended_at > horizon))
    )
    held = (  # ``RunRow.held_gpus`` from its columns: no ORM object per run
        Holding(queue, gpus + (share or 0.0), started, ended)
        for queue, gpus, share, started, ended in runs
    )
    return usage_of(held, now, half_life_s)

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

    def holdings(self) -> dict[str, dict[str, int]]:
        """GPUs held per leaf queue and pool by ``running`` (counted once, then kept up to
        date by ``add_running``)."""
        if self.held is None:
            self.held = holdings_of(self.fleet.tree, self.running)
        return self.held

    def add_running(self, run: Running) -> None:
        """Count a job bound by an incremental pass as running (its allocation is in
        ``state`` already)."""
        self.running.append(run)
        self.changes += 1
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
    for name, node in nodes.items():
        if name not in fleet.index:
            continue
        if node.state not in PLACEABLE_NODES or node.cordoned:
            state.cordoned[fleet.index[name]] = True
        if degraded(node, now):
            state.degraded[fleet.index[name]] = True
    if waiting is None:
        kept = set(rows)
        caches.jobs = {k: v for k, v in caches.jobs.items() if k in kept}
    routing = _routing(fleet, caches)
    world = World(fleet, state, nodes, rows, [], [], by_job, {}, now, routing)
    world.estimate, world.typical = mirror.estimate, mirror.typical
    world.ports = _ports(by_job)
    recovering = [r for r in rows.values() if r.state in WAITING and r.recovery_hold is not None]
    _hold(world, caches, lambda: _recovery_holds(world, recovering, hold_s))
    _others(world)
    _add_pending(
        world, sorted(rows) if waiting is None else sorted(set(waiting) & set(rows)), caches
    )
    return world


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


def _ports(by_job: dict[str, list[LiveReplica]]) -> Ports:
    """The rendezvous ports the replicas' gangs hold, by master address."""
    ports: Ports = {}
    for reps in by_job.values():
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
        if row is None or row.state not in HOLDING:
            continue
        job = _job(world, row, caches)
        reps = [r for r in reps if r.epoch == row.epoch]
        grants = _grants(world.fleet, reps)
        runtime = job.expected_runtime() if job is not None else None
        end = row.bound_at + runtime if row.bound_at is not None and runtime else None
        if not _allocate(world.state, Allocation(job_id, grants, end, row.priority)):
            continue
        claimed |= {(r.node, g) for r in reps for g in r.gpus}
        if job is not None:
            world.running.append(_running(job, world.state.allocations[job_id], row))
    if recovery is not None:
        claimed |= recovery()
    for job_id, reps in sorted(world.replicas.items()):
        row = world.rows.get(job_id)
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
    state, index = world.state, world.fleet.index
    for name, node in world.nodes.items():
        gpus, cpus, memory = held_by_others((node.health or {}).get(OTHERS))
        host = index.get(name)
        if host is None or not (gpus or cpus or memory):
            continue
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
    runs = s.scalars(
        select(RunRow).where((RunRow.ended_at.is_(None)) | (RunRow.ended_at > horizon))
    )
    held = (Holding(r.queue, r.held_gpus, r.started_at, r.ended_at) for r in runs)
    return usage_of(held, now, half_life_s)

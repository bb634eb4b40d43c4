"""The server's side of the agent protocol: registration, leases, desired state, and what
happens to a node's replicas when its lease runs out.

A node is ``ready`` while it heartbeats, ``suspect`` once ``suspect_s`` pass without one, or
while its agent shuts down, or once it stopped a replica on its own (it keeps its jobs, gets
no new ones, until a heartbeat says it is well), and ``dead`` when its lease expires: its
replicas are lost and their jobs requeue from their last checkpoint (within their restart
budget, see ``restarts``), unless a workload manager runs them (``outlive_lease``: a Slurm
node, whose bridge being away says nothing about the node): those run on, and the node's
next registration takes back the ones it lists. A node that comes back registers again.
One registering after its spot reclaim time (``spot``) is a new instance under the old
name: it comes back in service, uncordoned, with no reclaim pending.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field

from sqlalchemy import select
from sqlalchemy.orm import Session, defer

from boltforge.control.jobs.restarts import restart_or_fail
from boltforge.control.nodes.activity import merge
from boltforge.control.nodes.reports import maybe_running
from boltforge.control.scheduling import intent
from boltforge.control.scheduling.actuate import Touched, halt
from boltforge.control.scheduling.fleet import check_inventory
from boltforge.control.scheduling.lifecycle import HOLDING
from boltforge.control.store import ahead
from boltforge.control.store.db import by_key
from boltforge.control.store.mirror import Mirror
from boltforge.control.store.models import JobRow, NodeRow, ReplicaRow
from boltforge.wire.agent import (
    DesiredState,
    Heartbeat,
    Inventory,
    Lease,
    Registration,
    ReplicaSpec,
    ReplicaStatus,
)

LIVE_REPLICA = ("starting", "running", "stopping")


@dataclass(frozen=True)
class LeaseTerms:
    """How often agents heartbeat and how long silence is tolerated."""

    heartbeat_s: float = 2.0
    suspect_s: float = 6.0
    lease_s: float = 15.0


class SessionMismatch(Exception):
    """A heartbeat or report carried a session the node no longer holds: register again."""


REGISTERING = "register\x00"  # a batch read key: a registration's pool and node, \x00 apart
GROUP = "bolt.register.group"  # Session.info key: the ``GroupReads`` of the transaction


def registering(inv: Inventory) -> str:
    """The batch read key of a registration of ``inv`` (``read_ahead``)."""
    return f"{REGISTERING}{inv.pool}\x00{inv.name}"


@dataclass
class GroupReads:
    """What the registrations of one transaction read, read at once: the nodes, up to two
    stored nodes of each of their pools (their inventories' peers), and their live
    replicas; and, by pool, the first node registered in the transaction."""

    names: set[str] = field(default_factory=set)
    peers: dict[str, list[str]] = field(default_factory=dict)
    live: dict[str, list[ReplicaRow]] = field(default_factory=dict)
    registered: dict[str, tuple[str, Inventory]] = field(default_factory=dict)


def read_ahead(s: Session, keys: Iterable[str]) -> GroupReads:
    """Read what the registrations named by ``keys`` (``registering``) will read and keep
    it for the transaction (``Session.info``), added to what it read before: the nodes
    (those not stored are remembered absent, ``store/ahead.py``) and their live replicas in
    a statement each, and two stored nodes of each new pool in a statement per pool."""
    group: GroupReads = s.info.setdefault(GROUP, GroupReads())
    pairs = [k[len(REGISTERING) :].split("\x00", 1) for k in keys]
    names = {n for _, n in pairs} - group.names
    if not names:
        return group
    ahead.read(s, NodeRow, NodeRow.name, names)
    for pool in sorted({p for p, _ in pairs} - group.peers.keys()):
        # two, so that one is another node than any registering
        two = ahead.keep(s, s.scalars(select(NodeRow).where(NodeRow.pool == pool).limit(2)))
        group.peers[pool] = [r.name for r in two]
    on = ReplicaRow.node.in_(names)
    for rep in s.scalars(select(ReplicaRow).where(on, ReplicaRow.state.in_(LIVE_REPLICA))):
        group.live.setdefault(rep.node, []).append(rep)
    group.names |= names
    return group


def _peer(s: Session, inv: Inventory, group: GroupReads) -> Inventory | None:
    """The inventory of another node of ``inv``'s pool, if any is stored or registered."""
    for name in group.peers.get(inv.pool, []):
        row = ahead.get(s, NodeRow, name)
        if name != inv.name and row is not None and row.pool == inv.pool:
            return Inventory.model_validate(row.inventory)
    earlier = group.registered.get(inv.pool)
    return earlier[1] if earlier is not None and earlier[0] != inv.name else None


def register(s: Session, reg: Registration, terms: LeaseTerms, now: float) -> tuple[Lease, Touched]:
    """Register (or re-register) a node; reconcile what it says it runs with the store.
    Reads what ``read_ahead`` kept for the transaction's group (reading it first when the
    group did not name this node)."""
    inv = reg.inventory
    with s.no_autoflush:  # reads of stored rows: the group's earlier writes can wait
        group = read_ahead(s, [registering(inv)])
        check_inventory(inv, _peer(s, inv, group))
        node = ahead.get(s, NodeRow, inv.name)
    group.registered.setdefault(inv.pool, (inv.name, inv))
    reps = group.live.get(inv.name, [])
    expected = {r.id: r for r in reps if r.state in LIVE_REPLICA and r.node == inv.name}
    data = inv.model_dump(mode="json")
    if node is None:
        node = NodeRow(name=inv.name, registered_at=now, desired_version=0, cordoned=False)
        s.add(node)
        ahead.added(s, NodeRow, inv.name, node)
    node.inventory, node.pool, node.pod, node.rack, node.gpus = (
        data,
        inv.pool,
        inv.pod,
        inv.rack,
        inv.gpus,
    )
    if node.reclaim_at is not None and now >= node.reclaim_at:
        node.reclaim_at, node.cordoned = None, False
    node.state, node.session, node.registered_at = "ready", uuid.uuid4().hex, now
    node.last_heartbeat, node.lease_expires_at = now, now + terms.lease_s
    intent.renewed(node)  # the node is told what to run afresh
    stop, touched = reconcile(s, node, reg.running, now, True, expected)
    touched.nodes.add(node.name)
    return _lease(node, terms, stop), touched


def heartbeat(
    s: Session, name: str, hb: Heartbeat, terms: LeaseTerms, now: float
) -> tuple[Lease, Touched]:
    """Renew a node's lease; raise ``SessionMismatch`` when the session is not current. A
    leaving node stays ``suspect``: it keeps its jobs while they stop, and gets no new ones."""
    return _renew(s, current(s, name, hb.session), hb, terms, now, None)


@dataclass
class Renewed:
    """What a batch of heartbeats came to: the leases renewed, the nodes that must register
    again (their session is not current), and what changed."""

    leases: dict[str, Lease]
    lost: list[str]
    touched: Touched


def heartbeats(s: Session, beats: dict[str, Heartbeat], terms: LeaseTerms, now: float) -> Renewed:
    """``heartbeat`` for many nodes at once (a bridge speaking for a cluster), reading their
    nodes and live replicas in one query each; a node whose session is not current is listed
    in ``lost`` rather than raising. Neither the nodes' inventories nor the live replicas of
    nodes whose heartbeat lists none running are read: a heartbeat needs neither."""
    names = list(beats)
    nodes = by_key(s, NodeRow, names, defer(NodeRow.inventory))
    live: dict[str, dict[str, ReplicaRow]] = {n: {} for n in names}
    listing = [n for n in names if beats[n].running]
    if listing:
        on = ReplicaRow.node.in_(listing)
        for rep in s.scalars(select(ReplicaRow).where(on, ReplicaRow.state.in_(LIVE_REPLICA))):
            live[rep.node][rep.id] = rep
    out = Renewed({}, [], Touched())
    for name in names:
        node, hb = nodes.get(name), beats[name]
        if node is None or node.state == "dead" or node.session != hb.session:
            out.lost.append(name)
            continue
        lease, touched = _renew(s, node, hb, terms, now, live[name])
        out.leases[name] = lease
        out.touched |= touched
    return out


def _renew(
    s: Session,
    node: NodeRow,
    hb: Heartbeat,
    terms: LeaseTerms,
    now: float,
    expected: dict[str, ReplicaRow] | None,
) -> tuple[Lease, Touched]:
    was = node.state
    node.last_heartbeat, node.lease_expires_at = now, now + terms.lease_s
    gpus = merge((node.health or {}).get("gpus"), hb.gpus, now)
    node.state = "suspect" if hb.leaving else "ready"
    node.health = {**hb.health, "gpus": gpus} if gpus else dict(hb.health)
    stop, touched = reconcile(s, node, hb.running, now, forget_missing=False, expected=expected)
    if was != "ready":
        touched.nodes.add(node.name)
    return _lease(node, terms, stop), touched


def current(s: Session, name: str, session: str) -> NodeRow:
    """The node ``name`` if ``session`` is its current lease, else ``SessionMismatch``."""
    node = s.get(NodeRow, name)
    if node is None or node.state == "dead" or node.session != session:
        raise SessionMismatch(name)
    return node


def current_in(mirror: Mirror, name: str, session: str) -> None:
    """``current`` from the mirror, without the store: raise ``SessionMismatch`` unless
    ``session`` is node ``name``'s current lease."""
    with mirror.reading():
        node = mirror.nodes.get(name)
        if node is None or node.state == "dead" or node.session != session:
            raise SessionMismatch(name)


def reconcile(
    s: Session,
    node: NodeRow,
    running: list[ReplicaStatus],
    now: float,
    forget_missing: bool,
    expected: dict[str, ReplicaRow] | None = None,
) -> tuple[list[str], Touched]:
    """Replicas the node runs that the store does not expect (or expects for another epoch)
    are to be stopped; those it expects, of the same epoch, and still had ``starting`` are
    adopted as running. With ``forget_missing`` (a fresh registration), replicas the store
    expects there but the node no longer has are lost, and a job whose every replica now
    runs moves to running (a heartbeat leaves that to the start reports already on their
    way). ``expected``: the node's live replicas by id, when the caller has read them
    already."""
    if expected is None:
        query = select(ReplicaRow).where(
            ReplicaRow.node == node.name, ReplicaRow.state.in_(LIVE_REPLICA)
        )
        expected = {r.id: r for r in s.scalars(query)}
    stop = [
        st.replica
        for st in running
        if st.replica not in expected or expected[st.replica].epoch != st.epoch
    ]
    touched = Touched()
    adopted: set[str] = set()
    for st in running:
        rep = expected.get(st.replica)
        if rep is None or rep.epoch != st.epoch:
            continue  # not this allocation's replica: to be stopped, never adopted
        if rep.state == "starting" and st.state == "running":
            rep.state, rep.pid, rep.started_at = "running", st.pid, rep.started_at or now
            adopted.add(rep.job_id)
    if forget_missing:  # a restarted agent's start reports may be lost with its outbox
        for job in by_key(s, JobRow, adopted).values():
            maybe_running(s, job, now)
    if forget_missing:
        have = {st.replica for st in running}
        gone = [r for r in expected.values() if r.id not in have]
        touched |= lose(s, gone, now, f"node {node.name} restarted without them")
    return stop, touched


def lose(s: Session, reps: list[ReplicaRow], now: float, why: str) -> Touched:
    """Replicas that vanished with their node: the rest of each gang is stopped, and each job
    requeues from its last checkpoint, or fails once its restart budget is spent. A requeued
    job's GPUs on its healthy nodes are held for its restart (``restarts.hold``)."""
    touched = Touched()
    for rep in reps:
        rep.state, rep.exited_at = "lost", now
    for job_id in sorted({r.job_id for r in reps}):
        job = s.get(JobRow, job_id)
        if job is None:
            continue
        touched.jobs.add(job_id)
        rest = s.scalars(
            select(ReplicaRow).where(
                ReplicaRow.job_id == job_id, ReplicaRow.state.in_(("waiting", *LIVE_REPLICA))
            )
        )
        touched |= halt(s, rest, now)
        if job.state in (*HOLDING, "preempting"):
            lost = sorted({r.node for r in reps if r.job_id == job_id})
            restart_or_fail(s, job, now, why, lost)
    return touched


def extend_leases(s: Session, terms: LeaseTerms, now: float) -> None:
    """Give every live node a full lease from ``now``: a server that starts (or restarts)
    has heard no heartbeat yet, and must not take the time it was down for the nodes'
    silence. A node that stays silent a whole lease from now is dead as usual."""
    for node in s.scalars(select(NodeRow).where(NodeRow.state.in_(("ready", "suspect")))):
        node.lease_expires_at = max(node.lease_expires_at or now, now + terms.lease_s)


def expire(
    s: Session, terms: LeaseTerms, now: float, names: Iterable[str] | None = None
) -> Touched:
    """Mark silent nodes suspect, and dead once their lease is over (their work requeues,
    unless it outlives the lease: ``outlive_lease``).
    ``names``: only these nodes may be due (the rest are not read)."""
    touched = Touched()
    live = select(NodeRow).where(NodeRow.state.in_(("ready", "suspect")))
    if names is not None:
        live = live.where(NodeRow.name.in_(list(names)))
    for node in s.scalars(live):
        if node.lease_expires_at is not None and now > node.lease_expires_at:
            node.state = "dead"
            touched.nodes.add(node.name)
            if outlive_lease(node):
                continue  # they run on; its next registration says which still do
            reps = list(
                s.scalars(
                    select(ReplicaRow).where(
                        ReplicaRow.node == node.name,
                        ReplicaRow.state.in_(("waiting", *LIVE_REPLICA)),
                    )
                )
            )
            touched |= lose(s, reps, now, f"node {node.name} stopped answering")
        elif (
            node.state != "suspect"
            and node.last_heartbeat is not None
            and now > node.last_heartbeat + terms.suspect_s
        ):
            node.state = "suspect"
            touched.nodes.add(node.name)
    return touched


def outlive_lease(node: NodeRow) -> bool:
    """Whether ``node``'s replicas keep running when its lease runs out (a workload manager
    such as Slurm runs them, ``Inventory.replicas_outlive_lease``): they are then not lost
    with the lease, only with a registration that no longer lists them."""
    return bool((node.inventory or {}).get("replicas_outlive_lease", False))


def desired(mirror: Mirror, name: str) -> DesiredState | None:
    """What node ``name`` should run and stop now, with its version (None: unknown node).
    Read from the mirror: agents' long-polls never touch the store."""
    with mirror.reading():
        node = mirror.nodes.get(name)
        if node is None:
            return None
        reps = [r for r in mirror.held_on(name) if r.state in LIVE_REPLICA]
        version = node.desired_version
        teams = {r.job_id: job.team for r in reps if (job := mirror.jobs.get(r.job_id))}
    out = [
        ReplicaSpec(
            replica=r.id,
            job=r.job_id,
            team=teams.get(r.job_id, ""),
            epoch=r.epoch,
            action="stop" if r.state == "stopping" else "run",
            command=r.spec.get("command", []),
            cwd=r.spec.get("cwd"),
            env=r.spec.get("env", {}),
            gpus=list(r.gpus),
            grace_s=float(r.spec.get("grace_s", 30.0)),
            checkpoint_dir=r.spec.get("checkpoint_dir"),
            image=r.spec.get("image"),
            cpus=r.cpus,
            memory_gb=r.memory_gb,
            outputs=r.spec.get("outputs", []),
            share=r.spec.get("share"),
        )
        for r in reps
    ]
    return DesiredState(node=name, version=version, replicas=out)


def _lease(node: NodeRow, terms: LeaseTerms, stop: list[str]) -> Lease:
    return Lease(
        node=node.name,
        session=node.session,
        lease_s=terms.lease_s,
        heartbeat_s=terms.heartbeat_s,
        stop=stop,
        desired_version=node.desired_version,
    )

"""A pass's decisions written to the store: evictions first, then binds, then why the rest
wait. Nothing here talks to a node; the caller commits, then wakes the nodes it touched."""

from __future__ import annotations

import shlex
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, cast

from sqlalchemy import Table, bindparam, or_, select, update
from sqlalchemy.orm import Session

from boltforge.control.nodes.launch import Launcher, Ports, Slot, TorchrunLauncher
from boltforge.control.scheduling import intent
from boltforge.control.scheduling.lifecycle import HOLDING, WAITING, record, transition
from boltforge.control.scheduling.world import World
from boltforge.control.store.db import by_key
from boltforge.control.store.mirror import stage
from boltforge.control.store.models import HELD, JobRow, ReplicaRow, RunRow
from boltforge.core.billing.meter import hourly_price
from boltforge.core.decisions import Bind, CycleResult, Evict, Resize, Waiting
from boltforge.core.model.levels import Level
from boltforge.core.model.state import Grant
from boltforge.core.placement.explain import describe
from boltforge.ranges import hostlist


@dataclass
class Touched:
    """Nodes whose desired state changed and jobs whose timeline grew, to wake after commit."""

    nodes: set[str] = field(default_factory=set)
    jobs: set[str] = field(default_factory=set)

    def __ior__(self, other: Touched) -> Touched:
        self.nodes |= other.nodes
        self.jobs |= other.jobs
        return self


@dataclass(frozen=True)
class Settings:
    """What actuation needs to know about the site: where checkpoints live, and how the
    backend's gangs rendezvous and get their devices (``control/nodes/launch.py``)."""

    checkpoint_root: str
    launcher: Launcher = field(default_factory=TorchrunLauncher)


def apply(s: Session, world: World, result: CycleResult, settings: Settings) -> Touched:
    """Write ``result``: evict or shrink (checkpoint signal to the victims' nodes), bind
    (replicas that start once their GPUs are free), grow elastic jobs, and every waiting
    job's reason, place and estimate. The rows it changes are read from the store here, in
    one query per table; ``world`` (read from the mirror) is not changed."""
    touched = Touched()
    changing = [ev.job for ev in result.evictions] + [r.job for r in result.resizes]
    rows = by_key(s, JobRow, changing + [b.job for b in result.binds])
    held = _held(s, changing)
    for ev in result.evictions:
        touched |= evict(s, world, rows.get(ev.job), held.get(ev.job, []), ev, settings)
    victims: dict[str, list[str]] = {}
    for ev in result.evictions:
        victims.setdefault(ev.for_job, []).append(ev.job)
    for b in result.binds:
        row = rows.get(b.job)
        if row is not None:
            touched |= bind(s, world, row, b, settings, world.ports, victims.get(b.job, []))
    for r in result.resizes:
        touched |= grow(s, world, rows.get(r.job), held.get(r.job, []), r, settings)
    record_waits(s, world, result.waiting)
    return touched


def evict(
    s: Session,
    world: World,
    row: JobRow | None,
    reps: list[ReplicaRow],
    ev: Evict,
    settings: Settings,
) -> Touched:
    """Ask a victim's replicas (``reps``, those holding GPUs) to checkpoint and stop; a
    shrink (``ev.keep``) restarts it in place on the GPUs it keeps, without requeueing."""
    if row is None or row.state not in HOLDING:
        return Touched(jobs={ev.job})
    data = {"for": ev.for_job, "lost_gpu_s": ev.lost_gpu_seconds, "gpus": row.gpus}
    if ev.shrink_to is not None and ev.keep:
        why = f"shrunk to {ev.shrink_to} replica(s) by job {ev.for_job}"
        return resize(s, world, row, reps, ev.keep, settings, why, "shrunk", data)
    what = "shrink" if ev.shrink_to is not None else "preempted"
    lost = f", {ev.lost_gpu_seconds / 3600:.2f} GPU-h since the last checkpoint"
    return preempt(s, row, reps, world.now, f"{what} by job {ev.for_job}", "preempted", data, lost)


def grow(
    s: Session,
    world: World,
    row: JobRow | None,
    reps: list[ReplicaRow],
    r: Resize,
    settings: Settings,
) -> Touched:
    """Grow elastic ``row`` to ``r.replicas``: it restarts in place on the GPUs it holds
    plus ``r.added``."""
    held = world.state.allocations.get(r.job)
    if row is None or row.state not in HOLDING or held is None:
        return Touched(jobs={r.job})
    grants = (*held.grants, *r.added.grants)
    added = sum(len(g.gpus) for g in r.added.grants)
    data = {"replicas": r.replicas, "added_gpus": added, "note": r.note}
    why = f"grown to {r.replicas} replica(s) into free GPUs"
    return resize(s, world, row, reps, grants, settings, why, "grown", data)


def resize(
    s: Session,
    world: World,
    row: JobRow,
    reps: list[ReplicaRow],
    grants: Iterable[Grant],
    settings: Settings,
    why: str,
    kind: str,
    data: dict[str, Any],
) -> Touched:
    """Restart holding job ``row`` in place on ``grants`` (an elastic grow or shrink): its
    replicas holding GPUs (``reps``) get the checkpoint signal, and a new epoch is bound on
    ``grants`` at once, to start from that checkpoint once they have left (dispatch waits
    for their GPUs). The job never re-enters the queue, so nothing can take its GPUs in
    between; its timeline entry (of ``kind``) reads ``<why>: restarts from its checkpoint``."""
    close_run(s, row, world.now)
    touched = halt(s, reps, world.now)
    touched.jobs.add(row.id)
    row.resized_at = world.now
    hosts, gpus = _new_epoch(s, world, row, list(grants), settings, world.ports)
    data = {**data, "nodes": hostlist(hosts), "epoch": row.epoch, "gpus_now": gpus}
    message = f"{why}: {gpus} GPU(s) on {len(set(hosts))} host(s); restarts from its checkpoint"
    if row.state == "scheduled":
        record(s, row.id, world.now, kind, message, data)
    else:
        transition(s, row, "scheduled", world.now, message, kind, data)
    return touched


def preempt(
    s: Session,
    row: JobRow,
    reps: list[ReplicaRow],
    now: float,
    why: str,
    kind: str,
    data: dict[str, Any],
    detail: str = "",
    after: str = "",
) -> Touched:
    """Preempt holding job ``row``: ``reps`` (its replicas holding GPUs) get the checkpoint
    signal, and the job requeues once they exited (at once, if none had started). Its
    timeline entry (of ``kind``, with ``data``) reads ``<why>: checkpointing (grace N
    s<detail>)<after>``."""
    grace = max((float(r.spec.get("grace_s", 30)) for r in reps), default=0.0)
    message = f"{why}: checkpointing (grace {grace:.0f} s{detail}){after}"
    transition(s, row, "preempting", now, message, kind, data)
    row.preemptions += 1
    row.last_preempted_at = now
    touched = Touched(jobs={row.id})
    touched |= halt(s, reps, now)
    if not any(r.state == "stopping" and r.epoch == row.epoch for r in reps):
        finish_stop(s, row, now, "requeued", "requeued (it had not started)")
    return touched


def read_jobs(s: Session, ids: list[str]) -> list[JobRow]:
    """Read the jobs ``ids`` in one query, for a caller about to ``apply`` results for them
    one by one (``apply`` then finds them in the identity map); the caller keeps the list
    while it does (the identity map holds rows only while something else does)."""
    if not ids:
        return []
    return list(s.scalars(select(JobRow).where(JobRow.id.in_(set(ids)))))


def _held(s: Session, job_ids: list[str]) -> dict[str, list[ReplicaRow]]:
    """The replicas of ``job_ids`` that hold GPUs, by job."""
    out: dict[str, list[ReplicaRow]] = {}
    if job_ids:
        q = select(ReplicaRow).where(
            ReplicaRow.job_id.in_(set(job_ids)), ReplicaRow.state.in_(HELD)
        )
        for r in s.scalars(q.order_by(ReplicaRow.id)):
            out.setdefault(r.job_id, []).append(r)
    return out


def halt(s: Session, reps: Iterable[ReplicaRow], now: float) -> Touched:
    """Stop ``reps`` (``intent.stop``): the checkpoint signal, then a kill after the grace
    period; replicas never dispatched end at once. Returns the nodes told."""
    return Touched(nodes=intent.stop(s, reps, now))


def finish_stop(s: Session, row: JobRow, at: float, state: str, message: str) -> None:
    """Close the job's current run and move it to ``state`` (requeued, failed, ...)."""
    close_run(s, row, at)
    if row.state != state:
        transition(s, row, state, at, message)


def close_run(s: Session, row: JobRow, at: float) -> None:
    """End the job's open run at ``at``, keeping the last checkpoint it reported inside it
    (the cost meter counts the work after it as lost when the run was interrupted)."""
    run = s.query(RunRow).filter_by(job_id=row.id, epoch=row.epoch, ended_at=None).one_or_none()
    if run is not None:
        run.ended_at = at
        ckpt = row.last_checkpoint_at
        run.checkpoint_at = ckpt if ckpt is not None and ckpt >= run.started_at else None
        row.attained_gpu_s += run.held_gpus * max(at - run.started_at, 0.0)


def bind(
    s: Session,
    world: World,
    row: JobRow,
    b: Bind,
    settings: Settings,
    ports: Ports,
    victims: list[str],
) -> Touched:
    """Start a new allocation epoch for ``row`` (``b.job``): one ``waiting`` replica per
    grant. ``ports`` are the rendezvous ports in use (the new one is added); ``victims`` are
    the jobs preempted to make room (named on the ``placed`` event)."""
    if row.state not in WAITING:
        return Touched()
    row.borrowed = b.borrowed_gpus > 0
    grants = [g for plan in b.placement.roles for g in plan.grants]
    hosts, gpus = _new_epoch(s, world, row, grants, settings, ports)
    summary = placement_summary(world, b)
    notes = [b.note] if b.note else []
    row.explanation = [summary, *describe(world.fleet.tree, b.placement), *notes]
    row.reason, row.position, row.estimated_start, row.waiting = "", None, None, []
    row.recovery_hold = None  # placed: whatever was held for it is its own again, or free
    resumed = " (resumes from its last checkpoint)" if row.epoch > 1 else ""
    data = {"nodes": hostlist(hosts), "epoch": row.epoch, "gpus": gpus, "preempted": victims}
    transition(s, row, "scheduled", world.now, f"placed: {summary}{resumed}", "placed", data)
    if b.note:
        record(s, row.id, world.now, "note", b.note)
    return Touched(jobs={row.id})


def placement_summary(world: World, b: Bind) -> str:
    """``32 x H100-80GB on 4 host(s) inside pod p0 (host-[0-3])``."""
    tree = world.fleet.tree
    parts = []
    for plan in b.placement.roles:
        hosts = [tree.hosts[g.host].name for g in plan.grants]
        gpus = sum(len(g.gpus) for g in plan.grants)
        what = f"{gpus} x {plan.gpu_type}" if gpus else f"{len(plan.grants)} CPU replica(s)"
        where = plan.domain.rpartition("/")[2] if plan.level >= Level.RACK else plan.domain
        inside = f"{plan.level.label} {where}"
        parts.append(f"{what} on {len(set(hosts))} host(s) inside {inside} ({hostlist(hosts)})")
    return "; ".join(parts)


def _new_epoch(
    s: Session,
    world: World,
    row: JobRow,
    grants: list[Grant],
    settings: Settings,
    ports: Ports,
) -> tuple[list[str], int]:
    """Start allocation epoch ``row.epoch + 1`` on ``grants``: one ``waiting`` replica per
    grant (rank = its place in ``grants``), with the rendezvous the backend's launcher
    gives, and an open run priced at its pools. Returns each rank's node and the GPUs."""
    tree = world.fleet.tree
    row.epoch += 1
    row.bound_at = world.now
    slots = [_slot(world, rank, g) for rank, g in enumerate(grants)]
    envs = settings.launcher.rendezvous(slots, ports)
    for slot, g, env in zip(slots, grants, envs, strict=True):
        s.add(_replica(row, slot, g, env, settings))
    gpus = sum(len(g.gpus) for g in grants)
    s.add(
        RunRow(
            job_id=row.id,
            epoch=row.epoch,
            queue=row.queue,
            team=row.team,
            gpus=gpus,
            gpu_share=sum(g.share.weight for g in grants if g.share is not None) or None,
            cpus=sum(g.cpus for g in grants),
            dollars_per_hour=hourly_price(tree, grants),
            started_at=world.now,
        )
    )
    return [slot.node for slot in slots], gpus


def _slot(world: World, rank: int, g: Grant) -> Slot:
    node = world.fleet.tree.hosts[g.host].name
    live = world.nodes.get(node)
    address = live.inventory.get("address", "127.0.0.1") if live is not None else "127.0.0.1"
    return Slot(rank, g.role, node, address, tuple(g.gpus))


def _replica(
    row: JobRow, slot: Slot, g: Grant, rendezvous: dict[str, str], settings: Settings
) -> ReplicaRow:
    env = {
        **rendezvous,
        "BOLT_ROLE": g.role,
        "BOLT_NODE": slot.node,
        "BOLT_RESTARTS": str(row.epoch - 1),
        **{str(k): str(v) for k, v in (row.spec.get("env") or {}).items()},
    }
    if row.array_index is not None:
        env["BOLT_ARRAY_INDEX"] = str(row.array_index)
        env["BOLT_ARRAY_JOB_ID"] = str(row.array_id)
    spec: dict[str, Any] = {
        "command": _command(row.spec, g.role),
        "cwd": row.spec.get("workdir"),
        "env": env,
        "grace_s": float((row.spec.get("checkpoint") or {}).get("grace", 120.0)),
        "checkpoint_dir": f"{settings.checkpoint_root.rstrip('/')}/{row.id}",
        "image": _role_field(row.spec, g.role, "image"),
        "outputs": row.spec.get("outputs", []),
        "storage_gb": g.storage_gb,
    }
    if g.share is not None:
        spec["share"] = g.share.to_json()
    return ReplicaRow(
        id=f"{row.id}.{row.epoch}.{slot.rank}",
        job_id=row.id,
        epoch=row.epoch,
        role=g.role,
        rank=slot.rank,
        node=slot.node,
        gpus=list(g.gpus),
        cpus=g.cpus,
        memory_gb=g.memory_gb,
        state="waiting",
        spec=spec,
    )


def _role_field(spec: dict[str, Any], role: str, key: str) -> Any:
    """``key`` of ``role`` in the stored job ``spec``, else the job's own."""
    value = next(
        (r.get(key) for r in spec.get("roles", []) if r.get("name", "worker") == role), None
    )
    return value or spec.get(key)


def _command(spec: dict[str, Any], role: str) -> list[str]:
    command = _role_field(spec, role, "command")
    if isinstance(command, str):
        return (
            ["/bin/sh", "-c", command]
            if any(c in command for c in "|&;<>$`")
            else shlex.split(command)
        )
    return [str(c) for c in command or []]


def record_waits(s: Session, world: World, waits: Iterable[Waiting]) -> None:
    """Store each waiting job's reason, place in line (left as it is for ``position`` -1:
    incremental passes leave places to full ones), estimate and evidence, writing only what
    changed since ``world`` was read, in one statement per kind of change. A job that no
    longer waits is left alone."""
    by_columns: dict[tuple[str, ...], list[dict[str, Any]]] = {}
    for w in waits:
        live = world.rows.get(w.job)
        if live is None or live.state not in WAITING:
            continue
        values: dict[str, Any] = {
            "reason": w.reason.value,
            "estimated_start": w.estimated_start,
            "waiting": list(w.detail),
        }
        if w.position >= 0:
            values["position"] = w.position
        if all(getattr(live, k) == v for k, v in values.items()):
            continue
        by_columns.setdefault(tuple(values), []).append({"_id": w.job, **values})
        stage(s, JobRow, w.job, values)
    table = cast(Table, JobRow.__table__)
    for columns, params in by_columns.items():
        q = (
            update(table)
            .where(table.c.id == bindparam("_id"), or_(*(table.c.state == w for w in WAITING)))
            .values({c: bindparam(c) for c in columns})
        )
        s.execute(q, params)

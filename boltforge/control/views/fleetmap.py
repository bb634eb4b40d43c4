"""The console's fleet map and host view, read from the store.

Contract: one pass over nodes, held replicas and live jobs (three queries whatever the fleet's
size). A job the caller may not see in detail (``Caller.sees_team``) appears only as its team:
no id, name or state.
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from boltforge.control.auth import Caller
from boltforge.control.jobs.submit import PRIORITY_NAMES
from boltforge.control.scheduling.lifecycle import LIVE, WAITING
from boltforge.control.scheduling.world import degraded_by
from boltforge.control.store.models import HELD, JobRow, NodeRow, ReplicaRow
from boltforge.control.views.jobs import node_out, node_state, summary
from boltforge.wire.console import FleetMap, GpuSlot, HostDetail, MapHost, MapPod, MapRack, Owner

MIB_PER_GB = 1024.0
# What the map reads: plain columns, and single JSON fields rather than whole documents (at
# thousands of nodes and jobs, building ORM objects and decoding JSON is most of a map's cost).
_NODE_COLUMNS = (
    NodeRow.name,
    NodeRow.pool,
    NodeRow.pod,
    NodeRow.rack,
    NodeRow.gpus,
    NodeRow.state,
    NodeRow.cordoned,
    NodeRow.reclaim_at,
    NodeRow.degraded_until,
    NodeRow.inventory["gpu"].as_string().label("gpu"),
    NodeRow.health["degraded"].as_string().label("flag"),
)
_JOB_COLUMNS = (JobRow.id, JobRow.team, JobRow.name, JobRow.state, JobRow.priority)


@dataclass(frozen=True, slots=True)
class Holder:
    """One GPU's holder: a replica's job and rank."""

    job: str
    rank: int


def holders(s: Session, nodes: list[str] | None = None) -> dict[str, dict[int, Holder]]:
    """Node -> GPU index -> its holder, over replicas that hold GPUs (``nodes``: only these)."""
    q = select(ReplicaRow.node, ReplicaRow.gpus, ReplicaRow.job_id, ReplicaRow.rank).where(
        ReplicaRow.state.in_(HELD)
    )
    if nodes is not None:
        q = q.where(ReplicaRow.node.in_(nodes))
    out: dict[str, dict[int, Holder]] = defaultdict(dict)
    for node, gpus, job, rank in s.execute(q):
        for g in gpus:
            out[node][int(g)] = Holder(job, rank)
    return out


class _Owners:
    """The map's owner table: each visible job once, each hidden team once (``jobs``: rows of
    ``_JOB_COLUMNS`` by id)."""

    def __init__(self, jobs: dict[str, Any], who: Caller) -> None:
        self.jobs, self.who = jobs, who
        self.table: list[Owner] = []
        self._index: dict[str, int] = {}

    def of(self, job_id: str) -> int:
        row = self.jobs.get(job_id)
        team = row.team if row is not None else "?"
        key = job_id if row is not None and self.who.sees_team(team) else f"team:{team}"
        if key not in self._index:
            self._index[key] = len(self.table)
            self.table.append(self._owner(key, row, team))
        return self._index[key]

    def _owner(self, key: str, row: Any, team: str) -> Owner:
        if row is None or key.startswith("team:"):
            return Owner(team=team)
        return Owner(
            job=row.id,
            team=team,
            name=row.name,
            state=row.state,
            priority_name=PRIORITY_NAMES.get(row.priority, str(row.priority)),
        )


def fleet_map(
    s: Session, who: Caller, fragmentation: float, now: float, only: set[str] | None = None
) -> FleetMap:
    """Every node by pod and rack (sorted by name), each GPU pointing at its holder; with
    ``only``, just those nodes (the fleet-wide figures still count every node)."""
    q = select(*_NODE_COLUMNS).order_by(NodeRow.pod, NodeRow.rack, NodeRow.name)
    nodes = list(s.execute(q if only is None else q.where(NodeRow.name.in_(only))))
    held = holders(s, None if only is None else sorted(only))
    ids = {h.job for by_gpu in held.values() for h in by_gpu.values()}
    jobs = {r.id: r for r in s.execute(select(*_JOB_COLUMNS).where(JobRow.id.in_(ids)))}
    owners = _Owners(jobs, who)
    pods: dict[str, dict[str, list[MapHost]]] = {}
    used = total = 0
    for n in nodes:
        taken = held.get(n.name, {})
        cells = [owners.of(taken[i].job) if i in taken else -1 for i in range(n.gpus)]
        used += len(taken)
        total += n.gpus
        host = MapHost(
            name=n.name,
            pool=n.pool,
            gpu=n.gpu or "",
            state=node_state(n.state, n.cordoned, len(taken)),
            degraded=degraded_by(n.degraded_until, n.flag, now),
            reclaim_at=n.reclaim_at,
            gpus=cells,
        )
        pods.setdefault(n.pod, {}).setdefault(n.rack, []).append(host)
    if only is not None:
        total, used = _totals(s)
    return FleetMap(
        gpus=total,
        gpus_used=used,
        fragmentation=fragmentation,
        **_counts(s),
        owners=owners.table,
        pods=[
            MapPod(name=p, racks=[MapRack(name=r, hosts=hs) for r, hs in racks.items()])
            for p, racks in pods.items()
        ],
    )


def _totals(s: Session) -> tuple[int, int]:
    """GPUs on every node, and GPUs held by replicas."""
    total = sum(s.scalars(select(NodeRow.gpus)))
    held = sum(len(g) for g in s.scalars(select(ReplicaRow.gpus).where(ReplicaRow.state.in_(HELD))))
    return total, held


def _counts(s: Session) -> dict[str, int]:
    """Nodes (and those ready for work) and live jobs running or waiting."""
    nodes = list(s.execute(select(NodeRow.state, NodeRow.cordoned)))
    states = Counter(s.scalars(select(JobRow.state).where(JobRow.state.in_(LIVE))))
    return {
        "nodes": len(nodes),
        "nodes_ready": sum(state == "ready" and not cordoned for state, cordoned in nodes),
        "jobs_running": sum(states[k] for k in ("scheduled", "running", "preempting")),
        "jobs_pending": sum(states[k] for k in WAITING),
    }


def host_detail(s: Session, node: NodeRow, who: Caller, now: float) -> HostDetail:
    """One host: each GPU's holder and NVML sample, its visible jobs, and its health in words."""
    taken = holders(s, [node.name]).get(node.name, {})
    ids = sorted({h.job for h in taken.values()})
    rows = {r.id: r for r in s.scalars(select(JobRow).where(JobRow.id.in_(ids)))}
    visible = [rows[i] for i in ids if i in rows and who.sees_team(rows[i].team)]
    samples = (node.health or {}).get("gpus") or {}
    slots = [_slot(i, taken.get(i), rows, who, samples.get(str(i))) for i in range(node.gpus)]
    base = node_out(node, len(taken), [r.id for r in visible], now)
    return HostDetail(
        **base.model_dump(),
        cordoned=node.cordoned,
        health=health_words(node, base.degraded, now),
        slots=slots,
        job_list=[summary(r) for r in visible],
    )


def _slot(
    index: int,
    holder: Holder | None,
    rows: dict[str, JobRow],
    who: Caller,
    sample: dict[str, float] | None,
) -> GpuSlot:
    slot = GpuSlot(index=index)
    if sample:
        slot.utilization = float(sample.get("util_pct", 0.0)) / 100.0
        slot.memory_used_gb = round(float(sample.get("memory_used_mib", 0.0)) / MIB_PER_GB, 2)
    if holder is None:
        return slot
    row = rows.get(holder.job)
    slot.team = row.team if row is not None else None
    if row is not None and who.sees_team(row.team):
        slot.job, slot.rank = holder.job, holder.rank
    return slot


def health_words(node: NodeRow, is_degraded: bool, now: float) -> list[str]:
    """The host's health as sentences: heartbeat age and lease, cordon, reclaim, degraded."""
    words = []
    if node.last_heartbeat is None:
        words.append("no heartbeat yet")
    else:
        words.append(f"last heartbeat {max(now - node.last_heartbeat, 0.0):.1f} s ago")
    if node.state == "suspect":
        words.append("suspect: its lease ran out; dead if it stays silent")
    elif node.state == "dead":
        words.append("dead: its jobs were requeued to resume elsewhere")
    if node.cordoned:
        words.append("cordoned: takes no new work")
    if node.reclaim_at is not None:
        words.append(f"spot reclaim notice: gone at {_clock(node.reclaim_at)}")
    if is_degraded:
        until = node.degraded_until if (node.degraded_until or 0.0) > now else None
        why = f"a straggler was found here (until {_clock(until)})" if until else "agent says so"
        words.append(f"degraded: single-host work only; {why}")
    return words


def _clock(at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(at))

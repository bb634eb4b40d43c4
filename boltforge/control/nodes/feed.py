"""The state feed: what a backend observes (nodes, their leases, replicas starting and
exiting, progress) applied to the store; see ``control/nodes/backend.py`` for the contract."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from sqlalchemy.orm import Session

from boltforge.control import auth
from boltforge.control.audit import audit
from boltforge.control.auth import Caller
from boltforge.control.nodes import agents as protocol
from boltforge.control.nodes import reports, spot
from boltforge.control.nodes.reports import apply_events, apply_logs, apply_progress
from boltforge.control.scheduling.actuate import Touched
from boltforge.control.scheduling.loop import Scheduler
from boltforge.control.store.batch import Batcher
from boltforge.control.store.outage import StoreStatus, fault_of
from boltforge.wire.agent import AgentReport, Heartbeat, Lease, Registration

REPORT_HOLD_S = 4.0  # how long a report waits for an absent store before its 503
STORE_POLL_S = 0.1


class Feed:
    """What backends observe, applied to the store in group commits; wakes the loop and
    converges the nodes whose intent changed as a result."""

    def __init__(self, writes: Batcher, scheduler: Scheduler, terms: protocol.LeaseTerms) -> None:
        self.writes, self.scheduler, self.terms = writes, scheduler, terms

    async def register(self, reg: Registration, who: Caller, now: float) -> Lease:
        """A node (re-)registers with its inventory and the replicas it still runs; raises
        ``SpecError`` for an inventory that contradicts its pool."""

        def change(s: Session) -> tuple[Lease, Touched]:
            lease, touched = protocol.register(s, reg, self.terms, now)
            inv = reg.inventory
            audit(s, who, "register", inv.name, now, gpus=inv.gpus, pool=inv.pool)
            return lease, touched

        reads = frozenset({protocol.registering(reg.inventory)})
        lease, touched = await self.writes.write_async(change, reads)
        self.scheduler.announce(touched)
        self.scheduler.wake()  # the fleet changed
        return lease

    async def heartbeat(self, node: str, hb: Heartbeat, now: float) -> Lease:
        """Renew ``node``'s lease; raises ``SessionMismatch`` when its session is not
        current (it must register again)."""
        try:
            if not self.writes.db.status.available:  # answered at once, from memory
                raise self.writes.db.status.unavailable()
            lease, touched = await self.writes.write_async(
                lambda s: protocol.heartbeat(s, node, hb, self.terms, now)
            )
        except Exception as e:
            return self._held(node, hb.session, e)
        if touched.nodes or touched.jobs:
            self.scheduler.announce(touched)
            self.scheduler.wake()
        return lease

    async def heartbeats(self, beats: dict[str, Heartbeat], now: float) -> protocol.Renewed:
        """Many nodes' heartbeats (``heartbeat`` each) in one change of the store."""
        try:
            if not self.writes.db.status.available:  # answered at once, from memory
                raise self.writes.db.status.unavailable()
            renewed = await self.writes.write_async(
                lambda s: protocol.heartbeats(s, beats, self.terms, now)
            )
        except Exception as e:
            return self._held_all(beats, e)
        touched = renewed.touched
        if touched.nodes or touched.jobs:
            self.scheduler.announce(touched)
            self.scheduler.wake()
        return renewed

    def _held(self, node: str, session: str, error: Exception) -> Lease:
        """A heartbeat the store could not take (``error``, re-raised unless the store is
        away): the lease is held from memory for a node whose session the mirror knows as
        current (``SessionMismatch`` otherwise), with nothing to stop. This is safe because
        no pass runs while the store is away, and the loop gives every live node a full
        lease when it is back (``Scheduler.recover``): the agent keeps its replicas running
        instead of fencing them for the server's outage."""
        if fault_of(error) is None:
            raise error
        protocol.current_in(self.scheduler.mirror, node, session)
        with self.scheduler.mirror.reading():
            version = self.scheduler.mirror.nodes[node].desired_version
        return Lease(
            node=node,
            session=session,
            lease_s=self.terms.lease_s,
            heartbeat_s=self.terms.heartbeat_s,
            desired_version=version,
        )

    def _held_all(self, beats: dict[str, Heartbeat], error: Exception) -> protocol.Renewed:
        """``_held`` for a batch of heartbeats: the nodes the mirror knows are held, the
        rest must register again."""
        out = protocol.Renewed({}, [], Touched())
        for name, hb in beats.items():
            try:
                out.leases[name] = self._held(name, hb.session, error)
            except protocol.SessionMismatch:
                out.lost.append(name)
        return out

    async def report(self, node: str, body: AgentReport, now: float) -> tuple[list[str], Touched]:
        """Replica events, log chunks and progress from ``node`` (``reports`` of one);
        returns the refused replica ids and what changed. Raises ``SessionMismatch`` as
        ``heartbeat`` does."""
        done = await self.reports({node: body}, now)
        if done.lost:
            raise protocol.SessionMismatch(node)
        return done.refused[node], done.touched

    async def reports(self, batch: dict[str, AgentReport], now: float) -> Reported:
        """Many nodes' reports (``report`` each) in one change of the store; a node whose
        session is not current is listed in ``lost`` and none of its report is applied."""

        def change(s: Session) -> Reported:
            out = Reported({}, [], Touched())
            for node, body in batch.items():
                try:
                    protocol.current_in(self.scheduler.mirror, node, body.session)
                except protocol.SessionMismatch:
                    out.lost.append(node)
                    continue
                refused, touched = _apply_report(s, node, body, now)
                out.refused[node] = refused
                out.touched |= touched
            return out

        await _store_back(self.writes.db.status, REPORT_HOLD_S)
        done = await self.writes.write_async(change, _reads(batch))
        events = [ev for n, body in batch.items() if n not in done.lost for ev in body.events]
        if events:
            self.scheduler.announce(done.touched)
        if any(ev.kind != "started" for ev in events):
            self.scheduler.wake()  # GPUs freed or a job ended: the plan may change
        return done


async def _store_back(status: StoreStatus, limit_s: float) -> None:
    """Wait while the store is away, up to ``limit_s``: a report held here is applied as
    soon as the store is back, rather than after its agent's next retry."""
    deadline = time.monotonic() + limit_s
    while not status.available and time.monotonic() < deadline:
        await asyncio.sleep(STORE_POLL_S)


@dataclass
class Reported:
    """What a batch of reports came to: the refused replica ids by node, the nodes that
    must register again, and what changed."""

    refused: dict[str, list[str]]
    lost: list[str]
    touched: Touched


def _apply_report(
    s: Session, node: str, body: AgentReport, now: float
) -> tuple[list[str], Touched]:
    refused, touched = apply_events(s, node, body.events)
    refused += apply_logs(s, node, body.logs, now)
    refused += apply_progress(s, node, body.progress)
    spot.settle(s, touched.jobs | {p.job for p in body.progress if p.checkpoint})
    return refused, touched


def read_ahead(s: Session, keys: set[str]) -> None:
    """The agent protocol's group reads (``Batcher``'s ``warm``): the registrations' keys
    (``agents.registering``) to ``agents.read_ahead``, the claims' (``auth.claiming``) to
    ``auth.read_claims``, the reports' replica ids to ``reports.read_ahead``."""
    registering = {k for k in keys if k.startswith(protocol.REGISTERING)}
    claims = {k for k in keys if k.startswith(auth.CLAIMING)}
    if registering:
        protocol.read_ahead(s, registering)
    if claims:
        auth.read_claims(s, claims)
    if len(registering) + len(claims) < len(keys):
        reports.read_ahead(s, keys - registering - claims)


def _reads(batch: dict[str, AgentReport]) -> frozenset[str]:
    """The replicas a batch of reports reads (the batcher orders writes that share one)."""
    return frozenset(
        r
        for body in batch.values()
        for r in (
            [e.replica for e in body.events]
            + [c.replica for c in body.logs]
            + [p.replica for p in body.progress]
        )
    )

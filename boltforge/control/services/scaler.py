"""The services' autoscaler loop: every ``every_s`` it reads each active service's load,
asks ``core/serving/autoscale.decide`` how many replicas to run, and reconciles: it submits
the missing replicas as jobs of the service (through the intake, as any submission) and
cancels the surplus (waiting ones first, then the newest), each with the checkpoint signal
and grace of a cancel. What it decided, why, and the load it saw go on the service's row."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from boltforge.control.auth import Caller
from boltforge.control.jobs.cancel import cancel_jobs
from boltforge.control.jobs.intake import Order
from boltforge.control.jobs.submit import check_fit
from boltforge.control.runtime import Runtime
from boltforge.control.scheduling.lifecycle import WAITING
from boltforge.control.services.state import (
    Replicas,
    fresh_reports,
    load_json,
    read_load,
    replicas_of,
    scaler_json,
    scaler_of,
    spec_of,
)
from boltforge.control.store.models import JobRow, ServiceRow
from boltforge.control.store.outage import fault_of
from boltforge.core.serving.autoscale import decide
from boltforge.spec.service import ServiceSpec

log = logging.getLogger("boltforge.services")
AUTOSCALER = "autoscaler"


@dataclass(frozen=True, slots=True)
class Launch:
    """Replicas to submit for one service."""

    service: str
    spec: ServiceSpec
    count: int


class Scaler:
    """Runs the loop for one server (``run``); ``step`` is one round, for tests."""

    def __init__(self, rt: Runtime, every_s: float = 5.0, fresh_s: float = 30.0) -> None:
        self.rt, self.every_s, self.fresh_s = rt, every_s, fresh_s

    async def run(self) -> None:
        while True:
            try:
                await self.step()
            except Exception as e:  # one bad round must not stop the next ones
                if fault_of(e) is None:  # the store away: its status says so, once
                    log.exception("service autoscaling failed")
            await asyncio.sleep(self.every_s)

    async def step(self) -> None:
        """One round: decide and cancel in a thread, then submit what is missing."""
        launches = await asyncio.to_thread(self.plan)
        for launch in launches:
            await self._submit(launch)

    def plan(self) -> list[Launch]:
        """Decide every active service's count now; cancel the surplus, return the missing.
        Deciding reads and writes only the services' rows; the scheduler's lock is taken
        only to cancel, as a user's cancel takes it."""
        rt, now = self.rt, self.rt.clock()
        launches: list[Launch] = []
        let_go: list[str] = []
        with rt.db.session() as s:
            rows = list(s.scalars(select(ServiceRow).where(ServiceRow.state == "active")))
            for row in rows:
                spec, replicas = spec_of(row), replicas_of(s, row.name)
                want = self._decide(s, row, spec, replicas, now)
                have = len(replicas.live)
                if want > have:
                    launches.append(Launch(row.name, spec, want - have))
                elif want < have:
                    let_go += [j.id for j in surplus(replicas, have - want)]
        if let_go:
            self._cancel(let_go, now)
        return launches

    def _cancel(self, job_ids: list[str], now: float) -> None:
        rt = self.rt
        with rt.scheduler.lock, rt.db.session() as s:
            jobs = [j for j in (s.get(JobRow, i) for i in job_ids) if j is not None]
            touched = cancel_jobs(s, jobs, AUTOSCALER, now)
        rt.scheduler.announce(touched)
        rt.scheduler.wake()

    def _decide(
        self, s: Session, row: ServiceRow, spec: ServiceSpec, replicas: Replicas, now: float
    ) -> int:
        reports = fresh_reports(s, replicas, now, self.fresh_s)
        load = read_load(row, reports, now, self.fresh_s)
        scale = decide(spec.rules(), scaler_of(row), load)
        if scale.replicas != row.desired:
            row.scale_events += 1
            row.scaled_at = now
            row.reason = scale.reason[:200]
            log.info(
                "service %s: %d -> %d (%s)", row.name, row.desired, scale.replicas, scale.reason
            )
        row.desired = scale.replicas
        row.scaler = scaler_json(scale.state)
        gateway = (row.load or {}).get("gateway")
        count = len({p.job_id for p in reports})
        row.load = {**load_json(load, count), **({"gateway": gateway} if gateway else {})}
        return scale.replicas

    async def _submit(self, launch: Launch) -> None:
        """Submit ``launch.count`` replica jobs, checked against the fleet once."""
        rt = self.rt
        template = launch.spec.template
        fleet = rt.known_fleet() or await asyncio.to_thread(rt.fleet)
        gang = check_fit(template, fleet, f"service {launch.service}")
        who = Caller(AUTOSCALER, "admin", template.team, "server")
        for _ in range(launch.count):
            order = Order(template, None, gang, who, rt.clock(), None, service=launch.service)
            rows = await rt.intake.write_async(order)
            rt.notifier.notify(["jobs", *(f"job:{r['id']}" for r in rows)])


def surplus(replicas: Replicas, count: int) -> list[JobRow]:
    """The ``count`` replicas to let go: waiting ones first, then the newest."""
    waiting = [j for j in replicas.live if j.state in WAITING]
    holding = [j for j in replicas.live if j.state not in WAITING]
    return (list(reversed(waiting)) + list(reversed(holding)))[:count]

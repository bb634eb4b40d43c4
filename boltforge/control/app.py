"""The FastAPI application: routers, error handling, and the scheduling loop's lifetime."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.telemetry import TelemetryConfig

from boltforge import __version__
from boltforge import console as web
from boltforge.control import replicas
from boltforge.control.api import (
    admin,
    agents,
    artifacts,
    bodies,
    console,
    cost,
    errors,
    jobs,
    nodes,
    services,
    storefaults,
    stream,
)
from boltforge.control.api.headers import AskedGZip
from boltforge.control.api.overload import install as install_overload
from boltforge.control.api.secure import SecurityHeaders
from boltforge.control.runtime import Runtime, ServerConfig
from boltforge.control.services.scaler import Scaler
from boltforge.control.store.leadership import Leadership
from boltforge.control.store.outage import fault_of
from boltforge.control.views import metrics

log = logging.getLogger(__name__)
NO_TELEMETRY: TelemetryConfig = {"tracing": False, "metrics": False, "logs": False}
GZIP_MIN_BYTES = 4096  # replies larger than this are compressed for clients that accept it


def create_app(config: ServerConfig, clock: Callable[[], float] = time.time) -> FastAPI:
    """An app for ``config``; the store is migrated and the loop started when it starts.
    ``clock`` is the server's time (tests pass a fake one)."""
    rt = Runtime(config, clock)

    leadership = _leadership(rt)
    acting = asyncio.Event()

    async def act() -> list[asyncio.Task[None]]:
        await asyncio.to_thread(rt.start)
        scheduler = asyncio.create_task(rt.scheduler.run(), name="scheduler")
        scaler = Scaler(rt, rt.config.scale_every_s)
        tasks = [scheduler, asyncio.create_task(_sample(rt)), asyncio.create_task(scaler.run())]
        rt.scheduler.wake()
        acting.set()
        return tasks

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        rt.notifier.bind(asyncio.get_running_loop())
        tasks: list[asyncio.Task[None]] = []
        leading: asyncio.Task[None] | None = None
        if leadership is None:
            tasks = await act()
        else:
            await asyncio.to_thread(rt.db.migrate)

            async def start() -> None:
                tasks.extend(await act())

            leading = asyncio.create_task(replicas.follow_then_lead(leadership, start))
        try:
            yield
        finally:
            await _stop(rt, tasks, acting.is_set())
            if leadership is not None and leading is not None:  # the lease, last
                leading.cancel()
                await asyncio.gather(leading, return_exceptions=True)
                await asyncio.to_thread(leadership.release)
            rt.db.close()

    app = FastAPI(
        title="Boltforge",
        version=__version__,
        description="GPU cluster scheduler: jobs, nodes and the agent protocol.",
        lifespan=lifespan,
        telemetry=None if _otel_configured() else NO_TELEMETRY,
    )
    app.state.runtime = rt
    errors.install(app)
    app.add_middleware(AskedGZip, minimum_size=GZIP_MIN_BYTES)  # not event streams
    limits = bodies.Limits(config.max_body, config.max_agent_body)
    app.add_middleware(bodies.BodyGate, limits=limits)  # the caller, then the body's size
    storefaults.install(app, rt.db.status)  # the store away: 503, not 500
    install_overload(app, rt)  # sheds a flood before anything is read
    app.add_middleware(SecurityHeaders)  # outside the rest: on every reply, refusals too
    if leadership is not None:  # outermost: a follower sends callers to the leader
        app.add_middleware(replicas.FollowerForward, leadership=leadership, acting=acting)
    for module in (jobs, agents, artifacts, nodes, admin, cost, console, services, stream):
        app.include_router(module.router)
    metrics.install(app, rt)  # GET /metrics: unauthenticated, aggregates only
    web.install(app)  # GET /console/: static files, no data without a token

    @app.get("/healthz", tags=["health"])
    def healthz() -> dict[str, str]:
        """Up; ``degraded`` with the reason and since when while the store is away; with
        leader election, also whether this replica leads (and acts) or follows."""
        store = storefaults.health(rt.db.status)
        if leadership is None:
            return {"status": "ok", **store}
        role = "leader" if leadership.leading and acting.is_set() else "follower"
        return {"status": "ok", "role": role, "replica": leadership.holder, **store}

    return app


def _leadership(rt: Runtime) -> Leadership | None:
    """The replica's side of the leader lease, when leader election is on."""
    config = rt.config
    if not config.replica:
        return None
    leadership = Leadership(rt.db, config.replica, config.advertise_url, config.leader_lease)
    rt.db.fence = leadership.fence
    return leadership


async def _stop(rt: Runtime, tasks: list[asyncio.Task[None]], acting: bool) -> None:
    """Stop the loop and the sampler (when they run) and the writers."""
    for task in tasks:
        if task.get_name() != "scheduler":
            task.cancel()
    if acting:
        rt.scheduler.stop()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError, TimeoutError):
            await asyncio.wait_for(task, 10)
    rt.intake.close()
    rt.agent_writes.close()


def _otel_configured() -> bool:
    """Whether the environment configures OpenTelemetry (any ``OTEL_`` variable, as
    ``opentelemetry-instrument`` and the SDK read them). Without it FastAPI's own spans and
    metrics would go nowhere, yet it would look for a configured provider on every request."""
    return any(name.startswith("OTEL_") for name in os.environ)


async def _sample(rt: Runtime) -> None:
    """Take a utilization sample for the console every ``sample_every_s`` seconds."""
    while True:
        try:
            await asyncio.to_thread(rt.take_sample)
        except Exception as e:  # a failed sample must not stop the next ones
            if fault_of(e) is None:  # the store away: its status says so, once
                log.exception("utilization sample failed")
        await asyncio.sleep(rt.config.sample_every_s)

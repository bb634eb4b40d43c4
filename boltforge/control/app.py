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
from boltforge.control.api import (
    admin,
    agents,
    artifacts,
    console,
    cost,
    errors,
    jobs,
    nodes,
    stream,
)
from boltforge.control.api.headers import AskedGZip
from boltforge.control.api.overload import install as install_overload
from boltforge.control.runtime import Runtime, ServerConfig
from boltforge.control.views import metrics

log = logging.getLogger(__name__)
NO_TELEMETRY: TelemetryConfig = {"tracing": False, "metrics": False, "logs": False}
GZIP_MIN_BYTES = 4096  # replies larger than this are compressed for clients that accept it


def create_app(config: ServerConfig, clock: Callable[[], float] = time.time) -> FastAPI:
    """An app for ``config``; the store is migrated and the loop started when it starts.
    ``clock`` is the server's time (tests pass a fake one)."""
    rt = Runtime(config, clock)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await asyncio.to_thread(rt.start)
        rt.notifier.bind(asyncio.get_running_loop())
        task = asyncio.create_task(rt.scheduler.run())
        sampler = asyncio.create_task(_sample(rt))
        rt.scheduler.wake()
        try:
            yield
        finally:
            sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sampler
            rt.scheduler.stop()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait_for(task, 10)
            rt.intake.close()
            rt.agent_writes.close()
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
    install_overload(app, rt)  # outermost: sheds a flood before anything is read
    for module in (jobs, agents, artifacts, nodes, admin, cost, console, stream):
        app.include_router(module.router)
    metrics.install(app, rt)  # GET /metrics: unauthenticated, aggregates only
    web.install(app)  # GET /console/: static files, no data without a token

    @app.get("/healthz", tags=["health"])
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    return app


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
        except Exception:  # a failed sample must not stop the next ones
            log.exception("utilization sample failed")
        await asyncio.sleep(rt.config.sample_every_s)

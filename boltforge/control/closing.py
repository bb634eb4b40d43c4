"""The HTTP server ``bolt server`` runs: uvicorn's, ending its long-polls when it shuts down."""

from __future__ import annotations

import socket
from typing import Any

import uvicorn
from fastapi import FastAPI

from boltforge.control.notify import Notifier


def serve(app: FastAPI, **options: Any) -> None:
    """Serve ``app`` (``create_app``'s) with uvicorn's ``options`` (``uvicorn.Config``) until
    SIGTERM or SIGINT."""
    ClosingServer(uvicorn.Config(app, **options), app.state.runtime.notifier).run()


class ClosingServer(uvicorn.Server):
    """uvicorn's server that, when it starts shutting down, first answers the long-polls it
    holds (``Notifier.close``): an agent, bridge or ``bolt`` waiting on one gets its answer
    at once instead of having its request cancelled after the graceful timeout, and the
    console's event stream ends."""

    def __init__(self, config: uvicorn.Config, notifier: Notifier) -> None:
        super().__init__(config)
        self.notifier = notifier

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self.notifier.close()
        await super().shutdown(sockets)

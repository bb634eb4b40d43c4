"""Serving a ``Cluster`` over HTTP: uvicorn (httptools, on a uvloop event loop) on a socket
bound beforehand (so port 0 picks a free port that is known before serving starts), with
the cluster's background work alongside, every watch ended cleanly on shutdown, and a
dropped watch (``WatchDropped``) kept out of uvicorn's error log. Also the kubeconfig that
points the Python client and kubectl at a server."""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable
from pathlib import Path

import uvicorn
import yaml

from boltforge.testing.kubeapi.app import KubeApi
from boltforge.testing.kubeapi.cluster import Cluster
from boltforge.testing.kubeapi.watch import WatchDropped

NAME = "boltforge-fake"
TOKEN = "fake-token"


class _DropFilter(logging.Filter):
    """Keeps uvicorn from logging a dropped watch as an application error."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], WatchDropped))


class Uvicorn(uvicorn.Server):
    """uvicorn serving ``cluster``: runs its background work, calls ``on_ready`` once
    listening, and ends every watch cleanly when shutting down."""

    def __init__(self, cluster: Cluster, on_ready: Callable[[], None] | None = None) -> None:
        app = KubeApi(cluster)
        config = uvicorn.Config(
            app,
            lifespan="off",
            log_config=None,
            log_level="warning",
            access_log=False,
            proxy_headers=False,
            timeout_graceful_shutdown=3,
            timeout_keep_alive=30,
        )
        super().__init__(config)
        self.cluster, self.on_ready = cluster, on_ready
        self._background: asyncio.Task[None] | None = None
        errors = logging.getLogger("uvicorn.error")
        if not any(isinstance(f, _DropFilter) for f in errors.filters):
            errors.addFilter(_DropFilter())

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        self._background = asyncio.get_running_loop().create_task(self.cluster.run())
        await super().startup(sockets)
        if self.on_ready is not None:
            self.on_ready()

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self.cluster.drop_watches(abrupt=False)
        await super().shutdown(sockets)
        if self._background is not None:
            self._background.cancel()


def new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def listen(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    return sock


def write_kubeconfig(url: str, path: Path | str) -> Path:
    """A kubeconfig for ``url``: one cluster, one user with a bearer token, one context
    (namespace ``default``), current. Both the Python client and kubectl read it."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": NAME, "cluster": {"server": url}}],
        "users": [{"name": NAME, "user": {"token": TOKEN}}],
        "contexts": [
            {"name": NAME, "context": {"cluster": NAME, "user": NAME, "namespace": "default"}}
        ],
        "current-context": NAME,
        "preferences": {},
    }
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(yaml.safe_dump(config, sort_keys=False))
    return target

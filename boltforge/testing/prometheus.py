"""A throwaway Prometheus server for tests: the ``prometheus`` binary (Debian's
``prometheus`` package) started directly, not as a service, scraping given targets every
second, its data in a folder the caller owns, listening on 127.0.0.1 only."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from boltforge.testing.postgres import free_port
from boltforge.testing.processes import Proc, spawn


def binary() -> str | None:
    """The ``prometheus`` executable, or None when it is not installed."""
    return shutil.which("prometheus") or (
        "/usr/bin/prometheus" if Path("/usr/bin/prometheus").exists() else None
    )


@dataclass
class Prometheus:
    """A running server at ``url`` (its log is ``proc.log``)."""

    url: str
    proc: Proc

    def query(self, promql: str) -> list[dict[str, Any]]:
        """The instant vector ``promql`` evaluates to now (``[]`` when it has no samples)."""
        r = httpx.get(f"{self.url}/api/v1/query", params={"query": promql}, timeout=5)
        r.raise_for_status()
        body = r.json()
        assert body["status"] == "success", body
        result: list[dict[str, Any]] = body["data"]["result"]
        return result


@contextmanager
def prometheus(data: Path, targets: list[str], timeout: float = 60.0) -> Iterator[Prometheus]:
    """Start a server that scrapes ``targets`` (``host:port``, path ``/metrics``) every
    second, wait until it is ready, yield it, and stop it. Raises ``RuntimeError`` when the
    binary is missing or the server exits, ``TimeoutError`` when it is not ready in time."""
    exe = binary()
    if exe is None:
        raise RuntimeError("Prometheus is not installed. To fix: apt-get install -y prometheus")
    data.mkdir(parents=True, exist_ok=True)
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [{"job_name": "boltforge", "static_configs": [{"targets": targets}]}],
    }
    (data / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    cmd = [
        exe,
        f"--config.file={data / 'prometheus.yml'}",
        f"--storage.tsdb.path={data / 'tsdb'}",
        f"--web.listen-address=127.0.0.1:{port}",
    ]
    proc = spawn(cmd, data / "prometheus.log", env={"PATH": "/usr/bin:/bin"}, cwd=data)
    server = Prometheus(f"http://127.0.0.1:{port}", proc)
    try:
        _wait_ready(server, timeout)
        yield server
    finally:
        proc.stop()


def _wait_ready(server: Prometheus, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not server.proc.alive():
            raise RuntimeError(f"prometheus exited; see {server.proc.log}")
        try:
            if httpx.get(f"{server.url}/-/ready", timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"prometheus not ready in {timeout} s; see {server.proc.log}")

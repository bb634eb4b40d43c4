"""``ApiServer``: start and stop the fake kube-apiserver, in this process (uvicorn on a
background thread with its own event loop) or as a child process (``process=True``, for
benchmarks, where the server's thread would compete for the GIL with the code under test);
write a kubeconfig for it; and turn the test knobs, which work the same in both modes."""

from __future__ import annotations

import asyncio
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import IO, Protocol

from boltforge.testing.kubeapi.cluster import Cluster, Settings
from boltforge.testing.kubeapi.control import Remote
from boltforge.testing.kubeapi.serving import Uvicorn, listen, new_loop, write_kubeconfig


class Knobs(Protocol):
    def drop_watches(self, abrupt: bool = True) -> int: ...
    def compact(self) -> int: ...
    def set_kubelet(self, on: bool) -> None: ...
    def fail_next(
        self,
        verb: str,
        resource: str,
        status: int,
        times: int = 1,
        retry_after_s: int | None = None,
    ) -> None: ...
    def counts(self) -> Counter[tuple[str, str]]: ...


class ApiServer:
    """A fake kube-apiserver for tests (see the package docstring for what it serves).

    ``with ApiServer() as kube:`` starts it (``start()`` returns the base URL,
    ``http://127.0.0.1:PORT``, also ``kube.url``; ``stop()`` ends it, and a later
    ``start()`` serves an empty cluster again); ``kube.kubeconfig(path)`` writes a kubeconfig
    for it. ``kubelet``: emulate kubelets (``kubelet_start_delay_s`` from binding to
    Running; deleted pods go after ``min(grace, kubelet_grace_cap_s)``); ``log_size``:
    changes kept for watches to resume from; ``bookmark_interval_s``: how often a watch that
    allows bookmarks gets one; ``process``: serve from a child process (``python -m
    boltforge.testing.kubeapi``, its stderr to ``log``) rather than a thread of this one;
    ``port`` 0 picks a free one. An in-process server exposes its ``cluster`` (store,
    kubelet, request log); both kinds take the knobs below."""

    def __init__(
        self,
        *,
        kubelet: bool = True,
        kubelet_start_delay_s: float = 0.0,
        kubelet_grace_cap_s: float = 0.2,
        log_size: int = 10_000,
        bookmark_interval_s: float = 2.0,
        process: bool = False,
        host: str = "127.0.0.1",
        port: int = 0,
        log: Path | None = None,
    ) -> None:
        self.settings = Settings(
            kubelet, kubelet_start_delay_s, kubelet_grace_cap_s, log_size, bookmark_interval_s
        )
        self.process, self.host, self.port, self.log = process, host, port, log
        self.url: str | None = None
        self.cluster: Cluster | None = None
        self._knobs: Knobs | None = None
        self._kubelet = kubelet
        self._thread: threading.Thread | None = None
        self._server: Uvicorn | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 30.0) -> str:
        """Start serving; the base URL."""
        if self.url is not None:
            return self.url
        self.url = self._start_process(timeout) if self.process else self._start_thread(timeout)
        return self.url

    def _start_thread(self, timeout: float) -> str:
        sock = listen(self.host, self.port)
        self.cluster = self._knobs = Cluster(self.settings)
        ready = threading.Event()
        self._server = Uvicorn(self.cluster, ready.set)
        self._thread = threading.Thread(
            target=self._serve, args=(sock,), name="kubeapi", daemon=True
        )
        self._thread.start()
        if not ready.wait(timeout):
            raise TimeoutError(f"the fake API server did not start in {timeout} s")
        return f"http://{self.host}:{sock.getsockname()[1]}"

    def _serve(self, sock: socket.socket) -> None:
        assert self._server is not None
        with asyncio.Runner(loop_factory=new_loop) as runner:
            runner.run(self._server.serve(sockets=[sock]))

    def _start_process(self, timeout: float) -> str:
        cmd = [sys.executable, "-m", "boltforge.testing.kubeapi", *self._flags()]
        err: IO[bytes] | int = self.log.open("ab") if self.log else subprocess.DEVNULL
        try:
            self._proc = subprocess.Popen(
                cmd, stdout=subprocess.PIPE, stderr=err, start_new_session=True
            )
        finally:
            if not isinstance(err, int):
                err.close()
        url = _first_line(self._proc, timeout)
        self._knobs = Remote(url)
        return url

    def _flags(self) -> list[str]:
        s = self.settings
        flags = ["--host", self.host, "--port", str(self.port), "--log-size", str(s.log_size)]
        flags += ["--kubelet-start-delay", str(s.kubelet_start_delay_s)]
        flags += ["--kubelet-grace-cap", str(s.kubelet_grace_cap_s)]
        flags += ["--bookmark-interval", str(s.bookmark_interval_s)]
        return flags + ([] if s.kubelet else ["--no-kubelet"])

    def stop(self) -> None:
        """Stop serving (open watches end); safe to call twice."""
        if self._server is not None and self._thread is not None:
            self._server.should_exit = True
            self._thread.join(15)
        if self._proc is not None:
            _terminate(self._proc)
            self._knobs = None
        self._server = self._thread = self._proc = None
        self.url = None

    def kubeconfig(self, path: Path | str) -> Path:
        """Write a kubeconfig for this server at ``path`` (started first if need be)."""
        return write_kubeconfig(self.start(), path)

    def __enter__(self) -> ApiServer:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

    @property
    def knobs(self) -> Knobs:
        if self._knobs is None:
            raise RuntimeError("the fake API server is not started")
        return self._knobs

    def drop_watches(self, abrupt: bool = True) -> int:
        """Close every open watch connection; see ``Cluster.drop_watches``."""
        return self.knobs.drop_watches(abrupt)

    def compact(self) -> int:
        """Forget all history up to now (older watches get 410); the newest version."""
        return self.knobs.compact()

    @property
    def kubelet(self) -> bool:
        """Whether the kubelet emulation runs; assign to switch it."""
        return self._kubelet

    @kubelet.setter
    def kubelet(self, on: bool) -> None:
        self.knobs.set_kubelet(on)
        self._kubelet = on

    @property
    def requests(self) -> Counter[tuple[str, str]]:
        """Requests so far by ``(verb, resource)``, e.g. ``("create", "bindings")``."""
        return self.knobs.counts()

    def fail_next(
        self,
        verb: str,
        resource: str,
        status: int,
        times: int = 1,
        retry_after_s: int | None = None,
    ) -> None:
        """Answer the next ``times`` ``verb`` requests on ``resource`` (``"*"`` for any)
        with HTTP ``status`` and a Status body (see ``RequestLog.fail_next``)."""
        self.knobs.fail_next(verb, resource, status, times, retry_after_s)


def _first_line(proc: subprocess.Popen[bytes], timeout: float) -> str:
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the fake API server exited with {proc.returncode}")
        ready, _, _ = select.select([proc.stdout], [], [], 0.1)
        if ready:
            line = proc.stdout.readline().decode().strip()
            if line:
                return line
    os.killpg(proc.pid, signal.SIGKILL)
    raise TimeoutError(f"the fake API server did not start in {timeout} s")


def _terminate(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM (the server shuts down, ending its watches), then SIGKILL."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
    if proc.stdout is not None:
        proc.stdout.close()

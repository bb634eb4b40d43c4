"""Real control-plane processes for tests: a ``bolt server`` on SQLite in a temporary
directory, ``bolt agent``s with declared 8-GPU inventories, free ports, the ``bolt`` command
run as a user would, and waiting helpers (``wait_until`` comes from
``boltforge.testing.processes``). Everything talks over loopback."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from boltforge.cli.localfleet import free_port, inventory, write_private
from boltforge.client import Client
from boltforge.testing.processes import wait_until
from boltforge.tls import Certificates

ROOT = Path(__file__).resolve().parents[2]
ADMIN = "adm-test-token"
AGENT = "agt-test-token"


def isolated_env(home: Path, **extra: str) -> dict[str, str]:
    """This environment with the user's config and data dirs moved under ``home`` (so no test
    reads or writes the real ``bolt up`` file) and the venv's bin dir first on PATH."""
    env = {k: v for k, v in os.environ.items() if k not in ("BOLT_SERVER", "BOLT_TOKEN")}
    env["XDG_CONFIG_HOME"] = str(home / "config")
    env["XDG_DATA_HOME"] = str(home / "data")
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["PYTHONUNBUFFERED"] = "1"
    return {**env, **extra}


def bolt(
    *args: str,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    timeout: float = 120.0,
) -> subprocess.CompletedProcess[str]:
    """Run ``bolt ARGS`` in a fresh process and capture what it prints."""
    return subprocess.run(
        [sys.executable, "-m", "boltforge.cli.main", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd or ROOT,
        timeout=timeout,
        check=False,
    )


def _start(args: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "boltforge.cli.main", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            cwd=ROOT,
            start_new_session=True,
        )


def _stop(proc: subprocess.Popen[bytes], grace: float = 20.0) -> None:
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


@dataclass
class Plane:
    """A running server (and its agents): its URL, a tokened environment for ``bolt``, and
    the CA certificate its ``client()`` verifies it with when it serves HTTPS."""

    home: Path
    url: str
    server: subprocess.Popen[bytes]
    agents: list[subprocess.Popen[bytes]] = field(default_factory=list)
    ca: Path | None = None

    def env(self, token: str = ADMIN) -> dict[str, str]:
        return isolated_env(self.home, BOLT_SERVER=self.url, BOLT_TOKEN=token)

    def bolt(self, *args: str, token: str = ADMIN, **kw: Any) -> subprocess.CompletedProcess[str]:
        return bolt(*args, env=self.env(token), **kw)

    def client(self, token: str = ADMIN) -> Client:
        return Client(self.url, token, ca=self.ca)

    def log(self, name: str) -> str:
        path = self.home / "logs" / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def add_agents(self, hosts: int, timeout: float = 90.0, args: tuple[str, ...] = ()) -> None:
        """Start ``hosts`` agents (host-0.. in racks of two) and wait until all are ready;
        ``args`` are added to each ``bolt agent`` command line."""
        for i in range(len(self.agents), len(self.agents) + hosts):
            inv = self.home / "nodes" / f"host-{i}.yaml"
            inv.parent.mkdir(parents=True, exist_ok=True)
            inv.write_text(inventory(i))
            work = self.home / "agents" / f"host-{i}"
            token = self.home / "tokens" / "agent"
            write_private(token, AGENT + "\n")
            line = ["agent", "--server", self.url, "--token-file", str(token)]
            line += ["--inventory", str(inv), "--work-dir", str(work)]
            line += ["--allow-shared-identity", *args]  # replicas run as the test's user
            self.agents.append(_start(line, self.home / "logs" / f"host-{i}.log", self.env()))
        want = len(self.agents)
        with self.client() as c:
            wait_until(
                lambda: sum(n.state == "ready" for n in c.nodes().nodes) >= want,
                timeout,
                f"{want} ready node(s); agent log: {self.log('host-0')[-2000:]}",
            )

    def stop(self) -> None:
        for a in self.agents:
            _stop(a, 45.0)
        _stop(self.server)


@contextmanager
def control_plane(
    home: Path, *server_args: str, hosts: int = 0, tls: Certificates | None = None
) -> Iterator[Plane]:
    """A ``bolt server`` on SQLite under ``home`` (admin token ``ADMIN``, agent token
    ``AGENT``) with ``hosts`` agents, stopped afterwards: agents first, then the server.
    With ``tls`` it serves HTTPS with that certificate and key, and ``Plane.client()``
    verifies it with that CA (agents and ``bolt`` commands need ``--ca`` for it)."""
    (home / "logs").mkdir(parents=True, exist_ok=True)
    port = free_port()
    args = ["server", "--db", f"sqlite:///{home / 'server.db'}", "--port", str(port)]
    for name, token in (("admin", ADMIN), ("agent", AGENT)):
        write_private(home / "tokens" / name, token + "\n")
        args += [f"--{name}-token-file", str(home / "tokens" / name)]
    args += ["--checkpoint-root", str(home / "checkpoints"), *server_args]
    if tls is not None:
        args += ["--tls-cert", str(tls.cert), "--tls-key", str(tls.key)]
    server = _start(args, home / "logs" / "server.log", isolated_env(home))
    scheme = "https" if tls else "http"
    plane = Plane(home, f"{scheme}://127.0.0.1:{port}", server, ca=tls.ca if tls else None)
    try:
        with plane.client() as c:
            wait_until(
                lambda: c.healthy() or server.poll() is not None, 60.0, "the server to answer"
            )
        assert server.poll() is None, plane.log("server")
        if hosts:
            plane.add_agents(hosts)
        yield plane
    finally:
        plane.stop()

"""Real control-plane processes for tests, benchmarks and soak runs: a ``bolt server`` and
``bolt agent``s standing in for GPU hosts, on loopback, each in its own process group; and the
faults to inject into them: a host that dies or hangs, a server that crashes and restarts."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from boltforge.cli.credentials import TOKEN_VARS
from boltforge.cli.localfleet import write_private
from boltforge.client import Client
from boltforge.testing.postgres import free_port

BIN = Path(sys.executable).parent


def wait_until(check: Callable[[], Any], timeout: float = 60.0, what: str = "condition") -> Any:
    """Poll ``check`` until it returns something truthy (returned); fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.2)


def bolt() -> list[str]:
    """How to run the ``bolt`` command of this environment."""
    exe = BIN / "bolt"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "boltforge.cli.main"]


def child_env(data: Path) -> dict[str, str]:
    """The environment for a child: this venv first on PATH, its own data directory, and
    no token variable of this process's (tokens go through ``token_file``)."""
    env = {k: v for k, v in os.environ.items() if k not in TOKEN_VARS}
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env["XDG_DATA_HOME"] = str(data / "xdg-data")
    env["XDG_CONFIG_HOME"] = str(data / "xdg-config")
    return env


def token_file(data: Path, name: str, token: str) -> Path:
    """``token`` in ``data/tokens/name``, readable by its owner alone: what a child is
    given instead of the token on its command line."""
    path = data / "tokens" / name
    write_private(path, token + "\n")
    path.parent.chmod(0o700)
    return path


@dataclass
class Proc:
    """A child process with its log file; ``stop`` sends SIGTERM, then SIGKILL."""

    popen: subprocess.Popen[bytes]
    log: Path

    def alive(self) -> bool:
        return self.popen.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive():
            os.killpg(self.popen.pid, sig)

    def stop(self, grace: float = 10.0) -> int | None:
        self.signal(signal.SIGTERM)
        try:
            return self.popen.wait(grace)
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGKILL)
            return self.popen.wait(5)


def spawn(cmd: list[str], log: Path, env: dict[str, str], cwd: Path | None = None) -> Proc:
    out = log.open("ab")
    popen = subprocess.Popen(
        cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd, start_new_session=True
    )
    out.close()
    return Proc(popen, log)


def replica_pids(node: str) -> list[int]:
    """The processes whose environment says they are replicas on ``node``."""
    marker = f"BOLT_NODE={node}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            env = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if marker in env:
            found.append(int(entry.name))
    return found


@dataclass
class LocalCluster:
    """A server on ``db`` (SQLite in ``data`` by default) and ``hosts`` agents of 8 GPUs, two
    per rack. ``server_args`` go to ``bolt server`` (e.g. preemption settings);
    ``agent_args`` to the ``bolt agent`` of the host they are keyed by (e.g. its prologs).
    ``shared_identity``: the agents run every team's replicas without an image as their own
    user (``--allow-shared-identity``), as the fleet's tests expect; False: as root they
    run each team as a user of its own (``agent/identity.py``), whose files must then be
    reachable by those users."""

    data: Path
    hosts: int = 4
    db: str | None = None
    server_args: list[str] = field(default_factory=list)
    agent_args: dict[str, list[str]] = field(default_factory=dict)
    server_env: dict[str, str] = field(default_factory=dict)
    admin_token: str = "adm-token"
    agent_token: str = "agt-token"
    port: int = 0
    servers: str = ""  # the agents' --server when not this cluster's own (replicas' list)
    shared_identity: bool = True
    server: Proc | None = None
    agents: dict[str, Proc] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 60.0) -> LocalCluster:
        self.data.mkdir(parents=True, exist_ok=True)
        self.port = self.port or free_port()
        self.start_server()
        self.wait_healthy(timeout)
        for i in range(self.hosts):
            self.start_agent(f"host-{i}")
        self.wait_nodes(self.hosts, timeout)
        return self

    def start_server(self) -> None:
        db = self.db or f"sqlite:///{self.data / 'store.db'}"
        cmd = [
            *bolt(),
            "server",
            "--db",
            db,
            "--port",
            str(self.port),
            "--admin-token-file",
            str(token_file(self.data, "admin", self.admin_token)),
            "--agent-token-file",
            str(token_file(self.data, "agent", self.agent_token)),
            "--checkpoint-root",
            str(self.data / "checkpoints"),
            *self.server_args,
        ]
        env = {**child_env(self.data), **self.server_env}
        self.server = spawn(cmd, self.data / "server.log", env)

    def start_agent(self, name: str, rack: str | None = None) -> Proc:
        index = int(name.rsplit("-", 1)[-1]) if name.rsplit("-", 1)[-1].isdigit() else 0
        inventory = self.data / f"{name}.yaml"
        inventory.write_text(
            yaml.safe_dump(
                {
                    "name": name,
                    "pool": "h100",
                    "gpu": "H100-80GB",
                    "gpu_memory_gb": 80,
                    "gpus": 8,
                    "nvlink_island": 8,
                    "cpus": 64,
                    "memory_gb": 512,
                    "pod": "p0",
                    "rack": rack or f"r{index // 2}",
                }
            )
        )
        cmd = [
            *bolt(),
            "agent",
            "--server",
            self.servers or self.url,
            "--token-file",
            str(token_file(self.data, "agent", self.agent_token)),
            "--inventory",
            str(inventory),
            "--work-dir",
            str(self.data / "agents" / name),
            *(["--allow-shared-identity"] if self.shared_identity else []),
            *self.agent_args.get(name, []),
        ]
        proc = spawn(cmd, self.data / f"{name}.log", child_env(self.data), cwd=Path.cwd())
        self.agents[name] = proc
        return proc

    def wait_healthy(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.server is not None and not self.server.alive():
                raise RuntimeError(f"server exited; see {self.data / 'server.log'}")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise TimeoutError(f"server not healthy in {timeout} s; see {self.data / 'server.log'}")

    def wait_nodes(self, count: int, timeout: float) -> None:
        headers = {"Authorization": f"Bearer {self.admin_token}"}
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            nodes = httpx.get(f"{self.url}/v1/nodes", headers=headers, timeout=5).json()["nodes"]
            if sum(n["state"] == "ready" for n in nodes) >= count:
                return
            time.sleep(0.1)
        raise TimeoutError(f"{count} nodes not ready in {timeout} s")

    def client(self) -> Client:
        """An admin client for the server."""
        return Client(self.url, self.admin_token)

    def kill_server(self) -> None:
        """Crash the server: SIGKILL, no shutdown of any kind."""
        assert self.server is not None
        self.server.signal(signal.SIGKILL)
        self.server.popen.wait(10)

    def restart_server(self, timeout: float = 60.0) -> None:
        """Start the server again on the same store and port, and wait until it answers."""
        self.start_server()
        self.wait_healthy(timeout)

    def host_pids(self, name: str) -> list[int]:
        """Every process of host ``name``: its agent, and the replicas it runs (found by the
        ``BOLT_NODE`` their environment carries; Linux ``/proc``)."""
        agent = self.agents[name]
        pids = [agent.popen.pid] if agent.alive() else []
        return pids + replica_pids(name)

    def kill_host(self, name: str) -> None:
        """The host dies: its agent and every replica on it get SIGKILL at once."""
        self._signal_host(name, signal.SIGKILL)
        self.agents[name].popen.wait(10)

    def freeze_host(self, name: str) -> None:
        """The host hangs (SIGSTOP to its agent and replicas): it neither runs nor answers."""
        self._signal_host(name, signal.SIGSTOP)

    def thaw_host(self, name: str) -> None:
        """The hung host resumes where it was (SIGCONT)."""
        self._signal_host(name, signal.SIGCONT)

    def _signal_host(self, name: str, sig: int) -> None:
        for pid in self.host_pids(name):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, sig)

    def stop(self) -> None:
        for proc in self.agents.values():
            proc.signal(signal.SIGCONT)
            proc.stop()
        if self.server is not None:
            self.server.stop()

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()

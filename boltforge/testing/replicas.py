"""Several ``bolt server`` replicas on one store, for tests and benchmarks: start them, find
the leader, and fail it (SIGKILL, or SIGSTOP past its lease and SIGCONT after)."""

from __future__ import annotations

import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from boltforge.testing.postgres import free_port
from boltforge.testing.processes import Proc, bolt, child_env, spawn, token_file, wait_until

ADMIN_TOKEN, AGENT_TOKEN = "adm-token", "agt-token"
EXIT_DEPOSED = 75  # control/replicas.py


@dataclass
class Replica:
    name: str
    port: int = field(default_factory=free_port)
    proc: Proc | None = None
    db: str = ""  # its own way to the store (a relay the test can cut), else the set's

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def role(self) -> str:
        """``leader`` or ``follower`` as its ``/healthz`` says; ``down`` when it does not
        answer within a second."""
        try:
            reply = httpx.get(self.url + "/healthz", timeout=1.0).json()
        except (httpx.HTTPError, ValueError):
            return "down"
        return str(reply.get("role", "down"))

    def alive(self) -> bool:
        return self.proc is not None and self.proc.alive()


@dataclass
class ReplicaSet:
    """``count`` replicas on the store ``db``, logs and checkpoints under ``data``."""

    db: str
    data: Path
    count: int = 2
    lease_s: float = 3.0
    replicas: list[Replica] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.replicas = self.replicas or [Replica(f"r{i}") for i in range(self.count)]

    @property
    def servers(self) -> str:
        """Every replica's address, comma-separated (``--server`` for agents and clients)."""
        return ",".join(r.url for r in self.replicas)

    def start(self, replica: Replica, timeout: float = 60.0) -> None:
        cmd = [
            *bolt(),
            "server",
            "--db",
            replica.db or self.db,
            "--port",
            str(replica.port),
            "--admin-token-file",
            str(token_file(self.data, "admin", ADMIN_TOKEN)),
            "--agent-token-file",
            str(token_file(self.data, "agent", AGENT_TOKEN)),
            "--checkpoint-root",
            str(self.data / "checkpoints"),
            "--replica",
            replica.name,
            "--advertise",
            replica.url,
            "--leader-lease",
            f"{self.lease_s:g}",
        ]
        log = self.data / f"server-{replica.name}.log"
        replica.proc = spawn(cmd, log, child_env(self.data))
        wait_until(lambda: replica.role() != "down", timeout, f"replica {replica.name}")

    def start_all(self, timeout: float = 60.0) -> Replica:
        """Start every replica, the first alone until it leads; the leader."""
        self.start(self.replicas[0], timeout)
        wait_until(lambda: self.replicas[0].role() == "leader", timeout, "a first leader")
        for replica in self.replicas[1:]:
            self.start(replica, timeout)
        return self.replicas[0]

    def leader(self, timeout: float = 30.0, other_than: Replica | None = None) -> Replica:
        """The replica that says it leads (waiting up to ``timeout``)."""

        def find() -> Replica | None:
            for r in self.replicas:
                if r is not other_than and r.alive() and r.role() == "leader":
                    return r
            return None

        found: Replica = wait_until(find, timeout, "a replica to lead")
        return found

    def kill(self, replica: Replica) -> None:
        assert replica.proc is not None
        replica.proc.signal(signal.SIGKILL)
        replica.proc.popen.wait(10)

    def freeze(self, replica: Replica) -> None:
        assert replica.proc is not None
        replica.proc.signal(signal.SIGSTOP)

    def thaw(self, replica: Replica) -> None:
        assert replica.proc is not None
        replica.proc.signal(signal.SIGCONT)

    def failover(self, leader: Replica, freeze: bool, timeout: float = 60.0) -> float:
        """Fail ``leader`` (SIGKILL, or SIGSTOP when ``freeze``) and time until another
        replica leads, in seconds; a frozen leader is thawed once replaced."""
        t0 = time.monotonic()
        self.freeze(leader) if freeze else self.kill(leader)
        while True:
            for r in self.replicas:
                if r is not leader and r.alive() and r.role() == "leader":
                    took = time.monotonic() - t0
                    if freeze:
                        self.thaw(leader)
                    return took
            if time.monotonic() - t0 > timeout:
                raise TimeoutError(f"no replica took over in {timeout:.0f} s")
            time.sleep(0.05)

    def stop(self) -> None:
        for r in self.replicas:
            if r.proc is not None:
                r.proc.signal(signal.SIGCONT)
                r.proc.stop()

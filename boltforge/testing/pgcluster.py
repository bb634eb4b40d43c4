"""Real PostgreSQL servers that tests and benchmarks stop, restart, kill and fail over: a
primary, streaming standbys made with ``pg_basebackup -R``, and ``pg_ctl promote``. Each
listens on 127.0.0.1 at a port of its own; everything is removed on ``close``. Runs as the
plain user ``postgres.py`` uses when this process is root. Needs Debian's ``postgresql``."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from boltforge.testing.postgres import _as_user, binaries, free_port

RECONNECT = "200ms"  # a standby's wal_retrieve_retry_interval (see ``Cluster.standby``)


@dataclass
class Server:
    """One PostgreSQL server: its data folder and port."""

    name: str
    data: Path
    port: int


class Cluster:
    """A primary (``servers[0]``, superuser ``postgres``) and the standbys added to it.
    ``password``: the superuser's password, asked for by every TCP connection (md5/scram)
    when given; without it connections are trusted."""

    def __init__(self, password: str | None = None) -> None:
        found = binaries()
        if found is None:
            raise RuntimeError("PostgreSQL is not installed. To fix: apt-get install postgresql")
        self.bin = found
        self.root = Path(tempfile.mkdtemp(prefix="boltforge-pgc-"))
        if _as_user(["true"])[0] == "runuser":
            shutil.chown(self.root, "bfpg")
        self.password = password
        self.servers: list[Server] = []
        self._init_primary()

    def _run(self, tool: str, *args: str, check: bool = True) -> None:
        cmd = _as_user([str(self.bin / tool), *args])
        subprocess.run(cmd, check=check, capture_output=True, timeout=120)

    def _init_primary(self) -> None:
        primary = Server("primary", self.root / "primary", free_port())
        auth = ["--auth=trust"]
        if self.password is not None:
            pwfile = self.root / "pw"
            pwfile.write_text(self.password + "\n")
            if _as_user(["true"])[0] == "runuser":
                shutil.chown(pwfile, "bfpg")
            auth = ["--auth-local=trust", "--auth-host=scram-sha-256", f"--pwfile={pwfile}"]
        self._run("initdb", "-D", str(primary.data), "-U", "postgres", "-E", "UTF8", *auth)
        self.servers.append(primary)
        self.start(primary)

    def url(self, server: Server | None = None, database: str = "postgres") -> str:
        """A SQLAlchemy URL for ``server`` (the primary by default)."""
        s = server or self.servers[0]
        secret = f":{self.password}" if self.password is not None else ""
        return f"postgresql+psycopg://postgres{secret}@127.0.0.1:{s.port}/{database}"

    def multi_host(self, database: str = "postgres") -> str:
        """libpq's keyword form naming every server, connecting to the one taking writes."""
        hosts = ",".join("127.0.0.1" for _ in self.servers)
        ports = ",".join(str(s.port) for s in self.servers)
        return (
            f"host={hosts} port={ports} dbname={database} user=postgres "
            "target_session_attrs=read-write connect_timeout=3"
        )

    def standby(self) -> Server:
        """A streaming standby of the primary (``pg_basebackup -R``), started. It asks the
        primary for WAL again ``RECONNECT`` after losing it (PostgreSQL's default is 5 s):
        while a synchronous standby is away, every commit on the primary waits for it, so
        after a restart of the primary the store takes writes only once it is back."""
        primary = self.servers[0]
        server = Server(f"standby{len(self.servers)}", self.root / f"s{len(self.servers)}", 0)
        server.port = free_port()
        self._run(
            "pg_basebackup",
            *("-h", "127.0.0.1", "-p", str(primary.port), "-U", "postgres"),
            *("-D", str(server.data), "-R", "-X", "stream"),
        )
        with (server.data / "postgresql.auto.conf").open("a") as conf:
            conf.write(f"wal_retrieve_retry_interval = '{RECONNECT}'\n")
        self.servers.append(server)
        self.start(server)
        return server

    def synchronous(self) -> None:
        """Make the primary's commits wait until a standby has them (``synchronous_commit``
        on, any standby): what it acknowledged survives its death and a promotion."""
        self._sql(self.servers[0], "ALTER SYSTEM SET synchronous_standby_names = '*'")
        self._sql(self.servers[0], "SELECT pg_reload_conf()")

    def _sql(self, server: Server, statement: str) -> None:
        self._run(
            "psql",
            *("-h", "127.0.0.1", "-p", str(server.port), "-U", "postgres", "-d", "postgres"),
            *("-v", "ON_ERROR_STOP=1", "-c", statement),
        )

    def start(self, server: Server) -> None:
        options = f"-c listen_addresses=127.0.0.1 -p {server.port} -k {server.data}"
        log = str(self.root / f"{server.name}.log")
        self._run("pg_ctl", "-D", str(server.data), "-o", options, "-l", log, "-w", "start")

    def stop(self, server: Server, mode: str = "fast") -> None:
        """Stop ``server`` (``immediate``: as if it died, no shutdown checkpoint)."""
        self._run("pg_ctl", "-D", str(server.data), "-m", mode, "-w", "stop", check=False)

    def promote(self, server: Server) -> None:
        """Make the standby ``server`` a primary (waits until it takes writes)."""
        self._run("pg_ctl", "-D", str(server.data), "-w", "promote")

    def close(self) -> None:
        for server in self.servers:
            self.stop(server, "immediate")
        shutil.rmtree(self.root, ignore_errors=True)

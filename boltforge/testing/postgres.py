"""A throwaway PostgreSQL server for tests and benchmarks: ``initdb`` in a temporary folder,
listening on 127.0.0.1 only, stopped and removed afterwards.

PostgreSQL refuses to run as root, so as root the server runs as a plain user (``bfpg``,
created when missing). Needs Debian's ``postgresql`` package.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

USER = "bfpg"


def binaries() -> Path | None:
    """The newest installed PostgreSQL ``bin`` folder, or None when none is installed."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(p.split("/")[-2]))
    return Path(found[-1]) if found else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _as_user(cmd: list[str]) -> list[str]:
    """``cmd`` run as the plain user when this process is root (created when missing)."""
    if os.geteuid() != 0:
        return cmd
    if subprocess.run(["id", USER], capture_output=True).returncode != 0:
        subprocess.run(["useradd", "-m", USER], check=True, capture_output=True)
    return ["runuser", "-u", USER, "--", *cmd]


@contextmanager
def postgres() -> Iterator[str]:
    """Start a server and yield its SQLAlchemy URL (``postgresql+psycopg://...``)."""
    bin_dir = binaries()
    if bin_dir is None:
        raise RuntimeError("PostgreSQL is not installed. To fix: apt-get install -y postgresql")
    root = Path(tempfile.mkdtemp(prefix="boltforge-pg-"))
    data = root / "data"
    run = _as_user
    if run(["true"])[0] == "runuser":
        shutil.chown(root, USER)
    port = free_port()
    subprocess.run(
        run(
            [
                str(bin_dir / "initdb"),
                "-D",
                str(data),
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--no-sync",
            ]
        ),
        check=True,
        capture_output=True,
    )
    options = f"-c listen_addresses=127.0.0.1 -p {port} -k {data}"
    subprocess.run(
        run(
            [
                str(bin_dir / "pg_ctl"),
                "-D",
                str(data),
                "-o",
                options,
                "-l",
                str(root / "log"),
                "-w",
                "start",
            ]
        ),
        check=True,
        capture_output=True,
    )
    try:
        yield f"postgresql+psycopg://postgres@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run(
            run([str(bin_dir / "pg_ctl"), "-D", str(data), "stop", "-m", "fast"]),
            capture_output=True,
        )
        shutil.rmtree(root, ignore_errors=True)

"""A real container engine for tests and demos: podman with runc, or a Docker engine of its
own, set up for a host with no systemd and no registry, and the example workload image built
locally (``deploy/images/build.sh``).

``containers_conf`` copies the engine configuration these hosts need
(``deploy/images/containers.conf``: runc, no default network, ulimits the engine can set)
and returns the environment that points podman at it; ``engine_problem`` says why podman
cannot be used here (None when it can). ``docker_daemon`` starts a ``dockerd`` of its own
under a folder (no bridge, no iptables: containers get ``none`` or ``host`` networking only)
and yields the environment that points the ``docker`` client at it; ``docker_problem`` says
why it cannot. ``build_train_image`` builds ``TRAIN_IMAGE`` on either (the Debian root is
cached per host).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "deploy" / "images" / "build.sh"
TRAIN_IMAGE = "localhost/boltforge-train:latest"
CONF = ROOT / "deploy" / "images" / "containers.conf"


def containers_conf(folder: Path) -> dict[str, str]:
    """Copy podman's configuration for these hosts (``deploy/images/containers.conf``) under
    ``folder``; the environment that selects it."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "containers.conf"
    path.write_text(CONF.read_text())
    return {"CONTAINERS_CONF": str(path)}


def engine_problem(env: dict[str, str]) -> str | None:
    """Why podman cannot run containers here (not installed, not root, no runc), or None."""
    if shutil.which("podman") is None:
        return "podman is not installed (apt-get install podman runc catatonit debootstrap)"
    if os.geteuid() != 0:
        return "the container tests run podman as root"
    if shutil.which("debootstrap") is None:
        return "debootstrap is not installed (the base image is built with it)"
    run = subprocess.run(
        ["podman", "info", "--format", "{{.Host.OCIRuntime.Name}}"],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=60,
        check=False,
    )
    if run.returncode != 0:
        return f"podman info failed: {run.stderr.strip()[-300:]}"
    return None


def docker_problem() -> str | None:
    """Why a Docker engine of the tests' own cannot run here, or None."""
    if shutil.which("dockerd") is None or shutil.which("docker") is None:
        return "the Docker engine is not installed (apt-get install docker.io)"
    if os.geteuid() != 0:
        return "the container tests run dockerd as root"
    if shutil.which("debootstrap") is None:
        return "debootstrap is not installed (the base image is built with it)"
    return None


DOCKERD_FLAGS = (
    "--bridge=none",
    "--iptables=false",
    "--ip6tables=false",
    "--ip-forward=false",
    "--ip-masq=false",
    "--default-ulimit",
    "nofile=1024:1024",
)


@contextlib.contextmanager
def docker_daemon(folder: Path, ready_s: float = 60.0) -> Iterator[dict[str, str]]:
    """A ``dockerd`` with its socket, data and state under ``folder``, stopped (and its
    containers with it) on exit; yields the environment (``DOCKER_HOST``) for its clients.
    Raises ``RuntimeError`` with its log when it does not answer within ``ready_s``."""
    folder.mkdir(parents=True, exist_ok=True)
    sock = folder / "docker.sock"
    env = {"DOCKER_HOST": f"unix://{sock}"}
    argv = ["dockerd", "--host", env["DOCKER_HOST"], "--data-root", str(folder / "data")]
    argv += ["--exec-root", str(folder / "exec"), "--pidfile", str(folder / "docker.pid")]
    log = (folder / "dockerd.log").open("wb")
    daemon = subprocess.Popen([*argv, *DOCKERD_FLAGS], stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + ready_s
        while not _answers(env):
            if daemon.poll() is not None or time.monotonic() > deadline:
                tail = (folder / "dockerd.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"dockerd did not start:\n{tail}")
            time.sleep(0.2)
        yield env
    finally:
        daemon.send_signal(signal.SIGTERM)
        try:
            daemon.wait(30)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait()
        log.close()


def _answers(env: dict[str, str]) -> bool:
    run = subprocess.run(
        ["docker", "version", "--format", "{{.Server.Version}}"],
        capture_output=True,
        env={**os.environ, **env},
        timeout=30,
        check=False,
    )
    return run.returncode == 0


def build_train_image(env: dict[str, str], engine: str = "podman") -> None:
    """Build ``TRAIN_IMAGE`` with ``engine`` (``podman`` or ``docker``; about 40 s the first
    time on a host, then seconds). Raises ``RuntimeError`` with the build's output when it
    fails."""
    run = subprocess.run(
        ["bash", str(BUILD), engine],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=600,
        check=False,
    )
    if run.returncode != 0:
        raise RuntimeError(f"building {TRAIN_IMAGE} failed:\n{run.stdout}\n{run.stderr}")

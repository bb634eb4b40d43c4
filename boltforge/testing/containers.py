"""A real container engine for tests and demos: podman with runc, set up for a host with no
systemd and no registry, and the example workload image built locally
(``deploy/images/build.sh``).

``containers_conf`` copies the engine configuration these hosts need
(``deploy/images/containers.conf``: runc, no default network, ulimits the engine can set)
and returns the environment that points podman at it; ``engine_problem`` says why the engine
cannot be used here (None when it can); ``build_train_image`` builds ``TRAIN_IMAGE`` (the
Debian root is cached per host).
"""

from __future__ import annotations

import os
import shutil
import subprocess
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


def build_train_image(env: dict[str, str]) -> None:
    """Build ``TRAIN_IMAGE`` with podman (about 40 s the first time on a host, then seconds).
    Raises ``RuntimeError`` with the build's output when it fails."""
    run = subprocess.run(
        ["bash", str(BUILD), "podman"],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=600,
        check=False,
    )
    if run.returncode != 0:
        raise RuntimeError(f"building {TRAIN_IMAGE} failed:\n{run.stdout}\n{run.stderr}")

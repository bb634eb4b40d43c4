"""The Slurm tests' fleet: a real Slurm cluster, a server and the bridge
(``boltforge.testing.slurm_fleet``), skipped where Slurm is not installed unless CI requires
it (BOLT_REQUIRE_SLURM=1)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from boltforge.testing.processes import wait_until
from boltforge.testing.slurm import installed
from boltforge.testing.slurm_fleet import SlurmFleet, slurm_fleet

__all__ = ["SlurmFleet", "scheduled_slurm", "wait_until"]


def require_slurm() -> None:
    if installed():
        return
    if os.environ.get("BOLT_REQUIRE_SLURM") == "1":
        raise RuntimeError("Slurm is required here. To fix: apt-get install slurm-wlm munge")
    pytest.skip("Slurm is not installed (apt-get install slurm-wlm munge)")


@contextmanager
def scheduled_slurm(
    data: Path,
    server_args: list[str] | None = None,
    bridge_args: tuple[str, ...] = (),
    cpus: int = 32,
) -> Iterator[SlurmFleet]:
    require_slurm()
    with slurm_fleet(data, server_args, bridge_args=bridge_args, cpus=cpus) as f:
        yield f

"""SQLite on a disk that fills up: a write that fails for lack of space is a 503 that says
so, nothing accepted before is lost, reads keep working, and once space is freed the same
idempotency key makes the job. The store lives on a small tmpfs mounted for the test (needs
root; skipped where mounting is not allowed)."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from control_kit import ADMIN, Fleet, make_spec, wait_for

SIZE = "12m"


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={SIZE}", "tmpfs", str(disk)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)


def fill(disk: Path) -> Path:
    """Fill ``disk`` to the last byte with one file; returns it."""
    filler = disk / "filler"
    with filler.open("wb", buffering=0) as f:
        for size in (1 << 16, 512, 1):
            with contextlib.suppress(OSError):
                while True:
                    f.write(b"\0" * size)
    return filler


def submit(fleet: Fleet, name: str, key: str) -> httpx.Response:
    reply: httpx.Response = fleet.http.post(
        "/v1/jobs",
        json={"spec": {**make_spec(name, 8), "env": {"PAD": "x" * 4000}}},
        headers={**ADMIN, "Idempotency-Key": key},
    )
    return reply


def test_a_full_disk_is_a_503_that_says_so_and_loses_nothing(
    small_disk: Path, tmp_path: Path
) -> None:
    with Fleet(tmp_path, hosts=2, db_url=f"sqlite:///{small_disk / 'store.db'}") as fleet:
        kept = [fleet.submit(make_spec(f"kept{i}", 8)) for i in range(3)]
        filler = fill(small_disk)
        refused = None
        for i in range(200):  # the WAL may still have room for a few
            r = submit(fleet, f"more{i}", f"more-{i}")
            if r.status_code != 201:
                refused = (r, i)
                break
        assert refused is not None, "the full disk took every write"
        reply, n = refused
        assert reply.status_code == 503, reply.text
        assert "has no disk space left" in reply.json()["error"]
        assert [fleet.job(j).name for j in kept] == ["kept0", "kept1", "kept2"]  # reads go on
        assert fleet.http.get("/healthz").json()["status"] == "degraded"
        filler.unlink()
        wait_for(lambda: fleet.rt.db.status.available, 30.0)
        assert submit(fleet, f"more{n}", f"more-{n}").status_code == 201
        assert [fleet.job(j).name for j in kept] == ["kept0", "kept1", "kept2"]

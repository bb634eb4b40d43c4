"""Preflight and cleanup with real processes: a ``bolt server`` and ``bolt agent``s standing in
for 8-GPU hosts. A host whose prolog fails is drained and the job runs elsewhere, never
started there; a job's leftover process and /dev/shm file are gone before its GPUs go to the
next job; and no GPU is ever held by two allocations at once."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select
from test_faults import finished, fleet, store, submit

from boltforge.control.store.invariants import double_allocations
from boltforge.control.store.models import ReplicaRow
from boltforge.testing.processes import LocalCluster, wait_until

SETTLE_S = 90.0
linux = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")

LEAKY = """
import os, pathlib, subprocess, sys
shm = pathlib.Path("/dev/shm") / (os.environ["BOLT_SHM_PREFIX"] + "seg")
shm.write_text("x")
orphan = subprocess.Popen(["sleep", "1000"])
pathlib.Path(sys.argv[1]).write_text(f"{orphan.pid} {shm}")
"""

CHECKER = """
import pathlib, sys
pid, shm = pathlib.Path(sys.argv[1]).read_text().split()
stat = pathlib.Path(f"/proc/{pid}/stat")
alive = stat.exists() and stat.read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
print(f"orphan alive: {alive}; shm left: {pathlib.Path(shm).exists()}", flush=True)
"""


def job(name: str, code: str, *args: str) -> dict[str, Any]:
    command = [sys.executable, "-c", code, *args]
    return {"name": name, "team": "research", "gpus": 8, "command": command}


def replicas(cluster: LocalCluster) -> list[ReplicaRow]:
    """Every replica the store has, after checking no GPU was ever held twice."""
    db = store(cluster)
    try:
        with db.session() as s:
            assert double_allocations(s) == []
            return list(s.scalars(select(ReplicaRow)))
    finally:
        db.close()


def test_a_host_whose_prolog_fails_is_drained_and_the_job_runs_elsewhere(tmp_path: Path) -> None:
    prolog = tmp_path / "ecc-check.sh"
    prolog.write_text('#!/bin/sh\necho "ECC errors on GPUs $CUDA_VISIBLE_DEVICES"\nexit 1\n')
    prolog.chmod(0o755)
    with fleet(tmp_path, 2, [], {"host-0": ["--prolog", str(prolog)]}) as (cluster, api):
        jobs = [submit(api, job(f"j{i}", "import time; time.sleep(1)")) for i in range(2)]
        wait_until(lambda: finished(api, *jobs), SETTLE_S, "both jobs to finish")
        assert [api.job(j).state for j in jobs] == ["succeeded", "succeeded"]
        states = {n.name: n.state for n in api.nodes().nodes}
        events = [e for j in jobs for e in api.job(j).events if e.kind == "preflight_failed"]
    assert states == {"host-0": "cordoned", "host-1": "ready"}
    [event] = events
    assert event.data["node"] == "host-0"
    assert "ecc-check.sh exited with code 1" in event.data["evidence"]
    assert "ECC errors on GPUs 0,1,2,3,4,5,6,7" in event.data["evidence"]
    on_host_0 = [r for r in replicas(cluster) if r.node == "host-0"]
    assert on_host_0 and all(r.started_at is None and r.pid is None for r in on_host_0)


@linux
def test_leftovers_are_cleaned_up_before_the_gpus_go_to_the_next_job(tmp_path: Path) -> None:
    note = tmp_path / "leak.txt"
    with fleet(tmp_path, 1, []) as (cluster, api):
        leaky = submit(api, job("leaky", LEAKY, str(note)))
        checker = submit(api, job("checker", CHECKER, str(note)))
        wait_until(lambda: finished(api, leaky, checker), SETTLE_S, "both jobs to finish")
        assert [api.job(j).state for j in (leaky, checker)] == ["succeeded", "succeeded"]
        seen = api.logs(checker).lines
        [cleanup] = [e for e in api.job(leaky).events if e.kind == "cleanup"]
    assert "orphan alive: False; shm left: False" in seen
    assert "ended 1 leftover process(es)" in cleanup.message
    assert "removed 1 /dev/shm file(s)" in cleanup.message
    [first, second] = sorted(replicas(cluster), key=lambda r: r.dispatched_at or 0)
    assert first.job_id == leaky and second.job_id == checker

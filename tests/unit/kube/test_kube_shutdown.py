"""SIGTERM stops the scheduler as the kubelet means it to (Python as a container's PID 1
would otherwise ignore it): the pass under way ends, the Lease is released, and a standby
takes the lead at its next try, without waiting out the lease duration."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections.abc import Iterator
from typing import Any

import kubernetes.client as client
import pytest
from kube_sched_rig import rig
from kube_unit_kit import serve_kube
from test_kube_scheduler_run import WAIT_S, cluster, submitting

from boltforge.kube.leader import LeaderElector
from boltforge.kube.shutdown import run_until_stopped
from boltforge.testing.kubeapi import ApiServer

NS = "boltforge-system"


@pytest.fixture
def kube(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ApiServer, client.ApiClient]]:
    yield from serve_kube(tmp_path_factory.mktemp("kube"))


def lease(api: client.CoordinationV1Api) -> dict[str, Any]:
    body = json.loads(api.read_namespaced_lease("sched", NS, _preload_content=False).data)
    spec: dict[str, Any] = body["spec"]
    return spec


def sigterm() -> None:
    os.kill(os.getpid(), signal.SIGTERM)


def test_sigterm_asks_the_run_to_stop_and_waits_for_its_cleanup() -> None:
    seen: list[str] = []

    async def go() -> None:
        stopped = asyncio.Event()

        async def run() -> None:
            try:
                asyncio.get_running_loop().call_soon(sigterm)
                await stopped.wait()
            finally:
                seen.append("cleaned up")

        await run_until_stopped(run, stopped.set)
        seen.append("returned")

    asyncio.run(go())
    assert seen == ["cleaned up", "returned"]
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # the handler is gone


def test_sigterm_releases_the_lease_and_a_standby_leads_at_its_next_try(
    monkeypatch: pytest.MonkeyPatch, kube: tuple[ApiServer, client.ApiClient]
) -> None:
    coord = client.CoordinationV1Api(kube[1])
    r = rig(monkeypatch)
    cluster(r)
    submitted = submitting(r)
    r.sched.elector = LeaderElector(coord, NS, "sched", "sched-a", retry_s=0.05)
    r.sched.leading = False

    async def go() -> None:
        run = asyncio.create_task(run_until_stopped(r.sched.run, r.sched.stop))
        assert await asyncio.to_thread(submitted.wait, WAIT_S), "it never led"
        sigterm()
        await asyncio.wait_for(run, WAIT_S)

    asyncio.run(go())
    held = lease(coord)
    assert (held["holderIdentity"], held["leaseDurationSeconds"]) == ("", 1)
    standby = LeaderElector(coord, NS, "sched", "sched-b")
    assert standby.try_once()  # at once: no lease duration to wait out
    assert lease(coord)["holderIdentity"] == "sched-b"

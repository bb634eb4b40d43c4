"""Gangs formed from their owners as users write them, against the real control plane: the
kube-controller-manager's Job controller makes an indexed Job's pods, kwok runs them, and
``bolt kube-scheduler`` places them as one gang without a PodGroup or annotation."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes.client as client
import pytest

from boltforge.testing.kube_builders import job_json
from boltforge.testing.kube_fleet import KubeFleet, kube_fleet
from boltforge.testing.processes import wait_until
from boltforge.testing.realkube import RealKube, kwok_node

WAIT_S = 60.0


@pytest.fixture
def fleet(tmp_path: Path, real_kube_session: RealKube) -> Iterator[KubeFleet]:
    """Four nodes of 8 GPUs in rack r1."""
    with kube_fleet(tmp_path, real_kube_session, [kwok_node(f"h{i}") for i in range(4)]) as f:
        yield f


def start_job(f: KubeFleet, obj: dict[str, Any]) -> None:
    client.BatchV1Api(f.kube_api).create_namespaced_job(f.namespace, obj)


def workers(f: KubeFleet, job: str) -> dict[str, dict[str, Any]]:
    """The pods the Job controller made for ``job``, by name."""
    return {
        n: p
        for n, p in f.pods().items()
        if p["metadata"].get("labels", {}).get("batch.kubernetes.io/job-name") == job
    }


def test_an_indexed_job_is_one_gang_placed_whole(fleet: KubeFleet) -> None:
    start_job(fleet, job_json("train", 3, namespace=fleet.namespace))

    def placed() -> dict[str, dict[str, Any]]:
        ws = workers(fleet, "train")
        return ws if len(ws) == 3 and all(p["spec"].get("nodeName") for p in ws.values()) else {}

    ws = wait_until(placed, WAIT_S, "the Job's three pods to be bound")
    jobs = {p["metadata"]["annotations"]["boltforge.io/job"] for p in ws.values()}
    assert len(jobs) == 1  # one Boltforge job: one gang
    (job,) = jobs
    assert len({p["spec"]["nodeName"] for p in ws.values()}) == 3
    assert fleet.api.job(job).replicas == 3


def test_a_plain_jobs_pods_are_placed_one_by_one(fleet: KubeFleet) -> None:
    start_job(fleet, job_json("batch", 2, indexed=False, namespace=fleet.namespace))

    def placed() -> dict[str, dict[str, Any]]:
        ws = workers(fleet, "batch")
        return ws if len(ws) == 2 and all(p["spec"].get("nodeName") for p in ws.values()) else {}

    ws = wait_until(placed, WAIT_S, "the Job's two pods to be bound")
    jobs = {p["metadata"]["annotations"]["boltforge.io/job"] for p in ws.values()}
    assert len(jobs) == 2  # two gangs of one

"""A JobSet is one gang, against the real control plane: the JobSet controller built from
``sigs.k8s.io/jobset`` makes its child Jobs, the controller manager's Job controller their
pods, and ``bolt kube-scheduler`` places every pod of every child Job together or none.

Skipped where the JobSet controller is not built (``testenv/kube/build.sh``), unless
BOLT_REQUIRE_KUBE=1."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes.client as client
import pytest

from boltforge.testing.kube_builders import pod_json
from boltforge.testing.kube_fleet import KubeFleet, kube_fleet
from boltforge.testing.processes import wait_until
from boltforge.testing.realkube import RealKube, kwok_node
from boltforge.testing.realkube_jobset import jobset_missing

WAIT_S = 90.0
JOBSET_NAME = "jobset.sigs.k8s.io/jobset-name"
RESTART = "jobset.sigs.k8s.io/restart-attempt"


@pytest.fixture
def fleet(tmp_path: Path, real_kube_session: RealKube) -> Iterator[KubeFleet]:
    """Five nodes of 8 GPUs in rack r1, and the JobSet controller."""
    if absent := jobset_missing():
        why = f"{', '.join(absent)} not built. To fix: testenv/kube/build.sh"
        if os.environ.get("BOLT_REQUIRE_KUBE") == "1":
            raise RuntimeError(f"the JobSet controller is required here: {why}")
        pytest.skip(f"no JobSet controller: {why}")
    nodes = [kwok_node(f"h{i}") for i in range(5)]
    with kube_fleet(tmp_path, real_kube_session, nodes) as f, real_kube_session.jobset():
        yield f


def jobset_json(
    name: str, namespace: str, shape: dict[str, tuple[int, int]], restarts: int = 0
) -> dict[str, Any]:
    """A JobSet as a user writes it: per replicatedJob (name: replicas, parallelism), indexed
    Jobs of pods of 8 GPUs for the Boltforge scheduler, restarted whole up to ``restarts``
    times when a Job fails; no PodGroup, no gang annotation."""
    replicated = []
    for rj, (replicas, parallel) in shape.items():
        spec = pod_json(rj, namespace=namespace)["spec"]
        spec["restartPolicy"] = "Never"
        job = {
            "parallelism": parallel,
            "completions": parallel,
            "backoffLimit": 0,
            "completionMode": "Indexed",
            "template": {"spec": spec},
        }
        replicated.append({"name": rj, "replicas": replicas, "template": {"spec": job}})
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"replicatedJobs": replicated, "failurePolicy": {"maxRestarts": restarts}},
    }


def start(f: KubeFleet, name: str, shape: dict[str, tuple[int, int]], **kw: Any) -> Any:
    """Create the JobSet; the object as the API server stored it."""
    return client.CustomObjectsApi(f.kube_api).create_namespaced_custom_object(
        "jobset.x-k8s.io",
        "v1alpha2",
        f.namespace,
        "jobsets",
        jobset_json(name, f.namespace, shape, **kw),
    )


def members(f: KubeFleet, jobset: str) -> dict[str, dict[str, Any]]:
    """The pods of ``jobset``'s child Jobs, by name."""
    return {
        n: p
        for n, p in f.pods().items()
        if (p["metadata"].get("labels") or {}).get(JOBSET_NAME) == jobset
    }


def scheduled(pod: dict[str, Any]) -> dict[str, Any]:
    conds = (pod.get("status") or {}).get("conditions") or []
    return next((c for c in conds if c["type"] == "PodScheduled"), {})


def test_a_jobset_is_one_gang_across_its_replicated_jobs(fleet: KubeFleet) -> None:
    made = start(fleet, "llm", {"driver": (1, 1), "workers": (2, 2)})
    assert made["spec"]["network"]["enableDNSHostnames"] is True  # its webhook defaulted it
    ps = placed(fleet, "llm", 5)
    jobs = {p["metadata"]["annotations"]["boltforge.io/job"] for p in ps.values()}
    assert len(jobs) == 1  # one Boltforge job for the pods of three child Jobs
    (job,) = jobs
    assert len({p["metadata"]["labels"]["batch.kubernetes.io/job-name"] for p in ps.values()}) == 3
    assert len({p["spec"]["nodeName"] for p in ps.values()}) == 5
    assert fleet.api.job(job).replicas == 5


def placed(f: KubeFleet, jobset: str, n: int, attempt: str = "0") -> dict[str, dict[str, Any]]:
    """Wait until the ``n`` pods of ``jobset``'s restart ``attempt`` are all bound."""

    def bound() -> dict[str, dict[str, Any]]:
        ps = {
            name: p
            for name, p in members(f, jobset).items()
            if p["metadata"]["labels"].get(RESTART) == attempt
            and not p["metadata"].get("deletionTimestamp")
        }
        return ps if len(ps) == n and all(p["spec"].get("nodeName") for p in ps.values()) else {}

    found: dict[str, dict[str, Any]] = wait_until(bound, WAIT_S, f"{n} pods of {jobset} bound")
    return found


def test_a_restarted_jobset_is_placed_again_as_a_new_attempt(fleet: KubeFleet) -> None:
    start(fleet, "retry", {"driver": (1, 1), "workers": (2, 2)}, restarts=1)
    first = placed(fleet, "retry", 5)
    (job,) = {p["metadata"]["annotations"]["boltforge.io/job"] for p in first.values()}
    worker = next(n for n, p in first.items() if "workers" in n)
    fleet.kube.end_pod(worker, fleet.namespace, exit_code=1)  # its Job fails: a restart
    again = placed(fleet, "retry", 5, attempt="1")
    jobs = {p["metadata"]["annotations"]["boltforge.io/job"] for p in again.values()}
    assert len(jobs) == 1 and jobs != {job}  # one new Boltforge job for the new attempt
    assert not set(again) & set(first)


def test_a_jobset_larger_than_the_fleet_binds_nothing_and_says_why(fleet: KubeFleet) -> None:
    start(fleet, "huge", {"driver": (1, 1), "workers": (2, 3)})  # 7 pods of 8 GPUs, 5 nodes

    def told() -> dict[str, dict[str, Any]]:
        ps = members(fleet, "huge")
        why = [scheduled(p) for p in ps.values()]
        ok = len(ps) == 7 and all(c.get("reason") == "Unschedulable" for c in why)
        return ps if ok else {}

    ps = wait_until(told, WAIT_S, "the JobSet's seven pods to say why they wait")
    for p in ps.values():
        message = scheduled(p).get("message", "")
        assert message.startswith("boltforge:") and "can never run on this fleet" in message
    assert not any(p["spec"].get("nodeName") for p in members(fleet, "huge").values())

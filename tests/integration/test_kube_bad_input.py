"""Bad input against the real control plane: a gang larger than the fleet, a PodGroup whose
``minMember`` never arrives, a pod asking for a GPU product no node has, a node deleted
under a running gang. Each time the pods say why (their ``PodScheduled`` condition),
nothing of a gang is bound while the rest of it is not, and nothing is lost: the gang is
placed once what it waits for arrives."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes.client as client
import pytest

from boltforge.testing.kube_builders import job_json, pod_group_json, pod_json
from boltforge.testing.kube_fleet import KubeFleet, kube_fleet
from boltforge.testing.processes import wait_until
from boltforge.testing.realkube import RealKube, kwok_node

WAIT_S = 60.0


@pytest.fixture
def fleet(tmp_path: Path, real_kube_session: RealKube) -> Iterator[KubeFleet]:
    """Two nodes of 8 GPUs in rack r1."""
    with kube_fleet(tmp_path, real_kube_session, [kwok_node(f"h{i}") for i in range(2)]) as f:
        yield f


def pods(f: KubeFleet, prefix: str) -> dict[str, dict[str, Any]]:
    return {n: p for n, p in f.pods().items() if n.startswith(prefix)}


def bound(f: KubeFleet, prefix: str) -> list[str]:
    return sorted(n for n, p in pods(f, prefix).items() if p["spec"].get("nodeName"))


def said(f: KubeFleet, name: str) -> dict[str, Any]:
    conds = (f.pods().get(name, {}).get("status") or {}).get("conditions") or []
    return next((c for c in conds if c["type"] == "PodScheduled"), {})


def says(f: KubeFleet, name: str, reasons: set[str], words: str = "") -> dict[str, Any]:
    """Wait until ``name``'s PodScheduled condition has one of ``reasons`` (and ``words``)."""

    def told() -> dict[str, Any] | None:
        c = said(f, name)
        return c if c.get("reason") in reasons and words in str(c.get("message")) else None

    try:
        found: dict[str, Any] = wait_until(told, WAIT_S, f"{name} to say {reasons} {words}")
    except AssertionError as e:
        raise AssertionError(f"{e}; it says {said(f, name)}") from None
    return found


def all_bound(f: KubeFleet, prefix: str, n: int) -> list[str]:
    """Wait until ``n`` pods named ``prefix``... are bound."""

    def done() -> list[str]:
        names = bound(f, prefix)
        return names if len(names) == n else []

    found: list[str] = wait_until(done, WAIT_S, f"{n} {prefix} pods to be bound")
    return found


def test_a_gang_larger_than_the_fleet_waits_whole_and_runs_once_the_fleet_grows(
    fleet: KubeFleet,
) -> None:
    ns = fleet.namespace
    client.BatchV1Api(fleet.kube_api).create_namespaced_job(ns, job_json("big", 3, namespace=ns))
    wait_until(lambda: len(pods(fleet, "big-")) == 3, WAIT_S, "the Job's three pods")
    for name in pods(fleet, "big-"):
        found = says(fleet, name, {"Unschedulable"}, "can never run on this fleet")
        assert found["message"].startswith("boltforge:")
    assert bound(fleet, "big-") == []
    fleet.kube.add_nodes([kwok_node("h2")])
    assert len(all_bound(fleet, "big-", 3)) == 3


def test_a_podgroup_whose_members_never_all_arrive_binds_none(fleet: KubeFleet) -> None:
    ns = fleet.namespace
    fleet.create(pod_group_json("trio", 3, ns))
    for i in range(2):
        fleet.create(pod_json(f"trio-{i}", group="trio", gpus=4, namespace=ns))
    for i in range(2):
        says(fleet, f"trio-{i}", {"GangIncomplete"}, "2 of the 3 pods its PodGroup trio needs")
    assert bound(fleet, "trio-") == []
    fleet.create(pod_json("trio-2", group="trio", gpus=4, namespace=ns))
    all_bound(fleet, "trio-", 3)


def test_a_pod_asking_for_an_unknown_gpu_product_holds_back_its_whole_gang(
    fleet: KubeFleet,
) -> None:
    ns = fleet.namespace
    nope = {"nvidia.com/gpu.product": "NOPE"}
    fleet.create(pod_json("pair-0", gang=("pair", 2), namespace=ns))
    fleet.create(pod_json("pair-1", gang=("pair", 2), node_selector=nope, namespace=ns))
    for name in ("pair-0", "pair-1"):
        found = says(fleet, name, {"Unschedulable"})
        assert "nvidia.com/gpu.product=NOPE" in found["message"]
    assert bound(fleet, "pair-") == []


def test_a_node_deleted_under_a_running_gang_has_the_gang_placed_again(
    fleet: KubeFleet,
) -> None:
    ns = fleet.namespace
    job = job_json("train", 2, gpus=4, namespace=ns, backoff_limit=6)
    client.BatchV1Api(fleet.kube_api).create_namespaced_job(ns, job)

    def running() -> dict[str, str]:
        ps = pods(fleet, "train-")
        up = {
            n: p["spec"]["nodeName"]
            for n, p in ps.items()
            if (p.get("status") or {}).get("phase") == "Running" and p["spec"].get("nodeName")
        }
        return up if len(up) == 2 else {}

    first = wait_until(running, WAIT_S, "the gang to run")
    gone = sorted(first.values())[0]
    fleet.core.delete_node(gone)
    fleet.kube.add_nodes([kwok_node("h9")])

    def again() -> dict[str, str]:
        now = running()
        return now if now and not set(now) & set(first) else {}

    placed = wait_until(again, WAIT_S * 3, "the gang's new pods to run")
    assert gone not in placed.values()

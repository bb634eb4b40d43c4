"""The manifests in ``deploy/kubernetes`` hold together on a stock cluster: Boltforge's pods
use a PriorityClass the manifests ship (never a ``system-`` class, which some providers'
admission refuses outside kube-system), within the values allowed outside the system
classes; and the PodGroup CRD the scheduler lists is among them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

DEPLOY = Path(__file__).resolve().parents[3] / "deploy" / "kubernetes"
MAX_USER_PRIORITY = 1_000_000_000  # above it, only the system classes


def objects() -> list[dict[str, Any]]:
    return [
        obj
        for path in sorted(DEPLOY.glob("*.yaml"))
        for obj in yaml.safe_load_all(path.read_text())
        if obj
    ]


def of_kind(kind: str) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in objects() if o["kind"] == kind}


def test_every_deployment_uses_a_priority_class_the_manifests_ship() -> None:
    classes = of_kind("PriorityClass")
    deployments = of_kind("Deployment")
    assert set(deployments) == {"boltforge-server", "boltforge-scheduler"}
    for name, deployment in deployments.items():
        used = deployment["spec"]["template"]["spec"].get("priorityClassName")
        assert used in classes, f"{name} uses {used!r}"
        assert not used.startswith("system-")


def test_the_priority_class_is_one_a_stock_cluster_accepts() -> None:
    (pc,) = of_kind("PriorityClass").values()
    assert 0 < pc["value"] <= MAX_USER_PRIORITY
    assert pc["globalDefault"] is False


def test_the_podgroup_crd_ships_with_the_manifests() -> None:
    assert "podgroups.scheduling.x-k8s.io" in of_kind("CustomResourceDefinition")

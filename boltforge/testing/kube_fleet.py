"""A Kubernetes cluster scheduled by Boltforge, for the Kubernetes tests and
``bench/kubernetes.py``: the test suite's API server (``testing/kubeapi``; no kube-apiserver
can be installed here), a ``bolt server`` with no agents, and one or more ``bolt
kube-scheduler`` processes between them. Objects are created through the real client."""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import kubernetes.client as client

from boltforge.client import Client
from boltforge.kube.connect import api_client
from boltforge.testing.kubeapi import ApiServer
from boltforge.testing.processes import LocalCluster, Proc, bolt, child_env, spawn, wait_until

PREEMPT_AT_ONCE = ["--min-runtime", "0", "--churn", "1", "--cooldown", "0"]
FAST_LEASE = ["--lease-duration", "3", "--renew-deadline", "2", "--retry-period", "0.5"]


@dataclass
class KubeFleet:
    kube: ApiServer
    server: LocalCluster
    data: Path
    kubeconfig: Path
    schedulers: dict[str, Proc] = field(default_factory=dict)

    @property
    def api(self) -> Client:
        return self.server.client()

    @cached_property
    def kube_api(self) -> client.ApiClient:
        """One client of the API server (its connections are kept)."""
        return api_client(str(self.kubeconfig))

    @property
    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.kube_api)

    def start_scheduler(self, name: str = "sched-a", *extra: str) -> Proc:
        cmd = [*bolt(), "kube-scheduler", "--server", self.server.url]
        cmd += ["--token", self.server.admin_token, "--kubeconfig", str(self.kubeconfig)]
        cmd += ["--identity", name, *FAST_LEASE, *extra]
        proc = spawn(cmd, self.data / f"{name}.log", child_env(self.data))
        self.schedulers[name] = proc
        return proc

    def kill_scheduler(self, name: str) -> None:
        proc = self.schedulers[name]
        proc.signal(signal.SIGKILL)
        proc.popen.wait(10)

    def log(self, name: str = "sched-a") -> str:
        return (self.data / f"{name}.log").read_text()

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Create ``obj`` (any kind the API server serves) through the real client."""
        return client_create(self.kube_api, obj)

    def pods(self, namespace: str = "research") -> dict[str, dict[str, Any]]:
        reply = self.core.list_namespaced_pod(namespace, _preload_content=False)
        return {p["metadata"]["name"]: p for p in json.loads(reply.data)["items"]}

    def events(self, pod: str, namespace: str = "research") -> list[dict[str, Any]]:
        reply = self.core.list_namespaced_event(
            namespace, field_selector=f"involvedObject.name={pod}", _preload_content=False
        )
        items: list[dict[str, Any]] = json.loads(reply.data)["items"]
        return items


def client_create(api: client.ApiClient, obj: dict[str, Any]) -> dict[str, Any]:
    """Create ``obj`` with the client call its kind calls for; the object as created."""
    kind, ns = obj["kind"], obj["metadata"].get("namespace", "default")
    core = client.CoreV1Api(api)
    raw = None
    if kind == "Node":
        raw = core.create_node(obj, _preload_content=False)
    elif kind == "Pod":
        raw = core.create_namespaced_pod(ns, obj, _preload_content=False)
    elif kind == "PodDisruptionBudget":
        raw = client.PolicyV1Api(api).create_namespaced_pod_disruption_budget(
            ns, obj, _preload_content=False
        )
    elif kind == "PriorityClass":
        raw = client.SchedulingV1Api(api).create_priority_class(obj, _preload_content=False)
    elif kind == "PodGroup":
        created: dict[str, Any] = client.CustomObjectsApi(api).create_namespaced_custom_object(
            "scheduling.x-k8s.io", "v1alpha1", ns, "podgroups", obj
        )
        return created
    if raw is not None:  # read to the end, so the pool reuses its connection
        body: dict[str, Any] = json.loads(raw.data)
        return body
    raise ValueError(f"no create for kind {kind}")


@contextmanager
def kube_fleet(
    data: Path, nodes: list[dict[str, Any]], server_args: list[str] | None = None
) -> Iterator[KubeFleet]:
    """The API server with ``nodes``, a server, and scheduler ``sched-a`` with every node
    registered."""
    data.mkdir(parents=True, exist_ok=True)
    with ApiServer() as kube:
        kubeconfig = kube.kubeconfig(data / "kubeconfig")
        args = [*PREEMPT_AT_ONCE, *(server_args or [])]
        with LocalCluster(data, hosts=0, server_args=args) as server:
            fleet = KubeFleet(kube, server, data, kubeconfig)
            for node in nodes:
                fleet.create(node)
            fleet.start_scheduler()
            try:
                api = fleet.api
                want = len(nodes)
                wait_until(lambda: len(api.nodes().nodes) == want, 30, f"{want} nodes to register")
                yield fleet
            finally:
                for proc in fleet.schedulers.values():
                    if proc.alive():
                        proc.stop()

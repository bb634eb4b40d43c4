"""A Kubernetes cluster scheduled by Boltforge, for the Kubernetes tests: a real control plane
(``boltforge.testing.realkube``: kube-apiserver, kube-controller-manager, kube-scheduler and
kwok's nodes), a ``bolt server`` with no agents, and one or more ``bolt kube-scheduler``
processes between them. The schedulers authenticate as the ``boltforge-scheduler``
ServiceAccount of ``deploy/kubernetes/rbac.yaml``; the test creates its objects as the
cluster's admin, through the real client, in a namespace of its own."""

from __future__ import annotations

import itertools
import json
import signal
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kubernetes.client as client

from boltforge.client import Client
from boltforge.testing.processes import (
    LocalCluster,
    Proc,
    bolt,
    child_env,
    spawn,
    token_file,
    wait_until,
)
from boltforge.testing.realkube import SCHEDULER_SA, RealKube, drain

PREEMPT_AT_ONCE = ["--min-runtime", "0", "--churn", "1", "--cooldown", "0"]
FAST_LEASE = ["--lease-duration", "3", "--renew-deadline", "2", "--retry-period", "0.5"]
LEASE = "boltforge-scheduler"
_fleets = itertools.count(1)


@dataclass
class KubeFleet:
    kube: RealKube
    server: LocalCluster
    data: Path
    kubeconfig: Path  # the scheduler's: its ServiceAccount token
    namespace: str
    schedulers: dict[str, Proc] = field(default_factory=dict)

    @property
    def api(self) -> Client:
        return self.server.client()

    @property
    def admin_kubeconfig(self) -> Path:
        return self.kube.admin_kubeconfig

    @property
    def kube_api(self) -> client.ApiClient:
        """The cluster admin's client (its connections are kept)."""
        return self.kube.api

    @property
    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.kube_api)

    def start_scheduler(self, name: str = "sched-a", *extra: str) -> Proc:
        cmd = [*bolt(), "kube-scheduler", "--server", self.server.url]
        secret = token_file(self.data, name, self.server.admin_token)
        cmd += ["--token-file", str(secret), "--kubeconfig", str(self.kubeconfig)]
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

    def ensure(self, obj: dict[str, Any]) -> None:
        """Create cluster-wide ``obj`` unless it is there (PriorityClasses, shared by the
        tests of a session)."""
        try:
            self.create(obj)
        except client.ApiException as e:
            if e.status != 409:
                raise

    def pods(self, namespace: str | None = None) -> dict[str, dict[str, Any]]:
        reply = self.core.list_namespaced_pod(namespace or self.namespace, _preload_content=False)
        return {p["metadata"]["name"]: p for p in json.loads(reply.data)["items"]}

    def events(self, pod: str, namespace: str | None = None) -> list[dict[str, Any]]:
        reply = self.core.list_namespaced_event(
            namespace or self.namespace,
            field_selector=f"involvedObject.name={pod}",
            _preload_content=False,
        )
        items: list[dict[str, Any]] = json.loads(reply.data)["items"]
        return items

    def requests(self) -> Counter[tuple[str, str]]:
        """The schedulers' requests so far (their ServiceAccount's, from the API server's
        audit log), by verb and resource: ``("create", "pods/eviction")``."""
        return self.kube.audited()


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
    data: Path,
    kube: RealKube,
    nodes: list[dict[str, Any]],
    server_args: list[str] | None = None,
    namespace: str = "research",
) -> Iterator[KubeFleet]:
    """``nodes`` (``realkube.kwok_node``s) Ready on ``kube``, the PodGroup CRD installed, a
    fresh namespace named after ``namespace``, a server, and scheduler ``sched-a`` with every
    node registered. Afterwards the schedulers are stopped and the namespace, the nodes and
    the Lease are deleted, so the next fleet on ``kube`` starts from nothing."""
    data.mkdir(parents=True, exist_ok=True)
    kube.install_crds()
    ns = kube.namespace(f"{namespace}-{next(_fleets)}")
    try:
        kube.add_nodes(nodes)
        kubeconfig = kube.scheduler_kubeconfig(data / "scheduler.kubeconfig")
        args = [*PREEMPT_AT_ONCE, *(server_args or [])]
        with LocalCluster(data, hosts=0, server_args=args) as server:
            fleet = KubeFleet(kube, server, data, kubeconfig, ns)
            fleet.start_scheduler()
            try:
                api = fleet.api
                want = len(nodes)
                wait_until(lambda: len(api.nodes().nodes) == want, 60, f"{want} nodes to register")
                yield fleet
            finally:
                for proc in fleet.schedulers.values():
                    if proc.alive():
                        proc.stop()
    finally:
        clean(kube, ns)


def clean(kube: RealKube, namespace: str) -> None:
    """Remove what a fleet left: its pods at once (no grace), its namespace, every node and
    the scheduler's Lease."""
    with suppress(client.ApiException):
        drain(
            kube.core.delete_collection_namespaced_pod(
                namespace, grace_period_seconds=0, _preload_content=False
            )
        )
    kube.delete_namespace(namespace, wait=False)
    kube.delete_nodes()
    with suppress(client.ApiException):
        client.CoordinationV1Api(kube.api).delete_namespaced_lease(LEASE, SCHEDULER_SA[0])

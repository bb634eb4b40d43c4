"""What the scheduler writes to Kubernetes: bindings, evictions, pod conditions and events.
Blocking calls of the real client, run on the scheduler's worker threads. Each returns what
happened rather than raising for the answers a scheduler expects (already bound, refused by
a disruption budget, gone)."""

from __future__ import annotations

import json
import secrets
from datetime import UTC, datetime
from typing import Any

from kubernetes.client import ApiClient, CoreV1Api, PolicyV1Api
from kubernetes.client.exceptions import ApiException

from boltforge.kube.model import KubePod

COMPONENT = "boltforge-scheduler"


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _done(response: Any) -> None:
    """Read a raw (``_preload_content=False``) answer to its end and give its connection back
    to the pool: unread, the connection is never reused and every call opens a new one (and
    against a real API server, goes through a TLS handshake)."""
    response.read()
    response.release_conn()


def _refusal(e: ApiException) -> str:
    try:
        body = json.loads(e.body or "{}")
    except ValueError:
        body = {}
    causes = [c.get("message", "") for c in (body.get("details") or {}).get("causes") or []]
    return "; ".join([body.get("message") or str(e.reason), *filter(None, causes)])


class KubeWrites:
    """The scheduler's writes, as ``instance`` of component ``boltforge-scheduler``."""

    def __init__(self, client: ApiClient, instance: str) -> None:
        self.core, self.policy, self.instance = CoreV1Api(client), PolicyV1Api(client), instance

    def bind(self, pod: KubePod, node: str, annotations: dict[str, str]) -> str | None:
        """Bind ``pod`` to ``node`` through a Binding (its annotations land on the pod, as
        the API server copies them); None when bound (now or already, to that node), else
        why not."""
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": pod.name, "uid": pod.uid, "annotations": annotations},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        try:
            _done(
                self.core.create_namespaced_binding(
                    pod.namespace, body, _preload_content=False, _request_timeout=10
                )
            )
        except ApiException as e:
            if e.status == 409 and self._bound_to(pod, node):
                return None
            return f"{e.status}: {_refusal(e)}"
        return None

    def _bound_to(self, pod: KubePod, node: str) -> bool:
        try:
            now = self.core.read_namespaced_pod(pod.name, pod.namespace, _preload_content=False)
        except ApiException:
            return False
        return bool((json.loads(now.data).get("spec") or {}).get("nodeName") == node)

    def evict(self, pod: KubePod, grace_s: float | None) -> str | None:
        """Ask the Eviction API to evict ``pod`` (it honours PodDisruptionBudgets and gives
        the pod its grace); None when the eviction was taken (or the pod is gone), else the
        API server's reason, such as a disruption budget's."""
        body: dict[str, Any] = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": pod.name, "namespace": pod.namespace},
        }
        if grace_s is not None:
            body["deleteOptions"] = {"gracePeriodSeconds": max(0, round(grace_s))}
        try:
            _done(
                self.core.create_namespaced_pod_eviction(
                    pod.name, pod.namespace, body, _preload_content=False, _request_timeout=10
                )
            )
        except ApiException as e:
            if e.status == 404:
                return None
            return f"{e.status}: {_refusal(e)}"
        return None

    def unschedulable(self, pod: KubePod, reason: str, message: str) -> None:
        """Write ``PodScheduled=False`` with Boltforge's reason on ``pod``'s status."""
        condition = {
            "type": "PodScheduled",
            "status": "False",
            "reason": reason,
            "message": message,
            "lastTransitionTime": _now(),
        }
        patch = {"status": {"conditions": [condition]}}
        try:
            _done(
                self.core.patch_namespaced_pod_status(
                    pod.name, pod.namespace, patch, _preload_content=False, _request_timeout=10
                )
            )
        except ApiException as e:
            if e.status != 404:
                raise

    def event(self, pod: KubePod, reason: str, message: str, kind: str = "Normal") -> None:
        """A core/v1 Event about ``pod`` (what ``kubectl describe pod`` shows)."""
        now = _now()
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {
                "name": f"{pod.name}.{secrets.token_hex(8)}",
                "namespace": pod.namespace,
            },
            "involvedObject": {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": pod.name,
                "namespace": pod.namespace,
                "uid": pod.uid,
            },
            "reason": reason,
            "message": message[:1024],
            "type": kind,
            "source": {"component": COMPONENT},
            "reportingComponent": COMPONENT,
            "reportingInstance": self.instance,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        _done(
            self.core.create_namespaced_event(
                pod.namespace, body, _preload_content=False, _request_timeout=10
            )
        )

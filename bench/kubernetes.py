"""Boltforge as a Kubernetes scheduler at fleet scale, on a real control plane
(``boltforge.testing.realkube``: kube-apiserver, kube-controller-manager, the default
kube-scheduler and kwok, at the releases of ``testenv/kube/versions.env``): 1,024 kwok nodes
of 8 GPUs in racks of 16, 2,000 pods in gangs, the real ``bolt kube-scheduler`` (with the
``boltforge-scheduler`` ServiceAccount's token and RBAC) and ``bolt server`` processes, and
the default scheduler placing pods of its own beside them. kwok runs no containers: bound pods
go Running at once and evicted pods leave at once.

- **api_server**: the ``gitVersion`` the API server reports at ``/version``.
- **startup_s**: the control plane from nothing until its controllers run.
- **register_s**: from the nodes' creation until all are Ready and registered with the server.
- **background_bind_s**: 250 gangs of 8 pods of 2 GPUs (2,000 pods), created at once, until
  every pod is bound.
- **gang_bind_ms**: a 64-pod gang (a PodGroup and 64 pods of 1 GPU) timed from its last
  pod's creation until all 64 are bound, as a watch sees them. ``--gangs`` of them, one at a
  time. Target: p50 under 100 ms, p99 under 300 ms.
- **requests_per_gang**: the scheduler's requests to the API server per 64-pod gang, by kind
  (bindings, status patches, events, evictions, the rest), from the API server's audit log.
- **bind_floor_ms**: the API server's floor for the same 64 bindings: 64 pods of 1 GPU that
  no scheduler watches (``schedulerName: bench-direct``), bound by this script alone through
  the scheduler's own binding call on 32 threads onto 8 empty nodes, timed the same way
  (from the last pod's creation until a watch sees all 64 bound). No decision is made: it
  is what the control plane on this machine takes to accept and announce 64 bindings, the
  part of gang_bind_ms no scheduler can remove.
- **gang_first_binding_ms** and **gang_bindings_ms**: gang_bind_ms in parts, from the API
  server's audit log: until the first of the gang's bindings reaches the API server (the
  scheduler and the server deciding), then until the last of its 64 bindings is answered.
- **preempt_ms**: the rest of the fleet filled with low-priority gangs, then a high-priority
  64-pod gang: from its last pod's creation until the first eviction is seen (a victim pod
  marked for deletion, or gone), and **preempt_bind_ms** until the high gang is bound.
  ``--rounds``. Target: p50 under 200 ms.

``--json`` prints the figures as one object. Figures depend on the machine; nothing here
asserts them. Needs ``testenv/kube/build.sh`` to have been run.
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run as ``python bench/kubernetes.py``, this file's folder comes first on the path and its
# name would hide the ``kubernetes`` client package.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).parent.resolve()]

import argparse
import json
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Any

import kubernetes.client as client
import numpy as np

from boltforge.kube import model
from boltforge.kube.actions import KubeWrites
from boltforge.kube.informer import Informer
from boltforge.testing.kube_builders import CLASSES, pod_group_json, pod_json
from boltforge.testing.kube_fleet import PREEMPT_AT_ONCE, client_create
from boltforge.testing.processes import LocalCluster, bolt, child_env, spawn, token_file, wait_until
from boltforge.testing.realkube import RealKube, kwok_node, real_kube

NODES, RACK = 1024, 16


def pct(values: list[float]) -> dict[str, float]:
    return {
        "p50": round(float(np.percentile(values, 50)), 1),
        "p99": round(float(np.percentile(values, 99)), 1),
    }


class Watcher:
    """Every pod, as a watch sees it; ``until`` waits for a condition on them."""

    def __init__(self, api: client.ApiClient) -> None:
        self.changed = threading.Condition()
        self.informer: Informer[model.KubePod] = Informer(
            "pods", client.CoreV1Api(api).list_pod_for_all_namespaces, model.pod, self._poke
        )
        self.informer.start()
        self.informer.synced.wait(30)

    def _poke(self) -> None:
        with self.changed:
            self.changed.notify_all()

    def until(self, check: Callable[[dict[str, model.KubePod]], bool], timeout: float) -> float:
        """Wait until ``check`` holds on the pods; the monotonic time it was seen."""
        deadline = time.monotonic() + timeout
        with self.changed:
            while True:
                with self.informer.lock:  # no copy: this runs on every change
                    if check(self.informer.items):
                        return time.monotonic()
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError("pods did not reach the state in time")
                self.changed.wait(min(left, 0.5))


def create_all(api: client.ApiClient, objs: list[dict[str, Any]], workers: int = 16) -> None:
    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(lambda o: client_create(api, o), objs))


def gang_objs(
    name: str,
    pods: int,
    gpus: int,
    *,
    priority: str = "",
    group: bool = True,
    namespace: str = "bench",
) -> list[dict[str, Any]]:
    objs: list[dict[str, Any]] = []
    if group:
        objs.append(pod_group_json(name, pods, namespace))
    for i in range(pods):
        objs.append(
            pod_json(
                f"{name}-{i}",
                namespace=namespace,
                gpus=gpus,
                priority_class=priority,
                group=name if group else None,
                gang=None if group else (name, pods),
            )
        )
    return objs


def bound(names: list[str]) -> Callable[[dict[str, model.KubePod]], bool]:
    def check(pods: dict[str, model.KubePod]) -> bool:
        return all((p := pods.get(f"bench/{n}")) is not None and p.bound for n in names)

    return check


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gangs", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    data = Path(tempfile.mkdtemp(prefix="bench-kube-"))
    result: dict[str, Any] = {"nodes": NODES, "gpus": NODES * 8}
    t0 = time.monotonic()
    with real_kube(data / "kube", scheduler=True) as kube:
        result["api_server"] = kube.version()["gitVersion"]
        result["startup_s"] = round(time.monotonic() - t0, 1)
        kube.install_crds()
        kube.namespace("bench")
        kube.namespace("bench-default")
        kubeconfig = kube.scheduler_kubeconfig(data / "scheduler.kubeconfig")
        with LocalCluster(data, hosts=0, server_args=[*PREEMPT_AT_ONCE]) as server:
            run(kube, server, data, kubeconfig, args, result)
    if args.json:
        print(json.dumps(result))
    else:
        for k, v in result.items():
            print(f"{k:>20}: {v}")


def run(
    kube: RealKube,
    server: LocalCluster,
    data: Path,
    kubeconfig: Path,
    args: argparse.Namespace,
    result: dict[str, Any],
) -> None:
    api = kube.api
    t0 = time.monotonic()
    kube.add_nodes(kwok_node(f"n{i:04d}", rack=f"r{i // RACK:02d}") for i in range(NODES))
    cmd = [
        *bolt(),
        "kube-scheduler",
        "--server",
        server.url,
        "--token-file",
        str(token_file(data, "scheduler", server.admin_token)),
        "--kubeconfig",
        str(kubeconfig),
        "--no-leader-election",
    ]
    sched = spawn(cmd, data / "scheduler.log", child_env(data))
    try:
        bf = server.client()
        wait_until(lambda: len(bf.nodes().nodes) == NODES, 300, "nodes to register")
        result["register_s"] = round(time.monotonic() - t0, 1)
        create_all(api, CLASSES)
        watch = Watcher(api)
        create_all(api, default_scheduler_pods(64))  # the default scheduler's own, beside
        background = [
            o
            for g in range(250)
            for o in gang_objs(f"bg{g:03d}", 8, 2, priority="low", group=False)
        ]
        t0 = time.monotonic()
        create_all(api, background)
        names = [o["metadata"]["name"] for o in background if o["kind"] == "Pod"]
        result["background_bind_s"] = round(watch.until(bound(names), 600) - t0, 1)
        result["bind_floor_ms"] = pct(
            [bind_floor(api, watch, f"floor{i:02d}") for i in range(args.gangs)]
        )
        before = kube.audited()
        created: dict[str, float] = {}  # by gang: the wall-clock time its last pod was made
        result["gang_bind_ms"] = pct(
            [gang_bind(api, watch, f"g{i:02d}", created) for i in range(args.gangs)]
        )
        result["requests_per_gang"] = per_gang(kube.audited() - before, args.gangs)
        first, spans = binding_spans(kube, created)
        result["gang_first_binding_ms"] = pct(first)
        result["gang_bindings_ms"] = pct(spans)
        fill(api, watch)
        rounds = [preempt(api, watch, f"hi{i}") for i in range(args.rounds)]
        result["preempt_ms"] = pct([r[0] for r in rounds])
        result["preempt_bind_ms"] = pct([r[1] for r in rounds])
        result["default_scheduler_pods_bound"] = watch_default(api)
    finally:
        sched.stop()


def default_scheduler_pods(n: int) -> list[dict[str, Any]]:
    """Pods without GPUs for the default scheduler (``schedulerName`` default-scheduler)."""
    pods = []
    for i in range(n):
        pod = pod_json(f"web-{i}", namespace="bench-default", gpus=0, scheduler="default-scheduler")
        pod["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "1"}}
        pods.append(pod)
    return pods


def watch_default(api: client.ApiClient) -> int:
    """How many of the default scheduler's pods are bound."""
    reply = client.CoreV1Api(api).list_namespaced_pod("bench-default", _preload_content=False)
    return sum(1 for p in json.loads(reply.data)["items"] if p["spec"].get("nodeName"))


def binding_spans(kube: RealKube, created: dict[str, float]) -> tuple[list[float], list[float]]:
    """Per gang, from the audit log: ms from its last pod's creation until its first binding
    reaches the API server, and from then until its last binding is answered."""
    gangs = created
    first: dict[str, float] = {}
    last: dict[str, float] = {}
    with kube.audit_log.open() as f:
        for line in f:
            event = json.loads(line)
            ref = event.get("objectRef") or {}
            if event.get("verb") != "create" or ref.get("resource") != "bindings":
                continue
            gang = str(ref.get("name", "")).rsplit("-", 1)[0]
            if gang not in gangs:
                continue
            received = _stamp(event["requestReceivedTimestamp"])
            answered = _stamp(event["stageTimestamp"])
            first[gang] = min(first.get(gang, received), received)
            last[gang] = max(last.get(gang, answered), answered)
    seen = [g for g in gangs if g in first]
    return (
        [(first[g] - created[g]) * 1000 for g in seen],
        [(last[g] - first[g]) * 1000 for g in seen],
    )


def _stamp(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def per_gang(counts: Counter[tuple[str, str]], gangs: int) -> dict[str, float]:
    """The scheduler's requests per gang, by kind."""
    kinds = {
        "binds": ("create", "bindings"),
        "status_patches": ("patch", "pods/status"),
        "events": ("create", "events"),
        "evictions": ("create", "pods/eviction"),
    }
    out = {k: round(counts.get(key, 0) / gangs, 1) for k, key in kinds.items()}
    rest = sum(v for key, v in counts.items() if key not in kinds.values())
    out["other"] = round(rest / gangs, 1)
    return out


def gang_bind(api: client.ApiClient, watch: Watcher, name: str, created: dict[str, float]) -> float:
    objs = gang_objs(name, 64, 1)
    create_all(api, objs)
    t0 = time.monotonic()
    created[name] = time.time()
    names = [o["metadata"]["name"] for o in objs if o["kind"] == "Pod"]
    return (watch.until(bound(names), 60) - t0) * 1000


def bind_floor(api: client.ApiClient, watch: Watcher, name: str) -> float:
    """ms to bind 64 one-GPU pods straight from this client onto 8 empty nodes, until the
    watch sees all bound; the pods are deleted afterwards."""
    pods = [
        pod_json(f"{name}-{i}", namespace="bench", gpus=1, scheduler="bench-direct")
        for i in range(64)
    ]
    names = [p["metadata"]["name"] for p in pods]
    create_all(api, pods)
    t0 = time.monotonic()
    watch.until(lambda seen: all(f"bench/{n}" in seen for n in names), 60)
    snapshot = watch.informer.snapshot()
    busy = {p.node for p in snapshot.values() if p.node}
    empty = [f"n{i:04d}" for i in range(NODES) if f"n{i:04d}" not in busy][:8]
    writes = KubeWrites(api, "bench")
    targets = [(snapshot[f"bench/{n}"], empty[i // 8]) for i, n in enumerate(names)]
    with ThreadPoolExecutor(32) as pool:
        refused = [w for w in pool.map(lambda t: writes.bind(t[0], t[1], {}), targets) if w]
    if refused:
        raise RuntimeError(f"a direct binding was refused: {refused[0]}")
    seen = watch.until(bound(names), 60)
    core = client.CoreV1Api(api)
    for n in names:
        core.delete_namespaced_pod(n, "bench", grace_period_seconds=0)
    watch.until(lambda now: not any(f"bench/{n}" in now for n in names), 120)
    return (seen - t0) * 1000


def fill(api: client.ApiClient, watch: Watcher) -> None:
    """Low-priority annotation gangs of 8 pods of 8 GPUs into the free nodes."""
    used = sum(p.gpus for p in watch.informer.snapshot().values() if p.bound)
    free_nodes = (NODES * 8 - used) // 8
    objs = [
        o
        for g in range(free_nodes // 8)
        for o in gang_objs(f"fill{g:03d}", 8, 8, priority="low", group=False)
    ]
    create_all(api, objs)
    names = [o["metadata"]["name"] for o in objs]
    watch.until(bound(names), 300)


def preempt(api: client.ApiClient, watch: Watcher, name: str) -> tuple[float, float]:
    before = {k for k, p in watch.informer.snapshot().items() if p.deleting}
    objs = gang_objs(name, 64, 1, priority="high")
    create_all(api, objs)
    t0 = time.monotonic()
    names = [o["metadata"]["name"] for o in objs if o["kind"] == "Pod"]
    known = set(watch.informer.snapshot())

    def evicting(pods: dict[str, model.KubePod]) -> bool:
        gone = known - set(pods)
        return bool(gone) or any(p.deleting and k not in before for k, p in pods.items())

    evicted = watch.until(evicting, 60)
    placed = watch.until(bound(names), 60)
    return (evicted - t0) * 1000, (placed - t0) * 1000


if __name__ == "__main__":
    main()

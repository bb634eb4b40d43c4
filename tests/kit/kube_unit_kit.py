"""Builders for the Kubernetes scheduler's unit tests: parsed pods and nodes in the states a
pass meets them (bound, running, finished, being deleted, carrying a binding's
annotations), the server's desired replicas, a fake API server with a client of it, and the
scheduler's collaborators in memory (the agent protocol, the job API, its writes)."""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import kubernetes.client as client

from boltforge.client import ApiFailure
from boltforge.kube import model
from boltforge.kube.connect import api_client
from boltforge.kube.model import KubeNode, KubePod, PodGroup
from boltforge.testing.kube_builders import node_json, pod_json
from boltforge.testing.kubeapi import ApiServer
from boltforge.wire.agent import (
    AgentReport,
    DesiredChanges,
    Heartbeat,
    HeartbeatsReply,
    Lease,
    Registration,
    ReplicaEvent,
    ReplicaSpec,
    ReportsReply,
)
from boltforge.wire.jobs import SubmitRequest

_uids = itertools.count(1)


def raw_pod(
    name: str,
    *,
    node: str = "",
    phase: str = "Pending",
    uid: str | None = None,
    replica: str | None = None,
    job: str | None = None,
    deleting: bool = False,
    exit_codes: tuple[int, ...] = (),
    refused: tuple[str, str] | None = None,
    **kw: Any,
) -> dict[str, Any]:
    """``pod_json`` in the state a pass may find it: bound to ``node``, in ``phase``, with
    the annotations a binding of ``replica`` of ``job`` wrote, its containers ended with
    ``exit_codes``; ``refused``: Failed by its kubelet's admission (reason, message)."""
    obj = pod_json(name, **kw)
    meta = obj["metadata"]
    meta["uid"] = uid or f"uid-{name}-{next(_uids)}"
    meta["creationTimestamp"] = "2025-01-01T00:00:00Z"
    if replica is not None:
        meta["annotations"][model.REPLICA] = replica
    if job is not None:
        meta["annotations"][model.JOB] = job
    if deleting:
        meta["deletionTimestamp"] = "2025-01-01T00:01:00Z"
    if node:
        obj["spec"]["nodeName"] = node
    statuses = [
        {"name": f"c{i}", "state": {"terminated": {"exitCode": code}}}
        for i, code in enumerate(exit_codes)
    ]
    obj["status"] = {"phase": phase, "containerStatuses": statuses}
    if refused is not None:
        obj["status"].update(phase="Failed", reason=refused[0], message=refused[1])
    return obj


def kpod(name: str, **kw: Any) -> KubePod:
    """A parsed pod (see ``raw_pod``)."""
    return model.pod(raw_pod(name, **kw))


def knode(name: str, **kw: Any) -> KubeNode:
    """A parsed node (see ``node_json``)."""
    return model.node(node_json(name, **kw))


def kgroup(name: str, min_member: int, *, uid: str = "", namespace: str = "research") -> PodGroup:
    return PodGroup(namespace, name, uid or f"pg-{name}", min_member)


def by_key(pods: list[KubePod]) -> dict[str, KubePod]:
    """Pods as the pod informer keeps them (``namespace/name``)."""
    return {f"{p.namespace}/{p.name}": p for p in pods}


def rspec(
    job: str,
    epoch: int,
    rank: int,
    *,
    action: str = "run",
    role: str = "gpu8",
    grace_s: float = 30.0,
    command: tuple[str, ...] = ("kubernetes-pod",),
) -> ReplicaSpec:
    """Replica ``job.epoch.rank`` of role ``role`` as the server's desired state holds it."""
    return ReplicaSpec.model_validate(
        {
            "replica": f"{job}.{epoch}.{rank}",
            "job": job,
            "epoch": epoch,
            "action": action,
            "command": list(command),
            "env": {"BOLT_ROLE": role},
            "grace_s": grace_s,
        }
    )


def serve_kube(tmp: Path) -> Iterator[tuple[ApiServer, client.ApiClient]]:
    """A fake API server (no kubelet: pods stay as the test puts them) and a client of it,
    built with ``connect.api_client`` from a kubeconfig, as the scheduler builds its own."""
    kube = ApiServer(kubelet=False, bookmark_interval_s=60.0)
    kube.start()
    try:
        conf = kube.kubeconfig(tmp / "kubeconfig")
        api = api_client(str(conf))
        try:
            yield kube, api
        finally:
            api.close()
    finally:
        kube.stop()


# The scheduler's collaborators, in memory


class Clock:
    """A monotonic clock the test moves."""

    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class FakeAgents:
    """The agent protocol as the scheduler speaks it for every node: registrations,
    batched heartbeats (``stop`` and ``lost`` shape the reply), batched reports (a node in
    ``session_lost`` is lost) and the desired-state long-poll (``changes``, in turn)."""

    def __init__(self) -> None:
        self.registered: list[Registration] = []
        self.beats: list[dict[str, Heartbeat]] = []
        self.sent: list[tuple[str, AgentReport]] = []
        self.stop: dict[str, list[str]] = {}
        self.lost: list[str] = []
        self.session_lost: set[str] = set()
        self.beat_error: Exception | None = None
        self.register_error: Exception | None = None
        self.refuse_nodes: dict[str, Exception] = {}  # node -> what its registration raises
        self.changes: list[DesiredChanges] = []
        self.asked: list[int] = []

    def lease(self, node: str, stop: list[str] | None = None) -> Lease:
        n = sum(1 for r in self.registered if r.inventory.name == node)
        return Lease(node=node, session=f"s-{node}-{n}", lease_s=15, heartbeat_s=5, stop=stop or [])

    async def register(self, body: Registration) -> Lease:
        if self.register_error is not None:
            raise self.register_error
        if body.inventory.name in self.refuse_nodes:
            raise self.refuse_nodes[body.inventory.name]
        self.registered.append(body)
        return self.lease(body.inventory.name)

    async def heartbeats(self, beats: dict[str, Heartbeat], timeout_s: float) -> HeartbeatsReply:
        if self.beat_error is not None:
            raise self.beat_error
        self.beats.append(beats)
        leases = {n: self.lease(n, self.stop.get(n)) for n in beats if n not in self.lost}
        return HeartbeatsReply(leases=leases, lost=list(self.lost))

    async def reports(self, batch: dict[str, AgentReport]) -> ReportsReply:
        lost = [n for n in batch if n in self.session_lost]
        self.sent.extend((n, body) for n, body in batch.items() if n not in lost)
        return ReportsReply(lost=lost)

    async def desired_changes(self, since: int, wait_s: float) -> DesiredChanges:
        self.asked.append(since)
        if self.changes:
            return self.changes.pop(0)
        await asyncio.Event().wait()  # nothing more: the long-poll never answers
        raise AssertionError("unreachable")

    def events(self, node: str | None = None) -> list[ReplicaEvent]:
        return [e for n, r in self.sent if node in (None, n) for e in r.events]

    def kinds(self, replica: str) -> list[str]:
        return [e.kind for e in self.events() if e.replica == replica]


class FakeJobs:
    """The job API as the scheduler uses it: submit (``refuse`` raises instead), a job's
    state, the queue (``queue`` holds each pending job's place and reason), cancel and
    cordon."""

    def __init__(self) -> None:
        self.submitted: list[tuple[dict[str, Any], str, str]] = []  # spec, source, key
        self.states: dict[str, str] = {}
        self.queue: dict[str, tuple[int | None, str]] = {}
        self.cancelled: list[str] = []
        self.cordoned: list[str] = []
        self.uncordoned: list[str] = []
        self.refuse: Exception | None = None
        self.shown = 1000  # the jobs a listing without ids shows, as the real one its first 1,000

    def submit(self, req: SubmitRequest, key: str | None = None) -> Any:
        """A new job, or (as the server does) the job an idempotency key already made."""
        if self.refuse is not None:
            raise self.refuse
        made = [i for i, (_, _, k) in enumerate(self.submitted) if key and k == key]
        if made:
            job = f"j-{made[0] + 1}"
            return SimpleNamespace(
                job=SimpleNamespace(id=job, state=self.states[job]), created=False
            )
        job = f"j-{len(self.submitted) + 1}"
        self.submitted.append((req.spec or {}, req.source, key or ""))
        self.states[job] = "pending"
        return SimpleNamespace(job=SimpleNamespace(id=job, state="pending"), created=True)

    def job(self, job: str) -> Any:
        if job not in self.states:
            raise ApiFailure(404, f"no job {job}")
        return SimpleNamespace(id=job, state=self.states[job])

    def jobs(self, state: str | None = None, ids: Sequence[str] = ()) -> Any:
        rows = [
            SimpleNamespace(
                id=j,
                state=s,
                position=self.queue.get(j, (None, ""))[0],
                reason=self.queue.get(j, (None, ""))[1],
            )
            for j, s in self.states.items()
            if (state is None or s in state.split(",")) and (not ids or j in ids)
        ]
        return SimpleNamespace(jobs=rows if ids else rows[: self.shown])

    def cancel(self, job: str) -> Any:
        self.cancelled.append(job)
        self.states[job] = "cancelled"

    def cordon(self, node: str) -> None:
        self.cordoned.append(node)

    def uncordon(self, node: str) -> None:
        self.uncordoned.append(node)


class FakeWrites:
    """The scheduler's writes to Kubernetes, recorded; ``refuse_bind`` and ``refuse_evict``
    (pod name to the API server's words) make them fail."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.bound: dict[str, tuple[str, dict[str, str]]] = {}
        self.evicted: list[tuple[str, float | None]] = []
        self.conditions: list[tuple[str, str, str]] = []
        self.said: list[tuple[str, str, str, str]] = []
        self.refuse_bind: dict[str, str] = {}
        self.refuse_evict: dict[str, str] = {}

    def bind(self, pod: KubePod, node: str, annotations: dict[str, str]) -> str | None:
        with self.lock:
            if pod.name in self.refuse_bind:
                return self.refuse_bind[pod.name]
            self.bound[pod.name] = (node, dict(annotations))
            return None

    def evict(self, pod: KubePod, grace_s: float | None) -> str | None:
        with self.lock:
            if pod.name in self.refuse_evict:
                return self.refuse_evict[pod.name]
            self.evicted.append((pod.name, grace_s))
            return None

    def unschedulable(self, pod: KubePod, reason: str, message: str) -> None:
        with self.lock:
            self.conditions.append((pod.name, reason, message))

    def event(self, pod: KubePod, reason: str, message: str, kind: str = "Normal") -> None:
        with self.lock:
            self.said.append((pod.name, reason, message, kind))

    def events(self, reason: str) -> list[tuple[str, str]]:
        """(pod, message) of each event with ``reason``."""
        return [(p, m) for p, r, m, _ in self.said if r == reason]


class Inline:
    """An executor that runs what it is given at once, on the caller's thread."""

    def submit(self, fn: Any, *args: Any) -> None:
        fn(*args)

    def shutdown(self, wait: bool = True, cancel_futures: bool = False) -> None:
        pass

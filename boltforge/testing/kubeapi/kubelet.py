"""A stand-in for every node's kubelet, so pods live and die as on a real cluster.

- A pod bound to a node that exists (at the time it is bound), in phase Pending, moves once
  to Running after ``start_delay_s``: ``Initialized``, ``Ready`` and ``ContainersReady``
  True, ``startTime``, ``hostIP``/``podIP``, and a running ``containerStatuses`` entry per
  container. A pod whose phase someone else has moved on (a test writing Succeeded) is
  left alone: only Pending becomes Running, and only once per pod.
- A bound pod being deleted is, after ``min(its grace, grace_cap_s)`` seconds, given phase
  Failed with its containers terminated (``exitCode`` 143, reason ``Error``), unless already
  Succeeded or Failed, and then removed (or kept, with grace 0, while it has finalizers).

Switched off, bound pods stay Pending and terminating pods stay until a delete with grace
0, as with a dead kubelet; switching it on again catches up with every pod. Pods are not
removed when their node is, and no probes, restarts or resources are emulated."""

from __future__ import annotations

import asyncio
import hashlib
import threading
from collections.abc import Callable
from typing import Any

from boltforge.testing.kubeapi import deletion
from boltforge.testing.kubeapi.objects import (
    JSON,
    deleting,
    meta,
    section,
    set_condition,
    timestamp,
)
from boltforge.testing.kubeapi.resources import NODES, PODS
from boltforge.testing.kubeapi.store import DELETED, Change, Store, Stored


class Kubelet:
    """The emulation; ``observe`` is a store listener, timers run on the server's loop."""

    def __init__(
        self,
        store: Store,
        enabled: bool = True,
        start_delay_s: float = 0.0,
        grace_cap_s: float = 0.2,
    ) -> None:
        self.store, self.enabled = store, enabled
        self.start_delay_s, self.grace_cap_s = start_delay_s, grace_cap_s
        self.loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = 0
        self._starting: set[str] = set()  # uids with a start scheduled
        self._started: set[str] = set()  # uids moved to Running, never again
        self._stopping: set[str] = set()  # uids with a removal scheduled

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        """Run timers on ``loop`` (called on it) and catch up with every pod."""
        self.loop, self._loop_thread = loop, threading.get_ident()
        self.enable(self.enabled)

    def enable(self, on: bool) -> None:
        """Switch the emulation; on, it takes up every pod it has to start or remove."""
        with self.store.lock:
            self.enabled = on
            if on and self.loop is not None:
                for pod in self.store.items(PODS.plural):
                    self._consider(pod.obj)

    def observe(self, change: Change) -> None:
        if change.resource != PODS.plural:
            return
        if change.type == DELETED:
            uid = change.new.obj["metadata"]["uid"]
            for uids in (self._starting, self._started, self._stopping):
                uids.discard(uid)
        elif self.enabled and self.loop is not None:
            self._consider(change.new.obj)

    def _consider(self, pod: JSON) -> None:
        node, uid = section(pod, "spec").get("nodeName"), meta(pod)["uid"]
        if not node:
            return
        key = (meta(pod).get("namespace", ""), meta(pod)["name"], uid)
        if deleting(pod):
            if uid not in self._stopping:
                self._stopping.add(uid)
                grace = meta(pod).get("deletionGracePeriodSeconds") or 0
                self._later(min(float(grace), self.grace_cap_s), self._stop, *key)
        elif self._startable(pod, uid, node):
            self._starting.add(uid)
            self._later(self.start_delay_s, self._start, *key)

    def _startable(self, pod: JSON, uid: str, node: str) -> bool:
        if uid in self._starting or uid in self._started:
            return False
        pending = section(pod, "status").get("phase", "Pending") == "Pending"
        return pending and self.store.get(NODES.plural, "", node) is not None

    def _later(self, delay: float, action: Callable[..., None], *args: Any) -> None:
        loop = self.loop
        assert loop is not None
        if threading.get_ident() == self._loop_thread:
            loop.call_later(delay, action, *args)
        else:
            loop.call_soon_threadsafe(loop.call_later, delay, action, *args)

    def _current(self, ns: str, name: str, uid: str) -> Stored | None:
        found = self.store.get(PODS.plural, ns, name)
        return found if found and found.obj["metadata"]["uid"] == uid else None

    def _start(self, ns: str, name: str, uid: str) -> None:
        with self.store.lock:
            self._starting.discard(uid)
            found = self._current(ns, name, uid)
            if not self.enabled or found is None or deleting(found.obj):
                return
            if section(found.obj, "status").get("phase", "Pending") == "Pending":
                self._started.add(uid)
                self.store.put(PODS.plural, running(found.copy()))

    def _stop(self, ns: str, name: str, uid: str) -> None:
        with self.store.lock:
            found = self._current(ns, name, uid)
            if not self.enabled or found is None:
                self._stopping.discard(uid)
                return
            pod = found.copy()
            if section(pod, "status").get("phase") not in deletion.TERMINAL:
                terminated(pod)
            pod["metadata"]["deletionGracePeriodSeconds"] = 0
            deletion.finalize(self.store, PODS, self.store.put(PODS.plural, pod))


def _digest(seed: str) -> bytes:
    return hashlib.sha256(seed.encode()).digest()


def _address(seed: str, prefix: str) -> str:
    digest = _digest(seed)
    return f"{prefix}.{digest[0]}.{digest[1]}.{digest[2] % 254 + 1}"


def running(pod: JSON) -> JSON:
    """``pod`` as its kubelet reports it once its containers run."""
    now, status = timestamp(), section(pod, "status")
    status.update(phase="Running", startTime=now)
    status["hostIP"] = _address(pod["spec"]["nodeName"], "10")
    status["podIP"] = _address(pod["metadata"]["uid"], "172")
    status["podIPs"] = [{"ip": status["podIP"]}]
    for kind in ("Initialized", "Ready", "ContainersReady", "PodScheduled"):
        set_condition(status, kind, "True")
    status["containerStatuses"] = [
        {
            "name": c.get("name", ""),
            "image": c.get("image", ""),
            "imageID": "",
            "containerID": "containerd://"
            + _digest(pod["metadata"]["uid"] + c.get("name", "")).hex(),
            "ready": True,
            "started": True,
            "restartCount": 0,
            "state": {"running": {"startedAt": now}},
            "lastState": {},
        }
        for c in section(pod, "spec").get("containers") or []
    ]
    return pod


def terminated(pod: JSON) -> JSON:
    """``pod`` as its kubelet reports it once SIGTERM has ended its containers."""
    now, status = timestamp(), section(pod, "status")
    status["phase"] = "Failed"
    for kind in ("Ready", "ContainersReady"):
        set_condition(status, kind, "False", "PodCompleted")
    for cs in status.get("containerStatuses") or []:
        started = (cs.get("state") or {}).get("running", {}).get("startedAt", now)
        state = {"exitCode": 143, "reason": "Error", "startedAt": started, "finishedAt": now}
        cs.update(ready=False, started=False, state={"terminated": state})
    return pod

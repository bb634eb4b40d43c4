"""Leader election on a ``coordination.k8s.io/v1`` Lease, as client-go's leaderelection does.

Every ``retry_s`` each replica reads the Lease. The holder renews it (a replace carrying the
version it read, so two writers cannot both succeed: the API server answers the second 409
Conflict). Another replica takes it over only once it has seen the same record unchanged for
``lease_s`` by its own clock (never by comparing clocks across machines). A leader that could
not renew for ``renew_s`` stops acting at once, before anyone else may take over
(``renew_s`` < ``lease_s``), so two replicas never act together."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from kubernetes.client import CoordinationV1Api
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError as Urllib3Error

log = logging.getLogger("boltforge.kube")


def _micro_time(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    """Holds (or waits for) Lease ``namespace/name`` as ``identity``; ``try_once`` is called
    every ``retry_s``; ``leading()`` says whether this replica may act now."""

    def __init__(
        self,
        api: CoordinationV1Api,
        namespace: str,
        name: str,
        identity: str,
        *,
        lease_s: float = 15.0,
        renew_s: float = 10.0,
        retry_s: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not retry_s < renew_s < lease_s:
            raise ValueError("leader election needs retry_s < renew_s < lease_s")
        self.api, self.namespace, self.name, self.identity = api, namespace, name, identity
        self.lease_s, self.renew_s, self.retry_s, self.clock = lease_s, renew_s, retry_s, clock
        self.renewed_at: float | None = None  # when this replica last held it (its clock)
        self._seen: tuple[str, str] | None = None  # (holder, renewTime) last read
        self._seen_at = 0.0
        self._lock = threading.Lock()  # one try (or the release) at a time
        self._released = False

    def leading(self) -> bool:
        return self.renewed_at is not None and self.clock() - self.renewed_at < self.renew_s

    def try_once(self) -> bool:
        """Acquire or renew the Lease; True while this replica leads. After ``release``
        it does nothing (a try still under way when the replica stops must not take the
        Lease back)."""
        with self._lock:
            if self._released:
                return False
            return self._try(self.clock())

    def _try(self, now: float) -> bool:
        try:
            held = self._read()
            if held is None:
                self._create(now)
            else:
                self._renew_or_take(held, now)
        except ApiException as e:
            if e.status != 409:
                log.warning("leader election: %s %s", e.status, e.reason)
        except (Urllib3Error, OSError) as e:
            log.warning("leader election: %s", e)
        if not self.leading() and self.renewed_at is not None:
            log.warning("lost the lead (%s could not renew its lease)", self.identity)
            self.renewed_at = None
        return self.leading()

    def release(self) -> None:
        """Give the Lease up on a clean exit (SIGTERM, Ctrl-C), so the next replica need not
        wait it out: the holder is cleared and the duration cut to 1 s, which a standby
        takes at its next try. No try follows it."""
        with self._lock:
            self._released = True
            if self.leading():
                self._give_up()

    def _give_up(self) -> None:
        try:
            held = self._read()
            if held is not None and held["spec"].get("holderIdentity") == self.identity:
                held["spec"]["holderIdentity"] = ""
                held["spec"]["leaseDurationSeconds"] = 1
                self.api.replace_namespaced_lease(
                    self.name, self.namespace, held, _request_timeout=5
                )
        except (ApiException, Urllib3Error, OSError) as e:
            log.info("leader election: release failed: %s", e)
        self.renewed_at = None

    def _read(self) -> dict[str, Any] | None:
        try:
            response = self.api.read_namespaced_lease(
                self.name, self.namespace, _preload_content=False, _request_timeout=5
            )
        except ApiException as e:
            if e.status == 404:
                return None
            raise
        body: dict[str, Any] = json.loads(response.data)
        return body

    def _spec(self, transitions: int, acquired: str | None = None) -> dict[str, Any]:
        now = _micro_time(time.time())
        return {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": max(1, round(self.lease_s)),
            "acquireTime": acquired or now,
            "renewTime": now,
            "leaseTransitions": transitions,
        }

    def _create(self, now: float) -> None:
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": self.name, "namespace": self.namespace},
            "spec": self._spec(0),
        }
        self.api.create_namespaced_lease(self.namespace, body, _request_timeout=5)
        self._won(now)

    def _renew_or_take(self, held: dict[str, Any], now: float) -> None:
        spec = held.get("spec") or {}
        holder = spec.get("holderIdentity") or ""
        record = (holder, str(spec.get("renewTime")))
        if record != self._seen:
            self._seen, self._seen_at = record, now
        transitions = int(spec.get("leaseTransitions") or 0)
        if holder == self.identity:
            held["spec"] = self._spec(transitions, spec.get("acquireTime"))
        elif not holder or now - self._seen_at >= float(spec.get("leaseDurationSeconds") or 0):
            held["spec"] = self._spec(transitions + 1)
            log.info("taking the lead from %r", holder or "nobody")
        else:
            return  # someone else holds it
        self.api.replace_namespaced_lease(self.name, self.namespace, held, _request_timeout=5)
        self._won(now)

    def _won(self, asked_at: float) -> None:
        """Renewed: counted from when the renewal was asked, not when it was answered."""
        if self.renewed_at is None:
            log.info("%s leads", self.identity)
        self.renewed_at = asked_at

"""What tests count and inject: requests by (verb, resource) and faults to answer with.

Verbs are Kubernetes' (``get``, ``list``, ``watch``, ``create``, ``update``, ``patch``,
``delete``, ``deletecollection``); resources are plural names with their subresource
(``pods``, ``pods/status``, ``pods/binding``, ``pods/eviction``, ``bindings``,
``podgroups``). Discovery and OpenAPI requests are not counted. Thread-safe."""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass

from boltforge.testing.kubeapi.errors import ApiError


@dataclass
class Fault:
    verb: str
    resource: str
    status: int
    times: int
    retry_after_s: int | None = None

    def matches(self, verb: str, resource: str) -> bool:
        return self.verb in ("*", verb) and self.resource in ("*", resource)


class RequestLog:
    """Counts requests; answers the next ones matching a fault with its status."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[tuple[str, str]] = Counter()
        self._faults: list[Fault] = []

    def record(self, verb: str, resource: str) -> None:
        """Count a request; raise the injected error it is to get, if any."""
        with self._lock:
            self._counts[(verb, resource)] += 1
            fault = next((f for f in self._faults if f.matches(verb, resource)), None)
            if fault is None:
                return
            fault.times -= 1
            if fault.times <= 0:
                self._faults.remove(fault)
        message = f"injected fault: {verb} {resource} answered {fault.status}"
        wait = fault.retry_after_s
        raise ApiError(fault.status, message, details={"retryAfterSeconds": wait} if wait else {})

    def fail_next(
        self,
        verb: str,
        resource: str,
        status: int,
        times: int = 1,
        retry_after_s: int | None = None,
    ) -> None:
        """Answer the next ``times`` requests of ``verb`` on ``resource`` (``*`` matches any)
        with HTTP ``status`` and a Status body; with ``retry_after_s``, also a
        ``Retry-After`` header (which urllib3, under the Python client, obeys by itself for
        429 and 503: it retries up to three times before the caller sees the error)."""
        with self._lock:
            self._faults.append(Fault(verb, resource, status, times, retry_after_s))

    def counts(self) -> Counter[tuple[str, str]]:
        with self._lock:
            return Counter(self._counts)

    def reset(self) -> None:
        with self._lock:
            self._counts.clear()
            self._faults.clear()

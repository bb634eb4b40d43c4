"""The test knobs over HTTP, for a server running as its own process: ``POST
/_kubeapi/drop-watches?abrupt=1``, ``POST /_kubeapi/compact``, ``PUT
/_kubeapi/kubelet?on=1``, ``POST /_kubeapi/fail-next`` (JSON ``verb``, ``resource``,
``status``, ``times``), ``GET /_kubeapi/requests`` (``[[verb, resource, count], ...]``).
``Remote`` is the client side, with the same methods as a ``Cluster``'s knobs."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import httpx
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from boltforge.testing.kubeapi.cluster import Cluster
from boltforge.testing.kubeapi.errors import ApiError
from boltforge.testing.kubeapi.routing import TRUE

PREFIX = "/_kubeapi/"


async def handle(cluster: Cluster, request: Request) -> Response:
    what, q = request.url.path[len(PREFIX) :], request.query_params
    if (request.method, what) == ("POST", "drop-watches"):
        return JSONResponse({"dropped": cluster.drop_watches(q.get("abrupt", "1") in TRUE)})
    if (request.method, what) == ("POST", "compact"):
        return JSONResponse({"resourceVersion": cluster.compact()})
    if (request.method, what) == ("PUT", "kubelet"):
        cluster.set_kubelet(q.get("on") in TRUE)
        return JSONResponse({"kubelet": cluster.kubelet.enabled})
    if (request.method, what) == ("POST", "fail-next"):
        fault = json.loads(await request.body())
        cluster.fail_next(**fault)
        return JSONResponse({})
    if (request.method, what) == ("GET", "requests"):
        counts = cluster.requests.counts()
        return JSONResponse([[v, r, n] for (v, r), n in sorted(counts.items())])
    raise ApiError(404, f"no test knob {request.method} {what}")


class Remote:
    """The knobs of a server at ``url``."""

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/") + PREFIX

    def _call(self, method: str, what: str, **kwargs: Any) -> Any:
        reply = httpx.request(method, self.url + what, timeout=10, **kwargs)
        reply.raise_for_status()
        return reply.json()

    def drop_watches(self, abrupt: bool = True) -> int:
        return int(self._call("POST", "drop-watches", params={"abrupt": int(abrupt)})["dropped"])

    def compact(self) -> int:
        return int(self._call("POST", "compact")["resourceVersion"])

    def set_kubelet(self, on: bool) -> None:
        self._call("PUT", "kubelet", params={"on": int(on)})

    def fail_next(
        self,
        verb: str,
        resource: str,
        status: int,
        times: int = 1,
        retry_after_s: int | None = None,
    ) -> None:
        fault = {"verb": verb, "resource": resource, "status": status, "times": times}
        self._call("POST", "fail-next", json={**fault, "retry_after_s": retry_after_s})

    def counts(self) -> Counter[tuple[str, str]]:
        return Counter({(v, r): n for v, r, n in self._call("GET", "requests")})

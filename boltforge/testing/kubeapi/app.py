"""The ASGI application: kube-apiserver's HTTP surface over a ``Cluster``.

Every answer is JSON (``application/json``), errors a metav1 ``Status``. No authentication
or authorization (any bearer token is accepted, none is needed), no admission webhooks, no
protobuf or CBOR, no server-side apply, no OpenAPI schema (``/openapi/v2`` and
``/openapi/v3`` answer 404, so kubectl must be told ``--validate=false``)."""

from __future__ import annotations

import json
import logging
from typing import Any

from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

from boltforge.testing.kubeapi import control, discovery, handlers, openapi, routing
from boltforge.testing.kubeapi.cluster import Cluster
from boltforge.testing.kubeapi.errors import ApiError
from boltforge.testing.kubeapi.routing import TRUE
from boltforge.testing.kubeapi.watch import Receive, Send

log = logging.getLogger("boltforge.testing.kubeapi")
HEALTH = ("/healthz", "/livez", "/readyz")


def error(e: ApiError) -> Response:
    response = handlers.respond(e.status(), e.code)
    if e.code == 429:
        response.headers["Retry-After"] = "1"
    return response


class KubeApi:
    """The app; ``cluster`` is what it serves."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        request = Request(scope, receive)
        try:
            response = await self._respond(request)
        except ApiError as e:
            response = error(e)
        except Exception as e:
            log.exception("fake kube-apiserver failed on %s %s", request.method, request.url)
            response = error(ApiError(500, f"{type(e).__name__}: {e}"))
        await response(scope, receive, send)

    async def _respond(self, request: Request) -> Any:
        path = request.url.path
        if path.startswith(control.PREFIX):
            return await control.handle(self.cluster, request)
        if path in HEALTH:
            return PlainTextResponse("ok")
        if path == "/openapi/v2":
            body, kind = openapi.v2(request.headers.get("accept", ""))
            return handlers.respond(body, media_type=kind)
        host = request.headers.get("host", "127.0.0.1")
        doc = discovery.document(path, host)
        if doc is not None:
            return handlers.respond(json.dumps(doc).encode())
        target = routing.parse(path)
        watch = request.query_params.get("watch") in TRUE
        verb = routing.verb(request.method, target, watch)
        self.cluster.requests.record(verb, target.counted_as)
        return await handlers.handler(verb, target)(self.cluster, request, target)

"""The ASGI application: kube-apiserver's HTTP surface over a ``Cluster``.

Routes a request to discovery, ``/openapi/v2`` (an empty document, see ``openapi``), the
health checks, the test knobs (``control``) or a verb on a resource (``reads``,
``writes``), counting it and answering an injected fault first. Every answer is JSON
(``application/json``), errors a metav1 ``Status``. No authentication or authorization
(any bearer token is accepted, none is needed), no protobuf or CBOR; ``/openapi/v3``
answers 404."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

from boltforge.testing.kubeapi import control, discovery, openapi, reads, routing, writes
from boltforge.testing.kubeapi.answers import encode, respond
from boltforge.testing.kubeapi.cluster import Cluster
from boltforge.testing.kubeapi.errors import ApiError
from boltforge.testing.kubeapi.routing import TRUE
from boltforge.testing.kubeapi.watch import Receive, Send

log = logging.getLogger("boltforge.testing.kubeapi")
HEALTH = ("/healthz", "/livez", "/readyz")
Handler = Callable[[Cluster, Request, routing.Target], Awaitable[Any]]
VERBS: dict[str, Handler] = {
    "get": reads.get,
    "list": reads.list_,
    "watch": reads.watch,
    "create": writes.create,
    "update": writes.update,
    "patch": writes.patch,
    "delete": writes.delete,
    "deletecollection": writes.delete_collection,
}


def handler(verb: str, target: routing.Target) -> Handler:
    if target.res is None or target.sub == "binding":
        return writes.bind
    if target.sub == "eviction":
        return writes.evict
    return VERBS[verb]


def error(e: ApiError) -> Response:
    response = respond(e.status(), e.code)
    if e.details.get("retryAfterSeconds"):
        response.headers["Retry-After"] = str(e.details["retryAfterSeconds"])
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
            return respond(body, media_type=kind)
        host = request.headers.get("host", "127.0.0.1")
        doc = discovery.document(path, host)
        if doc is not None:
            return respond(encode(doc))
        target = routing.parse(path)
        watch = request.query_params.get("watch") in TRUE
        verb = routing.verb(request.method, target, watch)
        self.cluster.requests.record(verb, target.counted_as)
        return await handler(verb, target)(self.cluster, request, target)

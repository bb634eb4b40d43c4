"""One function per verb: read the request, call the verbs, and answer with JSON bytes (a
Table when kubectl asks for one) or a watch stream."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import yaml
from starlette.requests import Request
from starlette.responses import Response

from boltforge.testing.kubeapi import disruption, pods, tables, verbs
from boltforge.testing.kubeapi.cluster import Cluster
from boltforge.testing.kubeapi.errors import ApiError, bad_request, success
from boltforge.testing.kubeapi.objects import JSON
from boltforge.testing.kubeapi.resources import PDBS, PODS, Resource
from boltforge.testing.kubeapi.routing import TRUE, Target
from boltforge.testing.kubeapi.selectors import FieldSelector, parse_fields, parse_labels
from boltforge.testing.kubeapi.store import Stored
from boltforge.testing.kubeapi.watch import (
    END,
    Bookmark,
    Filter,
    Render,
    Watcher,
    WatchStream,
    frame,
)

Handler = Callable[[Cluster, Request, Target], Awaitable[Any]]


def respond(body: bytes | JSON, code: int = 200, media_type: str = "application/json") -> Response:
    content = body if isinstance(body, bytes) else json.dumps(body, separators=(",", ":")).encode()
    return Response(content, code, media_type=media_type)


async def read_body(request: Request) -> Any:
    raw = await request.body()
    if not raw.strip():
        return None
    try:
        if "yaml" in request.headers.get("content-type", ""):
            return yaml.safe_load(raw)
        return json.loads(raw)
    except (ValueError, yaml.YAMLError) as e:
        raise bad_request(f"the request body could not be decoded: {e}") from e


async def read_object(request: Request) -> JSON:
    body = await read_body(request)
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    return body


def _res(target: Target) -> Resource:
    assert target.res is not None
    return target.res


def _filter(target: Target, request: Request) -> Filter:
    q, res = request.query_params, _res(target)
    fields = parse_fields(q.get("fieldSelector"), res)
    if target.name is not None:
        terms = fields.terms if fields else ()
        fields = FieldSelector((("metadata.name", True, target.name), *terms))
    return Filter(target.namespace, parse_labels(q.get("labelSelector")), fields)


def _wants_table(request: Request) -> bool:
    return "as=Table" in request.headers.get("accept", "")


def _present(cluster: Cluster, res: Resource, stored: Stored) -> bytes | JSON:
    if res is PDBS:
        return disruption.with_status(cluster.store, stored)
    return stored.raw()


def _as_dict(body: bytes | JSON) -> JSON:
    return json.loads(body) if isinstance(body, bytes) else body


async def get(cluster: Cluster, request: Request, target: Target) -> Response:
    res = _res(target)
    assert target.name is not None
    stored = verbs.get(cluster.store, res, target.namespace or "", target.name)
    body = _present(cluster, res, stored)
    if _wants_table(request):
        include = request.query_params.get("includeObject")
        return respond(tables.table(res, [_as_dict(body)], None, include))
    return respond(body)


async def list_(cluster: Cluster, request: Request, target: Target) -> Response:
    res = _res(target)
    rv, items = verbs.listing(cluster.store, res, _filter(target, request))
    if _wants_table(request):
        include = request.query_params.get("includeObject")
        objects = [_as_dict(_present(cluster, res, s)) for s in items]
        return respond(tables.table(res, objects, rv, include))
    encoded = [_present(cluster, res, s) for s in items]
    raws = [b if isinstance(b, bytes) else json.dumps(b).encode() for b in encoded]
    head = {
        "kind": res.list_kind,
        "apiVersion": res.api_version,
        "metadata": {"resourceVersion": str(rv)},
    }
    prefix = json.dumps(head, separators=(",", ":")).encode()[:-1]
    return respond(prefix + b',"items":[' + b",".join(raws) + b"]}")


async def watch(cluster: Cluster, request: Request, target: Target) -> WatchStream:
    res, q, store = _res(target), request.query_params, cluster.store
    watcher = Watcher(store, res, _filter(target, request), _renderer(cluster, res, request))
    since = q.get("resourceVersion")
    initial_events = q.get("sendInitialEvents") in TRUE
    try:
        if since in (None, "", "0") or initial_events:
            rv, objects = store.subscribe_now(watcher, target.namespace)
            initial = watcher.added(objects)
            if initial_events:
                initial.append(watcher.bookmark(Bookmark(rv, initial_end=True)))
        else:
            changes = store.subscribe_since(watcher, _int(since, "resourceVersion"))
            initial = [e for e in map(watcher.encode, changes) if e is not None]
    except ApiError as e:  # 410 Expired: kube-apiserver answers it inside the stream
        watcher.offer(END)
        return WatchStream(watcher, [frame("ERROR", json.dumps(e.status()).encode())])
    timeout = float(_int(q.get("timeoutSeconds") or "0", "timeoutSeconds"))
    bookmarks = (
        cluster.settings.bookmark_interval_s if q.get("allowWatchBookmarks") in TRUE else None
    )
    watcher.start(timeout or None, bookmarks)
    return WatchStream(watcher, initial)


def _renderer(cluster: Cluster, res: Resource, request: Request) -> Render | None:
    """How a watch writes objects: one-row Tables when asked (``kubectl get -w``)."""
    if not _wants_table(request):
        return None
    include = request.query_params.get("includeObject")

    def render(stored: Stored) -> bytes:
        row = tables.table(res, [_as_dict(_present(cluster, res, stored))], None, include)
        return json.dumps(row, separators=(",", ":")).encode()

    return render


def _int(text: str, what: str) -> int:
    try:
        return int(text)
    except ValueError as e:
        raise bad_request(f"invalid {what}: {text!r}") from e


async def create(cluster: Cluster, request: Request, target: Target) -> Response:
    res, body = _res(target), await read_object(request)
    stored = verbs.create(cluster.store, res, target.namespace or "", body)
    return respond(_present(cluster, res, stored), 201)


async def update(cluster: Cluster, request: Request, target: Target) -> Response:
    res, body = _res(target), await read_object(request)
    assert target.name is not None
    stored = verbs.update(cluster.store, res, target.namespace or "", target.name, body, target.sub)
    return respond(_present(cluster, res, stored))


async def patch(cluster: Cluster, request: Request, target: Target) -> Response:
    res, raw = _res(target), await request.body()
    assert target.name is not None
    kind = request.headers.get("content-type", "")
    ns = target.namespace or ""
    stored = verbs.patch(cluster.store, res, ns, target.name, kind, raw, target.sub)
    return respond(_present(cluster, res, stored))


def _delete_options(request: Request, body: Any) -> JSON:
    options = dict(body) if isinstance(body, dict) else {}
    grace = request.query_params.get("gracePeriodSeconds")
    if grace is not None:
        options["gracePeriodSeconds"] = _int(grace, "gracePeriodSeconds")
    return options


async def delete(cluster: Cluster, request: Request, target: Target) -> Response:
    res, options = _res(target), _delete_options(request, await read_body(request))
    assert target.name is not None
    stored, gone = verbs.delete(cluster.store, res, target.namespace or "", target.name, options)
    if gone and res is not PODS and not res.custom:
        md = stored.obj["metadata"]
        details = {"name": md["name"], "kind": res.plural, "uid": md["uid"]}
        return respond(success(200, details))
    return respond(_present(cluster, res, stored))


async def delete_collection(cluster: Cluster, request: Request, target: Target) -> Response:
    res, options = _res(target), _delete_options(request, await read_body(request))
    _, items = verbs.listing(cluster.store, res, _filter(target, request))
    gone = []
    for s in items:
        md = s.obj["metadata"]
        gone.append(
            verbs.delete(cluster.store, res, md.get("namespace", ""), md["name"], options)[0]
        )
    head = {"kind": res.list_kind, "apiVersion": res.api_version, "metadata": {}}
    return respond({**head, "items": [s.obj for s in gone]})


async def bind(cluster: Cluster, request: Request, target: Target) -> Response:
    body = await read_object(request)
    pods.bind(cluster.store, target.namespace or "", body, target.name)
    return respond(success(201), 201)


async def evict(cluster: Cluster, request: Request, target: Target) -> Response:
    body = await read_object(request)
    assert target.name is not None
    disruption.evict(cluster.store, target.namespace or "", target.name, body)
    return respond(success(201), 201)


VERBS: dict[str, Handler] = {
    "get": get,
    "list": list_,
    "watch": watch,
    "create": create,
    "update": update,
    "patch": patch,
    "delete": delete,
    "deletecollection": delete_collection,
}


def handler(verb: str, target: Target) -> Handler:
    if target.res is None or target.sub == "binding":
        return bind
    if target.sub == "eviction":
        return evict
    return VERBS[verb]

"""The reading verbs: get, list (a ``...List`` with the store's ``resourceVersion``, or a
Table) and watch (see ``watch``: replay from ``resourceVersion``, or ADDED for every object
first; ``timeoutSeconds``, ``allowWatchBookmarks``, ``sendInitialEvents``; a version older
than the change log is one ERROR event, 410 Expired, inside a 200 stream, as kube-apiserver
answers it)."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from boltforge.testing.kubeapi import tables, verbs
from boltforge.testing.kubeapi.answers import (
    as_dict,
    encode,
    int_param,
    name,
    present,
    resource,
    respond,
    wanted,
    wants_table,
)
from boltforge.testing.kubeapi.cluster import Cluster
from boltforge.testing.kubeapi.errors import ApiError
from boltforge.testing.kubeapi.resources import Resource
from boltforge.testing.kubeapi.routing import TRUE, Target
from boltforge.testing.kubeapi.store import Stored
from boltforge.testing.kubeapi.watch import END, Bookmark, Render, Watcher, WatchStream, frame


async def get(cluster: Cluster, request: Request, target: Target) -> Response:
    res = resource(target)
    stored = verbs.get(cluster.store, res, target.namespace or "", name(target))
    body = present(cluster, res, stored)
    if wants_table(request):
        include = request.query_params.get("includeObject")
        return respond(tables.table(res, [as_dict(body)], None, include))
    return respond(body)


async def list_(cluster: Cluster, request: Request, target: Target) -> Response:
    res = resource(target)
    rv, items = verbs.listing(cluster.store, res, wanted(target, request))
    raws = [present(cluster, res, s) for s in items]
    if wants_table(request):
        include = request.query_params.get("includeObject")
        return respond(tables.table(res, [as_dict(r) for r in raws], rv, include))
    md = {"resourceVersion": str(rv)}
    head = encode({"kind": res.list_kind, "apiVersion": res.api_version, "metadata": md})
    return respond(head[:-1] + b',"items":[' + b",".join(raws) + b"]}")


async def watch(cluster: Cluster, request: Request, target: Target) -> WatchStream:
    res, q, store = resource(target), request.query_params, cluster.store
    watcher = Watcher(store, res, wanted(target, request), _renderer(cluster, res, request))
    since = q.get("resourceVersion")
    initial_events = q.get("sendInitialEvents") in TRUE
    try:
        if since in (None, "", "0") or initial_events:
            rv, objects = store.subscribe_now(watcher, target.namespace)
            initial = watcher.added(objects)
            if initial_events:
                initial.append(watcher.bookmark(Bookmark(rv, initial_end=True)))
        else:
            changes = store.subscribe_since(watcher, int_param(since, "resourceVersion"))
            initial = [e for e in map(watcher.encode, changes) if e is not None]
    except ApiError as e:
        watcher.offer(END)
        return WatchStream(watcher, [frame("ERROR", encode(e.status()))])
    timeout = int_param(q.get("timeoutSeconds") or "0", "timeoutSeconds")
    marks = q.get("allowWatchBookmarks") in TRUE
    watcher.start(timeout or None, cluster.settings.bookmark_interval_s if marks else None)
    return WatchStream(watcher, initial)


def _renderer(cluster: Cluster, res: Resource, request: Request) -> Render | None:
    """How a watch writes objects: one-row Tables when asked (``kubectl get -w``)."""
    if not wants_table(request):
        return None
    include = request.query_params.get("includeObject")

    def render(stored: Stored) -> bytes:
        return encode(tables.table(res, [as_dict(present(cluster, res, stored))], None, include))

    return render

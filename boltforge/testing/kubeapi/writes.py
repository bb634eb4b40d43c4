"""The writing verbs: create (201), update, patch, delete and deletecollection, and the
pod subresources ``binding`` (and the ``bindings`` endpoint) and ``eviction``, which
answer 201 with a ``Status`` of success, as kube-apiserver does.

A delete answers the object's last state for pods and custom resources (and for any object
that finalizers keep), a ``Status`` of success with the object's name, kind and uid for
the rest."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from boltforge.testing.kubeapi import pods, verbs
from boltforge.testing.kubeapi.answers import (
    int_param,
    name,
    present,
    read_body,
    read_object,
    resource,
    respond,
    wanted,
)
from boltforge.testing.kubeapi.cluster import Cluster
from boltforge.testing.kubeapi.errors import success
from boltforge.testing.kubeapi.objects import JSON
from boltforge.testing.kubeapi.resources import PODS
from boltforge.testing.kubeapi.routing import Target


async def create(cluster: Cluster, request: Request, target: Target) -> Response:
    res, body = resource(target), await read_object(request)
    stored = verbs.create(cluster.store, res, target.namespace or "", body)
    return respond(present(cluster, res, stored), 201)


async def update(cluster: Cluster, request: Request, target: Target) -> Response:
    res, body = resource(target), await read_object(request)
    ns = target.namespace or ""
    created = cluster.store.get(res.plural, ns, name(target)) is None  # a Lease may be
    stored = verbs.update(cluster.store, res, ns, name(target), body, target.sub)
    return respond(present(cluster, res, stored), 201 if created else 200)


async def patch(cluster: Cluster, request: Request, target: Target) -> Response:
    res, raw = resource(target), await request.body()
    kind, ns = request.headers.get("content-type", ""), target.namespace or ""
    stored = verbs.patch(cluster.store, res, ns, name(target), kind, raw, target.sub)
    return respond(present(cluster, res, stored))


def _delete_options(request: Request, body: Any) -> JSON:
    """DeleteOptions from the body, with ``gracePeriodSeconds`` from the query over it."""
    options = dict(body) if isinstance(body, dict) else {}
    grace = request.query_params.get("gracePeriodSeconds")
    if grace is not None:
        options["gracePeriodSeconds"] = int_param(grace, "gracePeriodSeconds")
    return options


async def delete(cluster: Cluster, request: Request, target: Target) -> Response:
    res, options = resource(target), _delete_options(request, await read_body(request))
    ns = target.namespace or ""
    stored, gone = verbs.delete(cluster.store, res, ns, name(target), options)
    if gone and res is not PODS and not res.custom:
        md = stored.obj["metadata"]
        return respond(success(200, {"name": md["name"], "kind": res.plural, "uid": md["uid"]}))
    return respond(present(cluster, res, stored))


async def delete_collection(cluster: Cluster, request: Request, target: Target) -> Response:
    res, options = resource(target), _delete_options(request, await read_body(request))
    _, items = verbs.listing(cluster.store, res, wanted(target, request))
    gone = []
    for s in items:
        md = s.obj["metadata"]
        ns = md.get("namespace", "")
        gone.append(verbs.delete(cluster.store, res, ns, md["name"], options)[0].obj)
    head = {"kind": res.list_kind, "apiVersion": res.api_version, "metadata": {}}
    return respond({**head, "items": gone})


async def bind(cluster: Cluster, request: Request, target: Target) -> Response:
    body = await read_object(request)
    pods.bind(cluster.store, target.namespace or "", body, target.name)
    return respond(success(201), 201)


async def evict(cluster: Cluster, request: Request, target: Target) -> Response:
    body = await read_object(request)
    cluster.budgets.evict(target.namespace or "", name(target), body)
    return respond(success(201), 201)

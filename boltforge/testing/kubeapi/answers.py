"""Reading requests and writing answers: bodies (JSON, or YAML), query parameters, the
filter a list or watch asks for, and objects as a read answers them (JSON bytes; a
PodDisruptionBudget with its status computed now; a Table when kubectl asks for one)."""

from __future__ import annotations

import json
from typing import Any

import yaml
from starlette.requests import Request
from starlette.responses import Response

from boltforge.testing.kubeapi.cluster import Cluster
from boltforge.testing.kubeapi.errors import bad_request
from boltforge.testing.kubeapi.objects import JSON
from boltforge.testing.kubeapi.resources import PDBS, Resource
from boltforge.testing.kubeapi.routing import Target
from boltforge.testing.kubeapi.selectors import FieldSelector, parse_fields, parse_labels
from boltforge.testing.kubeapi.store import Stored
from boltforge.testing.kubeapi.watch import Filter


def encode(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def respond(body: bytes | JSON, code: int = 200, media_type: str = "application/json") -> Response:
    return Response(body if isinstance(body, bytes) else encode(body), code, media_type=media_type)


async def read_body(request: Request) -> Any:
    """The body as JSON (or YAML, by its content type); None when empty."""
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


def int_param(text: str, what: str) -> int:
    try:
        return int(text)
    except ValueError as e:
        raise bad_request(f"invalid {what}: {text!r}") from e


def resource(target: Target) -> Resource:
    assert target.res is not None
    return target.res


def name(target: Target) -> str:
    assert target.name is not None
    return target.name


def wanted(target: Target, request: Request) -> Filter:
    """The namespace, ``labelSelector`` and ``fieldSelector`` (and a named object's name)."""
    q, res = request.query_params, resource(target)
    fields = parse_fields(q.get("fieldSelector"), res)
    if target.name is not None:
        terms = fields.terms if fields else ()
        fields = FieldSelector((("metadata.name", True, target.name), *terms))
    return Filter(target.namespace, parse_labels(q.get("labelSelector")), fields)


def wants_table(request: Request) -> bool:
    return "as=Table" in request.headers.get("accept", "")


def present(cluster: Cluster, res: Resource, stored: Stored) -> bytes:
    """``stored`` as a read answers it."""
    if res is PDBS:
        return encode(cluster.budgets.with_status(stored))
    return stored.raw()


def as_dict(raw: bytes) -> JSON:
    found: JSON = json.loads(raw)
    return found

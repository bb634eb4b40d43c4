"""The three patch formats kube-apiserver takes, applied to an object as a JSON dict.

- ``application/merge-patch+json``: RFC 7386 (maps merge, ``null`` deletes, lists replace).
- ``application/strategic-merge-patch+json``: a merge patch in which the lists Kubernetes
  marks ``patchStrategy: merge`` merge by their key (``conditions`` by ``type``,
  ``containers`` and ``containerStatuses`` by ``name``, ...; chosen by field name, not by a
  schema), ``finalizers`` merge as a set, and the ``$patch: delete|replace``,
  ``$deleteFromPrimitiveList/`` and ``$setElementOrder/`` directives are honoured (order
  directives are ignored). Custom resources refuse it (415), as kube-apiserver does.
- ``application/json-patch+json``: RFC 6902 (add, remove, replace, move, copy, test); an
  operation that cannot apply is 422.

Server-side apply (``application/apply-patch+yaml``) is not implemented (415)."""

from __future__ import annotations

import json
from typing import Any

from boltforge.testing.kubeapi.errors import ApiError, bad_request, unsupported_media
from boltforge.testing.kubeapi.objects import JSON
from boltforge.testing.kubeapi.resources import Resource

MERGE, STRATEGIC, JSON_PATCH = (
    "application/merge-patch+json",
    "application/strategic-merge-patch+json",
    "application/json-patch+json",
)
MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "containerStatuses": "name",
    "initContainerStatuses": "name",
    "ephemeralContainerStatuses": "name",
    "conditions": "type",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "ports": "containerPort",
    "ownerReferences": "uid",
    "imagePullSecrets": "name",
    "taints": "key",
    "addresses": "type",
    "hostAliases": "ip",
    "resourceClaims": "name",
}
SET_LISTS = {"finalizers"}


def apply(res: Resource, doc: JSON, content_type: str, body: bytes) -> JSON:
    """``doc`` (a copy the caller owns) with the patch ``body`` applied."""
    kind = content_type.split(";")[0].strip().lower()
    if kind not in (MERGE, STRATEGIC, JSON_PATCH) or (kind == STRATEGIC and res.custom):
        raise unsupported_media(kind)
    try:
        patch = json.loads(body or b"null")
    except ValueError as e:
        raise bad_request(f"error decoding patch: {e}") from e
    if kind == JSON_PATCH:
        if not isinstance(patch, list):
            raise bad_request("json patch must be a list of operations")
        return _as_object(json_patch(doc, patch))
    if not isinstance(patch, dict):
        raise bad_request("patch must be a JSON object")
    patched = merge_patch(doc, patch) if kind == MERGE else strategic_merge(doc, patch)
    return _as_object(patched)


def _as_object(doc: Any) -> JSON:
    if not isinstance(doc, dict):
        raise ApiError(422, "the patched object is not a JSON object", "Invalid")
    return doc


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 merge patch."""
    if not isinstance(patch, dict):
        return patch
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def strategic_merge(target: Any, patch: Any) -> Any:
    """A strategic merge patch (see the module docstring for what it knows)."""
    if not isinstance(patch, dict):
        return patch
    if patch.get("$patch") == "replace":
        return {k: v for k, v in patch.items() if k != "$patch"}
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if key.startswith(("$setElementOrder/", "$retainKeys")) or key == "$patch":
            continue
        if key.startswith("$deleteFromPrimitiveList/"):
            field = key.split("/", 1)[1]
            result[field] = [x for x in result.get(field) or [] if x not in value]
        elif value is None or (isinstance(value, dict) and value.get("$patch") == "delete"):
            result.pop(key, None)
        elif isinstance(value, list):
            result[key] = _merge_list(key, result.get(key), value)
        else:
            result[key] = strategic_merge(result.get(key), value)
    return result


def _merge_list(field: str, current: Any, patch: list[Any]) -> list[Any]:
    if any(isinstance(x, dict) and x.get("$patch") == "replace" for x in patch):
        return [x for x in patch if not (isinstance(x, dict) and "$patch" in x)]
    if not isinstance(current, list):
        return [_strip(x) for x in patch if not _is_delete(x)]
    if field in SET_LISTS:
        return current + [x for x in patch if x not in current]
    key = MERGE_KEYS.get(field)
    if key is None:
        return patch
    merged = list(current)
    for item in patch:
        at = _find(merged, key, item.get(key)) if isinstance(item, dict) else None
        if _is_delete(item):
            if at is not None:
                merged.pop(at)
        elif at is None:
            merged.append(_strip(item))
        else:
            merged[at] = strategic_merge(merged[at], item)
    return merged


def _find(items: list[Any], key: str, value: Any) -> int | None:
    return next(
        (i for i, x in enumerate(items) if isinstance(x, dict) and x.get(key) == value), None
    )


def _is_delete(item: Any) -> bool:
    return isinstance(item, dict) and item.get("$patch") == "delete"


def _strip(item: Any) -> Any:
    return strategic_merge({}, item) if isinstance(item, dict) else item


def json_patch(doc: Any, ops: list[Any]) -> Any:
    """RFC 6902 JSON patch."""
    for op in ops:
        if not isinstance(op, dict) or "path" not in op:
            raise bad_request(f"invalid json patch operation: {op!r}")
        doc = _operate(doc, op)
    return doc


def _operate(doc: Any, op: JSON) -> Any:
    kind, path = op.get("op"), op["path"]
    if kind == "test":
        if _get(doc, path) != op.get("value"):
            raise _failed(f"testing value {path} failed")
        return doc
    if kind in ("move", "copy"):
        value = _get(doc, op.get("from", ""))
        if kind == "move":
            doc = _remove(doc, op.get("from", ""))
        return _add(doc, path, json.loads(json.dumps(value)))
    if kind == "remove":
        return _remove(doc, path)
    if kind == "replace":
        _get(doc, path)
        return _add(_remove(doc, path), path, op.get("value"))
    if kind == "add":
        return _add(doc, path, op.get("value"))
    raise bad_request(f"unexpected json patch op {kind!r}")


def _failed(message: str) -> ApiError:
    return ApiError(422, message, "Invalid")


def _tokens(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise _failed(f"invalid JSON pointer {path!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _get(doc: Any, path: str) -> Any:
    for token in _tokens(path):
        doc = _child(doc, token, path)
    return doc


def _child(node: Any, token: str, path: str) -> Any:
    if isinstance(node, dict) and token in node:
        return node[token]
    if isinstance(node, list) and token.isdigit() and int(token) < len(node):
        return node[int(token)]
    raise _failed(f"doc is missing path: {path!r}")


def _add(doc: Any, path: str, value: Any) -> Any:
    tokens = _tokens(path)
    if not tokens:
        return value
    parent, last = _get(doc, path[: path.rfind("/")]), tokens[-1]
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list) and (last == "-" or last.isdigit()):
        at = len(parent) if last == "-" else int(last)
        if at > len(parent):
            raise _failed(f"index out of range in {path!r}")
        parent.insert(at, value)
    else:
        raise _failed(f"doc is missing path: {path!r}")
    return doc


def _remove(doc: Any, path: str) -> Any:
    tokens = _tokens(path)
    if not tokens:
        return None
    parent = _get(doc, path[: path.rfind("/")])
    _child(parent, tokens[-1], path)
    if isinstance(parent, dict):
        del parent[tokens[-1]]
    else:
        parent.pop(int(tokens[-1]))
    return doc

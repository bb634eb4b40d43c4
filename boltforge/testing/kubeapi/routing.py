"""Which resource, namespace, object and subresource a request's path names, and the
Kubernetes verb its method makes of it.

``/api/v1[/namespaces/{ns}]/{resource}[/{name}[/{subresource}]]`` and the same under
``/apis/{group}/{version}``; ``/api/v1/namespaces[/{name}]`` is the namespaces resource
itself, and ``POST /api/v1/namespaces/{ns}/bindings`` the bindings endpoint. A path to a
resource that is not served, or in the wrong scope, is 404 NotFound."""

from __future__ import annotations

from dataclasses import dataclass

from boltforge.testing.kubeapi.errors import ApiError
from boltforge.testing.kubeapi.resources import Resource, lookup

TRUE = ("1", "t", "T", "true", "TRUE", "True")
SUBRESOURCES = {"status", "binding", "eviction"}


@dataclass(frozen=True)
class Target:
    """``res`` is None for the ``bindings`` endpoint."""

    res: Resource | None
    namespace: str | None
    name: str | None
    sub: str | None

    @property
    def counted_as(self) -> str:
        """How the request log names what was asked (``pods/binding``, ``bindings``)."""
        plural = self.res.plural if self.res else "bindings"
        return f"{plural}/{self.sub}" if self.sub else plural


def missing() -> ApiError:
    return ApiError(404, "the server could not find the requested resource", "NotFound")


def parse(path: str) -> Target:
    parts = [p for p in path.split("/") if p]
    if parts[:2] == ["api", "v1"]:
        group, version, rest = "", "v1", parts[2:]
    elif len(parts) >= 3 and parts[0] == "apis":
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        raise missing()
    namespace = None
    if len(rest) >= 3 and rest[0] == "namespaces":
        namespace, rest = rest[1], rest[2:]
    if not rest or len(rest) > 3:
        raise missing()
    if (group, rest) == ("", ["bindings"]) and namespace:
        return Target(None, namespace, None, None)
    res = lookup(group, version, rest[0])
    name, sub = [*rest[1:], None, None][:2]
    if res is None or (namespace is not None and not res.namespaced):
        raise missing()
    if sub is not None and sub not in {s.name for s in res.subresources}:
        raise missing()
    if name is not None and res.namespaced and namespace is None:
        raise missing()
    return Target(res, namespace if res.namespaced else None, name, sub)


def verb(method: str, target: Target, watch: bool) -> str:
    """The Kubernetes verb of ``method`` on ``target``; 405 for one not allowed."""
    named = target.name is not None
    if target.res is None or target.sub in ("binding", "eviction"):
        allowed = {"POST": "create"}
    elif named:
        allowed = {"GET": "watch" if watch else "get", "PUT": "update", "PATCH": "patch"}
        if target.sub is None:
            allowed["DELETE"] = "delete"
    else:
        allowed = {"GET": "watch" if watch else "list", "POST": "create"}
        allowed["DELETE"] = "deletecollection"
    if method not in allowed:
        raise ApiError(405, "the server does not allow this method on the requested resource")
    return allowed[method]

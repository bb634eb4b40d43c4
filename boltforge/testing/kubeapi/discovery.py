"""API discovery, in its legacy (unaggregated) form, which every kubectl and client accepts:
``/version``, ``/api`` (APIVersions), ``/api/v1`` and ``/apis/{group}/{version}``
(APIResourceList, subresources included), ``/apis`` (APIGroupList) and ``/apis/{group}``.
A client asking for aggregated discovery (``as=APIGroupDiscoveryList``) gets this legacy
form with ``Content-Type: application/json``, from which client-go (kubectl 1.26+) falls
back to the per-group documents."""

from __future__ import annotations

from boltforge.testing.kubeapi.objects import JSON
from boltforge.testing.kubeapi.resources import GROUP_VERSIONS, RESOURCES, VERBS, Resource

VERSION: JSON = {
    "major": "1",
    "minor": "30",
    "gitVersion": "v1.30.0",
    "gitCommit": "7c48c2bd72b9bf5c44d21d7338cc7bea77d0ad2a",
    "gitTreeState": "clean",
    "buildDate": "2024-04-17T17:27:03Z",
    "goVersion": "go1.22.2",
    "compiler": "gc",
    "platform": "linux/amd64",
}


def _entries(res: Resource) -> list[JSON]:
    main: JSON = {
        "name": res.plural,
        "singularName": res.kind.lower(),
        "namespaced": res.namespaced,
        "kind": res.kind,
        "verbs": list(VERBS),
    }
    if res.short_names:
        main["shortNames"] = list(res.short_names)
    if res.categories:
        main["categories"] = list(res.categories)
    entries = [main]
    for sub in res.subresources:
        entry: JSON = {"name": f"{res.plural}/{sub.name}", "singularName": ""}
        entry.update(namespaced=res.namespaced, kind=sub.kind, verbs=list(sub.verbs))
        if sub.group is not None:
            entry.update(group=sub.group, version=sub.version)
        entries.append(entry)
    return entries


BINDINGS: JSON = {
    "name": "bindings",
    "singularName": "binding",
    "namespaced": True,
    "kind": "Binding",
    "verbs": ["create"],
}


def resource_list(group: str, version: str) -> JSON | None:
    """``/api/v1`` or ``/apis/{group}/{version}``; None for one not served."""
    if (group, version) not in GROUP_VERSIONS:
        return None
    served = [r for r in RESOURCES if (r.group, r.version) == (group, version)]
    entries = [e for r in served for e in _entries(r)] + ([BINDINGS] if not group else [])
    gv = f"{group}/{version}" if group else version
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": entries}


def _group(name: str) -> JSON:
    versions = [
        {"groupVersion": f"{name}/{v}", "version": v} for g, v in GROUP_VERSIONS if g == name
    ]
    return {"name": name, "versions": versions, "preferredVersion": versions[0]}


def group(name: str) -> JSON | None:
    if not name or name not in {g for g, _ in GROUP_VERSIONS}:
        return None
    return {"kind": "APIGroup", "apiVersion": "v1", **_group(name)}


def groups() -> JSON:
    names = dict.fromkeys(g for g, _ in GROUP_VERSIONS if g)
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": [_group(n) for n in names]}


def core_versions(address: str) -> JSON:
    cidrs = [{"clientCIDR": "0.0.0.0/0", "serverAddress": address}]
    return {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": cidrs}


def document(path: str, address: str) -> JSON | None:
    """The discovery document at ``path``, or None when ``path`` is not one."""
    parts = [p for p in path.split("/") if p]
    if parts == ["version"]:
        return VERSION
    if parts == ["api"]:
        return core_versions(address)
    if parts == ["api", "v1"]:
        return resource_list("", "v1")
    if parts == ["apis"]:
        return groups()
    if len(parts) == 2 and parts[0] == "apis":
        return group(parts[1])
    if len(parts) == 3 and parts[0] == "apis":
        return resource_list(parts[1], parts[2])
    return None

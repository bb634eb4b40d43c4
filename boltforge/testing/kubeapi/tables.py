"""Server-side printing: the ``meta.k8s.io/v1`` ``Table`` kubectl asks for
(``Accept: application/json;as=Table;v=v1;g=meta.k8s.io``) when it prints ``get``.

Pods have NAME, READY, STATUS, RESTARTS, AGE, and with ``-o wide`` IP and NODE; nodes NAME,
STATUS, ROLES, AGE, VERSION; everything else NAME, AGE. Each row carries the object's
metadata (``includeObject=Metadata``, the default), the whole object (``Object``) or
nothing (``None``)."""

from __future__ import annotations

import time
from collections.abc import Callable

from boltforge.testing.kubeapi.objects import JSON, deleting, meta, parse_time, section
from boltforge.testing.kubeapi.resources import NODES, PODS, Resource

Column = tuple[str, str, int]  # name, type, priority
Cells = Callable[[JSON], list[object]]
NAME: Column = ("Name", "string", 0)
AGE: Column = ("Age", "string", 0)


def age(obj: JSON, now: float | None = None) -> str:
    """How long ago ``obj`` was created, as kubectl writes it (``5s``, ``3m2s``, ``2d``)."""
    created = parse_time(meta(obj).get("creationTimestamp"))
    if created is None:
        return "<unknown>"
    return human_duration(int((now or time.time()) - created))


def human_duration(seconds: int) -> str:
    if seconds < 0:
        return "0s"
    if seconds < 120:
        return f"{seconds}s"
    minutes, hours, days = seconds // 60, seconds // 3600, seconds // 86400
    if minutes < 10:
        return f"{minutes}m{seconds % 60}s" if seconds % 60 else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    if hours < 8:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        return f"{days}d{hours % 24}h" if hours % 24 else f"{days}d"
    return f"{days}d" if days < 365 * 2 else f"{days // 365}y"


def pod_status(pod: JSON) -> str:
    """The STATUS column: the phase, or what a container waits on or ended with."""
    status = section(pod, "status")
    reason = status.get("reason") or status.get("phase") or "Pending"
    for cs in status.get("containerStatuses") or []:
        state = cs.get("state") or {}
        if (state.get("waiting") or {}).get("reason"):
            reason = state["waiting"]["reason"]
        elif "terminated" in state:
            ended = state["terminated"] or {}
            reason = ended.get("reason") or f"ExitCode:{ended.get('exitCode', 0)}"
    return "Terminating" if deleting(pod) else reason


def _pod_cells(pod: JSON) -> list[object]:
    status, spec = section(pod, "status"), section(pod, "spec")
    statuses = status.get("containerStatuses") or []
    ready = sum(1 for cs in statuses if cs.get("ready"))
    restarts = sum(int(cs.get("restartCount", 0)) for cs in statuses)
    total = len(spec.get("containers") or [])
    node = spec.get("nodeName") or "<none>"
    nominated = status.get("nominatedNodeName") or "<none>"
    row = [f"{ready}/{total}", pod_status(pod), restarts, age(pod)]
    return [*row, status.get("podIP") or "<none>", node, nominated]


def _node_cells(node: JSON) -> list[object]:
    conditions = section(node, "status").get("conditions") or []
    ready = next((c.get("status") for c in conditions if c.get("type") == "Ready"), None)
    state = {"True": "Ready", "False": "NotReady"}.get(str(ready), "Unknown")
    if section(node, "spec").get("unschedulable"):
        state += ",SchedulingDisabled"
    prefix = "node-role.kubernetes.io/"
    labels = meta(node).get("labels") or {}
    roles = ",".join(sorted(k[len(prefix) :] for k in labels if k.startswith(prefix)))
    version = (section(node, "status").get("nodeInfo") or {}).get("kubeletVersion", "")
    return [state, roles or "<none>", age(node), version]


COLUMNS: dict[str, tuple[list[Column], Cells]] = {
    PODS.plural: (
        [
            NAME,
            ("Ready", "string", 0),
            ("Status", "string", 0),
            ("Restarts", "integer", 0),
            AGE,
            ("IP", "string", 1),
            ("Node", "string", 1),
            ("Nominated Node", "string", 1),
        ],
        _pod_cells,
    ),
    NODES.plural: (
        [NAME, ("Status", "string", 0), ("Roles", "string", 0), AGE, ("Version", "string", 0)],
        _node_cells,
    ),
}


def table(res: Resource, objects: list[JSON], rv: int | None, include: str | None) -> JSON:
    """A Table of ``objects`` of ``res``."""
    columns, cells = COLUMNS.get(res.plural, ([NAME, AGE], lambda obj: [age(obj)]))
    definitions = [
        {
            "name": n,
            "type": t,
            "format": "name" if n == "Name" else "",
            "description": n,
            "priority": p,
        }
        for n, t, p in columns
    ]
    rows = [
        {"cells": [meta(o).get("name"), *cells(o)], "object": _row_object(o, include)}
        for o in objects
    ]
    md = {"resourceVersion": str(rv)} if rv is not None else {}
    return {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": md,
        "columnDefinitions": definitions,
        "rows": rows,
    }


def _row_object(obj: JSON, include: str | None) -> JSON | None:
    if include == "None":
        return None
    if include == "Object":
        return obj
    return {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": meta(obj)}

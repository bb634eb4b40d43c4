"""Gangs from the objects that own pods, as users write them: a ``batch/v1`` Job with
``completionMode: Indexed`` is one gang of ``min(parallelism, completions)`` pods.

An indexed Job's pods are ranks of one program (each knows its index, the Job's headless
Service gives each a stable name), so they are started together or not at all. A plain Job's
pods are interchangeable workers: the Job counts their successes, makes them one at a time as
``parallelism`` allows and replaces each alone, so its pods are gangs of one unless their
template names a gang (``boltforge.io/gang``) or a PodGroup. Pure functions over the API's
JSON."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"  # annotation and label


@dataclass(frozen=True)
class Owner:
    """The indexed Job that made a pod (its controller owner reference)."""

    name: str
    uid: str


@dataclass(frozen=True)
class IndexedJob:
    """A ``batch/v1`` Job as a gang: how many of its pods run at once (``size``), and
    whether it is indexed (only an indexed Job's pods are a gang)."""

    namespace: str
    name: str
    uid: str
    size: int
    indexed: bool


def indexed_owner(meta: Mapping[str, Any]) -> Owner | None:
    """The Job that controls a pod of metadata ``meta``, when the pod carries a completion
    index (an indexed Job made it); else None."""
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    if COMPLETION_INDEX not in annotations and COMPLETION_INDEX not in labels:
        return None
    for ref in meta.get("ownerReferences") or []:
        if ref.get("kind") == "Job" and ref.get("controller") and _batch(ref):
            return Owner(ref.get("name", ""), ref.get("uid", ""))
    return None


def _batch(ref: Mapping[str, Any]) -> bool:
    return str(ref.get("apiVersion", "")).startswith("batch/")


def job(obj: Mapping[str, Any]) -> IndexedJob:
    """A Job's gang size: ``parallelism`` (1 when unset), at most ``completions``."""
    meta, spec = obj.get("metadata") or {}, obj.get("spec") or {}
    parallel = spec.get("parallelism")
    size = 1 if parallel is None else int(parallel)
    completions = spec.get("completions")
    if completions is not None:
        size = min(size, int(completions))
    return IndexedJob(
        namespace=meta.get("namespace", "default"),
        name=meta.get("name", ""),
        uid=meta.get("uid", ""),
        size=max(1, size),
        indexed=spec.get("completionMode") == "Indexed",
    )

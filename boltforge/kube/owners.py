"""Gangs from the objects that own pods, as users write them: a ``batch/v1`` Job with
``completionMode: Indexed`` is one gang of ``min(parallelism, completions)`` pods.

An indexed Job's pods are ranks of one program (each knows its index, the Job's headless
Service gives each a stable name), so they are started together or not at all. A plain Job's
pods are interchangeable workers: the Job counts their successes, makes them one at a time as
``parallelism`` allows and replaces each alone, so its pods are gangs of one unless their
template names a gang (``boltforge.io/gang``) or a PodGroup.

A JobSet (``jobset.x-k8s.io``) is one gang across all its child Jobs: its controller makes
``replicas`` indexed Jobs of each of its ``replicatedJobs`` and labels each Job, and so each
pod, with the JobSet's name and UID, the replicatedJob's name and replicas, the sum of all
replicas and the JobSet's restart attempt (``JobSetRef``). The gang's size is the sum over
its replicatedJobs of replicas × the Job's size, known once one Job of every replicatedJob is
(``jobset_size``). A restart replaces every child Job and bumps the attempt: a new gang
attempt. Pure functions over the API's JSON."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"  # annotation and label
# The labels the JobSet controller writes on its Jobs and their pods (sigs.k8s.io/jobset).
JOBSET_NAME = "jobset.sigs.k8s.io/jobset-name"
JOBSET_UID = "jobset.sigs.k8s.io/jobset-uid"
REPLICATED_JOB = "jobset.sigs.k8s.io/replicatedjob-name"
REPLICATED_JOB_REPLICAS = "jobset.sigs.k8s.io/replicatedjob-replicas"
GLOBAL_REPLICAS = "jobset.sigs.k8s.io/global-replicas"
RESTART_ATTEMPT = "jobset.sigs.k8s.io/restart-attempt"


@dataclass(frozen=True)
class JobSetRef:
    """The JobSet a Job or pod belongs to, as its labels say: the JobSet's ``name`` and
    ``uid``, its restart ``attempt``, the ``replicated_job`` it is of, that replicatedJob's
    ``replicas`` and the sum of every replicatedJob's replicas (``global_replicas``)."""

    name: str
    uid: str
    attempt: int
    replicated_job: str
    replicas: int
    global_replicas: int


@dataclass(frozen=True)
class Owner:
    """The indexed Job that made a pod (its controller owner reference), and the JobSet
    that made that Job, if one did."""

    name: str
    uid: str
    jobset: JobSetRef | None = None


@dataclass(frozen=True)
class IndexedJob:
    """A ``batch/v1`` Job as a gang: how many of its pods run at once (``size``), and
    whether it is indexed (only an indexed Job's pods are a gang)."""

    namespace: str
    name: str
    uid: str
    size: int
    indexed: bool
    jobset: JobSetRef | None = None


def jobset_of(meta: Mapping[str, Any]) -> JobSetRef | None:
    """The JobSet that the labels of ``meta`` (a Job's or a pod's metadata) name; None
    without the JobSet name and UID labels. A count that does not parse reads as 0."""
    labels = meta.get("labels") or {}
    name, uid = labels.get(JOBSET_NAME), labels.get(JOBSET_UID)
    if not name or not uid:
        return None
    return JobSetRef(
        name=name,
        uid=uid,
        attempt=_count(labels.get(RESTART_ATTEMPT)),
        replicated_job=labels.get(REPLICATED_JOB, ""),
        replicas=_count(labels.get(REPLICATED_JOB_REPLICAS)),
        global_replicas=_count(labels.get(GLOBAL_REPLICAS)),
    )


def _count(text: str | None) -> int:
    try:
        return max(0, int(text or "0"))
    except ValueError:
        return 0


def jobset_size(jobs: Iterable[IndexedJob], uid: str, attempt: int) -> int | None:
    """How many pods the JobSet of UID ``uid`` runs at once in restart ``attempt``: the sum
    over its replicatedJobs of replicas × the size of one of its Jobs among ``jobs``. None
    until a Job of every replicatedJob is known (their replicas add up to the JobSet's
    global replicas)."""
    sizes: dict[str, tuple[int, int]] = {}  # replicatedJob -> (replicas, one Job's size)
    want = 0
    for j in jobs:
        ref = j.jobset
        if ref is None or ref.uid != uid or ref.attempt != attempt or not j.indexed:
            continue
        sizes.setdefault(ref.replicated_job, (ref.replicas, j.size))
        want = max(want, ref.global_replicas)
    if not sizes or sum(r for r, _ in sizes.values()) < want:
        return None
    return sum(r * size for r, size in sizes.values())


def indexed_owner(meta: Mapping[str, Any]) -> Owner | None:
    """The Job that controls a pod of metadata ``meta``, when the pod carries a completion
    index (an indexed Job made it); else None."""
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    if COMPLETION_INDEX not in annotations and COMPLETION_INDEX not in labels:
        return None
    for ref in meta.get("ownerReferences") or []:
        if ref.get("kind") == "Job" and ref.get("controller") and _batch(ref):
            return Owner(ref.get("name", ""), ref.get("uid", ""), jobset_of(meta))
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
        jobset=jobset_of(meta),
    )

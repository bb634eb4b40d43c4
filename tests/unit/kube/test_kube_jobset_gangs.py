"""A JobSet's pods are one gang across all its child Jobs, of the sum over its
replicatedJobs of replicas × a Job's size, anchored on the JobSet's UID and restart attempt;
it waits until a Job of every replicatedJob is known."""

from __future__ import annotations

from typing import Any

from boltforge.kube import model
from boltforge.kube.gangs import GangIndex, GangKey, gangs, key_of
from boltforge.kube.model import KubePod
from boltforge.kube.owners import IndexedJob, job, jobset_of, jobset_size
from boltforge.testing.kube_builders import job_json, job_pod_json

JS_UID = "jobset-uid-1"
KEY = GangKey("research", "jobset", "llm")
# replicatedJob -> (replicas, parallelism): a driver of one pod, two worker Jobs of two
SHAPE = {"driver": (1, 1), "workers": (2, 2)}


def labels(rj: str, index: int, attempt: int = 0, uid: str = JS_UID) -> dict[str, str]:
    """What the JobSet controller writes on a child Job and its pods."""
    return {
        "jobset.sigs.k8s.io/jobset-name": "llm",
        "jobset.sigs.k8s.io/jobset-uid": uid,
        "jobset.sigs.k8s.io/replicatedjob-name": rj,
        "jobset.sigs.k8s.io/replicatedjob-replicas": str(SHAPE[rj][0]),
        "jobset.sigs.k8s.io/global-replicas": str(sum(r for r, _ in SHAPE.values())),
        "jobset.sigs.k8s.io/job-index": str(index),
        "jobset.sigs.k8s.io/restart-attempt": str(attempt),
    }


def child(rj: str, index: int, attempt: int = 0) -> dict[str, Any]:
    obj = job_json(f"llm-{rj}-{index}", SHAPE[rj][1], uid=f"{rj}-{index}-{attempt}")
    obj["metadata"]["labels"] = labels(rj, index, attempt)
    return obj


def pods_of(rj: str, index: int, attempt: int = 0, deleting: bool = False) -> list[KubePod]:
    name, parallel = f"llm-{rj}-{index}", SHAPE[rj][1]
    out = []
    for i in range(parallel):
        obj = job_pod_json(name, f"{rj}-{index}-{attempt}", i)
        obj["metadata"]["labels"] |= labels(rj, index, attempt)
        obj["metadata"]["uid"] = f"pod-{name}-{i}-{attempt}"
        if deleting:
            obj["metadata"]["name"] += "-old"
            obj["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
        out.append(model.pod(obj))
    return out


def jobs_of(*objs: dict[str, Any]) -> dict[str, IndexedJob]:
    return {f"{j.namespace}/{j.name}": j for j in map(job, objs)}


ALL = [("driver", 0), ("workers", 0), ("workers", 1)]


def test_a_jobsets_pods_are_one_gang_across_its_jobs() -> None:
    pods = [p for rj, i in ALL for p in pods_of(rj, i)]
    found = gangs(pods, {}, jobs_of(*(child(rj, i) for rj, i in ALL)))
    assert list(found) == [KEY]
    gang = found[KEY]
    assert gang.min_member == 5 and gang.not_ready() is None
    assert gang.group_uid == JS_UID
    assert gang.idempotency_key().endswith(f"/jobset/llm/{JS_UID}")


def test_the_size_needs_one_job_of_every_replicated_job() -> None:
    only_workers = map(job, (child("workers", 0), child("workers", 1)))
    assert jobset_size(only_workers, JS_UID, 0) is None
    one_each = map(job, (child("driver", 0), child("workers", 1)))
    assert jobset_size(one_each, JS_UID, 0) == 1 * 1 + 2 * 2
    assert jobset_size(map(job, [child("driver", 0)]), "another-uid", 0) is None


def test_nothing_is_placed_until_every_pod_of_every_job_exists() -> None:
    pods = pods_of("driver", 0) + pods_of("workers", 0)
    gang = gangs(pods, {}, jobs_of(*(child(rj, i) for rj, i in ALL)))[KEY]
    assert "3 of the 5 pods its JobSet llm needs" in (gang.not_ready() or "")


def test_pods_whose_jobs_are_not_all_known_wait_and_say_so() -> None:
    gang = gangs(pods_of("workers", 0), {}, jobs_of(child("workers", 0)))[KEY]
    assert gang.min_member is None
    assert "not every replicatedJob of JobSet llm" in (gang.not_ready() or "")


def test_a_restart_is_a_new_attempt_with_its_own_jobs() -> None:
    gone = [p for rj, i in ALL for p in pods_of(rj, i, deleting=True)]
    new = [p for rj, i in ALL for p in pods_of(rj, i, attempt=1)]
    jobs = jobs_of(*(child(rj, i, attempt=1) for rj, i in ALL))
    gang = gangs(new + gone, {}, jobs)[KEY]
    assert gang.group_uid == f"{JS_UID}/restart-1"
    assert gang.min_member == 5 and gang.not_ready() is None
    stale = gangs(new, {}, jobs_of(*(child(rj, i) for rj, i in ALL)))[KEY]
    assert stale.min_member is None  # the attempt-0 Jobs do not size attempt 1


def test_a_child_job_that_arrives_after_its_pods_makes_the_gang_ready() -> None:
    index = GangIndex()
    pods = {p.path: p for rj, i in ALL for p in pods_of(rj, i)}
    partial = jobs_of(child("workers", 0))
    index.update(pods, None, {}, None, partial, None)
    assert index.gangs[KEY].min_member is None
    index.update(
        pods, set(), {}, set(), jobs_of(*(child(rj, i) for rj, i in ALL)), {"research/llm-driver-0"}
    )
    assert KEY in index.touched
    assert index.gangs[KEY].not_ready() is None


def test_the_labels_are_read_from_a_pod_and_a_job() -> None:
    pod = pods_of("workers", 1)[0]
    assert key_of(pod) == KEY
    assert pod.owner is not None and pod.owner.name == "llm-workers-1"
    ref = jobset_of({"labels": labels("workers", 1, attempt=3)})
    assert ref is not None and (ref.attempt, ref.replicas, ref.global_replicas) == (3, 2, 3)
    assert jobset_of({"labels": {"jobset.sigs.k8s.io/jobset-name": "llm"}}) is None
    assert job(child("driver", 0)).jobset is not None

"""An indexed Job's pods are one gang of the Job's size, anchored on the Job's UID; a plain
Job's pods are gangs of one; a PodGroup or gang annotation on the template still wins."""

from __future__ import annotations

from typing import Any

from boltforge.kube import model
from boltforge.kube.gangs import GangIndex, GangKey, gangs, key_of
from boltforge.kube.model import KubePod
from boltforge.kube.owners import IndexedJob, job
from boltforge.testing.kube_builders import job_json, job_pod_json, pod_json

JOB_UID = "job-uid-1"


def worker(index: int, uid: str = JOB_UID, **kw: Any) -> KubePod:
    obj = job_pod_json("train", uid, index, **kw)
    obj["metadata"]["uid"] = f"pod-{uid}-{index}"
    return model.pod(obj)


def jobs_of(*objs: dict[str, Any]) -> dict[str, IndexedJob]:
    return {f"{j.namespace}/{j.name}": j for j in map(job, objs)}


TRAIN = jobs_of(job_json("train", 4, uid=JOB_UID))
KEY = GangKey("research", "job", "train")


def test_an_indexed_jobs_pods_are_one_gang_of_its_parallelism() -> None:
    pods = [worker(i) for i in range(4)]
    found = gangs(pods, {}, TRAIN)
    assert list(found) == [KEY]
    gang = found[KEY]
    assert gang.min_member == 4 and gang.not_ready() is None
    assert gang.group_uid == JOB_UID
    assert gang.idempotency_key().endswith(f"/{JOB_UID}")
    assert gang.idempotency_key(2).endswith(f"/{JOB_UID}/attempt-2")


def test_nothing_of_an_indexed_job_is_placed_until_all_its_pods_exist() -> None:
    gang = gangs([worker(0), worker(1), worker(2)], {}, TRAIN)[KEY]
    why = gang.not_ready() or ""
    assert "3 of the 4 pods its indexed Job train needs" in why


def test_the_gang_is_at_most_the_jobs_completions() -> None:
    assert job(job_json("j", 8, completions=3)).size == 3
    assert job(job_json("j", 2, completions=8)).size == 2


def test_a_pod_of_a_job_not_yet_known_waits_and_says_so() -> None:
    gang = gangs([worker(0)], {}, {})[KEY]
    assert gang.min_member is None
    assert "Job train is not known in namespace research" in (gang.not_ready() or "")


def test_a_plain_jobs_pods_are_gangs_of_one() -> None:
    obj = job_pod_json("train", JOB_UID, 0)
    del obj["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"]
    pod = model.pod(obj)
    assert pod.owner is None
    assert key_of(pod) == GangKey("research", "pod", "train-0")
    assert not job(job_json("train", 4, indexed=False)).indexed


def test_a_pod_group_label_or_gang_annotation_on_the_template_wins() -> None:
    grouped = worker(0, group="llm")
    annotated = worker(1, gang=("pair", 2))
    assert key_of(grouped) == GangKey("research", "podgroup", "llm")
    assert key_of(annotated) == GangKey("research", "gang", "pair")


def test_a_pod_owned_by_something_else_than_a_job_is_its_own_gang() -> None:
    obj = job_pod_json("train", JOB_UID, 0)
    obj["metadata"]["ownerReferences"][0]["kind"] = "ReplicaSet"
    assert key_of(model.pod(obj)) == GangKey("research", "pod", "train-0")
    assert model.pod(pod_json("lone")).owner is None


def test_a_job_that_arrives_after_its_pods_makes_their_gang_ready() -> None:
    index = GangIndex()
    pods = {p.path: p for p in (worker(i) for i in range(4))}
    index.update(pods, None, {}, None, {}, None)
    assert index.gangs[KEY].min_member is None
    index.update(pods, set(), {}, set(), TRAIN, {"research/train"})
    assert KEY in index.touched
    assert index.gangs[KEY].not_ready() is None


def test_a_job_made_again_under_its_name_does_not_take_the_old_jobs_pods() -> None:
    newer = jobs_of(job_json("train", 4, uid="job-uid-2"))
    gang = gangs([worker(i) for i in range(4)], {}, newer)[KEY]
    assert gang.min_member is None

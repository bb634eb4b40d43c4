"""Pods into gangs: which pods are placed together, and whether a gang is ready to place.

A pod belongs to the gang of its PodGroup (the ``scheduling.x-k8s.io/pod-group`` label, as
the coscheduling plugin uses; the gang is ready once ``minMember`` of its pods wait), else to
the gang its ``boltforge.io/gang`` annotation names (ready once ``boltforge.io/gang-size`` of
them wait), else to the gang of the JobSet whose indexed Job made it (ready once the sum
over its replicatedJobs of replicas × a Job's size wait), else to the gang of the indexed Job
that made it (ready once the Job's ``min(parallelism, completions)`` of them wait;
``owners.py``), else it is a gang of one.
Pure functions over the informers' snapshots."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from boltforge.kube.budgets import protection
from boltforge.kube.model import GANG, GANG_SIZE, Budget, KubePod, PodGroup
from boltforge.kube.owners import IndexedJob, jobset_size
from boltforge.kube.translate import name_of


class GangKey(NamedTuple):
    namespace: str
    kind: str  # podgroup, gang, jobset, job or pod
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass
class PodGang:
    """A gang's pods (all of them, in any phase, by ``namespace/name``) and how many must
    wait before it is placed (None: its PodGroup does not exist)."""

    key: GangKey
    members: dict[str, KubePod] = field(default_factory=dict)
    min_member: int | None = 1
    group_uid: str = ""

    @property
    def pods(self) -> list[KubePod]:
        return list(self.members.values())

    @property
    def waiting(self) -> list[KubePod]:
        """Pods to place: not yet bound, not being deleted, not held by a scheduling gate
        (``spec.schedulingGates``), in name order."""
        return sorted(
            (
                p
                for p in self.pods
                if not p.bound and not p.deleting and not p.finished and not p.gates
            ),
            key=lambda p: p.name,
        )

    @property
    def gated(self) -> list[KubePod]:
        """Pods not yet bound that a scheduling gate holds back."""
        return [p for p in self.pods if p.gates and not p.bound and not p.deleting]

    def not_ready(self) -> str | None:
        """Why the gang cannot be placed yet (None: it can)."""
        if self.min_member is None and self.key.kind == "job":
            return (
                f"Job {self.key.name} is not known in namespace {self.key.namespace} (yet); "
                "its pods are placed together once it is"
            )
        if self.min_member is None and self.key.kind == "jobset":
            return (
                f"not every replicatedJob of JobSet {self.key.name} has a Job known in "
                f"namespace {self.key.namespace} (yet); its pods are placed together once "
                "they do"
            )
        if self.min_member is None:
            return (
                f"PodGroup {self.key.name} does not exist in namespace {self.key.namespace}; "
                "create it (scheduling.x-k8s.io/v1alpha1) or remove the pod-group label"
            )
        have = len(self.waiting)
        if have < self.min_member:
            what = {"podgroup": "PodGroup", "job": "indexed Job", "jobset": "JobSet"}.get(
                self.key.kind, f"{GANG_SIZE} of gang"
            )
            gated = self.gated
            held = ""
            if gated:
                gates = sorted({g for p in gated for g in p.gates})
                held = (
                    f" ({len(gated)} more held by scheduling gates {', '.join(gates)}; "
                    "they count once their gates are removed)"
                )
            return (
                f"waiting for its gang: {have} of the {self.min_member} pods its {what} "
                f"{self.key.name} needs exist{held}; nothing is bound until all do"
            )
        return None

    def idempotency_key(self, attempt: int = 0) -> str:
        """The same for the same gang and attempt whichever scheduler replica submits it.
        A gang whose job ended and whose pods are made again (a Job controller's) is a new
        attempt: a new job."""
        anchor = self.group_uid
        if not anchor:
            uids = sorted(p.uid for p in self.waiting)
            anchor = hashlib.sha256(",".join(uids).encode()).hexdigest()[:32]
        tail = f"/attempt-{attempt}" if attempt else ""
        end = f"/{anchor}{tail}"  # kept whole: a long name is cut, never the anchor
        key = f"k8s/{self.key.namespace}/{self.key.kind}/{self.key.name}"[: 200 - len(end)]
        return key + end

    def job_name(self) -> str:
        return name_of(f"{self.key.namespace}-{self.key.name}", "gang")


def key_of(pod: KubePod) -> GangKey:
    if pod.pod_group:
        return GangKey(pod.namespace, "podgroup", pod.pod_group)
    if GANG in pod.annotations:
        return GangKey(pod.namespace, "gang", pod.annotations[GANG])
    if pod.owner is not None and pod.owner.jobset is not None:
        return GangKey(pod.namespace, "jobset", pod.owner.jobset.name)
    if pod.owner is not None:
        return GangKey(pod.namespace, "job", pod.owner.name)
    return GangKey(pod.namespace, "pod", pod.name)


def gangs(
    pods: Iterable[KubePod],
    groups: Mapping[str, PodGroup],
    jobs: Mapping[str, IndexedJob] | None = None,
) -> dict[GangKey, PodGang]:
    """Every gang of ``pods`` (the scheduler's own pods), with its readiness rule."""
    index = GangIndex()
    index.update({p.path: p for p in pods}, None, groups, None, jobs, None)
    return index.gangs


class GangIndex:
    """``gangs`` kept current from what changed (the informers' change sets) rather than
    worked out again from every pod on every pass."""

    def __init__(self) -> None:
        self.gangs: dict[GangKey, PodGang] = {}
        self.touched: set[GangKey] = set()  # the gangs the last update changed or removed
        self._of: dict[str, GangKey] = {}  # pod path -> its gang

    def update(
        self,
        pods: Mapping[str, KubePod],
        changed: Iterable[str] | None,
        groups: Mapping[str, PodGroup],
        changed_groups: Iterable[str] | None,
        jobs: Mapping[str, IndexedJob] | None = None,
        changed_jobs: Iterable[str] | None = (),
    ) -> dict[GangKey, PodGang]:
        """Bring the gangs up to date with ``pods`` (by path), ``groups`` and ``jobs``, given
        the paths that changed since the last update (None: any may have); ``touched`` names
        the gangs that may have changed (every one, after a full update, and those gone)."""
        jobs = jobs or {}
        touched: set[GangKey] = set()
        if changed is None:
            touched, self.gangs, self._of = set(self.gangs), {}, {}
            changed = pods
        for path in changed:
            pod = pods.get(path)
            key = key_of(pod) if pod is not None else None
            old = self._of.pop(path, None)
            if old is not None and old != key:
                self.gangs[old].members.pop(path, None)
                touched.add(old)
            if pod is not None and key is not None:
                self._of[path] = key
                self.gangs.setdefault(key, PodGang(key)).members[path] = pod
                touched.add(key)
        if changed_groups is None:
            touched |= set(self.gangs)
        else:
            touched |= {_group_gang(path) for path in changed_groups}
        if changed_jobs is None:
            touched |= {k for k in self.gangs if k.kind in ("job", "jobset")}
        else:
            for path in changed_jobs:
                touched.add(_group_gang(path, "job"))
                ref = jobs[path].jobset if path in jobs else None
                if ref is not None:
                    touched.add(GangKey(jobs[path].namespace, "jobset", ref.name))
        self.touched = touched
        for key in touched:
            gang = self.gangs.get(key)
            if gang is not None and not gang.members:
                del self.gangs[key]
            elif gang is not None:
                _rule(gang, groups, jobs)
        return self.gangs


def _group_gang(path: str, kind: str = "podgroup") -> GangKey:
    namespace, _, name = path.partition("/")
    return GangKey(namespace, kind, name)


def _rule(gang: PodGang, groups: Mapping[str, PodGroup], jobs: Mapping[str, IndexedJob]) -> None:
    """Set how many of ``gang``'s pods must wait: its PodGroup's ``minMember``, its indexed
    Job's size (None while the Job is not known), its JobSet's size (``owners.jobset_size``),
    or the largest gang size its pods annotate. A Job's gang is anchored on the Job's UID, as
    a PodGroup's is on its own; a JobSet's on the JobSet's UID and its newest restart attempt
    among the pods still to run."""
    key = gang.key
    if key.kind == "jobset":
        _jobset_rule(gang, jobs)
        return
    if key.kind == "job":
        job = jobs.get(f"{key.namespace}/{key.name}")
        uids = {p.owner.uid for p in gang.members.values() if p.owner is not None}
        gang.group_uid = job.uid if job else min(uids, default="")
        gang.min_member = job.size if job is not None and job.uid in uids | {""} else None
        return
    if key.kind == "podgroup":
        group = groups.get(f"{key.namespace}/{key.name}")
        gang.min_member = group.min_member if group else None
        gang.group_uid = group.uid if group else ""
    elif key.kind == "gang":
        gang.min_member = max(_size(p.annotations.get(GANG_SIZE)) for p in gang.members.values())


def _jobset_rule(gang: PodGang, jobs: Mapping[str, IndexedJob]) -> None:
    refs = [p.owner.jobset for p in gang.members.values() if p.owner and p.owner.jobset]
    live = [
        p.owner.jobset
        for p in gang.members.values()
        if p.owner and p.owner.jobset and not p.deleting and not p.finished
    ]
    newest = max(live or refs, key=lambda r: r.attempt)
    gang.group_uid = newest.uid + (f"/restart-{newest.attempt}" if newest.attempt else "")
    mine = (j for j in jobs.values() if j.namespace == gang.key.namespace)
    gang.min_member = jobset_size(mine, newest.uid, newest.attempt)


def _size(text: str | None) -> int:
    try:
        return max(1, int(text or "1"))
    except ValueError:
        return 1


def preemptible(gang: PodGang, budgets: Iterable[Budget], pods: Iterable[KubePod]) -> bool:
    """Whether Boltforge may bump the whole gang (``budgets.protection``)."""
    return not protection(gang.waiting, budgets, pods)

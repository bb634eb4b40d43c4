"""What the Kubernetes scheduler keeps between passes: which pod runs which replica, which
gang is which Boltforge job, what it told each pod. Rebuilt from the pods themselves (the
annotations their bindings wrote) when a replica takes the lead."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Literal

from boltforge.kube.desired import DesiredStates
from boltforge.kube.gangs import GangKey
from boltforge.kube.model import JOB, REPLICA, KubePod
from boltforge.kube.words import Told
from boltforge.node.follower import ReportOutbox
from boltforge.wire.agent import Inventory, Lease, ReplicaEvent, ReplicaStatus


@dataclass
class Placed:
    """A replica bound to a pod: the pod (namespace, name, uid), its node, and what has been
    reported and asked of it."""

    replica: str
    job: str
    epoch: int
    pod: KubePod
    node: str
    started: bool = False
    exited: bool = False
    evicted_at: float | None = None
    retry_at: float = 0.0

    def status(self) -> ReplicaStatus:
        state: Literal["running", "stopping"] = (
            "stopping" if self.evicted_at is not None else "running"
        )
        return ReplicaStatus(replica=self.replica, job=self.job, epoch=self.epoch, state=state)

    def event(self, kind: str, **extra: object) -> ReplicaEvent:
        return replica_event(self.replica, self.job, self.epoch, kind, **extra)


def replica_event(replica: str, job: str, epoch: int, kind: str, **extra: object) -> ReplicaEvent:
    """What happened to ``replica`` now (``extra``: the event's other fields)."""
    fields = {"replica": replica, "job": job, "epoch": epoch, "kind": kind, "at": time.time()}
    return ReplicaEvent.model_validate({**fields, **extra})


def adopted(pod: KubePod) -> Placed | None:
    """The replica a bound pod runs, from the annotations its binding wrote."""
    replica, job = pod.annotations.get(REPLICA), pod.annotations.get(JOB)
    if not (pod.bound and replica and job) or pod.finished or replica.count(".") < 2:
        return None
    epoch = int(replica.rsplit(".", 2)[1])
    return Placed(replica, job, epoch, pod, pod.node, started=pod.phase == "Running")


@dataclass
class SchedulerState:
    leases: dict[str, Lease] = field(default_factory=dict)
    registered: dict[str, Inventory] = field(default_factory=dict)  # as last registered
    refused_nodes: dict[str, str] = field(default_factory=dict)  # node -> the server's words
    desired: DesiredStates = field(default_factory=DesiredStates)
    job_of: dict[GangKey, str] = field(default_factory=dict)
    gang_of: dict[str, GangKey] = field(default_factory=dict)
    placed: dict[str, Placed] = field(default_factory=dict)  # by replica id; see ``place``
    on_pod: dict[str, set[str]] = field(default_factory=dict)  # pod path -> its replicas
    on_node: dict[str, set[str]] = field(default_factory=dict)  # node -> its replicas
    moved: set[str] = field(default_factory=set)  # nodes whose statuses changed; see ``moves``
    unplaced: int = 0  # grows with every ``unplace``
    refused: dict[GangKey, str] = field(default_factory=dict)
    blocked: dict[str, str] = field(default_factory=dict)  # job -> why its eviction waits
    attempts: dict[GangKey, int] = field(default_factory=dict)  # the gang's current attempt
    ended_gangs: set[GangKey] = field(default_factory=set)  # their job ended; pods wait again
    submitted_pods: dict[GangKey, set[str]] = field(default_factory=dict)  # uids, as submitted
    told: Told = field(default_factory=Told)  # what each waiting pod was told, and when
    fits_nowhere: set[GangKey] = field(default_factory=set)  # refused: no node could run it
    ended: set[str] = field(default_factory=set)  # replicas whose exit was reported
    foreign: set[str] = field(default_factory=set)
    cordoned: set[str] = field(default_factory=set)
    unleased: set[str] = field(default_factory=set)  # leases dropped, to register again
    outbox: ReportOutbox = field(default_factory=ReportOutbox)  # events to report, by node

    def place(self, placed: Placed) -> None:
        """Record that ``placed.pod`` runs ``placed.replica``."""
        self.placed[placed.replica] = placed
        self.on_pod.setdefault(placed.pod.path, set()).add(placed.replica)
        self.on_node.setdefault(placed.node, set()).add(placed.replica)
        self.moved.add(placed.node)

    def unplace(self, replica: str) -> None:
        """Forget ``replica``'s pod."""
        placed = self.placed.pop(replica)
        self.unplaced += 1
        for index, key in ((self.on_pod, placed.pod.path), (self.on_node, placed.node)):
            on = index.get(key, set())
            on.discard(replica)
            if not on:
                index.pop(key, None)
        self.moved.add(placed.node)

    def moves(self, placed: Placed) -> None:
        """Note that ``placed``'s status changed (stopping, or exited)."""
        self.moved.add(placed.node)

    def drop_lease(self, node: str) -> None:
        """Forget ``node``'s lease (its session is gone): it registers again on the next
        pass."""
        self.leases.pop(node, None)
        self.unleased.add(node)

    def taken(self) -> set[str]:
        """The uids of pods that run (or ran) a replica."""
        return {p.pod.uid for p in self.placed.values()}

    def statuses(self, node: str) -> list[ReplicaStatus]:
        """What ``node`` runs, as its agent would report it."""
        placed = (self.placed[r] for r in sorted(self.on_node.get(node, ())))
        return [p.status() for p in placed if not p.exited]

    def link(self, key: GangKey, job: str) -> None:
        self.job_of[key] = job
        self.gang_of[job] = key

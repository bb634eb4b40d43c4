"""What the Slurm bridge keeps between passes: the gangs it started (which replica runs on
which node of a Slurm job) and its bookkeeping, all rebuilt from Slurm's admin comments when
the bridge starts again."""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Literal

from boltforge.node.follower import ReportOutbox
from boltforge.wire.agent import Lease, ReplicaEvent, ReplicaSpec, ReplicaStatus

TAG = "boltforge"
MADE = "made=1"  # in the admin comment: the bridge made this Slurm job (``launch.py``)


@dataclass
class SlurmGang:
    """A Slurm job the bridge started for one epoch of a Boltforge job: which replica runs
    on which node, in rank order; whether its start was reported; when its stop's grace
    ends (None while it is not being stopped)."""

    job: str
    epoch: int
    replicas: dict[str, str]
    started: bool = False
    stop_by: float | None = None
    signalled_at: float | None = None
    made: bool = False  # the bridge made the Slurm job (``bolt submit``, ``launch.py``)

    def statuses(self, node: str) -> list[ReplicaStatus]:
        state: Literal["running", "stopping"] = "running" if self.stop_by is None else "stopping"
        return [
            ReplicaStatus(replica=r, job=self.job, epoch=self.epoch, state=state)
            for r, n in self.replicas.items()
            if n == node
        ]

    def events(self, kind: str, **extra: object) -> dict[str, list[ReplicaEvent]]:
        out: dict[str, list[ReplicaEvent]] = defaultdict(list)
        for r, n in self.replicas.items():
            ev = ReplicaEvent.model_validate(
                {
                    "replica": r,
                    "job": self.job,
                    "epoch": self.epoch,
                    "kind": kind,
                    "at": time.time(),
                    **extra,
                }
            )
            out[n].append(ev)
        return out

    def admin_comment(self) -> str:
        placed = ",".join(f"{r}@{n}" for r, n in self.replicas.items())
        made = f" {MADE}" if self.made else ""
        return f"{job_comment(self.job)} epoch={self.epoch} replicas={placed}{made}"


def job_comment(job: str) -> str:
    """The admin comment of a Slurm job that stands for Boltforge job ``job``."""
    return f"{TAG} job={job}"


def parse_admin_comment(text: str) -> tuple[str | None, SlurmGang | None]:
    """The Boltforge job id (and the gang, once started) kept in a job's admin comment."""
    if not text.startswith(f"{TAG} "):
        return None, None
    fields = dict(f.split("=", 1) for f in text.split()[1:] if "=" in f)
    job = fields.get("job")
    if job is None or "epoch" not in fields or "replicas" not in fields:
        return job, None
    placed = dict(p.split("@", 1) for p in fields["replicas"].split(",") if "@" in p)
    made = f"made={fields.get('made')}" == MADE
    return job, SlurmGang(job, int(fields["epoch"]), placed, started=True, made=made)


@dataclass
class BridgeState:
    """What the bridge knows between passes; rebuilt from Slurm's admin comments at start."""

    leases: dict[str, Lease] = field(default_factory=dict)
    desired: dict[str, list[ReplicaSpec]] = field(default_factory=dict)
    bf_of: dict[str, str] = field(default_factory=dict)  # Slurm job id -> Boltforge job id
    gangs: dict[str, SlurmGang] = field(default_factory=dict)  # Slurm job id -> its started gang
    last_epoch: dict[str, int] = field(default_factory=dict)  # the last epoch started
    refused: set[str] = field(default_factory=set)
    cancelled: set[str] = field(default_factory=set)
    foreign: set[tuple[str, int]] = field(default_factory=set)
    made: dict[str, tuple[str, int]] = field(default_factory=dict)  # Slurm job -> (job, epoch)
    unstarted: set[tuple[str, int]] = field(default_factory=set)
    cordoned: set[str] = field(default_factory=set)
    comments: dict[str, str] = field(default_factory=dict)
    outbox: ReportOutbox = field(default_factory=ReportOutbox)  # events to report, by node

"""One replica the agent launched: its spec, process and files, and what it has produced."""

from __future__ import annotations

import asyncio
from typing import Any, Literal

from pydantic import ValidationError

from boltforge.agent.identity import Identity
from boltforge.agent.outbox import Outbox
from boltforge.agent.processes import ReplicaPaths
from boltforge.agent.tails import LogTail, ProgressTail
from boltforge.wire.agent import LogChunk, Progress, ReplicaEvent, ReplicaSpec, ReplicaStatus

CHUNK_BYTES = 64 << 10
PROGRESS_BYTES = 256 << 10


class Replica:
    """A replica from launch until its output has all been read.

    ``term_at`` is when the agent sent the checkpoint signal (None until it is asked to stop);
    ``by_node`` is True when the agent stopped it on its own rather than at the server's word;
    ``killed`` once the agent sent it SIGKILL;
    ``done`` is set once the process has exited and been reaped. Log chunks are numbered from
    0 in the order the output was written. ``identity``: the user it runs as (None: the
    agent's own, or a container's).
    """

    def __init__(
        self, spec: ReplicaSpec, paths: ReplicaPaths, identity: Identity | None = None
    ) -> None:
        self.spec = spec
        self.paths = paths
        self.identity = identity
        self.log = LogTail(paths.log)
        self.progress = ProgressTail(paths.progress)
        self.process: asyncio.subprocess.Process | None = None
        self.seq = 0
        self.term_at: float | None = None
        self.by_node = False
        self.killed = False
        self.done = asyncio.Event()

    @property
    def name(self) -> str:
        return self.spec.replica

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def status(self) -> ReplicaStatus:
        state: Literal["running", "stopping", "exited"] = (
            "exited" if self.done.is_set() else "stopping" if self.term_at else "running"
        )
        spec = self.spec
        return ReplicaStatus(
            replica=spec.replica, job=spec.job, epoch=spec.epoch, state=state, pid=self.pid
        )

    def event(
        self, kind: Literal["started", "exited", "failed"], at: float, **fields: Any
    ) -> ReplicaEvent:
        spec = self.spec
        return ReplicaEvent(
            replica=spec.replica, job=spec.job, epoch=spec.epoch, kind=kind, at=at, **fields
        )

    def collect(self, outbox: Outbox) -> bool:
        """Move new output and progress lines into ``outbox``, as far as it has room.
        True when anything was read."""
        got = False
        while (room := min(outbox.log_room(), CHUNK_BYTES)) > 0:
            text = self.log.read(room)
            if not text:
                break
            outbox.add_log(self._chunk(text))
            got = True
        limit = PROGRESS_BYTES if outbox.progress_room() else 0
        for line in self.progress.read(limit):
            got = True
            item = self._progress(line)
            if item is not None:
                outbox.add_progress(item)
        return got

    def _chunk(self, text: str) -> LogChunk:
        spec = self.spec
        chunk = LogChunk(
            replica=spec.replica, job=spec.job, epoch=spec.epoch, seq=self.seq, data=text
        )
        self.seq += 1
        return chunk

    def _progress(self, line: dict[str, Any]) -> Progress | None:
        spec = self.spec
        try:
            return Progress.model_validate(
                {
                    "replica": spec.replica,
                    "job": spec.job,
                    "epoch": spec.epoch,
                    "rank": line.get("rank", 0),
                    "step": line.get("step"),
                    "at": line.get("at"),
                    "step_time_s": line.get("step_time_s"),
                    "checkpoint": bool(line.get("checkpoint", False)),
                    "metrics": line.get("metrics") or {},
                }
            )
        except ValidationError:
            return None

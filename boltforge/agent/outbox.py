"""Reports waiting to be sent: events, log chunks and progress, kept in order until the server
has taken them, and bounded in memory.

The bound holds by back-pressure rather than by dropping: while the outbox is full the agent
stops reading replicas' log and progress files, which keep everything on disk, and reads on
once reports go through. Events (a few per replica) are always taken.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from itertools import islice

from boltforge.wire.agent import AgentReport, LogChunk, Progress, ReplicaEvent, ReplicaStatus

MAX_LOG_BYTES = 8 << 20
MAX_PROGRESS = 20_000
BATCH_LOG_BYTES = 1 << 20
BATCH_ITEMS = 500


@dataclass(frozen=True, slots=True)
class Batch:
    """One report and how many items of each kind it took from the front of the outbox."""

    report: AgentReport
    events: int
    logs: int
    progress: int


class Outbox:
    """Pending report items in the order they happened. One sender takes a ``batch()``, sends
    it, and ``commit``s it on success; a failed send leaves everything in place for a retry."""

    def __init__(self, max_log_bytes: int = MAX_LOG_BYTES, max_progress: int = MAX_PROGRESS):
        self.max_log_bytes = max_log_bytes
        self.max_progress = max_progress
        self.events: deque[ReplicaEvent] = deque()
        self.logs: deque[LogChunk] = deque()
        self.progress: deque[Progress] = deque()
        self.log_bytes = 0

    def __len__(self) -> int:
        return len(self.events) + len(self.logs) + len(self.progress)

    def log_room(self) -> int:
        """How many more bytes of log output fit."""
        return max(0, self.max_log_bytes - self.log_bytes)

    def progress_room(self) -> int:
        """How many more progress items fit."""
        return max(0, self.max_progress - len(self.progress))

    def add_event(self, event: ReplicaEvent) -> None:
        self.events.append(event)

    def add_log(self, chunk: LogChunk) -> None:
        self.logs.append(chunk)
        self.log_bytes += len(chunk.data)

    def add_progress(self, item: Progress) -> None:
        self.progress.append(item)

    def batch(self, session: str) -> Batch | None:
        """The oldest items, up to one report's worth; None when nothing waits."""
        if not self:
            return None
        events = list(islice(self.events, BATCH_ITEMS))
        logs: list[LogChunk] = []
        size = 0
        for chunk in self.logs:
            if len(logs) >= BATCH_ITEMS or (logs and size + len(chunk.data) > BATCH_LOG_BYTES):
                break
            logs.append(chunk)
            size += len(chunk.data)
        progress = list(islice(self.progress, BATCH_ITEMS))
        report = AgentReport(session=session, events=events, logs=logs, progress=progress)
        return Batch(report, len(events), len(logs), len(progress))

    def commit(self, batch: Batch) -> None:
        """Drop the items ``batch`` took: the server has them (or refused them for good)."""
        for _ in range(batch.events):
            self.events.popleft()
        for _ in range(batch.logs):
            self.log_bytes -= len(self.logs.popleft().data)
        for _ in range(batch.progress):
            self.progress.popleft()

    def unreported_exits(self) -> list[ReplicaStatus]:
        """Replicas whose exit the server has not heard of yet (for heartbeats and
        registrations, which list what the node has)."""
        return [
            ReplicaStatus(replica=e.replica, job=e.job, epoch=e.epoch, state="exited")
            for e in self.events
            if e.kind in ("exited", "failed")
        ]

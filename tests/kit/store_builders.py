"""Builders for tests of the store and the job side on a real SQLite file, without a server:
a migrated ``Database``, rows of every live table with sensible defaults, and small readers
of what a test wrote.

Every builder takes the columns a test cares about as keyword arguments and fills in the
rest, so a scenario reads as what makes it special (``a_job(s, "running", epoch=2)``).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from boltforge.control.store.db import Database
from boltforge.control.store.models import (
    EventRow,
    JobRow,
    NodeRow,
    ReplicaRow,
    RunRow,
)

T0 = 1_800_000_000.0  # 2027-01-15, well inside a month
_numbers = itertools.count(1)


def sqlite_url(path: Path) -> str:
    return f"sqlite:///{path}"


@contextmanager
def migrated(path: Path) -> Iterator[Database]:
    """A store at the newest schema in the SQLite file ``path``, closed afterwards."""
    db = Database(sqlite_url(path))
    db.migrate()
    try:
        yield db
    finally:
        db.close()


def a_job(s: Session, state: str = "pending", **extra: Any) -> JobRow:
    """A job row in ``state`` (flushed), numbered from a counter shared by the test run."""
    n = next(_numbers)
    values: dict[str, Any] = {
        "id": f"j{n}",
        "num": n,
        "name": f"train-{n}",
        "team": "research",
        "queue": "research",
        "priority": 2,
        "state": state,
        "spec": {},
        "gpus": 8,
        "replicas": 1,
        "submitted_at": T0,
        "epoch": 1,
        "restarts": 0,
        "attained_gpu_s": 0.0,
        "waiting": [],
        "explanation": [],
    }
    values.update(extra)
    job = JobRow(**values)
    s.add(job)
    s.flush()
    return job


def a_node(s: Session, name: str, **extra: Any) -> NodeRow:
    values: dict[str, Any] = {
        "name": name,
        "inventory": {"name": name, "gpus": 8},
        "pool": "h100",
        "pod": "p0",
        "rack": "r0",
        "gpus": 8,
        "state": "ready",
        "registered_at": T0,
        "desired_version": 0,
        "health": {},
    }
    values.update(extra)
    node = NodeRow(**values)
    s.add(node)
    s.flush()
    return node


def a_replica(
    s: Session, job: JobRow, rank: int, node: str, state: str, **extra: Any
) -> ReplicaRow:
    """Replica ``rank`` of ``job``'s current epoch on ``node`` (which must exist)."""
    values: dict[str, Any] = {
        "id": f"{job.id}.{job.epoch}.{rank}",
        "job_id": job.id,
        "epoch": job.epoch,
        "role": "worker",
        "rank": rank,
        "node": node,
        "gpus": [0, 1, 2, 3],
        "cpus": 8.0,
        "memory_gb": 64.0,
        "state": state,
        "spec": {},
    }
    if state not in ("waiting",):
        values["dispatched_at"] = T0
    values.update(extra)
    rep = ReplicaRow(**values)
    s.add(rep)
    s.flush()
    return rep


def a_run(s: Session, job: JobRow, started_at: float = T0, **extra: Any) -> RunRow:
    """An open run of ``job``'s current epoch (``ended_at`` unset unless given)."""
    values: dict[str, Any] = {
        "job_id": job.id,
        "epoch": job.epoch,
        "queue": job.queue,
        "team": job.team,
        "gpus": job.gpus,
        "cpus": 0.0,
        "dollars_per_hour": 0.0,
        "started_at": started_at,
    }
    values.update(extra)
    run = RunRow(**values)
    s.add(run)
    s.flush()
    return run


def events_of(s: Session, job_id: str) -> list[EventRow]:
    """``job_id``'s timeline, oldest first (what the session wrote so far included)."""
    s.flush()
    q = select(EventRow).where(EventRow.job_id == job_id).order_by(EventRow.id)
    return list(s.scalars(q))


def kinds_of(s: Session, job_id: str) -> list[str]:
    return [e.kind for e in events_of(s, job_id)]


def rows_in(s: Session, model: type[Any]) -> int:
    return int(s.scalar(select(func.count()).select_from(model)) or 0)


def spec_dict(
    name: str = "train", gpus: int = 8, team: str = "research", **extra: Any
) -> dict[str, Any]:
    """A runnable job spec as a request carries it."""
    return {"name": name, "team": team, "gpus": gpus, "command": ["python", "train.py"], **extra}


@contextmanager
def store_with_nodes(
    path: Path, nodes: tuple[str, ...] = ("host-0", "host-1")
) -> Iterator[Database]:
    """A migrated store in ``path`` holding ``nodes`` (registered, ready), closed afterwards."""
    with migrated(path) as store:
        with store.session() as s:
            for name in nodes:
                a_node(s, name)
        yield store


def rolled_back(db: Database) -> Iterator[Session]:
    """A session rolled back at the end (for a fixture to ``yield from``): every scenario
    starts from what the store held before it."""
    session = db.sessions()
    try:
        yield session
    finally:
        session.rollback()
        session.close()

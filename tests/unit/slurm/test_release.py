"""``bolt slurm-release`` (``boltforge/slurm/release.py``): which jobs it releases, which it
only clears, which it leaves alone. The real slurmctld runs in
tests/integration/test_slurm_release.py."""

from __future__ import annotations

import asyncio
from typing import Any, cast

from slurm_builders import squeue_job

from boltforge.slurm.model import SlurmJob, parse_jobs
from boltforge.slurm.release import release_all

HELD = {"state_reason": "JobHeldUser", "priority": 0, "comment": "boltforge: held for placement"}


class Queue:
    """The jobs slurmctld lists, and the commands run against them."""

    def __init__(self, *jobs: dict[str, Any]) -> None:
        self.jobs = parse_jobs({"jobs": [squeue_job(**j) for j in jobs]})
        self.ran: list[tuple[str, ...]] = []

    async def all_jobs(self) -> list[SlurmJob]:
        return self.jobs

    async def unpin(self, job: str, pending: bool) -> None:
        self.ran.append(("unpin", job, "pending" if pending else "running"))

    async def release(self, job: str) -> None:
        self.ran.append(("release", job))


def release(queue: Queue) -> tuple[list[str], list[str]]:
    done = asyncio.run(release_all(cast(Any, queue)))
    return done.released, done.cleared


def test_a_held_job_is_unpinned_then_released_and_a_running_one_only_loses_its_comments() -> None:
    queue = Queue(
        {**HELD, "job_id": 1, "admin_comment": "boltforge job=7 epoch=2 replicas=7.2.0@n4"},
        {"job_id": 2, "job_state": "RUNNING", "comment": "boltforge: placed on n1"},
    )
    assert release(queue) == (["1"], ["2"])
    assert queue.ran == [
        ("unpin", "1", "pending"),
        ("release", "1"),
        ("unpin", "2", "running"),
    ]


def test_jobs_boltforge_never_touched_and_finished_ones_are_left_alone() -> None:
    queue = Queue(
        {"job_id": 3, "state_reason": "JobHeldUser", "priority": 0},  # held by its user
        {"job_id": 4, "job_state": "RUNNING", "partition": "cpu"},
        {"job_id": 5, "job_state": "COMPLETED", "comment": "boltforge: placed on n2"},
    )
    assert release(queue) == ([], [])
    assert queue.ran == []


def test_a_job_released_to_its_nodes_but_not_yet_started_loses_its_pin_and_words() -> None:
    queue = Queue({"job_id": 6, "admin_comment": "boltforge job=9 epoch=1 replicas=9.1.0@n2"})
    assert release(queue) == ([], ["6"])
    assert queue.ran == [("unpin", "6", "pending")]

"""Two tools the crash and soak tests lean on: ``double_allocations`` (no GPU ever held by
two allocations at once, over the store's whole history) as a table of histories, and the
failpoints that make a server kill itself at a named place."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy.orm import Session
from store_builders import a_job, a_replica, rolled_back, store_with_nodes

from boltforge.control.store.db import Database
from boltforge.control.store.invariants import double_allocations
from boltforge.control.store.models import JobRow, ReplicaRow


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Database]:
    with store_with_nodes(tmp_path_factory.mktemp("inv") / "store.db") as store:
        yield store


@pytest.fixture
def s(db: Database) -> Iterator[Session]:
    """A session rolled back at the end, so every history starts from the same two nodes."""
    yield from rolled_back(db)


@dataclass(frozen=True)
class Hold:
    """A replica of job ``job`` (allocation ``epoch``) holding ``gpus`` of ``node`` from
    ``start`` to ``end`` (None: still holding; a start of None: never dispatched)."""

    job: int
    epoch: int
    rank: int
    node: str
    gpus: tuple[int, ...]
    start: float | None
    end: float | None


def write(s: Session, holds: list[Hold]) -> dict[int, str]:
    """Store ``holds``; the job ids by the number each hold names."""
    jobs: dict[int, JobRow] = {}
    for h in holds:
        if h.job not in jobs:
            jobs[h.job] = a_job(s, "running")
        a_replica(
            s,
            jobs[h.job],
            h.rank,
            h.node,
            "exited" if h.end is not None else "running",
            id=f"{jobs[h.job].id}.{h.epoch}.{h.rank}",
            epoch=h.epoch,
            gpus=list(h.gpus),
            dispatched_at=h.start,
            exited_at=h.end,
        )
    return {n: job.id for n, job in jobs.items()}


HISTORIES: dict[str, tuple[list[Hold], list[str]]] = {
    "one after the other": (
        [Hold(1, 1, 0, "host-0", (0, 1), 10, 20), Hold(2, 1, 0, "host-0", (0, 1), 30, None)],
        [],
    ),
    "the next starts the instant the last ends": (
        [Hold(1, 1, 0, "host-0", (0,), 10, 20), Hold(2, 1, 0, "host-0", (0,), 20, 40)],
        [],
    ),
    "overlapping on one GPU": (
        [Hold(1, 1, 0, "host-0", (0, 1), 10, 20), Hold(2, 1, 0, "host-0", (1, 2), 15, 25)],
        ["GPU 1 of host-0: {1}.1 and {2}.1 overlap"],
    ),
    "a holder that never exited blocks everything after it": (
        [Hold(1, 1, 0, "host-0", (3,), 10, None), Hold(2, 1, 0, "host-0", (3,), 500, 600)],
        ["GPU 3 of host-0: {1}.1 and {2}.1 overlap"],
    ),
    "the same GPU number on two nodes": (
        [Hold(1, 1, 0, "host-0", (0,), 10, 20), Hold(2, 1, 0, "host-1", (0,), 10, 20)],
        [],
    ),
    "two replicas of one allocation": (
        [Hold(1, 1, 0, "host-0", (0,), 10, 20), Hold(1, 1, 1, "host-0", (0,), 15, 25)],
        [],
    ),
    "a job's next allocation before its last let go": (
        [Hold(1, 1, 0, "host-0", (0,), 10, 20), Hold(1, 2, 0, "host-0", (0,), 15, 25)],
        ["GPU 0 of host-0: {1}.1 and {1}.2 overlap"],
    ),
    "a replica never dispatched holds nothing": (
        [Hold(1, 1, 0, "host-0", (0,), None, None), Hold(2, 1, 0, "host-0", (0,), 10, None)],
        [],
    ),
    "a long holder outlives a short one inside it": (
        [
            Hold(1, 1, 0, "host-0", (0,), 0, 100),
            Hold(2, 1, 0, "host-0", (0,), 10, 20),
            Hold(3, 1, 0, "host-0", (0,), 50, 60),
        ],
        ["GPU 0 of host-0: {1}.1 and {2}.1 overlap", "GPU 0 of host-0: {1}.1 and {3}.1 overlap"],
    ),
    "findings come in node then GPU order": (
        [
            Hold(1, 1, 0, "host-1", (5,), 0, 10),
            Hold(2, 1, 0, "host-1", (5,), 5, 15),
            Hold(3, 1, 0, "host-0", (7,), 0, 10),
            Hold(4, 1, 0, "host-0", (7,), 5, 15),
            Hold(3, 1, 1, "host-0", (2,), 0, 10),
            Hold(4, 1, 1, "host-0", (2,), 5, 15),
        ],
        [
            "GPU 2 of host-0: {3}.1 and {4}.1 overlap",
            "GPU 7 of host-0: {3}.1 and {4}.1 overlap",
            "GPU 5 of host-1: {1}.1 and {2}.1 overlap",
        ],
    ),
}


@pytest.mark.parametrize("case", HISTORIES, ids=list(HISTORIES))
def test_double_allocations_names_every_gpu_two_allocations_held_at_once(
    s: Session, case: str
) -> None:
    holds, said = HISTORIES[case]
    jobs = write(s, holds)
    s.flush()
    names = {f"{{{n}}}": job for n, job in jobs.items()}
    expected = []
    for line in said:
        for placeholder, job in names.items():
            line = line.replace(placeholder, job)
        expected.append(line)
    assert double_allocations(s) == expected


def test_an_empty_store_has_no_double_allocation(s: Session) -> None:
    assert double_allocations(s) == []


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 20), min_size=2, max_size=6),
    early=st.integers(0, 5),
)
def test_back_to_back_holders_never_overlap_and_one_that_starts_early_does(
    db: Database, lengths: list[int], early: int
) -> None:
    """Holders laid end to end on one GPU (each starting where the last ended) are fine;
    pull one start a moment earlier and exactly that pair is found."""
    early = early % len(lengths) or 1  # never the first: it has nobody before it
    with db.sessions() as s:
        try:
            starts = [float(sum(lengths[:i])) for i in range(len(lengths))]
            holds = [
                Hold(i, 1, 0, "host-0", (4,), at, at + n)
                for i, (at, n) in enumerate(zip(starts, lengths, strict=True))
            ]
            jobs = write(s, holds)
            s.flush()
            assert double_allocations(s) == []
            moved = s.get_one(ReplicaRow, f"{jobs[early]}.1.0")
            moved.dispatched_at = starts[early] - 0.5
            s.flush()
            assert double_allocations(s) == [
                f"GPU 4 of host-0: {jobs[early - 1]}.1 and {jobs[early]}.1 overlap"
            ]
        finally:
            s.rollback()


# -- failpoints --------------------------------------------------------------------------------

PROBE = (
    "import sys\n"
    "from boltforge.control.store import failpoints as f\n"
    "print(','.join(sorted(f.ARMED)), flush=True)\n"
    "for name in sys.argv[1:]:\n"
    "    f.hit(name)\n"
    "    print('passed', name, flush=True)\n"
)


def probe(armed: str | None, *names: str) -> subprocess.CompletedProcess[str]:
    """A process that arms ``armed`` and goes past each failpoint of ``names`` in turn."""
    env = {k: v for k, v in os.environ.items() if k != "BOLT_FAILPOINTS"}
    if armed is not None:
        env["BOLT_FAILPOINTS"] = armed
    return subprocess.run(
        [sys.executable, "-c", PROBE, *names],
        capture_output=True,
        text=True,
        env=env,
        cwd=Path(__file__).resolve().parents[4],
        timeout=60,
        check=False,
    )


def test_an_unarmed_server_goes_past_every_failpoint() -> None:
    done = probe(None, "decided", "dispatched")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["", "passed decided", "passed dispatched"]


def test_an_armed_failpoint_kills_the_process_there_and_nowhere_before() -> None:
    done = probe("dispatched", "decided", "dispatched", "decided")
    assert done.returncode == -signal.SIGKILL
    assert done.stdout.splitlines() == ["dispatched", "passed decided"]


def test_the_armed_list_ignores_blanks_and_spaces() -> None:
    done = probe(" decided , ,dispatched,")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["decided,dispatched"]

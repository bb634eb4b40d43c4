"""Dispatching bound gangs (``scheduling/dispatch.py``), as scenarios written into the
store: a gang goes to its nodes whole, once no started replica holds any of its GPUs; gangs
wanting the same GPUs go in priority order, then submission order; each node told is
marked changed once."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sched_builders import Bench

from boltforge.control.scheduling.dispatch import dispatch
from boltforge.control.store.models import JobRow, ReplicaRow

PRIORITY = {"high": 1, "normal": 2, "low": 3}


@pytest.fixture
def bench(tmp_path: Path) -> Iterator[Bench]:
    with Bench(tmp_path, hosts=2) as b:
        b.settle()
        yield b


@dataclass(frozen=True)
class Rep:
    """A replica of job ``job`` (a name) on ``node`` holding ``gpus``, in ``state``."""

    job: str
    node: str
    gpus: tuple[int, ...]
    state: str = "waiting"


def write(bench: Bench, jobs: dict[str, str], reps: list[Rep]) -> dict[str, str]:
    """Jobs by name with their priority word, bound in epoch 1 with ``reps``; returns each
    name's job id. Jobs are submitted in the order given."""
    ids = {name: bench.submit(name, 8) for name in jobs}

    def change(s: Any) -> None:
        for name, word in jobs.items():
            row = s.get(JobRow, ids[name])
            row.state, row.epoch, row.priority = "scheduled", 1, PRIORITY[word]
        s.flush()
        ranks: dict[str, int] = {}
        for r in reps:
            rank = ranks[r.job] = ranks.get(r.job, -1) + 1
            s.add(
                ReplicaRow(
                    id=f"{ids[r.job]}.1.{rank}", job_id=ids[r.job], epoch=1, role="worker",
                    rank=rank, node=r.node, gpus=list(r.gpus), state=r.state, spec={},
                )
            )  # fmt: skip

    bench.write(change)
    return ids


def run(bench: Bench) -> tuple[set[str], set[str]]:
    """Dispatch now; the jobs that went, by id, and the nodes told."""
    now = bench.clock()
    touched = bench.write(lambda s: dispatch(s, bench.mirror, now))
    return touched.jobs, touched.nodes


def started(bench: Bench, job_id: str) -> list[str]:
    return [r.state for r in bench.replicas(job_id)]


@dataclass(frozen=True)
class Scenario:
    name: str
    jobs: dict[str, str]
    reps: list[Rep]
    went: set[str]


SCENARIOS = [
    Scenario(
        "a-gang-whose-gpus-are-free-goes-whole",
        {"a": "normal"},
        [Rep("a", "host-0", (0, 1)), Rep("a", "host-1", (0, 1))],
        {"a"},
    ),
    Scenario(
        "one-busy-gpu-holds-back-the-whole-gang",
        {"old": "low", "a": "normal"},
        [
            Rep("old", "host-1", (1,), "stopping"),
            Rep("a", "host-0", (0, 1)),
            Rep("a", "host-1", (0, 1)),
        ],
        set(),
    ),
    Scenario(
        "a-starting-replica-holds-its-gpus-too",
        {"old": "low", "a": "normal"},
        [Rep("old", "host-0", (3,), "starting"), Rep("a", "host-0", (3, 4))],
        set(),
    ),
    Scenario(
        "gpus-of-other-busy-replicas-do-not-matter",
        {"old": "low", "a": "normal"},
        [Rep("old", "host-0", (7,), "running"), Rep("a", "host-0", (0, 1))],
        {"a"},
    ),
    Scenario(
        "higher-priority-first-on-the-same-gpus",
        {"early": "low", "late": "high"},
        [Rep("early", "host-0", (0, 1)), Rep("late", "host-0", (1, 2))],
        {"late"},
    ),
    Scenario(
        "same-priority-earlier-submission-first",
        {"early": "normal", "late": "normal"},
        [Rep("late", "host-0", (1, 2)), Rep("early", "host-0", (0, 1))],
        {"early"},
    ),
    Scenario(
        "disjoint-gangs-both-go",
        {"a": "normal", "b": "low"},
        [Rep("a", "host-0", (0, 1)), Rep("b", "host-0", (2, 3)), Rep("b", "host-1", (0,))],
        {"a", "b"},
    ),
    Scenario(
        "a-waiting-gang-does-not-block-another",
        {"old": "low", "a": "high", "b": "normal"},
        [
            Rep("old", "host-1", (0,), "stopping"),
            Rep("a", "host-1", (0,)),  # waits for old
            Rep("b", "host-0", (0,)),
        ],
        {"b"},
    ),
]


@pytest.mark.parametrize("case", SCENARIOS, ids=[c.name for c in SCENARIOS])
def test_which_gangs_go(bench: Bench, case: Scenario) -> None:
    ids = write(bench, case.jobs, case.reps)
    versions = {n: bench.node(n).desired_version for n in ("host-0", "host-1")}
    jobs, nodes = run(bench)
    assert jobs == {ids[name] for name in case.went}
    told = {r.node for r in case.reps if r.job in case.went}
    assert nodes == told
    for name, job_id in ids.items():
        mine = [r.state for r in case.reps if r.job == name]
        went = name in case.went
        expected = ["starting" if went and s == "waiting" else s for s in mine]
        assert started(bench, job_id) == expected
    for node, version in versions.items():
        assert bench.node(node).desired_version == version + int(node in told)


def test_dispatched_replicas_are_stamped_with_the_time(bench: Bench) -> None:
    ids = write(bench, {"a": "normal"}, [Rep("a", "host-0", (0,))])
    bench.clock.advance(7.0)
    run(bench)
    [rep] = bench.replicas(ids["a"])
    assert (rep.state, rep.dispatched_at) == ("starting", bench.clock())


def test_nothing_waiting_changes_nothing(bench: Bench) -> None:
    assert run(bench) == (set(), set())


def test_a_gang_held_back_goes_once_the_leaving_replica_exited(bench: Bench) -> None:
    ids = write(
        bench,
        {"old": "low", "a": "normal"},
        [Rep("old", "host-0", (0,), "stopping"), Rep("a", "host-0", (0, 1))],
    )
    assert run(bench) == (set(), set())

    def exited(s: Any) -> None:
        s.get(ReplicaRow, f"{ids['old']}.1.0").state = "exited"

    bench.write(exited)
    assert run(bench) == ({ids["a"]}, {"host-0"})

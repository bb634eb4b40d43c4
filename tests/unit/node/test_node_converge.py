"""The node-side rules every backend follows, as scenario tables: what a node does with its
desired state given what it runs, what it already ran, and which GPUs are still busy."""

from __future__ import annotations

import pytest

from boltforge.node.converge import NEVER_STARTED, never_started, plan
from boltforge.wire.agent import ReplicaSpec


def spec(
    replica: str, epoch: int = 1, action: str = "run", gpus: tuple[int, ...] = (0,)
) -> ReplicaSpec:
    return ReplicaSpec(
        replica=replica,
        job=replica.split("/")[0],
        epoch=epoch,
        action=action,  # type: ignore[arg-type]
        command=["train"],
        gpus=list(gpus),
        grace_s=12.0 if action == "stop" else 30.0,
    )


# (scenario, desired, live: replica -> epoch, finished, busy GPUs,
#  expected starts, expected stops: replica -> grace, expected skips)
SCENARIOS = [
    ("a new replica starts", [spec("a/0")], {}, set(), set(), ["a/0"], {}, []),
    ("a running replica is left alone", [spec("a/0")], {"a/0": 1}, set(), set(), [], {}, []),
    (
        "a replica asked at a newer epoch is stopped first",
        [spec("a/0", epoch=2)], {"a/0": 1}, set(), set(), [], {"a/0": None}, [],
    ),
    (
        "an epoch that ran to its end is not run again",
        [spec("a/0")], {}, {("a/0", 1)}, set(), [], {}, [],
    ),
    (
        "a replica waits for its GPUs to be freed",
        [spec("a/0", gpus=(3,))], {}, set(), {3}, [], {}, [],
    ),
    (
        "a stop of a running replica carries the desired state's grace",
        [spec("a/0", action="stop")], {"a/0": 1}, set(), set(), [], {"a/0": 12.0}, [],
    ),
    (
        "a stop of an older epoch leaves a newer live one running",
        [spec("a/0", epoch=1, action="stop")], {"a/0": 2}, set(), set(), [], {}, [],
    ),
    (
        "a stop of a replica that never started here is skipped",
        [spec("a/0", action="stop")], {}, set(), set(), [], {}, ["a/0"],
    ),
    (
        "a stop of an epoch that already ended here is not reported again",
        [spec("a/0", action="stop")], {}, {("a/0", 1)}, set(), [], {}, [],
    ),
    (
        "a live replica the desired state does not list is stopped",
        [], {"old/0": 4}, set(), set(), [], {"old/0": None}, [],
    ),
]  # fmt: skip


@pytest.mark.parametrize(
    "desired, live, finished, busy, starts, stops, skips",
    [s[1:] for s in SCENARIOS],
    ids=[s[0] for s in SCENARIOS],
)
def test_a_node_converges_on_its_desired_state(
    desired: list[ReplicaSpec],
    live: dict[str, int],
    finished: set[tuple[str, int]],
    busy: set[int],
    starts: list[str],
    stops: dict[str, float | None],
    skips: list[str],
) -> None:
    todo = plan(desired, live, finished, frozenset(busy))
    assert [s.replica for s in todo.start] == starts
    assert todo.stop == stops
    assert [s.replica for s in todo.skip] == skips
    assert plan(desired, live, finished, frozenset(busy)) == todo  # the same, asked again


def test_a_replica_listed_twice_to_run_starts_once() -> None:
    todo = plan([spec("a/0"), spec("a/0")], {}, set())
    assert [s.replica for s in todo.start] == ["a/0"]


def test_a_replica_stopped_before_it_started_is_reported_exited_without_having_run() -> None:
    event = never_started("a/0", "a", 3, at=100.0)
    assert (event.replica, event.job, event.epoch, event.at) == ("a/0", "a", 3, 100.0)
    assert event.kind == "exited" and event.detail == NEVER_STARTED
    assert event.exit_code is None and event.signal is None and event.pid is None

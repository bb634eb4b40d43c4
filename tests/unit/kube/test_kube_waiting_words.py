"""Why a pod waits, as autoscalers read it: a pod only queued says ``SchedulerQueued`` (the
cluster autoscaler and Karpenter add nodes for ``Unschedulable``), ``Unschedulable`` is kept
for pods no node could ever run; the message never carries the place in line, a condition
is rewritten only when its reason or words change (numbers aside), and events are
rate-limited per pod."""

from __future__ import annotations

import pytest
from kube_sched_rig import Rig, rig
from kube_unit_kit import knode, kpod

from boltforge.client import ApiFailure
from boltforge.kube.words import EVENT_EVERY_S, Told


@pytest.fixture
def r(monkeypatch: pytest.MonkeyPatch) -> Rig:
    r = rig(monkeypatch)
    r.nodes(knode("n1"))
    return r


def queued(r: Rig, position: int, reason: str) -> None:
    """The server holds the gang's job (the first submitted) pending at ``position`` for
    ``reason``."""
    r.jobs.queue["j-1"] = (position, reason)


def said(r: Rig, pod: str = "llm-0") -> list[tuple[str, str]]:
    return [(reason, text) for p, reason, text in r.writes.conditions if p == pod]


WORDS = [
    ("queued behind quota", "quota: team research is at its 64 GPUs", "SchedulerQueued"),
    ("behind the gangs ahead", "capacity: 3 gangs ahead", "SchedulerQueued"),
    (
        "never on this fleet",
        "it could never run on this fleet, even with every job gone",
        "Unschedulable",
    ),
]


@pytest.mark.parametrize(("why", "reason"), [w[1:] for w in WORDS], ids=[w[0] for w in WORDS])
def test_a_pending_gang_is_unschedulable_only_when_it_could_never_run(
    r: Rig, why: str, reason: str
) -> None:
    queued(r, 4, why)
    r.gang("llm", 1)
    r.passes(2, every_s=2)
    assert said(r) == [(reason, f"boltforge: waiting: {why}")]


REFUSALS = [
    ("too big", {"gpus": 16}, "Unschedulable"),
    ("no node fits", {"node_selector": {"zone": "mars"}}, "Unschedulable"),
]


@pytest.mark.parametrize(
    ("asks", "reason"), [w[1:] for w in REFUSALS], ids=[w[0] for w in REFUSALS]
)
def test_a_gang_no_node_could_run_is_unschedulable(
    r: Rig, asks: dict[str, object], reason: str
) -> None:
    r.put(kpod("llm-0", **asks))
    r.passes()
    assert [why for why, _ in said(r)] == [reason]


def test_a_gang_the_server_refuses_is_refused_not_unschedulable(r: Rig) -> None:
    r.jobs.refuse = ApiFailure(422, "team research has no quota in this fleet")
    r.gang("llm", 1)
    r.passes()
    assert said(r) == [
        ("SchedulerRefused", "boltforge: refused: team research has no quota in this fleet")
    ]


def test_a_gang_the_server_says_the_fleet_could_never_run_is_unschedulable(r: Rig) -> None:
    r.jobs.refuse = ApiFailure(422, "can never run on this fleet: it needs 24 GPUs, 16 exist")
    r.gang("llm", 1)
    r.passes()
    assert [why for why, _ in said(r)] == ["Unschedulable"]


def test_the_place_in_line_and_moving_counts_do_not_rewrite_the_condition(r: Rig) -> None:
    r.gang("llm", 1)
    for position, free in ((5, 3), (4, 5), (2, 6)):
        queued(r, position, f"capacity: {free} of 8 GPUs free on the best node")
        r.passes(2, every_s=2)
    assert said(r) == [
        ("SchedulerQueued", "boltforge: waiting: capacity: 3 of 8 GPUs free on the best node")
    ]
    queued(r, 1, "quota: team research is at its limit")
    r.passes(2, every_s=2)
    assert [reason for reason, _ in said(r)] == ["SchedulerQueued", "SchedulerQueued"]
    assert said(r)[-1][1] == "boltforge: waiting: quota: team research is at its limit"


def test_events_are_rate_limited_per_pod() -> None:
    told = Told()
    assert told.tell("u1", "SchedulerQueued", "quota", 0.0) == (True, True)
    assert told.tell("u1", "SchedulerQueued", "quota", 1.0) == (False, False)
    assert told.tell("u1", "SchedulerQueued", "capacity", 2.0) == (True, False)
    assert told.tell("u2", "SchedulerQueued", "capacity", 2.0) == (True, True)  # its own
    assert told.tell("u1", "Unschedulable", "never", EVENT_EVERY_S) == (True, True)
    told.forget({"u2"})
    assert told.tell("u1", "Unschedulable", "never", EVENT_EVERY_S + 1) == (True, True)

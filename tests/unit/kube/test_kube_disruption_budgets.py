"""PodDisruptionBudgets as the disruption controller writes them: a gang's preemptibility
comes from the budgets' status (else their spec), a pod under two budgets is never
preemptible, and an eviction its budget refuses now is not asked every 5 s but when the
budget changes, while the gang waiting for the room says what blocks it."""

from __future__ import annotations

from typing import Any

import pytest
from kube_sched_rig import Rig, rig
from kube_unit_kit import kpod, rspec
from test_kube_scheduler_passes import placed_pods, submitted

from boltforge.kube import model
from boltforge.kube.budgets import blocked, protection
from boltforge.testing.kube_builders import pdb_json

APP = {"app": "llm"}


def budget(name: str = "keep", **kw: Any) -> model.Budget:
    kw.setdefault("min_available", 1)
    return model.budget(pdb_json(name, APP, **kw))


def pods(n: int) -> list[model.KubePod]:
    return [kpod(f"llm-{i}", labels=APP) for i in range(n)]


def test_a_budgets_status_is_read_once_written_for_its_spec() -> None:
    now = budget(allowed=2, expected=4, generation=3, observed=3)
    stale = budget(allowed=2, expected=4, generation=4, observed=3)
    assert (now.disruptions_allowed, now.expected, now.desired_healthy) == (2, 4, 1)
    assert (stale.disruptions_allowed, stale.expected) == (None, None)


BUDGET_CASES: list[tuple[str, list[dict[str, Any]], int, str]] = [
    ("spec allows", [{"min_available": 0}], 2, ""),
    ("spec keeps one of two", [{"min_available": 1}], 2, "allows 1 disruptions"),
    ("status keeps all", [{"min_available": 4, "allowed": 0, "expected": 4}], 4, "allows 0"),
    # the controller counts 4 pods (the gang's 2 and 2 it expects from their controller)
    ("status over spec", [{"min_available": 2, "allowed": 0, "expected": 4}], 2, ""),
    ("two budgets", [{}, {"name": "also"}], 1, "under 2 PodDisruptionBudgets"),
]


@pytest.mark.parametrize(
    ("budgets", "size", "why"), [c[1:] for c in BUDGET_CASES], ids=[c[0] for c in BUDGET_CASES]
)
def test_a_gangs_budgets_decide_whether_it_may_be_bumped(
    budgets: list[dict[str, Any]], size: int, why: str
) -> None:
    mine = pods(size)
    said = protection(mine, [budget(**b) for b in budgets], mine)
    assert (said == "") if not why else (why in said)


def test_an_eviction_is_blocked_by_what_the_status_allows_now() -> None:
    assert blocked(pods(2), [budget(allowed=2, expected=3)]) == ""
    assert "allows 1 disruptions now (2 asked)" in blocked(pods(2), [budget(allowed=1, expected=3)])
    assert "under 2 PodDisruptionBudgets" in blocked(pods(1), [budget(), budget("also")])


# in the passes


@pytest.fixture
def r(monkeypatch: pytest.MonkeyPatch) -> Rig:
    return rig(monkeypatch)


def a_victim_to_evict(r: Rig) -> str:
    """A placed one-pod gang ``llm`` labelled app=llm, which the server wants stopped."""
    job = submitted(r, "llm", 1, labels=APP)
    placed_pods(r, job, ["n1"])
    pod = r.pods["research/llm-0"]
    r.put(
        kpod(
            "llm-0", uid=pod.uid, node="n1", group="llm", labels=APP, replica=f"{job}.1.0", job=job
        )
    )
    r.clear()
    r.wants("n1", rspec(job, 1, 0, action="stop"))
    return job


def test_a_budget_allowing_no_disruption_is_waited_on_not_asked_every_5_s(r: Rig) -> None:
    r.budgets(budget(allowed=0, expected=1))
    a_victim_to_evict(r)
    r.passes(12, every_s=5.0)  # a minute by the scheduler's clock
    assert r.writes.evicted == []
    (said,) = r.writes.events("EvictionBlocked")
    assert "PodDisruptionBudget research/keep allows 0 disruptions now" in said[1]
    r.budgets(budget(allowed=1, expected=2))  # the disruption controller's new status
    r.passes()
    assert [name for name, _ in r.writes.evicted] == ["llm-0"]


def test_an_eviction_a_budget_refuses_is_asked_again_when_the_budget_changes(r: Rig) -> None:
    a_victim_to_evict(r)
    r.writes.refuse_evict["llm-0"] = "500: This pod has more than one PodDisruptionBudget"
    r.passes(6, every_s=5.0)
    assert len(r.writes.events("EvictionBlocked")) == 1  # asked once, said once
    del r.writes.refuse_evict["llm-0"]
    r.budgets(budget(allowed=1, expected=2))
    r.passes()
    assert [name for name, _ in r.writes.evicted] == ["llm-0"]


def test_the_gang_waiting_for_the_room_says_which_budget_blocks_it(r: Rig) -> None:
    r.budgets(budget(allowed=0, expected=1))
    a_victim_to_evict(r)
    r.gang("urgent", 1)
    r.passes()
    urgent = r.job_of("urgent")
    r.jobs.states[urgent] = "scheduled"  # placed where the victim runs, waiting for it
    r.passes(2, every_s=2.0)
    (reason, text) = next((why, t) for p, why, t in r.writes.conditions if p == "urgent-0")
    assert reason == "EvictionBlocked"
    assert "PodDisruptionBudget research/keep allows 0 disruptions now" in text

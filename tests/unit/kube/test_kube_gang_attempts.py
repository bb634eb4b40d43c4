"""A gang whose Boltforge job ended is placed again when its controller makes new pods (a Job
recreating failed or evicted workers): the gang becomes a new job, its next attempt, under
an idempotency key of its own; a scheduler that takes the lead finds the attempts already
made through their keys and goes on from the last."""

from __future__ import annotations

import pytest
from kube_sched_rig import Rig, racks, rig
from kube_unit_kit import kpod

WORDS_S = 2.0  # the words (and the jobs' states) are read every 2 s by default


@pytest.fixture
def r(monkeypatch: pytest.MonkeyPatch) -> Rig:
    r = rig(monkeypatch)
    r.nodes(*racks(("r1", ["n1", "n2"])))
    return r


def keys(r: Rig) -> list[str]:
    return [key.rsplit("/", 1)[-1] for _, _, key in r.jobs.submitted]


def job_ends_and_workers_are_made_again(r: Rig, job: str, state: str, made: str) -> None:
    """``job`` ended in ``state``; the old pods failed and the Job made ``llm-N-{made}``."""
    r.jobs.states[job] = state
    r.put(*(kpod(f"llm-{i}", node=f"n{i + 1}", phase="Failed", group="llm") for i in range(2)))
    r.put(*(kpod(f"llm-{i}-{made}", group="llm") for i in range(2)))


@pytest.mark.parametrize("state", ["failed", "cancelled", "succeeded"])
def test_a_gang_whose_job_ended_is_a_new_job_when_its_pods_are_made_again(
    r: Rig, state: str
) -> None:
    r.gang("llm", 2)
    r.passes()
    first = r.job_of("llm")
    job_ends_and_workers_are_made_again(r, first, state, "b")
    r.passes(3, every_s=WORDS_S)
    second = r.job_of("llm")
    assert second != first and r.jobs.states[second] == "pending"
    assert keys(r) == ["pg-llm", "attempt-1"]


def test_a_gang_whose_job_still_waits_is_not_submitted_again(r: Rig) -> None:
    r.gang("llm", 2)
    r.passes(3, every_s=WORDS_S)
    assert len(r.jobs.submitted) == 1


def test_a_new_leader_goes_on_from_the_last_attempt(r: Rig) -> None:
    r.gang("llm", 2)
    r.passes()
    job_ends_and_workers_are_made_again(r, r.job_of("llm"), "failed", "b")
    r.passes(3, every_s=WORDS_S)
    r.jobs.states[r.job_of("llm")] = "failed"
    r.lead()  # another replica takes over: it knows no attempts
    r.drop("llm-0-b", "llm-1-b")
    r.put(*(kpod(f"llm-{i}-c", group="llm") for i in range(2)))
    r.passes(3, every_s=WORDS_S)
    assert keys(r) == ["pg-llm", "attempt-1", "attempt-2"]
    assert r.jobs.states[r.job_of("llm")] == "pending"


def test_pods_left_waiting_by_a_cancelled_job_are_not_submitted_again_and_say_so(
    r: Rig,
) -> None:
    r.gang("llm", 2)
    r.passes()
    job = r.job_of("llm")
    r.jobs.states[job] = "cancelled"  # `bolt cancel` while the pods wait
    r.passes(3, every_s=WORDS_S)
    assert len(r.jobs.submitted) == 1
    (reason, text) = next((why, t) for p, why, t in reversed(r.writes.conditions) if p == "llm-0")
    assert reason == "SchedulerRefused"
    assert text.startswith(f"boltforge: its Boltforge job {job} is cancelled")

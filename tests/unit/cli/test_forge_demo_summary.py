"""The forge demo's summary line for a failed job carries what ended it."""

from __future__ import annotations

from boltforge.cli.forgedemo import failure_words
from boltforge.wire.jobs import EventOut, JobDetail

ENGINE = "failed: replica 0 the container engine could not run the container (exit 125): oops"


def detail(state: str, *messages: str) -> JobDetail:
    events = [EventOut(seq=i, at=float(i), kind="k", message=m) for i, m in enumerate(messages)]
    base = dict(id="1", name="n", team="t", priority=2, priority_name="normal")
    return JobDetail(
        **base,
        state=state,
        gpus=8,
        replicas=1,
        submitted_at=0.0,
        events=events,
    )


def test_a_failed_job_is_told_by_its_last_failure_event() -> None:
    d = detail("failed", "queued: 8 GPU(s)", "failed: an older one", ENGINE, "released")
    assert failure_words(d) == ENGINE


def test_a_job_that_did_not_fail_needs_no_words() -> None:
    assert failure_words(detail("succeeded", "queued: 8 GPU(s)", "succeeded")) == ""

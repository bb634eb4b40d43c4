"""An elastic training job on a real control plane (``bolt server``, ``bolt agent``s and
the example trainer): it grows into the host another job frees, shrinks back for a
high-priority job, and keeps training through both, each time resuming from the checkpoint
its stop wrote, without ever returning to the queue."""

from __future__ import annotations

from pathlib import Path

from test_faults import PREEMPT_AT_ONCE, checkpointed, fleet, resumed_from, submit, trainer

from boltforge.client import Client
from boltforge.testing.processes import wait_until
from boltforge.wire.jobs import JobDetail


def at_size(api: Client, job: str, epoch: int, gpus: int) -> JobDetail | None:
    """The job, once it runs at ``epoch`` on ``gpus`` GPUs."""
    d = api.job(job)
    held = sum(len(r.gpus) for r in d.placement)
    return d if d.state == "running" and d.epoch == epoch and held == gpus else None


def test_an_elastic_job_grows_then_shrinks_for_a_high_priority_job_and_keeps_training(
    tmp_path: Path,
) -> None:
    with fleet(tmp_path, 2, PREEMPT_AT_ONCE) as (_, api):
        other = submit(api, trainer("other", 60))
        wait_until(lambda: checkpointed(api, other, 10), 60, "the other job to run")
        spec = trainer("elastic", 1200, elastic={"min": 1, "max": 2}, time_limit="2h")
        job = submit(api, spec)
        wait_until(lambda: checkpointed(api, job, 10), 60, "the elastic job to run")
        assert api.job(job).epoch == 1

        grown = wait_until(lambda: at_size(api, job, 2, 16), 90, "the job to grow to 2 hosts")
        assert any(e.kind == "grown" for e in grown.events)
        wait_until(lambda: checkpointed(api, job, (grown.last_step or 0) + 20), 60, "progress")

        high = submit(api, trainer("urgent", 40, priority="high", team="nlp"))
        shrunk = wait_until(lambda: at_size(api, job, 3, 8), 90, "the job to shrink to 1 host")
        assert any(e.kind == "shrunk" and high in e.message for e in shrunk.events)
        wait_until(lambda: api.job(high).state == "succeeded", 90, "the urgent job to finish")

        done = wait_until(lambda: api.job(job).state == "succeeded" and api.job(job), 180)
        assert done.preemptions == 0 and done.restarts == 0
        assert not any(e.kind == "requeued" for e in done.events)
        steps = resumed_from(api, job)
        assert len(steps) >= 2 and 0 < steps[0] < steps[-1]  # each size went on from the last
        assert done.last_step == 1200

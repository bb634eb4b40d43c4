"""``bolt queue``, ``bolt submit`` and the server's timeline print a job on part of a GPU as
that part, not as ``0 GPU(s)``."""

from __future__ import annotations

from typing import Any

import pytest
from rich.console import Console

from boltforge.cli.queue import fold, queue_table
from boltforge.cli.submit import _print_reply
from boltforge.control.jobs.submit import queued_message
from boltforge.control.views.jobs import stored_summary
from boltforge.wire.jobs import JobSummary, SubmitReply

QUARTER = {"gpu": {"fraction": 0.25, "memory_gb": 16}, "command": ["python", "serve.py"]}


def row(spec: dict[str, Any], gpus: int, replicas: int = 1) -> dict[str, Any]:
    return {
        "id": "7",
        "name": "small-inference",
        "team": "nlp",
        "user": "ana",
        "priority": 2,
        "state": "pending",
        "spec": spec,
        "gpus": gpus,
        "replicas": replicas,
        "submitted_at": 0.0,
    }


def shown(jobs: list[JobSummary]) -> str:
    out = Console(width=120, record=True)
    out.print(queue_table(fold(jobs), 0.0))
    return out.export_text()


def test_a_quarter_gpu_job_is_a_quarter_in_the_queue() -> None:
    summary = stored_summary(row(QUARTER, 0))
    assert summary.gpu_part == "0.25"
    line = shown([summary]).splitlines()[1].split()
    assert line[:6] == ["7", "small-inference", "nlp", "normal", "pending", "0.25"]


def test_whole_gpu_jobs_keep_their_count() -> None:
    summary = stored_summary(row({"command": ["true"]}, 8, 2))
    assert summary.gpu_part == ""
    assert shown([summary]).splitlines()[1].split()[5] == "8"


def test_the_timeline_says_the_part() -> None:
    assert queued_message(row(QUARTER, 0, 4)).startswith("queued: 4 x 0.25 GPU in 4 replica(s)")
    assert queued_message(row({}, 0)).startswith("queued: 1 replica(s) for team nlp")


def test_submit_says_the_part(capsys: pytest.CaptureFixture[str]) -> None:
    _print_reply(SubmitReply(job=stored_summary(row(QUARTER, 0))), json=False)
    assert "submitted job 7 (small-inference, 0.25 GPU)" in capsys.readouterr().out

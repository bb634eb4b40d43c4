"""API reply models built by hand, for tests of what renders them (the CLI's views)."""

from __future__ import annotations

from typing import Any

from boltforge.wire.jobs import JobSummary


def job_summary(id_: str, state: str, submitted_at: float, **fields: Any) -> JobSummary:
    """A normal-priority 8-GPU job of team ``research`` named ``job-<id>``; ``fields``
    override any of it."""
    base: dict[str, Any] = {
        "id": id_,
        "name": f"job-{id_}",
        "team": "research",
        "priority": 50,
        "priority_name": "normal",
        "state": state,
        "gpus": 8,
        "replicas": 1,
        "submitted_at": submitted_at,
    }
    return JobSummary.model_validate(base | fields)

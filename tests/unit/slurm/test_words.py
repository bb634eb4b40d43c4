"""The comment a Slurm user reads in ``squeue -o "%i %T %k"``, scenario by scenario: what the
server says of the job in, the comment out."""

from __future__ import annotations

import pytest

from boltforge.slurm.words import (
    LIMIT,
    JobView,
    fit,
    job_comment,
    qos_note,
    refusal_comment,
    sbatch_words,
)

CHURN = "preempting would exceed the churn budget (8 of 1 GPUs per 10m)"
YOUNG = "2 candidate victims are in their first 10m"
URGENT = qos_note("urgent", None)

SCENARIOS = {
    "waiting with its place in line": (
        JobView("pending", "quota", position=3),
        "boltforge: waiting (#3 in line): quota",
    ),
    "waiting before its first pass": (JobView("pending"), "boltforge: waiting: next pass"),
    "a requeued job waits, and says it was preempted, not where it ran": (
        JobView("requeued", "capacity", nodes="n3", position=1),
        "boltforge: waiting (#1 in line): preempted, capacity",
    ),
    "placed but not yet started by Slurm": (
        JobView("scheduled", nodes="n1,n2"),
        "boltforge: placed on n1,n2, starting",
    ),
    "running in Boltforge while Slurm still starts it": (
        JobView("running", nodes="n3", slurm_running=False),
        "boltforge: placed on n3, starting",
    ),
    "running in both": (
        JobView("running", nodes="n[1-4]", slurm_running=True),
        "boltforge: placed on n[1-4]",
    ),
    "being preempted": (JobView("preempting", nodes="n3"), "boltforge: preempted, stopping on n3"),
    "running with no nodes named says nothing": (JobView("running"), ""),
    "finished says nothing": (JobView("succeeded", nodes="n1"), ""),
    "cancelled says nothing": (JobView("cancelled", "by ada"), ""),
    "the churn budget rules preemption out": (
        JobView("pending", "capacity", position=1, detail=("no rack with room", CHURN)),
        f"boltforge: waiting (#1 in line): capacity; preemption ruled out: {CHURN}",
    ),
    "the minimum runtime rules preemption out": (
        JobView("pending", "capacity", position=2, detail=(YOUNG,)),
        f"boltforge: waiting (#2 in line): capacity; preemption ruled out: {YOUNG}",
    ),
    "detail that names no preemption rule adds nothing": (
        JobView("pending", "capacity", position=2, detail=("no rack with room",)),
        "boltforge: waiting (#2 in line): capacity",
    ),
    "a QOS that names no class says so, with the fix": (
        JobView("pending", "capacity", position=1, notes=(URGENT,)),
        "boltforge: waiting (#1 in line): capacity; QOS urgent names no priority class, so it "
        "runs as normal. To fix: ask an admin for `bolt slurm-bridge --qos-class urgent=CLASS`",
    ),
    "a placed job keeps the QOS note": (
        JobView("running", nodes="n1", slurm_running=True, notes=(URGENT,)),
        "boltforge: placed on n1: QOS urgent names no priority class, so it runs as normal. "
        "To fix: ask an admin for `bolt slurm-bridge --qos-class urgent=CLASS`",
    ),
}


@pytest.mark.parametrize(("view", "text"), SCENARIOS.values(), ids=SCENARIOS.keys())
def test_the_squeue_comment(view: JobView, text: str) -> None:
    assert job_comment(view) == text


def test_a_long_reason_is_cut_to_what_slurm_keeps() -> None:
    text = job_comment(JobView("pending", "x" * 400, position=1))
    assert len(text) == LIMIT and text.startswith("boltforge: waiting (#1 in line): xxx")
    assert text.endswith("...")


def test_a_long_reason_is_shortened_and_its_fix_kept_whole() -> None:
    fix = "ask at most `--gres=gpu:8` per node, with -N for more nodes"
    text = refusal_comment(f"{'why ' * 100}. To fix: {fix}")
    assert LIMIT - 2 <= len(text) <= LIMIT
    assert text.endswith(f"... To fix: {fix}")
    assert text.startswith("boltforge: refused: why why")


def test_a_fix_longer_than_the_limit_is_cut_last() -> None:
    text = fit("refused", "why", "f" * 400)
    assert len(text) == LIMIT and text.startswith("boltforge: refused: ... To fix: fff")


def test_a_short_refusal_is_left_whole() -> None:
    assert refusal_comment("it asks 16 GPUs. To fix: ask 8") == (
        "boltforge: refused: it asks 16 GPUs. To fix: ask 8"
    )


@pytest.mark.parametrize(
    ("server", "user"),
    [
        ("per_node: 16 is more than any node has", "GPUs per node (--gres=gpu:N): 16 is more"),
        ("roles[0].cpus: too many for role worker", "cpus: too many for the job"),
        ("memory_gb: over a node's memory", "--mem: over a node's memory"),
        ("time_limit: longer than the team allows", "-t: longer than the team allows"),
        ("team: is not a team here", "team: is not a team here"),
    ],
)
def test_a_server_refusal_speaks_sbatch_options(server: str, user: str) -> None:
    assert sbatch_words(server).startswith(user)


@pytest.mark.parametrize(("qos", "mapped_to"), [("", None), ("urgent", "high"), ("low", "low")])
def test_no_qos_note_for_no_qos_or_a_mapped_one(qos: str, mapped_to: str | None) -> None:
    assert qos_note(qos, mapped_to) == ""

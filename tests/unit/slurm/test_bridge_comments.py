"""The comments the bridge writes on the jobs it manages, against an in-memory Slurm and
server: stale words replaced, preemption's real reason, a QOS that names no class, and
refusals in ``sbatch``'s words. (The text itself: test_words.py.)"""

from __future__ import annotations

import logging
from typing import Any, cast

import pytest
from slurm_fakes import FakeServer, FakeSlurm, bridge, run, team_users

from boltforge.slurm.bridge import SlurmBridge

CHURN = "preempting would exceed the churn budget (8 of 1 GPUs per 10m)"


def commented(b: SlurmBridge) -> None:
    """One pass that writes comments."""
    b._next_comments = 0.0
    run(b)


def test_a_preempted_job_waiting_again_no_longer_says_where_it_ran() -> None:
    slurm, server = FakeSlurm(), FakeServer()
    sid = slurm.submit(job_id=7)
    b = bridge(slurm, server)
    run(b)
    server.states["1"], server.nodes["1"] = "scheduled", "n3"
    commented(b)
    assert slurm.queue[sid].comment == "boltforge: placed on n3, starting"
    server.states["1"] = "requeued"
    commented(b)
    assert slurm.queue[sid].comment == "boltforge: waiting (#0 in line): preempted, capacity"


def test_a_job_waiting_because_preemption_is_ruled_out_says_why() -> None:
    slurm, server = FakeSlurm(), FakeServer()
    sid = slurm.submit(job_id=7, qos="high")
    server.waiting["1"] = ["no rack with room", CHURN]
    b = bridge(slurm, server)
    run(b)
    commented(b)
    assert slurm.queue[sid].comment.endswith(f"capacity; preemption ruled out: {CHURN}")
    reads = server.detail_reads
    commented(b)
    assert server.detail_reads == reads  # read again only when its reason changes, or later


def test_a_job_that_does_not_wait_for_room_has_no_detail_read() -> None:
    slurm, server = FakeSlurm(), FakeServer()
    slurm.submit(job_id=7)
    b = bridge(slurm, server)
    run(b)
    reads = server.detail_reads
    server.states["1"], server.nodes["1"] = "running", "n1"
    commented(b)
    commented(b)
    assert server.detail_reads == reads
    assert slurm.queue["7"].comment == "boltforge: placed on n1, starting"


def test_a_qos_that_names_no_class_runs_as_normal_says_so_and_is_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    slurm, server = FakeSlurm(), FakeServer()
    sids = [slurm.submit(job_id=7 + i, qos="urgent") for i in range(2)]
    b = bridge(slurm, server)
    with caplog.at_level(logging.WARNING, logger="boltforge.slurm.bridge"):
        run(b)
        commented(b)
        commented(b)
    assert [s["priority"] for s in server.submitted] == ["normal", "normal"]
    for sid in sids:
        comment = slurm.queue[sid].comment
        assert "QOS urgent names no priority class" in comment
        assert "To fix: ask an admin for `bolt slurm-bridge --qos-class urgent=CLASS`" in comment
    assert sum("QOS urgent" in r.getMessage() for r in caplog.records) == 1


def test_a_qos_mapped_with_qos_class_gets_its_class_and_no_note() -> None:
    slurm, server = FakeSlurm(), FakeServer()
    sid = slurm.submit(job_id=7, qos="urgent")
    b = SlurmBridge(
        cast(Any, slurm), cast(Any, server), cast(Any, server), ["bolt"],
        team_users=team_users(), qos_classes={"urgent": "high"},
    )  # fmt: skip
    run(b)
    commented(b)
    assert server.submitted[0]["priority"] == "high"
    assert "QOS" not in slurm.queue[sid].comment


def test_more_gpus_per_node_than_a_node_has_is_refused_in_sbatch_words() -> None:
    slurm, server = FakeSlurm(), FakeServer()
    sid = slurm.submit(job_id=7, tres_per_node="gres:gpu:16")
    run(bridge(slurm, server), passes=2)
    assert server.submitted == []
    assert slurm.queue[sid].comment == (
        "boltforge: refused: it asks 16 GPUs per node and nodes here have 8. To fix: ask at "
        "most `--gres=gpu:8` per node, with -N for more nodes"
    )

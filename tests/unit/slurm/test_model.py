"""What Slurm says, parsed: host lists, GRES strings, ``sinfo --json`` nodes, ``squeue --json``
jobs (the 22.05 layout) and ``topology.conf``. The captures under ``data/`` are trimmed from a
real Slurm 22.05.8 cluster."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from slurm_builders import sinfo_node, squeue_job

from boltforge.slurm.model import (
    SlurmJob,
    SlurmNode,
    gres_gpus,
    hostnames,
    parse_jobs,
    parse_nodes,
    parse_topology,
)

DATA = Path(__file__).parent / "data"
UNLIMITED = 0xFFFFFFFE  # what squeue says for a job without a time limit (NO_VAL)


def capture(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((DATA / name).read_text())
    return data


def job(**fields: Any) -> SlurmJob:
    (parsed,) = parse_jobs({"jobs": [squeue_job(**fields)]})
    return parsed


def node(**fields: Any) -> SlurmNode:
    (parsed,) = parse_nodes({"nodes": [sinfo_node(**fields)]})
    return parsed


# host lists


@pytest.mark.parametrize(
    ("text", "hosts"),
    [
        ("n[1-3,7],m2", ("n1", "n2", "n3", "n7", "m2")),
        ("gpu[01-03]", ("gpu01", "gpu02", "gpu03")),
        ("gpu[08-10]", ("gpu08", "gpu09", "gpu10")),
        ("gpu[9-10]", ("gpu9", "gpu10")),
        ("n5", ("n5",)),
        ("a,b,c", ("a", "b", "c")),
        ("rack1-n[2-3]", ("rack1-n2", "rack1-n3")),
        ("n[1-2],m[3-4]", ("n1", "n2", "m3", "m4")),
        ("", ()),
    ],
)
def test_a_host_list_expands_to_its_hosts_in_order(text: str, hosts: tuple[str, ...]) -> None:
    assert hostnames(text) == hosts


# GRES


@pytest.mark.parametrize(
    ("text", "gpus", "kind"),
    [
        ("gpu:h100:8", 8, "h100"),  # a node's GRES
        ("gres:gpu:4", 4, None),  # a job's tres_per_node in 22.05
        ("gres:gpu:a100:2", 2, "a100"),
        ("gres/gpu=2", 2, None),  # a TRES list
        ("gpu:8(S:0-1)", 8, None),  # with socket affinity
        ("gpu:h100:8(S:0-1)", 8, "h100"),
        ("gpu", 1, None),
        ("mps:100,gpu:h100:4", 4, "h100"),  # the GPUs, not the first GRES
        ("cpu=2,mem=500G,node=2,billing=2", 0, None),
        ("", 0, None),
    ],
)
def test_gres_gives_the_gpu_count_and_type(text: str, gpus: int, kind: str | None) -> None:
    assert gres_gpus(text) == (gpus, kind)


# nodes


def test_a_captured_node_parses_with_its_gpus_rack_and_partitions() -> None:
    (n1,) = parse_nodes(capture("sinfo-22.05.json"))

    assert (n1.name, n1.gpus, n1.gpu_type) == ("n1", 8, "h100")
    assert n1.cpus == 32
    assert n1.memory_gb == pytest.approx(250.0)  # real_memory is in MiB
    assert n1.partitions == ("bolt", "low", "high")
    assert n1.feature("rack") == "r0"
    assert n1.feature("pod") is None
    assert n1.responding
    assert not n1.draining


def test_a_node_without_a_gpu_type_is_a_plain_gpu_node() -> None:
    assert (node(gres="gpu:4").gpus, node(gres="gpu:4").gpu_type) == (4, "gpu")


def test_a_node_without_gres_has_no_gpus() -> None:
    assert node(gres="").gpus == 0
    assert node(gres=None).gpus == 0


def test_a_node_has_each_of_its_features() -> None:
    n = node(features="rack=r3,pod=p1,ib")
    assert n.features == ("rack=r3", "pod=p1", "ib")
    assert (n.feature("rack"), n.feature("pod"), n.feature("ib")) == ("r3", "p1", None)


@pytest.mark.parametrize(
    ("state", "flags", "responding", "draining"),
    [
        ("idle", [], True, False),
        ("mixed", [], True, False),
        ("allocated", [], True, False),
        ("idle", ["DRAIN"], True, True),
        ("mixed", ["DRAIN"], True, True),
        ("draining", [], True, True),
        ("drained", [], True, True),
        ("down", [], False, False),
        ("DOWN", [], False, False),
        ("down", ["DRAIN"], False, True),
        ("idle", ["NOT_RESPONDING"], False, False),
        ("fail", [], False, False),
        ("future", [], False, False),
    ],
)
def test_a_node_state_says_whether_it_responds_and_drains(
    state: str, flags: list[str], responding: bool, draining: bool
) -> None:
    n = node(state=state, state_flags=flags)
    assert (n.responding, n.draining) == (responding, draining)


# jobs


def test_the_captured_held_job_parses_as_asked() -> None:
    held, queued = parse_jobs(capture("squeue-22.05.json"))

    assert (held.id, held.name, held.partition, held.account) == (
        "1",
        "job-28272979312899.sh",
        "bolt",
        "research",
    )
    assert (held.node_count, held.gpus_per_node, held.gpus_total) == (2, 8, 0)
    assert held.gpu_type is None
    assert held.time_limit_s == 600.0
    assert held.nodes == ()
    assert held.held
    assert not held.finished
    assert held.comment == "boltforge: held for placement"

    assert queued.id == "2"
    assert not queued.held  # pending on its priority, not held
    assert queued.time_limit_s is None  # squeue says null for no limit
    assert queued.gpus_per_node == 2


def test_a_running_job_has_its_nodes_expanded() -> None:
    running = job(job_state="RUNNING", nodes="gpu[01-02]", node_count=2)
    assert running.nodes == ("gpu01", "gpu02")
    assert not running.held


@pytest.mark.parametrize(
    ("tres_per_node", "tres_per_job", "per_node", "total", "kind"),
    [
        ("gres:gpu:h100:8", "", 8, 0, "h100"),  # --gres=gpu:h100:8
        ("gres:gpu:8", "", 8, 0, None),  # --gpus-per-node=8
        ("", "gres:gpu:16", 0, 16, None),  # --gpus=16
        ("", "gres:gpu:a100:16", 0, 16, "a100"),  # --gpus=a100:16
        ("", "", 0, 0, None),  # no GPUs
    ],
)
def test_a_job_asks_gpus_per_node_or_in_all(
    tres_per_node: str, tres_per_job: str, per_node: int, total: int, kind: str | None
) -> None:
    j = job(tres_per_node=tres_per_node, tres_per_job=tres_per_job)
    assert (j.gpus_per_node, j.gpus_total, j.gpu_type) == (per_node, total, kind)


@pytest.mark.parametrize(
    ("wait_status", "exit_code", "signal"),
    [
        (0, 0, None),
        (768, 3, None),  # exit(3)
        (256, 1, None),
        (9, None, 9),  # SIGKILL
        (15, None, 15),  # SIGTERM
        (0x80 | 11, None, 11),  # SIGSEGV with a core dump
    ],
)
def test_a_job_exit_status_is_a_raw_wait_status(
    wait_status: int, exit_code: int | None, signal: int | None
) -> None:
    ended = job(job_state="FAILED", exit_code=wait_status)
    assert (ended.exit_code, ended.signal) == (exit_code, signal)


@pytest.mark.parametrize(
    ("time_limit", "seconds"),
    [
        (10, 600.0),
        (1, 60.0),
        (1440, 86400.0),
        (UNLIMITED, None),
        (0xFFFFFFFF, None),  # INFINITE
        (None, None),
        (0, None),
    ],
)
def test_a_job_time_limit_in_minutes_becomes_seconds(
    time_limit: int | None, seconds: float | None
) -> None:
    assert job(time_limit=time_limit).time_limit_s == seconds


@pytest.mark.parametrize(
    ("state", "priority", "reason", "held"),
    [
        ("PENDING", 0, "JobHeldUser", True),  # scontrol hold, as the submit plugin does
        ("PENDING", 0, "None", True),
        ("PENDING", 1000, "JobHeldAdmin", True),
        ("PENDING", 1000, "JobHeldUser", True),
        ("PENDING", 1000, "Priority", False),
        ("RUNNING", 0, "None", False),
        ("COMPLETED", 0, "None", False),
    ],
)
def test_a_job_is_held_when_pending_with_no_priority_or_a_hold(
    state: str, priority: int, reason: str, held: bool
) -> None:
    assert job(job_state=state, priority=priority, state_reason=reason).held is held


@pytest.mark.parametrize(
    ("state", "finished"),
    [
        ("PENDING", False),
        ("RUNNING", False),
        ("COMPLETING", False),
        ("COMPLETED", True),
        ("FAILED", True),
        ("CANCELLED", True),
        ("TIMEOUT", True),
        ("NODE_FAIL", True),
        ("OUT_OF_MEMORY", True),
        ("PREEMPTED", True),
    ],
)
def test_a_job_in_a_final_state_is_finished(state: str, finished: bool) -> None:
    assert job(job_state=state).finished is finished


@pytest.mark.parametrize(
    ("qos", "comment", "requested"),
    [
        ("", "boltforge: held for placement [qos=high]", "high"),
        ("", "boltforge: held for placement [qos=batch_2.x-y]", "batch_2.x-y"),
        ("low", "boltforge: held for placement [qos=high]", "low"),  # Slurm's own field wins
        ("normal", "", "normal"),
        ("", "boltforge: held for placement", ""),
        ("", "", ""),
    ],
)
def test_a_job_requested_qos_is_slurms_else_the_submit_plugins_tag(
    qos: str, comment: str, requested: str
) -> None:
    assert job(qos=qos, comment=comment).requested_qos == requested


def test_a_job_missing_optional_fields_gets_defaults() -> None:
    bare = parse_jobs({"jobs": [{"job_id": 7}]})[0]
    assert (bare.id, bare.state, bare.node_count) == ("7", "UNKNOWN", 1)
    assert (bare.gpus_per_node, bare.gpus_total, bare.time_limit_s) == (0, 0, None)
    assert not bare.held


def test_squeue_without_jobs_has_none() -> None:
    assert parse_jobs({"meta": {}, "errors": []}) == []
    assert parse_nodes({"meta": {}, "errors": []}) == []


# topology.conf


def test_topology_gives_each_node_its_leaf_switch() -> None:
    text = """
# topology.conf, generated
SwitchName=r1 Nodes=n[1-4]  # rack 1
SwitchName=r2 Nodes=n[5-6],gpu07 LinkSpeed=100
  # SwitchName=r9 Nodes=n[9-10]
SwitchName=spine Switches=r[1-2]

"""
    assert parse_topology(text) == {
        "n1": "r1",
        "n2": "r1",
        "n3": "r1",
        "n4": "r1",
        "n5": "r2",
        "n6": "r2",
        "gpu07": "r2",
    }


def test_topology_keys_are_read_in_any_case_as_slurm_reads_them() -> None:
    text = "switchname=r1 nodes=n[1-2]\nSWITCHNAME=r2 NODES=n3\n"
    assert parse_topology(text) == {"n1": "r1", "n2": "r1", "n3": "r2"}


def test_an_empty_topology_places_no_node() -> None:
    assert parse_topology("") == {}
    assert parse_topology("# nothing here\n") == {}

"""Builders for what Slurm 22.05 says: a job as ``squeue --json`` shows it and a node as
``sinfo --json`` shows it, each with fields to override."""

from __future__ import annotations

from typing import Any


def squeue_job(**fields: Any) -> dict[str, Any]:
    """A pending one-node 8-GPU job of team ``research`` with an hour's limit."""
    return {
        "job_id": 41,
        "name": "train.sh",
        "job_state": "PENDING",
        "state_reason": "Priority",
        "partition": "bolt",
        "account": "research",
        "qos": "",
        "user_name": "ada",
        "nodes": "",
        "node_count": 1,
        "tres_per_node": "gres:gpu:8",
        "tres_per_job": "",
        "time_limit": 60,
        "comment": "",
        "admin_comment": "",
        "exit_code": 0,
        "submit_time": 1795569555,
        "priority": 4294901759,
        **fields,
    }


def sinfo_node(**fields: Any) -> dict[str, Any]:
    """An idle 8 x H100 node in rack r0 of partition ``bolt``."""
    return {
        "name": "n1",
        "gres": "gpu:h100:8",
        "state": "idle",
        "state_flags": [],
        "cpus": 32,
        "real_memory": 256000,
        "features": "rack=r0",
        "partitions": ["bolt"],
        **fields,
    }

"""Slurm's words into Boltforge's: a node into an inventory, a held job into a job spec.
Pure functions; a job Boltforge cannot run as asked is a ``Untranslatable`` whose message
goes into the job's comment, where its user looks."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from boltforge.slurm.model import SlurmJob, SlurmNode
from boltforge.spec.job import PRIORITY_CLASSES
from boltforge.wire.agent import Inventory

COMMAND = "slurm-job"  # the command of a Slurm job's gang: Slurm runs the batch script


class Untranslatable(ValueError):
    """A job Slurm accepted that Boltforge cannot take as asked; the message says the fix."""


def inventory(node: SlurmNode, pool: str, switch: str | None) -> Inventory:
    """A Slurm node as a Boltforge node: its rack is its ``topology.conf`` leaf switch, else
    its ``rack=`` feature, else ``rack0``. Its replicas outlive its lease: Slurm runs them,
    so the bridge being away ends none of them."""
    return Inventory(
        name=node.name,
        pool=pool,
        gpu=node.gpu_type,
        gpus=node.gpus,
        cpus=node.cpus,
        memory_gb=node.memory_gb,
        rack=switch or node.feature("rack") or "rack0",
        pod=node.feature("pod") or "pod0",
        address=node.name,
        replicas_outlive_lease=True,  # Slurm runs them, whether or not the bridge is there
    )


def priority_class(qos: str, qos_classes: Mapping[str, str]) -> str | None:
    """The priority class a QOS names: ``qos_classes``' entry for it (``--qos-class``), else
    the QOS itself when it is named like a class; None when it names none (or is empty)."""
    if qos in qos_classes:
        return qos_classes[qos]
    return qos if qos in PRIORITY_CLASSES else None


def job_spec(
    job: SlurmJob,
    default_team: str,
    grace_s: float,
    qos_classes: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The Boltforge job spec of a held Slurm job: one replica per node it asked for, with
    the GPUs, CPUs and memory per node it asked for; its account is its team
    (``default_team`` when it has none), its QOS's priority class its class
    (``priority_class``; ``normal`` when the QOS names none)."""
    per_node = _per_node(job)
    spec: dict[str, Any] = {
        "name": _name(job),
        "team": job.account or default_team,
        "priority": priority_class(job.requested_qos, qos_classes or {}) or "normal",
        "command": [COMMAND, job.id],
        "checkpoint": {"grace": f"{round(grace_s)}s"},
    }
    if per_node:
        spec["gpus"] = per_node * job.node_count
        spec["per_node"] = per_node
        spec.update(_host_share(job))
    else:
        role = {"name": "worker", "replicas": job.node_count, "gpus": 0}
        spec["roles"] = [{**role, **_host_share(job)}]
    if job.gpu_type:
        spec["gpu"] = {"types": [job.gpu_type]}
    if job.time_limit_s is not None:
        spec["time_limit"] = f"{round(job.time_limit_s)}s"
    return spec


def _host_share(job: SlurmJob) -> dict[str, Any]:
    """The CPUs and memory each replica (one per node) asks: the job's totals over its nodes
    (CPUs rounded up), so placement counts them as Slurm does; none when it asks none."""
    out: dict[str, Any] = {}
    if job.cpus > 0:
        out["cpus"] = -(-job.cpus // job.node_count)
    if job.memory_gb > 0:
        out["memory_gb"] = round(job.memory_gb / job.node_count, 3)
    return out


def _per_node(job: SlurmJob) -> int:
    if job.gpus_per_node:
        per_node = job.gpus_per_node
    elif job.gpus_total and job.gpus_total % job.node_count == 0:
        per_node = job.gpus_total // job.node_count
    elif job.gpus_total:
        raise Untranslatable(
            f"--gpus={job.gpus_total} does not split evenly over {job.node_count} nodes; "
            "ask for GPUs per node (--gpus-per-node or --gres=gpu:N)"
        )
    else:
        per_node = 0
    return per_node


def check_whole_nodes(job: SlurmJob, gpus_per_node: int) -> None:
    """A job may ask no more GPUs per node than the largest node has (``gpus_per_node``;
    0: no node known yet, nothing checked), and a multi-node job must take whole nodes:
    Boltforge may put two replicas of a smaller gang on one node, which Slurm's ``-N``
    would not allow. The message says the fix in ``sbatch`` options."""
    per_node = _per_node(job)
    if gpus_per_node and per_node > gpus_per_node:
        raise Untranslatable(
            f"it asks {per_node} GPUs per node and nodes here have {gpus_per_node}. "
            f"To fix: ask at most `--gres=gpu:{gpus_per_node}` per node, with -N for more nodes"
        )
    if job.node_count > 1 and per_node and per_node != gpus_per_node:
        raise Untranslatable(
            f"a {job.node_count}-node job must take whole nodes of {gpus_per_node} GPUs "
            f"(it asks {per_node} per node). To fix: submit --gres=gpu:{gpus_per_node} "
            "per node, or one node"
        )


def _name(job: SlurmJob) -> str:
    """``slurm-`` and the Slurm job's name as a valid Boltforge name. Jobs sent again under one
    name share it, so the runtimes learned from the earlier ones speak for the next
    (``core/queueing/runtimes.py``); the Slurm job id is the second word of the command."""
    base = re.sub(r"[^a-z0-9_.-]", "-", job.name.lower()).strip("-._") or "job"
    return f"slurm-{base}"[:63].rstrip("-._")

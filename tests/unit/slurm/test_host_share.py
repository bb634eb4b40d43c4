"""A Slurm job's CPUs and memory into Boltforge's: Slurm's own totals of ``-n``, ``-c``,
``--mem``, ``--mem-per-cpu`` and ``--mem-per-gpu`` (its ``tres_req_str``, as squeue shows
it) become each replica's CPUs and memory, which placement counts on the node."""

from __future__ import annotations

from typing import Any

import pytest
from slurm_builders import squeue_job

from boltforge.slurm.model import SlurmJob, parse_jobs, tres_request
from boltforge.slurm.translate import job_spec
from boltforge.spec.job import parse_job


def held(tres: str, **fields: Any) -> SlurmJob:
    tag = {"comment": "boltforge: held for placement", "priority": 0, "tres_req_str": tres}
    (job,) = parse_jobs({"jobs": [squeue_job(**{**tag, **fields})]})
    return job


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("cpu=2,mem=1G,node=1,billing=2", {"cpus": 2, "memory_gb": 1.0}),  # -c 2 --mem=1G
        ("cpu=3,mem=1.50G,node=1,billing=3", {"cpus": 3, "memory_gb": 1.5}),  # --mem-per-cpu
        ("cpu=4,mem=4000M,node=1", {"cpus": 4, "memory_gb": 4000 / 1024}),  # -n 2 -c 2
        ("cpu=1,mem=2T", {"cpus": 1, "memory_gb": 2048.0}),
        ("cpu=1,mem=512", {"cpus": 1, "memory_gb": 0.5}),  # megabytes when unmarked
        ("node=1,billing=1", {}),
        ("", {}),
        ("cpu=x,mem=lots", {}),
    ],
)
def test_a_tres_request_gives_the_jobs_cpus_and_memory(text: str, want: dict[str, Any]) -> None:
    assert tres_request(text) == want


def test_each_replica_asks_its_share_of_the_jobs_cpus_and_memory() -> None:
    job = held("cpu=33,mem=64G,node=2", node_count=2, tres_per_node="gres:gpu:8")
    spec = parse_job(job_spec(job, "shared", 60.0), "slurm")
    assert (spec.cpus, spec.memory_gb) == (17, 32.0)  # CPUs rounded up


def test_a_job_with_no_gpus_asks_its_cpus_and_memory_in_its_role() -> None:
    job = held("cpu=4,mem=8G,node=1", tres_per_node="")
    spec = parse_job(job_spec(job, "shared", 60.0), "slurm")
    [role] = spec.roles
    assert (role.gpus, role.cpus, role.memory_gb) == (0, 4, 8.0)


def test_a_job_that_names_no_cpus_or_memory_asks_none() -> None:
    spec = job_spec(held(""), "shared", 60.0)
    assert "cpus" not in spec and "memory_gb" not in spec

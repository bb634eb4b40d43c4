"""The fleet-state spec: running jobs (where they sit, when they end) and cordoned hosts."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from boltforge.core.model.state import Allocation, Conflict, FleetState, Grant
from boltforge.core.model.topology import TopologyTree
from boltforge.spec.bounds import Duration
from boltforge.spec.errors import SpecError, SpecProblem, from_validation
from boltforge.spec.loader import read_yaml


class RunningJob(BaseModel):
    """A job holding GPUs: host name to GPU indices, and how long until it is expected to end."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    job: str
    nodes: dict[str, list[int]] = Field(min_length=1)
    ends_in: Duration | None = None
    priority: int = Field(3, ge=0, le=3)
    cpus_per_node: float = Field(0, ge=0)
    memory_gb_per_node: float = Field(0, ge=0)


class StateSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    running: list[RunningJob] = []
    cordoned: list[str] = []


def build_state(spec: StateSpec, tree: TopologyTree, source: str, now: float = 0.0) -> FleetState:
    """Apply ``spec`` to an empty state of ``tree``; unknown hosts or clashes are ``SpecError``s."""
    state = FleetState(tree)
    problems: list[SpecProblem] = []
    for i, job in enumerate(spec.running):
        grants: list[Grant] = []
        for host, gpus in job.nodes.items():
            h = tree.host_index.get(host)
            field = f"state.running[{i}].nodes.{host}"
            if h is None:
                problems.append(
                    SpecProblem(
                        field,
                        host,
                        "is not a host of this fleet. To fix: use a name from `bolt fleet show`",
                    )
                )
                continue
            bad = [g for g in gpus if not 0 <= g < int(tree.host_gpus[h])]
            if bad:
                problems.append(
                    SpecProblem(field, bad, f"GPU indices run 0-{tree.host_gpus[h] - 1}")
                )
                continue
            grants.append(
                Grant(
                    "worker",
                    len(grants),
                    h,
                    tuple(sorted(set(gpus))),
                    job.cpus_per_node,
                    job.memory_gb_per_node,
                )
            )
        end = None if job.ends_in is None else now + job.ends_in
        try:
            state.allocate(Allocation(job.job, tuple(grants), end, job.priority))
        except Conflict as e:
            problems.append(
                SpecProblem(
                    f"state.running[{i}]", job.job, f"{e}. To fix: give each GPU to one job only"
                )
            )
    for host in spec.cordoned:
        h = tree.host_index.get(host)
        if h is None:
            problems.append(SpecProblem("state.cordoned", host, "is not a host of this fleet"))
        else:
            state.cordoned[h] = True
    if problems:
        raise SpecError(source, problems)
    return state


def load_state(path: str | Path, tree: TopologyTree, now: float = 0.0) -> FleetState:
    data = read_yaml(path) or {}
    try:
        spec = StateSpec.model_validate(data)
    except ValidationError as e:
        raise from_validation(str(path), "state", e) from None
    return build_state(spec, tree, str(path), now)

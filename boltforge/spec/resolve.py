"""Turn a validated job spec into the core's ``Gang`` for one fleet (GPU names, per-node split)."""

from __future__ import annotations

from boltforge.core.model.gang import Capability, Gang, Role, TopologyRule
from boltforge.core.model.topology import TopologyTree
from boltforge.spec.errors import SpecError, SpecProblem
from boltforge.spec.job import GpuNeed, JobSpec, Parallelism, RoleSpec


def match_types(tree: TopologyTree, names: list[str]) -> tuple[frozenset[str], list[str]]:
    """Fleet GPU models each name matches (exactly, or as a prefix like ``A100``) and misses."""
    fleet = sorted({p.gpu_type for p in tree.pools if p.gpus_per_host})
    found: set[str] = set()
    missing = []
    for name in names:
        key = name.lower()
        hits = [t for t in fleet if t.lower() == key or t.lower().startswith(key)]
        found.update(hits)
        if not hits:
            missing.append(name)
    return frozenset(found), missing


def to_gang(spec: JobSpec, tree: TopologyTree, source: str = "job") -> Gang:
    """Resolve ``spec`` against ``tree``; raise ``SpecError`` naming the field and the fix."""
    problems: list[SpecProblem] = []
    roles = [_role(spec, r, tree, f"job.roles[{i}]", problems) for i, r in enumerate(spec.roles)]
    if not spec.roles:
        roles = [_single_role(spec, tree, problems)]
    if (
        spec.elastic
        and len(roles) == 1
        and not (spec.elastic.min <= roles[0].replicas <= spec.elastic.max)
    ):
        problems.append(
            SpecProblem(
                "job.elastic",
                f"{spec.elastic.min}-{spec.elastic.max}",
                f"must include the {roles[0].replicas} replicas asked for. To fix: widen the range",
            )
        )
    names = [r.name for r in roles]
    if len(set(names)) != len(names):
        problems.append(SpecProblem("job.roles", names, "role names repeat. To fix: rename them"))
    if problems:
        raise SpecError(source, problems)
    rule = spec.topology.to_rule()
    return Gang(
        spec.name,
        tuple(roles),
        TopologyRule(rule.required, rule.preferred),
        spec.team,
        spec.priority_class,
    )


def _capability(
    spec: JobSpec,
    need: GpuNeed,
    min_memory: float,
    tree: TopologyTree,
    field: str,
    problems: list[SpecProblem],
    extra_type: str | None = None,
) -> Capability:
    names = list(need.types or spec.gpu.types)
    if extra_type:
        names.append(extra_type)
    types, missing = match_types(tree, names)
    if missing:
        fleet = ", ".join(sorted({p.gpu_type for p in tree.pools if p.gpus_per_host}))
        problems.append(
            SpecProblem(
                field,
                ", ".join(missing),
                f"names no GPU model in fleet {tree.name}. To fix: use one of {fleet}",
            )
        )
    memory = max(need.min_memory_gb, min_memory, spec.gpu.min_memory_gb, spec.min_gpu_memory_gb)
    return Capability(types, memory, frozenset(spec.pools), spec.spot)


def _role(
    spec: JobSpec, r: RoleSpec, tree: TopologyTree, field: str, problems: list[SpecProblem]
) -> Role:
    cap = _capability(spec, r.gpu, r.min_gpu_memory_gb, tree, f"{field}.gpu", problems)
    share = r.gpu.share() or spec.gpu.share()
    return Role(
        r.name,
        r.replicas,
        0 if share else r.gpus,
        r.cpus,
        r.memory_gb,
        cap,
        r.parallelism.tensor,
        r.parallelism.pipeline,
        r.parallelism.data,
        storage_gb=r.storage_gb,
        share=share,
    )


def _single_role(spec: JobSpec, tree: TopologyTree, problems: list[SpecProblem]) -> Role:
    share = spec.gpu.share()
    if share is not None:
        cap = _capability(spec, spec.gpu, 0, tree, "job.gpu", problems)
        return Role("worker", 1, 0, spec.cpus, spec.memory_gb, cap, share=share)
    total, shorthand = spec.total_gpus()
    cap = _capability(
        spec, spec.gpu, 0, tree, "job.gpus" if shorthand else "job.gpu", problems, shorthand
    )
    per_node = spec.per_node or _default_per_node(tree, cap, total)
    if total and total % per_node:
        lower = next(d for d in range(per_node, 0, -1) if total % d == 0)
        upper = -(-total // per_node) * per_node
        problems.append(
            SpecProblem(
                "job.gpus",
                total,
                f"does not split into replicas of {per_node} GPUs per node. To fix: set "
                f"`per_node: {lower}` or ask for {upper} GPUs",
            )
        )
        per_node = total
    replicas = max(1, total // per_node) if total else 1
    p: Parallelism = spec.parallelism
    if p.tensor > 1 and (total == 0 or min(per_node, total) % p.tensor):
        problems.append(
            SpecProblem(
                "job.parallelism.tensor",
                p.tensor,
                f"must divide the {per_node} GPUs per node. To fix: lower it or raise per_node",
            )
        )
    return Role(
        "worker",
        replicas,
        min(per_node, total),
        spec.cpus,
        spec.memory_gb,
        cap,
        p.tensor,
        p.pipeline,
        p.data,
        storage_gb=spec.storage_gb,
    )


def _default_per_node(tree: TopologyTree, cap: Capability, total: int) -> int:
    """All GPUs on one host when a matching host is big enough, else whole hosts."""
    sizes = [p.gpus_per_host for p in tree.pools if cap.accepts(p, True)]
    biggest = max(sizes, default=8) or 8
    return max(1, total if total <= biggest else biggest)

"""The fleet as the scheduler sees it: a topology tree built from the nodes that registered."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from boltforge.core.model.topology import HostLayout, Pool, Tier, TopologyTree
from boltforge.spec.errors import SpecError, SpecProblem
from boltforge.spec.fleet import check_mig
from boltforge.wire.agent import Inventory

HARDWARE = (
    *("gpu", "gpu_memory_gb", "gpus", "nvlink_island", "cpus", "memory_gb", "rails"),
    *("node_class", "storage_gb", "storage_gbps", "mig", "mig_layout"),
)


@dataclass(frozen=True)
class Fleet:
    """A tree over some nodes, and the way between node names and the tree's host indices."""

    tree: TopologyTree
    names: tuple[str, ...]
    index: dict[str, int]


def build_fleet(name: str, inventories: Sequence[Inventory]) -> Fleet:
    """The tree of ``inventories``: one pool per pool name, hosts ordered by pod, rack and
    name so every rack and pod is numbered contiguously."""
    ordered = sorted(inventories, key=lambda i: (i.pod, i.rack, i.name))
    pools: dict[str, int] = {}
    pool_list: list[Pool] = []
    layout: list[HostLayout] = []
    for inv in ordered:
        if inv.pool not in pools:
            pools[inv.pool] = len(pool_list)
            pool_list.append(to_pool(inv))
        layout.append(HostLayout(inv.name, pools[inv.pool], inv.pod, f"{inv.pod}/{inv.rack}"))
    tree = TopologyTree.build(name, tuple(pool_list), layout)
    names = tuple(i.name for i in ordered)
    return Fleet(tree, names, {n: i for i, n in enumerate(names)})


def to_pool(inv: Inventory) -> Pool:
    """The pool a node's inventory describes."""
    gpus = inv.gpus
    return Pool(
        name=inv.pool,
        gpu_type=inv.gpu if gpus else "cpu",
        gpu_memory_gb=inv.gpu_memory_gb,
        gpus_per_host=gpus,
        island_size=(inv.nvlink_island or gpus) if gpus else 1,
        cpus=inv.cpus,
        memory_gb=inv.memory_gb,
        rails=inv.rails or max(gpus, 1),
        tier=Tier(inv.tier),
        price_per_gpu_hour=inv.price_per_gpu_hour,
        node_class=inv.node_class or "",
        storage_gb=inv.storage_gb,
        storage_gbps=inv.storage_gbps,
        price_per_vcpu_hour=inv.price_per_vcpu_hour,
        mig=inv.mig,
        mig_layout=tuple(inv.mig_layout),
    )


def check_inventory(inv: Inventory, pool_peer: Inventory | None) -> None:
    """Raise ``SpecError`` when an inventory contradicts itself or the other nodes of its pool
    (a pool is identical hardware)."""
    problems: list[SpecProblem] = []
    if inv.gpus and inv.gpu in ("", "none"):
        problems.append(
            SpecProblem("inventory.gpu", inv.gpu, "names no GPU model. To fix: e.g. H100")
        )
    island = inv.nvlink_island or inv.gpus
    if inv.gpus and inv.gpus % island:
        problems.append(
            SpecProblem(
                "inventory.nvlink_island",
                inv.nvlink_island,
                f"must divide the node's {inv.gpus} GPUs. To fix: use a divisor of {inv.gpus}",
            )
        )
    try:
        check_mig(inv.pool, inv.gpu, inv.gpu_memory_gb, inv.mig, inv.mig_layout)
    except ValueError as e:
        problems.append(SpecProblem("inventory.mig", inv.mig_layout or inv.mig, str(e)))
    if pool_peer is not None and pool_peer.name != inv.name:
        for field in HARDWARE:
            mine, theirs = getattr(inv, field), getattr(pool_peer, field)
            if mine != theirs:
                problems.append(
                    SpecProblem(
                        f"inventory.{field}",
                        mine,
                        f"differs from node {pool_peer.name} of pool {inv.pool} ({theirs}). "
                        "To fix: put different hardware in its own pool",
                    )
                )
    if problems:
        raise SpecError(f"node {inv.name}", problems)

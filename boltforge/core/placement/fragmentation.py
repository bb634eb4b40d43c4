"""How broken-up the free capacity is: free GPUs that large requests cannot use."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from boltforge.core.model.state import FleetState
from boltforge.core.model.topology import BoolArray


@dataclass(frozen=True, slots=True)
class Fragmentation:
    """Fragmentation of a fleet's free GPUs.

    ``index`` (the headline figure) is the share of free GPUs on hosts that are partly used, so
    no full-host request could take them: 0 when every free GPU sits on an empty host, 1 when no
    host is entirely free. ``rack_index`` is the same at rack level. ``largest_free_rack`` and
    ``largest_free_pod`` are the biggest runs of free GPUs inside one rack or pod.
    """

    free_gpus: int
    index: float
    rack_index: float
    largest_free_host: int
    largest_free_rack: int
    largest_free_pod: int


def measure(state: FleetState) -> Fragmentation:
    """Measure ``state`` (GPU hosts only; CPU-only hosts hold no GPUs and never count)."""
    tree = state.tree
    per_host = state.free_gpus_per_host()
    free = int(per_host.sum())
    gpu_hosts = tree.host_gpus > 0
    whole_hosts = gpu_hosts & (per_host == tree.host_gpus) & ~state.cordoned
    rack_free, pod_free = state.rack_free, state.pod_free
    rack_cap = np.append(tree.host_gpus, 0)[tree.rack_hosts].sum(axis=1)
    whole_racks = (rack_free == rack_cap) & (rack_cap > 0)
    if free == 0:
        return Fragmentation(0, 0.0, 0.0, 0, 0, 0)
    return Fragmentation(
        free_gpus=free,
        index=1.0 - float(per_host[whole_hosts].sum()) / free,
        rack_index=1.0 - float(rack_free[whole_racks].sum()) / free,
        largest_free_host=int(per_host.max()),
        largest_free_rack=int(rack_free.max()),
        largest_free_pod=int(pod_free.max()),
    )


def index_over(state: FleetState, hosts: BoolArray) -> float:
    """``Fragmentation.index`` counted over the hosts ``hosts`` selects only (one pool's,
    say): the share of their free GPUs that sit on partly used or cordoned hosts. 0 when
    they have no free GPU. ``index_over(state, all hosts)`` equals ``measure(state).index``."""
    per_host = state.free_gpus_per_host()
    free = int(per_host[hosts].sum())
    if free == 0:
        return 0.0
    tree = state.tree
    whole = hosts & (tree.host_gpus > 0) & (per_host == tree.host_gpus) & ~state.cordoned
    return 1.0 - float(per_host[whole].sum()) / free

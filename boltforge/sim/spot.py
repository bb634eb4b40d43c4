"""Spot reclaims in the simulator: when a spot pool's provider takes a host back.

Each host of a pool with a ``Reclaim`` process is reclaimed ``rate_per_host_day`` times per day
on average, independently of the others (a Poisson process per host, while the host is there).
A reclaim warns the host's jobs ``notice_s`` seconds ahead and takes the host at the end of
the notice; the host comes back ``back_after_s`` seconds after that.

A job on a reclaimed host whose checkpoint takes no longer than the notice writes one at once
and stops with every bit of its progress kept; any other job runs until the host goes and
keeps only its last periodic checkpoint. Either way it requeues, and its restart overhead
counts as lost as after any interruption.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from boltforge.core.model.topology import TopologyTree
from boltforge.spec.fleet import FleetSpec

DAY_S = 86400.0


@dataclass(frozen=True, slots=True)
class Reclaim:
    """One pool's reclaim process: rate per host per day, warning and absence in seconds."""

    rate_per_host_day: float
    notice_s: float = 120.0
    back_after_s: float = 7200.0


def reclaims_of(spec: FleetSpec) -> dict[str, Reclaim]:
    """The reclaim process of every pool of ``spec`` that has one, by pool name."""
    return {
        p.name: Reclaim(p.reclaim.rate_per_host_day, p.reclaim.notice, p.reclaim.back_after)
        for p in spec.pools
        if p.reclaim is not None and p.reclaim.rate_per_host_day > 0
    }


class ReclaimClock:
    """When each reclaiming pool next takes a host, and which host it takes.

    Per pool, reclaims arrive at ``rate_per_host_day * hosts`` per day and pick a host
    uniformly; the caller skips a pick that is already away, which leaves each present host a
    Poisson process of ``rate_per_host_day``. Each pool draws from its own generator seeded by
    ``(seed, pool index)``, so the same seed gives the same reclaims whatever else runs.
    """

    def __init__(self, tree: TopologyTree, reclaims: Mapping[str, Reclaim], seed: int) -> None:
        self.processes: dict[str, Reclaim] = {}
        self.hosts: dict[str, np.ndarray] = {}
        self.rngs: dict[str, np.random.Generator] = {}
        gpu_hosts = tree.host_gpus > 0
        for i, pool in enumerate(tree.pools):
            process = reclaims.get(pool.name)
            hosts = np.flatnonzero((tree.host_pool == i) & gpu_hosts)
            if process is None or process.rate_per_host_day <= 0 or hosts.size == 0:
                continue
            self.processes[pool.name] = process
            self.hosts[pool.name] = hosts
            self.rngs[pool.name] = np.random.default_rng([seed, 7919, i])

    def next_after(self, pool: str, now: float) -> float:
        """The time of ``pool``'s next reclaim after ``now``."""
        rate = self.processes[pool].rate_per_host_day * self.hosts[pool].size / DAY_S
        return now + float(self.rngs[pool].exponential(1.0 / rate))

    def pick(self, pool: str) -> int:
        """A host of ``pool``, uniformly."""
        hosts = self.hosts[pool]
        return int(hosts[int(self.rngs[pool].integers(hosts.size))])

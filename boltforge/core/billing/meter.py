"""The cost meter: GPU-hours and dollars a job held (allocated) and kept (productive).

A job's allocation history is a list of ``Stretch``es, one per stretch it held GPUs (an
allocation epoch, from bind to the moment its replicas were all gone). Over a time window
``[since, now]``:

- **allocated** GPU-seconds are ``gpus`` times the part of the stretch inside the window; an
  open stretch (the job still holds its GPUs) runs up to ``now``. Allocated dollars are the
  stretch's ``dollars_per_hour`` (its GPUs at their pools' prices) over the same time.
- **lost** is the part of an *interrupted* stretch after its last checkpoint: from the last
  checkpoint the job reported inside the stretch (or the stretch's start, when it reported
  none) to its end. A stretch is interrupted when it ended and the job did not end with it
  by succeeding or being cancelled: it was preempted, drained or moved, its node was lost,
  or the job failed. The next stretch resumes from that checkpoint, so that work is done
  again. Lost time is clipped to the window like allocated time.
- **productive** is allocated minus lost. An open stretch is productive so far: what it
  will lose is known only when it ends.

A stretch straddling the window's start counts pro rata: only its seconds inside the window.
So the meters of consecutive windows add up to the meter of their union, and the dollars of
every job add up to the GPU-hours of every pool times its price.

Dollars have one formula, shared by the server and the simulator: what grants hold is
counted per pool by ``held_by_pool`` (GPUs, a share of a GPU as its part of it, and vCPUs); a
stretch's ``dollars_per_hour`` is the sum over its pools of GPUs times the pool's price per
GPU-hour plus vCPUs times its price per vCPU-hour (``hourly_price``), and ``meter_stretch``
turns that into dollars over the time held. The server stores the rate on each run; the
simulator meters each segment it ends, pool by pool, with ``grant_dollars``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from boltforge.core.model.state import Grant
from boltforge.core.model.topology import TopologyTree

ENDS_CLEANLY = frozenset({"succeeded", "cancelled"})


@dataclass(frozen=True, slots=True)
class Stretch:
    """One allocation epoch of a job. ``ended_at`` is None while it holds its GPUs;
    ``checkpoint_at`` is the last checkpoint the job reported inside it (None: none);
    ``interrupted`` says whether its work since that checkpoint was lost; ``vcpus`` the CPUs
    it held (metered in vCPU-hours beside its GPUs). ``gpus`` counts parts of GPUs as their
    part (a MIG instance its compute slices of seven, a fraction its fraction)."""

    gpus: float
    dollars_per_hour: float
    started_at: float
    ended_at: float | None
    checkpoint_at: float | None = None
    interrupted: bool = False
    vcpus: float = 0.0


@dataclass(frozen=True, slots=True)
class Meter:
    """GPU-seconds, vCPU-seconds and dollars, allocated and productive (productive <=
    allocated)."""

    gpu_s: float = 0.0
    dollars: float = 0.0
    productive_gpu_s: float = 0.0
    productive_dollars: float = 0.0
    vcpu_s: float = 0.0
    productive_vcpu_s: float = 0.0

    def __add__(self, other: Meter) -> Meter:
        return Meter(
            self.gpu_s + other.gpu_s,
            self.dollars + other.dollars,
            self.productive_gpu_s + other.productive_gpu_s,
            self.productive_dollars + other.productive_dollars,
            self.vcpu_s + other.vcpu_s,
            self.productive_vcpu_s + other.productive_vcpu_s,
        )

    @property
    def vcpu_hours(self) -> float:
        return self.vcpu_s / 3600.0

    @property
    def productive_vcpu_hours(self) -> float:
        return self.productive_vcpu_s / 3600.0

    @property
    def gpu_hours(self) -> float:
        return self.gpu_s / 3600.0

    @property
    def productive_gpu_hours(self) -> float:
        return self.productive_gpu_s / 3600.0


def overlap(start: float, end: float, since: float, now: float) -> float:
    """Seconds of ``[start, end]`` inside ``[since, now]`` (0 when they do not meet)."""
    return max(min(end, now) - max(start, since), 0.0)


def meter_stretch(s: Stretch, since: float, now: float) -> Meter:
    """What ``s`` held and kept inside the window ``[since, now]`` (see the module's rules)."""
    end = s.ended_at if s.ended_at is not None else now
    held = overlap(s.started_at, end, since, now)
    lost = 0.0
    if s.interrupted and s.ended_at is not None:
        kept_until = min(max(s.checkpoint_at or s.started_at, s.started_at), end)
        lost = overlap(kept_until, end, since, now)
    kept = held - lost
    return Meter(
        s.gpus * held,
        s.dollars_per_hour * held / 3600.0,
        s.gpus * kept,
        s.dollars_per_hour * kept / 3600.0,
        s.vcpus * held,
        s.vcpus * kept,
    )


def meter_job(stretches: Iterable[Stretch], since: float, now: float) -> Meter:
    """The sum of ``meter_stretch`` over a job's stretches."""
    total = Meter()
    for s in stretches:
        total += meter_stretch(s, since, now)
    return total


def dollars_per_hour(gpus_by_pool: Mapping[str, float], prices: Mapping[str, float]) -> float:
    """What holding ``gpus_by_pool`` (pool -> GPUs) costs per hour at ``prices`` (pool -> dollars
    per GPU-hour); every pool held must have a price (``KeyError``). The same sum prices CPUs:
    pool -> vCPUs at dollars per vCPU-hour."""
    return sum(gpus * prices[pool] for pool, gpus in gpus_by_pool.items())


def pool_dollars(
    gpus_by_pool: Mapping[str, float],
    prices: Mapping[str, float],
    started_at: float,
    ended_at: float,
) -> dict[str, float]:
    """Dollars per pool for holding ``gpus_by_pool`` over ``[started_at, ended_at]``: each
    pool's GPUs metered as one stretch at that pool's price (``meter_stretch``). Their sum is
    the meter's dollars for one stretch holding all of them."""
    out = {}
    for pool, gpus in gpus_by_pool.items():
        rate = dollars_per_hour({pool: gpus}, prices)
        held = Stretch(gpus, rate, started_at, ended_at)
        out[pool] = meter_stretch(held, started_at, ended_at).dollars
    return out


def held_by_pool(
    tree: TopologyTree, grants: Iterable[Grant]
) -> tuple[dict[str, float], dict[str, float]]:
    """GPUs and vCPUs per pool name that ``grants`` hold, as they are priced: a share of a
    GPU counts its part of the GPU (``Share.weight``: a MIG instance's compute slices of
    seven, or its fraction). Quotas count differently (a share as one GPU, so shares never
    let a queue past its quota: ``core.cycle.gpus_by_pool``)."""
    gpus: dict[str, float] = {}
    cpus: dict[str, float] = {}
    pool_name = tree.host_lists.pool_name
    for g in grants:
        name = pool_name[g.host]
        cpus[name] = cpus.get(name, 0.0) + g.cpus
        gpus[name] = gpus.get(name, 0.0) + (len(g.gpus) if g.share is None else g.share.weight)
    return gpus, cpus


def hourly_price(tree: TopologyTree, grants: Iterable[Grant]) -> float:
    """What ``grants`` cost per hour: their GPUs at their pools' prices per GPU-hour plus
    their vCPUs at their pools' prices per vCPU-hour (``held_by_pool``)."""
    gpus, cpus = held_by_pool(tree, grants)
    return dollars_per_hour(gpus, _gpu_prices(tree)) + dollars_per_hour(cpus, _cpu_prices(tree))


def grant_dollars(
    tree: TopologyTree, grants: Iterable[Grant], started_at: float, ended_at: float
) -> dict[str, float]:
    """Dollars per pool for holding ``grants`` over ``[started_at, ended_at]``, GPUs and
    vCPUs at their pools' prices (``pool_dollars`` of each). Their sum is
    ``hourly_price`` over the same time."""
    gpus, cpus = held_by_pool(tree, grants)
    out = pool_dollars(gpus, _gpu_prices(tree), started_at, ended_at)
    for pool, dollars in pool_dollars(cpus, _cpu_prices(tree), started_at, ended_at).items():
        out[pool] = out.get(pool, 0.0) + dollars
    return out


def _gpu_prices(tree: TopologyTree) -> dict[str, float]:
    return {pool.name: pool.price_per_gpu_hour for pool in tree.pools}


def _cpu_prices(tree: TopologyTree) -> dict[str, float]:
    return {pool.name: pool.price_per_vcpu_hour for pool in tree.pools}


def interrupted(
    epoch: int,
    ended_at: float | None,
    job_epoch: int,
    job_state: str,
    job_finished_at: float | None,
) -> bool:
    """Whether the stretch of allocation ``epoch`` lost its work since its last checkpoint.

    It did unless it is open, or it is the job's last stretch and the job ended with it
    (``ended_at`` at or after the job's finish) by succeeding or being cancelled. A stretch
    that ended before a cancellation (the job was waiting to resume) was interrupted.
    """
    if ended_at is None:
        return False
    ended_job = (
        epoch == job_epoch
        and job_state in ENDS_CLEANLY
        and job_finished_at is not None
        and ended_at >= job_finished_at
    )
    return not ended_job


def last_checkpoint(
    stored: float | None, latest: float | None, started_at: float, ended_at: float | None
) -> float | None:
    """A stretch's last checkpoint: the one stored when it ended (``stored``), or the job's
    latest checkpoint (``latest``) when that falls inside the stretch, whichever is later."""
    inside = (
        latest
        if latest is not None and latest >= started_at and (ended_at is None or latest <= ended_at)
        else None
    )
    found = [t for t in (stored, inside) if t is not None]
    return max(found) if found else None

"""The node-side rules every backend follows (pure, no I/O): which replicas to start and
stop so a node matches its desired state (``plan``), and what a node reports for a replica
told to stop before it ever started there (``never_started``)."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Set
from dataclasses import dataclass, field

from boltforge.wire.agent import ReplicaEvent, ReplicaSpec

NEVER_STARTED = "stopped before it started"


@dataclass(frozen=True, slots=True)
class ConvergePlan:
    """``start``: specs to launch. ``stop``: replica names to stop, each with the grace the
    desired state gives it (None: the grace of the spec it was started with). ``skip``:
    replicas told to stop before this node ever ran them (each reported once, with
    ``never_started``, and never run)."""

    start: list[ReplicaSpec] = field(default_factory=list)
    stop: dict[str, float | None] = field(default_factory=dict)
    skip: list[ReplicaSpec] = field(default_factory=list)


def plan(
    desired: Iterable[ReplicaSpec],
    live: Mapping[str, int],
    finished: set[tuple[str, int]],
    busy: Set[int] = frozenset(),
) -> ConvergePlan:
    """Compare the desired replicas with ``live`` (replica name -> epoch of the process the
    agent has) and ``finished`` (``(replica, epoch)`` pairs already run to exit or failed).
    ``busy``: the GPUs the node's live processes still hold; a replica needing any of them
    starts on a later call, once they were freed (a GPU never runs two processes).

    - ``run`` at the live epoch: nothing. At another epoch: stop the live one first; the new
      one starts on a later call, once the old has exited. Never started, and not finished
      at that epoch: start. Finished at that epoch: nothing (a replica runs once per epoch).
    - ``stop``: stop the live replica unless it runs a newer epoch than the stop names. With
      no live replica and that epoch never run here: skip it (the server hears it ended).
    - A live replica the desired state does not list: stop.

    Idempotent: calling it again before anything changed gives the same plan; the caller
    ignores stops of replicas already stopping.
    """
    out = ConvergePlan()
    named: set[str] = set()
    starting: set[str] = set()
    for spec in desired:
        named.add(spec.replica)
        epoch = live.get(spec.replica)
        if spec.action == "stop":
            if epoch is not None and epoch <= spec.epoch:
                out.stop[spec.replica] = spec.grace_s
            elif epoch is None and (spec.replica, spec.epoch) not in finished:
                out.skip.append(spec)
        elif epoch is not None:
            if epoch != spec.epoch:
                out.stop[spec.replica] = None
        elif (spec.replica, spec.epoch) not in finished and spec.replica not in starting:
            if busy.isdisjoint(spec.gpus):
                out.start.append(spec)
            starting.add(spec.replica)
    for name in live:
        if name not in named:
            out.stop[name] = None
    return out


def never_started(replica: str, job: str, epoch: int, at: float | None = None) -> ReplicaEvent:
    """The report of ``replica`` (of ``job``'s ``epoch``) told to stop before its node ever
    started it: ``exited`` with no exit code and no signal (nothing ran), ``detail``
    ``NEVER_STARTED``. Its node sends it once per (replica, epoch) and never starts that
    epoch afterwards; the server then counts the replica as stopped, its GPUs free.
    ``at``: when (default: now)."""
    when = time.time() if at is None else at
    return ReplicaEvent(
        replica=replica, job=job, epoch=epoch, kind="exited", at=when, detail=NEVER_STARTED
    )

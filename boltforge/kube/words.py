"""Why a pod waits, in the words Kubernetes users and their autoscalers read: the reason and
message of its ``PodScheduled=False`` condition and its ``FailedScheduling`` events.

The cluster autoscaler and Karpenter add nodes for a pending pod whose ``PodScheduled``
condition has reason ``Unschedulable``. Kueue, the reference for queueing on Kubernetes,
keeps the pods it queues behind a scheduling gate (``kueue.x-k8s.io/admission``) until their
workload is admitted, so they carry ``SchedulingGated``, never ``Unschedulable``. Boltforge's
pods already exist ungated, so it writes a reason of its own for the pods it only queues:

- ``SchedulerQueued``: submitted and waiting its turn (quota, fair share, priority, the
  gangs ahead, the room to free): more nodes are not what it waits for, or not only;
- ``Unschedulable``: no node could ever run it as asked (more GPUs than any node has, no
  node its selectors, affinity and tolerations allow, or the core says it can never run on
  this fleet): a node of another shape could help, which is what autoscalers act on;
- ``GangIncomplete``, ``PodGroupCRDMissing``, ``SchedulerRefused``, ``EvictionBlocked``:
  waiting for its gang, the PodGroup CRD, a fix to its spec, a disruption budget.

A condition is rewritten only when its reason or the shape of its message changes (numbers
aside: the counts in a message move with the queue and would rewrite every waiting pod on
every pass); the message never carries the place in line. Events are rate-limited per pod
(``Told``)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from boltforge.kube.gangs import PodGang

QUEUED = "SchedulerQueued"
UNSCHEDULABLE = "Unschedulable"
REFUSED = "SchedulerRefused"
GANG_INCOMPLETE = "GangIncomplete"
CRD_MISSING = "PodGroupCRDMissing"
EVICTION_BLOCKED = "EvictionBlocked"
EVENT_EVERY_S = 60.0  # at most one FailedScheduling event per pod this often
_NEVER = ("can never run", "could never run", "can never start")


def pending(summary: Any) -> tuple[str, str]:
    """The words of a submitted gang whose job is pending: queued, unless the core says it
    can never run on this fleet."""
    why = summary.reason or "next pass"
    reason = UNSCHEDULABLE if any(w in why for w in _NEVER) else QUEUED
    return f"boltforge: waiting: {why}", reason


def refused(text: str, fits_nowhere: bool) -> tuple[str, str]:
    """The words of a gang Boltforge refused: ``Unschedulable`` when no node could run it,
    or when the server says the fleet never could (a gang larger than the fleet: more nodes
    would help, which is what autoscalers act on)."""
    never = fits_nowhere or any(w in text for w in _NEVER)
    return f"boltforge: refused: {text}", UNSCHEDULABLE if never else REFUSED


def blocked(evictions: Mapping[str, str]) -> tuple[str, str]:
    """The words of a placed gang waiting for victims whose evictions are blocked."""
    victims = "; ".join(f"job {j}: {w}" for j, w in sorted(evictions.items())[:2])
    return (
        f"boltforge: placed, waiting for room: evicting the gangs it displaces is blocked "
        f"({victims}); those pods are not evicted until their budgets allow it",
        EVICTION_BLOCKED,
    )


def ended(job: str, state: str) -> tuple[str, str]:
    """The words of pods left waiting by a job that ended (cancelled in Boltforge): only new
    pods run the gang again."""
    return (
        f"boltforge: its Boltforge job {job} is {state}; these pods are not placed again. "
        "To fix: delete them, or recreate them (their controller does) to run the gang again",
        REFUSED,
    )


def incomplete(gang: PodGang) -> tuple[str, str]:
    why = gang.not_ready()
    return (f"boltforge: {why}", GANG_INCOMPLETE) if why else ("", "")


def shape(reason: str, text: str) -> str:
    """What decides whether a condition is rewritten: its reason and its message with the
    numbers taken out."""
    return f"{reason}|{re.sub(r'[0-9]+', '#', text)}"


@dataclass
class Told:
    """What each pod (by uid) was last told, and when its last event went."""

    said: dict[str, str] = field(default_factory=dict)  # uid -> ``shape`` of its condition
    evented: dict[str, float] = field(default_factory=dict)  # uid -> when

    def tell(self, uid: str, reason: str, text: str, now: float) -> tuple[bool, bool]:
        """Whether to write the condition (its shape changed) and an event (it changed and
        the pod's last event is ``EVENT_EVERY_S`` old)."""
        key = shape(reason, text)
        if self.said.get(uid) == key:
            return False, False
        self.said[uid] = key
        last = self.evented.get(uid)
        event = last is None or now - last >= EVENT_EVERY_S
        if event:
            self.evented[uid] = now
        return True, event

    def forget(self, keep: set[str]) -> None:
        """Forget the pods not in ``keep`` (uids)."""
        for table in (self.said, self.evented):
            for uid in [u for u in table if u not in keep]:
                del table[uid]

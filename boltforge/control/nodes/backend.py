"""The seam between the control plane and whatever runs the replicas.

A backend is where jobs' processes live: Boltforge's own agents (the native backend), or a
Slurm controller, or a Kubernetes API server. The control plane talks to every backend the
same way, through three things:

**Intent, in the store.** Every decision is written before anything is acted on: a replica
row in ``starting`` means "run this on that node" (``actuate.bind`` wrote it ``waiting``;
``dispatch`` moves a gang to ``starting`` once its GPUs are free), ``stopping`` means "send
the checkpoint signal now, and kill after the replica's grace"; the replica's spec carries
the command, environment, GPUs and grace. Those two states are set, and the node marked
changed, in one place only (``control/scheduling/intent.py``: ``start``, ``stop``,
``changed``; a test holds every other module to it). A backend never decides; it carries
out the intent the store holds.

**The four things the control plane asks, all as intent.** A *start* is a gang's replicas
moved to ``starting`` together, once no leaving replica holds their GPUs. A *stop* is
``stopping`` with the replica's grace: the checkpoint signal now, a kill after the grace.
A *cancel* is a stop of every replica the job holds (``control/jobs/cancel.py``). A *resize* of
an elastic job (grown into free GPUs, or shrunk for a more important job) is a stop of the
epoch it runs and a start of the next one on more or fewer GPUs, bound at once so nothing
takes its GPUs in between (``actuate.resize``): the job restarts from the checkpoint its
stop wrote, as torchrun's elastic agent restarts its workers on a membership change. A
backend that can change a running gang's size natively may do so for a stop and a start
of the same job at once; the store's intent is the same.

**Launch: ``Backend.launcher``.** How a gang's ranks rendezvous and whether the scheduler's
GPU indices bind the node are the backend's choice (``control/nodes/launch.py``); the native
backend speaks torchrun's static rendezvous on the indices the scheduler counted.

**Actuation: ``Backend.converge(nodes)``.** Called after every commit that changed the
intent for some nodes (the ``Touched.nodes`` of a pass, a report, a cancel, an admin
action), outside any transaction and without the scheduler's lock. The backend makes those
nodes converge on their intent: start what is ``starting``, signal what is ``stopping``.
It must be quick and must not raise (it queues work for its own threads if acting is
slow), and it must be idempotent: it may be called again for a node whose intent did not
change, and a server that restarts calls it for every node. The native backend wakes the
node's agent, which long-polls its desired state (``GET /v1/agents/{node}/desired``) and
converges by itself.

**The state feed: ``control.feed.Feed``.** What the backend observes comes back through one object:
``register`` (a node and its inventory, and the replicas it still runs), ``heartbeat``
(the node is alive; its lease is renewed), ``report`` (replica started, exited or failed;
log chunks; progress and checkpoints). Each is applied in a group commit with its
neighbours (``control/store/batch.py``); a start wakes no pass, an exit or a node change asks
the loop for one. The native backend's feed is the agent protocol's HTTP endpoints.

Inventory is the first call of the feed: a node exists for the scheduler once it
registered, and is lost when its lease runs out (``agents.expire``) or its backend says so.
Nothing in ``core/`` knows which backend runs a job.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from boltforge.control.nodes.launch import Launcher, TorchrunLauncher
from boltforge.control.notify import Notifier


class Backend(Protocol):
    """Where replicas run (see the module docstring for the contract)."""

    name: str
    launcher: Launcher

    def converge(self, nodes: Iterable[str]) -> None:
        """After a commit: make ``nodes`` carry out the intent the store now holds for
        them. Quick, idempotent, never raises."""
        ...


class NativeBackend:
    """Boltforge's own agents: each long-polls its node's desired state, so converging is
    waking that long-poll."""

    name = "native"

    def __init__(self, notifier: Notifier) -> None:
        self.notifier = notifier
        self.launcher: Launcher = TorchrunLauncher()

    def converge(self, nodes: Iterable[str]) -> None:
        self.notifier.notify(f"node:{n}" for n in nodes)

"""Kubernetes Nodes as the server's nodes: each Ready node registered over the agent
protocol with its inventory, and again whenever that inventory changes (the device plugin's
GPUs, GPU feature discovery's and the admin's labels often arrive after the node is Ready); a
node that is not Ready let go; a node cordoned in Boltforge while it is unschedulable or has
a taint none of the scheduler's live pods tolerates; and, for the pass's gangs, which nodes
(``fit.Fitter``) they may use."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping

from boltforge.agent.client import Refused, ServerClient
from boltforge.client import Client
from boltforge.kube.fit import Fitter
from boltforge.kube.gangs import GangKey, PodGang
from boltforge.kube.model import KubeNode
from boltforge.kube.state import SchedulerState
from boltforge.kube.taints import Toleration, blocking
from boltforge.kube.translate import NO_GPUS, Labels, changes, cordoned, inventory, tolerations
from boltforge.wire.agent import Inventory, Registration

log = logging.getLogger("boltforge.kube")


class NodeSync:
    """Registers, lets go of and cordons the nodes (``sync``), for one scheduler. The
    tolerations ``labels.tolerated`` names are taken as every pod's."""

    def __init__(self, agents: ServerClient, api: Client, labels: Labels) -> None:
        self.agents, self.api, self.labels = agents, api, labels
        self.tols = tolerations(labels)
        self.tainted: set[str] = set()  # nodes with taints that keep some pods off
        self.pod_tols: frozenset[Toleration] = frozenset()  # of the scheduler's live pods

    def taints_of(self, nodes: Mapping[str, KubeNode]) -> None:
        """Note which nodes have taints that keep some pods off (after the nodes changed)."""
        self.tainted = {n for n, node in nodes.items() if blocking(node.taints, self.tols)}

    def tolerations_of(
        self, all_gangs: Mapping[GangKey, PodGang], changed: set[str] | None
    ) -> set[str] | None:
        """Keep the tolerations of the scheduler's live pods (waiting or running) current,
        while some node is tainted; when they changed, the tainted nodes are added to the
        nodes that ``changed`` (their cordon depends on them)."""
        tols: frozenset[Toleration] = frozenset()
        if self.tainted:
            tols = frozenset(
                t
                for g in all_gangs.values()
                for p in g.members.values()
                if not p.finished and not p.deleting
                for t in p.tolerations
            )
        moved = tols != self.pod_tols
        self.pod_tols = tols
        return changed | self.tainted if moved and changed is not None else changed

    async def sync(
        self, state: SchedulerState, nodes: Mapping[str, KubeNode], changed: set[str] | None
    ) -> None:
        """Register the Ready nodes without a lease or whose inventory changed, let the rest
        go, and cordon or uncordon: every node, or those that ``changed`` and those whose
        lease was dropped. A node the server refuses is logged and skipped."""
        names = sorted(
            set(nodes) | set(state.leases) if changed is None else changed | state.unleased
        )
        state.unleased = set()
        for name in [n for n in names if n in state.leases and not _ready(nodes.get(n))]:
            del state.leases[name]
            log.warning("node %s is not Ready: letting its lease run out", name)
        sem = asyncio.Semaphore(64)

        async def register(node: KubeNode, inv: Inventory) -> None:
            async with sem:
                await self._register(state, node, inv)

        await asyncio.gather(*(register(n, inv) for n, inv in self._due(state, nodes, names)))
        for name in names:
            if name in nodes:
                await self._cordon(state, nodes[name])

    def _due(
        self, state: SchedulerState, nodes: Mapping[str, KubeNode], names: list[str]
    ) -> list[tuple[KubeNode, Inventory]]:
        """The Ready nodes of ``names`` to register: those without a lease, and those whose
        inventory changed since it was registered."""
        due = []
        for name in names:
            node = nodes.get(name)
            if node is None or not node.ready:
                continue
            inv = inventory(node, self.labels)
            if name not in state.leases or state.registered.get(name) != inv:
                due.append((node, inv))
        return due

    async def _register(self, state: SchedulerState, node: KubeNode, inv: Inventory) -> None:
        was = state.registered.get(node.name)
        if node.name in state.leases and was is not None:
            log.info("node %s changed (%s): registering it again", node.name, changes(was, inv))
        reg = Registration(inventory=inv, running=state.statuses(node.name), agent_version="k8s")
        try:
            state.leases[node.name] = await self.agents.register(reg)
        except Refused as e:
            state.refused_nodes[node.name] = "; ".join([e.error, *e.problems])
            log.warning("node %s: the server refused it: %s", node.name, e)
            return
        state.registered[node.name] = inv
        state.refused_nodes.pop(node.name, None)
        if not inv.gpus:
            log.warning("node %s: %s", node.name, NO_GPUS)

    async def _cordon(self, state: SchedulerState, node: KubeNode) -> None:
        blocked = cordoned(node, self.labels, self.pod_tols)
        if blocked and node.name not in state.cordoned and node.name in state.leases:
            await asyncio.to_thread(self.api.cordon, node.name)
            state.cordoned.add(node.name)
        elif not blocked and node.name in state.cordoned:
            await asyncio.to_thread(self.api.uncordon, node.name)
            state.cordoned.discard(node.name)

    def fitter(self, state: SchedulerState, nodes: Mapping[str, KubeNode]) -> Fitter:
        """Which nodes gangs may use: the registered nodes, but those unschedulable (a node
        cordoned for its taints counts: a pod that tolerates them may go there, and it is
        uncordoned while one lives)."""
        pool_of = {
            n: inv.pool
            for n, inv in state.registered.items()
            if n in state.leases and n in nodes and not nodes[n].unschedulable
        }
        return Fitter(nodes, pool_of, self.tols, self.labels.pool)


def _ready(node: KubeNode | None) -> bool:
    return node is not None and node.ready

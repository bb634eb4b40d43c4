"""A Kubernetes scheduler wired to in-memory collaborators, for tests that drive it pass by
pass: the informers' caches are set by the test (no API server), its writes are recorded,
the agent protocol and the job API are fakes, its clock is the test's, and what it does
beside a pass (heartbeats, reports, words) is finished before the pass counts as done."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from concurrent.futures import Future
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, cast

import kubernetes.client as client
import pytest
from kube_unit_kit import Clock, FakeAgents, FakeJobs, FakeWrites, Inline, kgroup, knode, kpod

from boltforge.kube import scheduler as scheduler_module
from boltforge.kube.informer import Informer
from boltforge.kube.model import Budget, KubeNode, KubePod, PodGroup, PriorityClass
from boltforge.kube.scheduler import KubeScheduler, Options
from boltforge.wire.agent import ReplicaSpec


@dataclass
class Rig:
    sched: KubeScheduler
    agents: FakeAgents
    jobs: FakeJobs
    writes: FakeWrites
    clock: Clock
    pods: dict[str, KubePod] = field(default_factory=dict)

    def nodes(self, *nodes: KubeNode) -> None:
        cache(self.sched.nodes, {n.name: n for n in nodes})

    def put(self, *pods: KubePod) -> None:
        """Pods as the informer sees them now (replacing any of the same name)."""
        for p in pods:
            self.pods[f"{p.namespace}/{p.name}"] = p
        cache(self.sched.pods, dict(self.pods))

    def drop(self, *names: str, namespace: str = "research") -> None:
        for name in names:
            self.pods.pop(f"{namespace}/{name}", None)
        cache(self.sched.pods, dict(self.pods))

    def groups(self, *groups: PodGroup) -> None:
        cache(self.sched.groups, {f"{g.namespace}/{g.name}": g for g in groups})

    def classes(self, *classes: PriorityClass) -> None:
        cache(self.sched.classes, {c.name: c for c in classes})

    def budgets(self, *budgets: Budget) -> None:
        cache(self.sched.budgets, {f"{b.namespace}/{b.name}": b for b in budgets})

    def gang(self, name: str, size: int, *, gpus: int = 8, **kw: Any) -> list[KubePod]:
        """A PodGroup ``name`` of ``size`` pods (``name-0`` ...), all waiting."""
        pods = [kpod(f"{name}-{i}", group=name, gpus=gpus, **kw) for i in range(size)]
        self.put(*pods)
        groups = dict(self.sched.groups.items)
        groups[f"research/{name}"] = kgroup(name, size)
        cache(self.sched.groups, groups)
        return pods

    def wants(self, node: str, *specs: ReplicaSpec) -> None:
        """The server's desired state for ``node`` now holds ``specs`` too."""
        desired = self.sched.state.desired
        desired.put(node, [*desired.nodes.get(node, []), *specs])

    def clear(self) -> None:
        self.sched.state.desired.clear()

    def passes(self, n: int = 1, *, every_s: float = 0.0) -> None:
        """``n`` passes, ``every_s`` apart by the scheduler's clock, each with the work it
        started beside it finished."""

        async def go() -> None:
            for _ in range(n):
                await self.sched.step()
                beside = [t for t in self.sched._beside.values() if not t.done()]
                await asyncio.gather(*beside)
                self.clock.advance(every_s)

        asyncio.run(go())

    def lead(self) -> None:
        """What the scheduler does when it starts leading: adopt the bound pods."""
        self.sched._take_over()

    def job_of(self, gang: str) -> str:
        return next(j for k, j in self.sched.state.job_of.items() if k.name == gang)


def rig(monkeypatch: pytest.MonkeyPatch, options: Options | None = None) -> Rig:
    clock = Clock()
    monkeypatch.setattr(scheduler_module, "time", SimpleNamespace(monotonic=clock))
    agents, jobs, writes = FakeAgents(), FakeJobs(), FakeWrites()
    kube = client.ApiClient(client.Configuration())  # never called: the writes are fakes
    sched = KubeScheduler(kube, cast(Any, agents), cast(Any, jobs), "sched-a", options)
    sched.writes = cast(Any, writes)
    sched._pool.shutdown()
    sched._pool = cast(Any, InlinePool())
    sched._words_pool = cast(Any, Inline())
    for inf in sched.informers:
        cache(inf, {})
    return Rig(sched, agents, jobs, writes, clock)


def cache(informer: Informer[Any], items: dict[str, Any]) -> None:
    """Set ``informer``'s cache to ``items`` as its watch would have: the keys whose object
    was added, replaced or removed count as changed."""
    with informer.lock:
        old, informer.items = informer.items, items
        if informer._changed is not None:
            informer._changed |= {
                k for k in old.keys() | items.keys() if old.get(k) is not items.get(k)
            }


class InlinePool:
    """``run_in_executor``'s executor, run at once (bindings and evictions in order)."""

    def submit(self, fn: Any, *args: Any) -> Any:
        future: Future[Any] = Future()
        future.set_result(fn(*args))
        return future

    def shutdown(self, wait: bool = True, cancel_futures: bool = False) -> None:
        pass


def racks(*layout: tuple[str, Iterable[str]]) -> list[KubeNode]:
    """Ready 8-GPU nodes: ``("r1", ["n1", "n2"])`` puts n1 and n2 in rack r1."""
    return [knode(n, rack=r) for r, names in layout for n in names]

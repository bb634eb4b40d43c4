"""Everything one fake API server holds: the store, the request log, the kubelet emulation
and the disruption controller, and the knobs tests turn. The methods tests call are
thread-safe; ``run`` is the background work on the server's event loop."""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass

from boltforge.testing.kubeapi import verbs
from boltforge.testing.kubeapi.budgets import Budgets
from boltforge.testing.kubeapi.knobs import RequestLog
from boltforge.testing.kubeapi.kubelet import Kubelet
from boltforge.testing.kubeapi.pods import SYSTEM_PRIORITY_CLASSES
from boltforge.testing.kubeapi.resources import PRIORITY_CLASSES
from boltforge.testing.kubeapi.store import Store
from boltforge.testing.kubeapi.watch import DROP, END


@dataclass(frozen=True)
class Settings:
    """``log_size``: changes kept for watches to resume from; ``bookmark_interval_s``: how
    often a watch that allows bookmarks gets one."""

    kubelet: bool = True
    kubelet_start_delay_s: float = 0.0
    kubelet_grace_cap_s: float = 0.2
    log_size: int = 10_000
    bookmark_interval_s: float = 2.0


class Cluster:
    """The state behind the HTTP app, seeded with namespaces ``default`` and
    ``kube-system`` and the two system PriorityClasses."""

    def __init__(self, settings: Settings | None = None) -> None:
        self.settings = settings or Settings()
        self.store = Store(self.settings.log_size)
        self.requests = RequestLog()
        self.kubelet = Kubelet(
            self.store,
            self.settings.kubelet,
            self.settings.kubelet_start_delay_s,
            self.settings.kubelet_grace_cap_s,
        )
        self.budgets = Budgets(self.store)
        self.store.listen(self.kubelet.observe)
        self.store.listen(self.budgets.observe)
        self._seed()

    def _seed(self) -> None:
        for ns in ("default", "kube-system"):
            verbs.ensure_namespace(self.store, ns)
        for name, value in SYSTEM_PRIORITY_CLASSES.items():
            body = {"metadata": {"name": name}, "value": value, "description": "system"}
            verbs.create(self.store, PRIORITY_CLASSES, "", body)

    async def run(self) -> None:
        """Background work, until cancelled: kubelet timers, the disruption controller."""
        self.kubelet.attach(asyncio.get_running_loop())
        while True:
            await asyncio.sleep(self.budgets.interval_s)
            self.budgets.sync()

    def drop_watches(self, abrupt: bool = True) -> int:
        """Close every open watch: ``abrupt`` cuts the connection mid-stream (the client
        sees a broken chunked response); otherwise the stream ends cleanly, as at a watch
        timeout. The number of watches closed."""
        subscribers = self.store.subscribers()
        for sub in subscribers:
            sub.offer(DROP if abrupt else END)
        return len(subscribers)

    def compact(self) -> int:
        """Forget the history: a watch from any version before now gets 410 Expired."""
        return self.store.compact()

    def set_kubelet(self, on: bool) -> None:
        self.kubelet.enable(on)

    def fail_next(
        self,
        verb: str,
        resource: str,
        status: int,
        times: int = 1,
        retry_after_s: int | None = None,
    ) -> None:
        self.requests.fail_next(verb, resource, status, times, retry_after_s)

    def counts(self) -> Counter[tuple[str, str]]:
        return self.requests.counts()

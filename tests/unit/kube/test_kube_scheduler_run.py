"""The scheduler's loop from the start: it lists every kind it needs (the scheduler's own
pods only, and the nodes ``--node-selector`` picks), waits until all are listed, adopts the
pods already bound, and passes; cancelled, it stops its informers and its work beside.
The informers' list and watch calls are answered in memory (the API server's side of
them is in test_kube_informer.py)."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from kube_sched_rig import Rig, rig
from kube_unit_kit import raw_pod

from boltforge.kube.informer import Informer
from boltforge.kube.scheduler import Options
from boltforge.testing.kube_builders import node_json, pod_group_json, priority_class_json

WAIT_S = 10.0


class Quiet:
    """A watch on which nothing happens until its socket is shut down (``shutdown``, as
    urllib3's response has it) or it is closed."""

    def __init__(self) -> None:
        self.closed = threading.Event()

    def stream(self, amt: Any = None, decode_content: bool = False) -> Iterator[bytes]:
        self.closed.wait(WAIT_S)
        yield b""

    def release_conn(self) -> None:
        pass

    def close(self) -> None:
        self.closed.set()

    def shutdown(self) -> None:
        self.closed.set()


class Kind:
    """One kind's list (``items``) and a quiet watch after it; records each call."""

    def __init__(self, inf: Informer[Any], items: list[dict[str, Any]]) -> None:
        self.inf, self.items = inf, items
        self.calls: list[dict[str, Any]] = []
        inf.lister = self

    def __call__(self, **kw: Any) -> Any:
        self.calls.append(kw)
        if not kw.get("watch"):
            body = {"metadata": {"resourceVersion": "1"}, "items": self.items}
            return type("Listed", (), {"data": json.dumps(body).encode()})()
        quiet = Quiet()
        if self.inf._stop.is_set():
            quiet.close()
        return quiet


def cluster(r: Rig) -> dict[str, Kind]:
    """Two nodes, a two-pod gang (one pod already bound to a replica), a priority class."""
    bound = raw_pod("w0", node="n1", phase="Running", replica="j-4.1.0", job="j-4", group="g")
    return {
        "nodes": Kind(r.sched.nodes, [node_json("n1"), node_json("n2")]),
        "pods": Kind(r.sched.pods, [bound, raw_pod("solo")]),
        "podgroups": Kind(r.sched.groups, [pod_group_json("g", 1)]),
        "jobs": Kind(r.sched.jobs, []),
        "priorityclasses": Kind(r.sched.classes, [priority_class_json("high", 1_000_000)]),
        "poddisruptionbudgets": Kind(r.sched.budgets, []),
    }


def run_until(r: Rig, done: threading.Event) -> None:
    """Run the scheduler until ``done``, then cancel it."""

    async def go() -> None:
        task = asyncio.create_task(r.sched.run())
        assert await asyncio.to_thread(done.wait, WAIT_S), "the scheduler did not get there"
        # On Python 3.11 a cancel that meets the loop's wake-up is swallowed by
        # asyncio.wait_for (see the report): cancel until it ends.
        for _ in range(200):
            task.cancel()
            finished, _ = await asyncio.wait([task], timeout=0.05)
            if finished:
                break
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(go())


def submitting(r: Rig) -> threading.Event:
    """Set once the scheduler submits a gang."""
    done = threading.Event()
    submit = r.jobs.submit

    def spy(*args: Any) -> Any:
        try:
            return submit(*args)
        finally:
            done.set()

    r.jobs.submit = spy  # type: ignore[method-assign,assignment]
    return done


def test_it_lists_every_kind_adopts_the_bound_pods_and_passes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    r = rig(monkeypatch)
    kinds = cluster(r)
    run_until(r, submitting(r))
    assert [s.inventory.name for s in r.agents.registered] == ["n1", "n2"]
    (n1,) = [s for s in r.agents.registered if s.inventory.name == "n1"]
    assert [s.replica for s in n1.running] == ["j-4.1.0"]  # adopted before the first pass
    ((spec, source, _),) = r.jobs.submitted
    assert source == "kubernetes gang research/solo" and spec["name"] == "research-solo"
    for kind in kinds.values():
        assert kind.calls[0].get("watch") is None  # listed first
        assert kind.inf.synced.is_set()


def test_it_watches_only_its_own_pods_and_the_nodes_it_is_given(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    r = rig(monkeypatch, Options(scheduler_name="gangs", node_selector="pool=gpu"))
    kinds = cluster(r)
    run_until(r, submitting(r))
    assert kinds["pods"].calls[0]["field_selector"] == "spec.schedulerName=gangs"
    assert kinds["nodes"].calls[0]["label_selector"] == "pool=gpu"
    for name in ("podgroups", "jobs", "priorityclasses", "poddisruptionbudgets"):
        assert "label_selector" not in kinds[name].calls[0]
        assert "field_selector" not in kinds[name].calls[0]


def test_cancelled_it_stops_its_informers(monkeypatch: pytest.MonkeyPatch) -> None:
    r = rig(monkeypatch)
    kinds = cluster(r)
    threads: list[threading.Thread] = []
    for kind in kinds.values():
        start = kind.inf.start

        def started(start: Any = start) -> threading.Thread:
            thread: threading.Thread = start()
            threads.append(thread)
            return thread

        kind.inf.start = started  # type: ignore[method-assign]
    run_until(r, submitting(r))
    for thread in threads:
        thread.join(WAIT_S)
    assert len(threads) == 6 and not any(t.is_alive() for t in threads)

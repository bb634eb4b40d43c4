"""The informers' contract (list once, then watch from the list's version; a watch that ends
or drops resumes from the last version seen; 410 Gone lists again; errors back off from
0.2 s to 10 s), first against a scripted lister that answers call by call, then against the
test suite's API server through the real client."""

from __future__ import annotations

import functools
import json
import threading
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

import kubernetes.client as client
import pytest
from kube_unit_kit import serve_kube
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import ProtocolError

from boltforge.agent.client import Backoff
from boltforge.kube import informer as informer_module
from boltforge.kube import model
from boltforge.kube.informer import Informer
from boltforge.testing.kube_builders import pod_json
from boltforge.testing.kubeapi import ApiServer

WAIT_S = 10.0


def obj(name: str, rv: int, namespace: str | None = "ns", **extra: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "resourceVersion": str(rv), **extra}
    if namespace:
        meta["namespace"] = namespace
    return {"metadata": meta}


def event(kind: str, o: dict[str, Any]) -> dict[str, Any]:
    return {"type": kind, "object": o}


def error(code: int, message: str = "") -> dict[str, Any]:
    return {"type": "ERROR", "object": {"kind": "Status", "code": code, "message": message}}


class Listed:
    """A list response (``_preload_content=False``): its raw JSON body."""

    def __init__(self, items: list[dict[str, Any]], rv: int) -> None:
        body = {"metadata": {"resourceVersion": str(rv)}, "items": items}
        self.data = json.dumps(body).encode()


class Stream:
    """A watch response: one JSON event per line, then its end (or ``fail``)."""

    def __init__(
        self, *events: dict[str, Any], fail: Exception | None = None, raw: str = ""
    ) -> None:
        self.body = "".join(json.dumps(e) + "\n" for e in events) + raw
        self.fail = fail
        self.released = self.closed = False
        self.data = json.dumps({"metadata": {"resourceVersion": "0"}, "items": []}).encode()

    def stream(self, amt: Any = None, decode_content: bool = False) -> Iterator[bytes]:
        # Split mid-line, as chunks arrive: a line must not be applied before it is whole.
        half = len(self.body) // 2
        yield self.body[:half].encode()
        yield self.body[half:].encode()
        if self.fail is not None:
            raise self.fail

    def release_conn(self) -> None:
        self.released = True

    def close(self) -> None:
        self.closed = True


class Script:
    """A lister that answers each call with the next answer (raising it if it is an
    exception); when the answers run out it stops the informer."""

    def __init__(self, *answers: Any) -> None:
        self.answers = list(answers)
        self.calls: list[dict[str, Any]] = []
        self.informer: Informer[Any] | None = None

    def __call__(self, **kwargs: Any) -> Any:
        self.calls.append(kwargs)
        if not self.answers:
            assert self.informer is not None
            self.informer.stop()
            return Stream()
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    def versions(self) -> list[str | None]:
        """The version each watch asked for ("list" for a list)."""
        return [c["resource_version"] if c.get("watch") else "list" for c in self.calls]


class Delays(Backoff):
    """The real backoff, recording each delay it hands out, with ``gate`` to hold the
    informer inside its wait; the informer waits 0 s instead (no test sleeps)."""

    made: ClassVar[list[Delays]] = []

    def __init__(self) -> None:
        super().__init__()
        self.delays: list[float] = []
        self.resets = 0
        self.entered = threading.Event()
        self.gate = threading.Event()
        self.gate.set()
        Delays.made.append(self)

    def next(self) -> float:
        self.delays.append(super().next())
        self.entered.set()
        self.gate.wait(WAIT_S)
        return 0.0

    def reset(self) -> None:
        self.resets += 1
        super().reset()


@pytest.fixture(autouse=True)
def delays(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[], Delays]]:
    Delays.made = []
    monkeypatch.setattr(informer_module, "Backoff", Delays)

    def last() -> Delays:
        assert Delays.made, "the informer made no backoff"
        return Delays.made[-1]

    yield last


class Changes:
    """``on_change``, counted; ``until`` waits (on a condition, no sleeps) for a state."""

    def __init__(self) -> None:
        self.count = 0
        self.cond = threading.Condition()

    def __call__(self) -> None:
        with self.cond:
            self.count += 1
            self.cond.notify_all()

    def until(self, ready: Callable[[], bool], what: str) -> None:
        with self.cond:
            assert self.cond.wait_for(ready, WAIT_S), f"timed out waiting for {what}"


def scripted(*answers: Any, **kw: Any) -> tuple[Informer[dict[str, Any]], Script, Changes]:
    script, changes = Script(*answers), Changes()
    inf: Informer[dict[str, Any]] = Informer("things", script, dict, changes, **kw)
    script.informer = inf
    return inf, script, changes


# against a scripted lister


def test_it_lists_then_watches_from_the_lists_version_and_applies_each_event() -> None:
    inf, script, changes = scripted(
        Listed([obj("a", 3), obj("b", 4)], 10),
        Stream(
            event("ADDED", obj("c", 11)),
            event("MODIFIED", obj("a", 12, labels={"v": "2"})),
            event("DELETED", obj("b", 13)),
        ),
        watch_s=60,
        selectors={"label_selector": "app=x"},
    )
    inf.run()
    assert sorted(inf.snapshot()) == ["ns/a", "ns/c"]
    assert inf.snapshot()["ns/a"]["metadata"]["labels"] == {"v": "2"}
    assert (inf.version, inf.lists, inf.synced.is_set(), changes.count) == ("13", 1, True, 4)
    listed, watched = script.calls[0], script.calls[1]
    assert listed == {"_preload_content": False, "_request_timeout": 30, "label_selector": "app=x"}
    assert watched["watch"] is True and watched["resource_version"] == "10"
    assert watched["timeout_seconds"] == 60 and watched["allow_watch_bookmarks"] is True
    assert watched["label_selector"] == "app=x" and watched["_preload_content"] is False


def test_a_watch_that_ends_resumes_from_the_last_version_seen_without_listing() -> None:
    first = Stream(event("ADDED", obj("a", 11)), event("ADDED", obj("b", 12)))
    second = Stream(event("DELETED", obj("a", 13)))
    inf, script, _ = scripted(Listed([], 10), first, second)
    inf.run()
    assert script.versions() == ["list", "10", "12", "13"]
    assert inf.lists == 1 and sorted(inf.snapshot()) == ["ns/b"]
    assert first.released and second.released


def test_a_bookmark_moves_the_version_on_without_a_change() -> None:
    inf, script, changes = scripted(
        Listed([obj("a", 3)], 10),
        Stream(event("BOOKMARK", {"metadata": {"resourceVersion": "50"}})),
    )
    inf.run()
    assert script.versions() == ["list", "10", "50"]
    assert changes.count == 1 and sorted(inf.snapshot()) == ["ns/a"]


def test_a_410_event_lists_again_and_the_new_list_replaces_the_cache(
    delays: Callable[[], Delays],
) -> None:
    inf, script, changes = scripted(
        Listed([obj("a", 3), obj("b", 4)], 10),
        Stream(event("ADDED", obj("c", 11)), error(410, "too old resource version: 11 (40)")),
        Listed([obj("b", 4), obj("d", 41)], 42),
        Stream(event("ADDED", obj("e", 43))),
    )
    inf.run()
    assert script.versions() == ["list", "10", "list", "42", "43"]
    assert sorted(inf.snapshot()) == ["ns/b", "ns/d", "ns/e"]  # a and c went while it was away
    assert inf.lists == 2 and changes.count == 4
    assert delays().delays == []  # expiry is not an error: no backoff


def test_changes_name_the_keys_each_event_touched_and_none_after_every_list() -> None:
    seen: list[set[str] | None] = []
    script = Script(
        Listed([obj("a", 3), obj("b", 4)], 10),
        Stream(event("ADDED", obj("c", 11)), event("MODIFIED", obj("a", 12))),
        Stream(event("DELETED", obj("b", 13)), error(410, "too old resource version")),
        Listed([obj("c", 11)], 40),
    )
    inf: Informer[dict[str, Any]] = Informer("things", script, dict, lambda: None)
    script.informer = inf
    inf.on_change = lambda: seen.append(inf.changes()[1])
    inf.run()
    assert seen == [None, {"ns/c"}, {"ns/a"}, {"ns/b"}, None]
    items, after = inf.changes()
    assert after == set() and sorted(items) == ["ns/c"]


def test_changes_gather_every_key_touched_between_two_calls() -> None:
    script = Script(
        Listed([obj("a", 3)], 10),
        Stream(
            event("ADDED", obj("b", 11)),
            event("MODIFIED", obj("b", 12)),
            event("DELETED", obj("a", 13)),
            event("BOOKMARK", {"metadata": {"resourceVersion": "20"}}),
        ),
    )
    inf: Informer[dict[str, Any]] = Informer("things", script, dict, lambda: None)
    script.informer = inf
    first: list[set[str] | None] = []
    inf.on_change = lambda: None if first else first.append(inf.changes()[1])  # the list
    inf.run()
    items, changed = inf.changes()
    assert first == [None]
    assert changed == {"ns/a", "ns/b"} and sorted(items) == ["ns/b"]


def test_a_watch_answered_410_gone_lists_again_at_once(delays: Callable[[], Delays]) -> None:
    inf, script, _ = scripted(
        Listed([obj("a", 3)], 10), ApiException(status=410, reason="Gone"), Listed([], 20)
    )
    inf.run()
    assert script.versions() == ["list", "10", "list", "20"]
    assert inf.snapshot() == {} and inf.lists == 2
    assert delays().delays == []


def test_another_error_event_backs_off_and_watches_again_from_the_same_version(
    delays: Callable[[], Delays],
) -> None:
    inf, script, _ = scripted(
        Listed([], 10),
        Stream(event("ADDED", obj("a", 11)), error(500, "etcd is sad")),
        Stream(event("ADDED", obj("b", 12))),
    )
    inf.run()
    assert script.versions() == ["list", "10", "11", "12"]
    assert inf.lists == 1 and sorted(inf.snapshot()) == ["ns/a", "ns/b"]
    assert len(delays().delays) == 1


def test_a_dropped_connection_keeps_what_arrived_and_resumes_after_it(
    delays: Callable[[], Delays],
) -> None:
    cut = ProtocolError("Response ended prematurely")
    dropped = Stream(event("ADDED", obj("a", 11)), fail=cut)
    inf, script, _ = scripted(Listed([], 10), dropped, Stream(event("ADDED", obj("b", 12))))
    inf.run()
    assert script.versions() == ["list", "10", "11", "12"]
    assert sorted(inf.snapshot()) == ["ns/a", "ns/b"]
    assert dropped.released  # the connection goes back to the pool even when cut
    assert len(delays().delays) == 1


def test_a_garbled_line_is_an_error_that_backs_off(delays: Callable[[], Delays]) -> None:
    garbled = Stream(event("ADDED", obj("a", 11)), raw="{not json\n")
    inf, script, _ = scripted(Listed([], 10), garbled)
    inf.run()
    assert script.versions() == ["list", "10", "11"]
    assert len(delays().delays) == 1


def test_a_failed_list_backs_off_and_the_informer_is_not_synced_until_one_succeeds(
    delays: Callable[[], Delays],
) -> None:
    inf, script, _ = scripted(
        ApiException(status=503, reason="Unavailable"),
        OSError("connection refused"),
        Listed([obj("a", 3)], 10),
    )
    seen: list[bool] = []
    original = script.__call__

    def spy(**kw: Any) -> Any:
        seen.append(inf.synced.is_set())
        return original(**kw)

    inf.lister = spy
    inf.run()
    assert seen[:3] == [False, False, False] and inf.synced.is_set()
    assert script.versions() == ["list", "list", "list", "10"]
    assert len(delays().delays) == 2


def test_errors_back_off_doubling_from_a_fifth_of_a_second_to_ten_seconds_then_reset(
    delays: Callable[[], Delays],
) -> None:
    failures = [OSError(f"down {i}") for i in range(8)]
    inf, _, _ = scripted(Listed([], 10), *failures, Stream(), OSError("down again"))
    inf.run()
    d = delays()
    want = [0.2, 0.4, 0.8, 1.6, 3.2, 6.4, 10.0, 10.0]
    assert len(d.delays) == 9
    for got, base in zip(d.delays, want, strict=False):
        assert base * 0.8 <= got <= base * 1.2  # with jitter, never more than 20% off
    assert 0.16 <= d.delays[8] <= 0.24  # a watch that worked reset the backoff
    assert d.resets >= 1


def test_cluster_scoped_objects_are_kept_by_name_and_namespaced_ones_by_namespace() -> None:
    inf, _, _ = scripted(Listed([obj("node-1", 3, namespace=None), obj("p", 4)], 10))
    inf.run()
    assert sorted(inf.snapshot()) == ["node-1", "ns/p"]


def test_objects_are_kept_parsed_and_a_snapshot_is_a_copy() -> None:
    script, changes = Script(Listed([{"metadata": {"name": "n1"}}], 10)), Changes()
    inf: Informer[model.KubeNode] = Informer("nodes", script, model.node, changes)
    script.informer = inf
    inf.run()
    snap = inf.snapshot()
    assert isinstance(snap["n1"], model.KubeNode) and snap["n1"].name == "n1"
    snap.clear()
    assert list(inf.snapshot()) == ["n1"]


# against the test suite's API server


@pytest.fixture(scope="module")
def kube(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ApiServer, client.ApiClient]]:
    yield from serve_kube(tmp_path_factory.mktemp("kube"))


@pytest.fixture
def core(kube: tuple[ApiServer, client.ApiClient]) -> client.CoreV1Api:
    return client.CoreV1Api(kube[1])


@pytest.fixture
def live(
    kube: tuple[ApiServer, client.ApiClient], core: client.CoreV1Api
) -> Iterator[Callable[..., tuple[Informer[model.KubePod], Changes]]]:
    """Start a pod informer on the test's own namespace; stopped after the test."""
    started: list[tuple[Informer[Any], threading.Thread]] = []

    def start(namespace: str, **kw: Any) -> tuple[Informer[model.KubePod], Changes]:
        changes = Changes()
        lister = functools.partial(core.list_namespaced_pod, namespace)
        inf: Informer[model.KubePod] = Informer("pods", lister, model.pod, changes, **kw)
        started.append((inf, inf.start()))
        assert inf.synced.wait(WAIT_S)
        return inf, changes

    yield start
    for inf, thread in started:
        inf.stop()
        thread.join(WAIT_S)
        assert not thread.is_alive()


def test_live_stop_cuts_off_a_watch_waiting_for_data(core: client.CoreV1Api, live: Any) -> None:
    """The server sends nothing on a quiet namespace (this server's bookmarks come once a
    minute): ``stop``, from another thread, ends the watch without waiting for a line."""
    inf, _ = live("inf-stop")
    opened = threading.Event()
    for _ in range(500):  # until its watch is open
        if inf._response is not None:
            opened.set()
            break
        opened.wait(0.01)
    assert opened.is_set()
    readers = [t for t in threading.enumerate() if t.name == "informer-pods"]
    stopper = threading.Thread(target=inf.stop)
    stopper.start()
    stopper.join(WAIT_S)
    assert not stopper.is_alive()  # closing the response instead blocked for the minute
    for thread in readers:
        thread.join(WAIT_S)
        assert not thread.is_alive()


def make(core: client.CoreV1Api, namespace: str, *names: str, **kw: Any) -> None:
    for name in names:
        core.create_namespaced_pod(namespace, pod_json(name, namespace=namespace, **kw))


def names(inf: Informer[model.KubePod]) -> list[str]:
    return sorted(p.name for p in inf.snapshot().values())


def test_live_it_lists_the_pods_there_then_sees_every_change(
    kube: tuple[ApiServer, client.ApiClient], core: client.CoreV1Api, live: Any
) -> None:
    make(core, "inf-a", "a", "b")
    before = kube[0].requests
    inf, changes = live("inf-a")
    assert names(inf) == ["a", "b"]
    make(core, "inf-a", "c")
    core.delete_namespaced_pod("a", "inf-a")
    core.patch_namespaced_pod("b", "inf-a", {"metadata": {"labels": {"seen": "yes"}}})
    changes.until(
        lambda: names(inf) == ["b", "c"] and inf.snapshot()["inf-a/b"].labels.get("seen") == "yes",
        "the changes",
    )
    after = kube[0].requests
    assert after[("list", "pods")] - before[("list", "pods")] == 1 and inf.lists == 1


def test_live_a_field_selector_keeps_only_the_schedulers_pods(
    core: client.CoreV1Api, live: Any
) -> None:
    make(core, "inf-b", "mine")
    make(core, "inf-b", "theirs", scheduler="default-scheduler")
    inf, changes = live("inf-b", selectors={"field_selector": "spec.schedulerName=boltforge"})
    assert names(inf) == ["mine"]
    make(core, "inf-b", "also-mine")
    make(core, "inf-b", "also-theirs", scheduler="default-scheduler")
    make(core, "inf-b", "last")
    changes.until(lambda: "last" in names(inf), "the last pod")
    assert names(inf) == ["also-mine", "last", "mine"]


def test_live_a_watch_the_server_ends_resumes_from_where_it_was(
    kube: tuple[ApiServer, client.ApiClient], core: client.CoreV1Api, live: Any
) -> None:
    inf, changes = live("inf-c")
    make(core, "inf-c", "a")
    changes.until(lambda: names(inf) == ["a"], "pod a")
    watches = kube[0].requests[("watch", "pods")]
    assert kube[0].drop_watches(abrupt=False) >= 1
    make(core, "inf-c", "b")
    changes.until(lambda: names(inf) == ["a", "b"], "pod b after the watch ended")
    assert inf.lists == 1
    assert kube[0].requests[("watch", "pods")] > watches


def test_live_a_cut_connection_backs_off_then_replays_what_it_missed(
    kube: tuple[ApiServer, client.ApiClient],
    core: client.CoreV1Api,
    live: Any,
    delays: Callable[[], Delays],
) -> None:
    inf, changes = live("inf-d")
    make(core, "inf-d", "a", "b")
    changes.until(lambda: names(inf) == ["a", "b"], "pods a and b")
    backoff = delays()
    backoff.gate.clear()
    kube[0].drop_watches(abrupt=True)
    assert backoff.entered.wait(WAIT_S), "the cut watch did not back off"
    make(core, "inf-d", "c")  # while it is away
    core.delete_namespaced_pod("a", "inf-d")
    backoff.gate.set()
    changes.until(lambda: names(inf) == ["b", "c"], "the missed changes")
    assert inf.lists == 1  # replayed from the version it had, not listed again
    assert 0.16 <= backoff.delays[0] <= 0.24


def test_live_a_version_the_server_forgot_makes_it_list_again(
    kube: tuple[ApiServer, client.ApiClient],
    core: client.CoreV1Api,
    live: Any,
    delays: Callable[[], Delays],
) -> None:
    make(core, "inf-e", "old")
    inf, changes = live("inf-e")
    make(core, "inf-e", "seen")
    changes.until(lambda: names(inf) == ["old", "seen"], "the watch to be open")
    backoff = delays()
    backoff.gate.clear()
    kube[0].drop_watches(abrupt=True)
    assert backoff.entered.wait(WAIT_S)
    make(core, "inf-e", "new")
    core.delete_namespaced_pod("old", "inf-e")
    kube[0].compact()
    backoff.gate.set()
    changes.until(lambda: inf.lists == 2, "a second list")
    assert names(inf) == ["new", "seen"]


def test_live_a_watch_refused_with_410_lists_again_without_backing_off(
    kube: tuple[ApiServer, client.ApiClient],
    core: client.CoreV1Api,
    live: Any,
    delays: Callable[[], Delays],
) -> None:
    inf, changes = live("inf-f")
    kube[0].fail_next("watch", "pods", 410)
    kube[0].drop_watches(abrupt=False)
    changes.until(lambda: inf.lists == 2, "a second list")
    make(core, "inf-f", "after")
    changes.until(lambda: names(inf) == ["after"], "the pod after the relist")
    assert delays().delays == []


def test_live_a_failing_list_is_retried_until_it_succeeds(
    kube: tuple[ApiServer, client.ApiClient],
    core: client.CoreV1Api,
    live: Any,
    delays: Callable[[], Delays],
) -> None:
    make(core, "inf-g", "a")
    kube[0].fail_next("list", "pods", 500, times=2)
    inf, _ = live("inf-g")
    assert names(inf) == ["a"] and inf.lists == 1
    assert len(delays().delays) == 2

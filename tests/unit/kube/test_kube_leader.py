"""Leader election on a Lease: the first replica creates it, the holder renews it, another
takes over only after watching the same record unchanged for a whole lease by its own
clock, and a holder that cannot renew stops acting before anyone may take over. Against the
test suite's API server through the real client (optimistic concurrency included), with
each replica's clock in the test's hands; then, against an in-memory Lease, every
interleaving hypothesis finds keeps two replicas from leading at once."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import kubernetes.client as client
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kube_unit_kit import serve_kube
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import MaxRetryError

from boltforge.kube import leader as leader_module
from boltforge.kube.leader import LeaderElector
from boltforge.testing.kubeapi import ApiServer

NS = "boltforge-system"
_names = itertools.count()


class Clock:
    """A replica's monotonic clock, moved by the test."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture(scope="module")
def kube(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ApiServer, client.ApiClient]]:
    yield from serve_kube(tmp_path_factory.mktemp("kube"))


@pytest.fixture
def coord(kube: tuple[ApiServer, client.ApiClient]) -> client.CoordinationV1Api:
    return client.CoordinationV1Api(kube[1])


@pytest.fixture
def lease_name() -> str:
    return f"sched-{next(_names)}"


def elector(api: Any, name: str, who: str, clock: Clock, **kw: float) -> LeaderElector:
    return LeaderElector(api, NS, name, who, clock=clock, **kw)


def spec(coord: client.CoordinationV1Api, name: str) -> dict[str, Any]:
    body = json.loads(coord.read_namespaced_lease(name, NS, _preload_content=False).data)
    out: dict[str, Any] = body["spec"]
    return out


@pytest.mark.parametrize(
    ("lease_s", "renew_s", "retry_s"),
    [(15, 15, 2), (15, 10, 10), (10, 15, 2), (15, 10, 12)],
    ids=["renew-equals-lease", "retry-equals-renew", "renew-over-lease", "retry-over-renew"],
)
def test_timings_must_be_retry_under_renew_under_lease(
    lease_s: float, renew_s: float, retry_s: float
) -> None:
    with pytest.raises(ValueError, match="retry_s < renew_s < lease_s"):
        LeaderElector(Any, NS, "x", "a", lease_s=lease_s, renew_s=renew_s, retry_s=retry_s)


def test_the_first_replica_creates_the_lease_and_leads(
    coord: client.CoordinationV1Api, lease_name: str
) -> None:
    a = elector(coord, lease_name, "sched-a", Clock())
    assert not a.leading()
    assert a.try_once() and a.leading()
    s = spec(coord, lease_name)
    assert (s["holderIdentity"], s["leaseDurationSeconds"], s["leaseTransitions"]) == (
        "sched-a",
        15,
        0,
    )
    assert s["acquireTime"] == s["renewTime"] and s["renewTime"].endswith("Z")


def test_the_holder_renews_keeping_its_acquire_time_and_transitions(
    kube: tuple[ApiServer, client.ApiClient], coord: client.CoordinationV1Api, lease_name: str
) -> None:
    clock = Clock()
    a = elector(coord, lease_name, "sched-a", clock)
    a.try_once()
    first = spec(coord, lease_name)
    updates = kube[0].requests[("update", "leases")]
    clock.advance(9)
    assert a.try_once()
    clock.advance(9)  # 18 s after it first led: still leading, having renewed at 9 s
    assert a.leading()
    now = spec(coord, lease_name)
    assert kube[0].requests[("update", "leases")] == updates + 1
    assert now["acquireTime"] == first["acquireTime"] and now["leaseTransitions"] == 0
    assert now["renewTime"] > first["renewTime"]


def test_another_replica_takes_over_only_after_a_whole_lease_of_the_same_record(
    coord: client.CoordinationV1Api, lease_name: str
) -> None:
    a = elector(coord, lease_name, "sched-a", Clock())
    b_clock = Clock(1000.0)  # its own clock: nothing to compare with the holder's
    b = elector(coord, lease_name, "sched-b", b_clock)
    assert a.try_once()
    assert not b.try_once()  # first sight of the record at b's 1000 s
    b_clock.advance(14.9)
    assert not b.try_once()
    b_clock.advance(0.1)
    assert b.try_once() and b.leading()
    s = spec(coord, lease_name)
    assert (s["holderIdentity"], s["leaseTransitions"]) == ("sched-b", 1)
    assert s["acquireTime"] == s["renewTime"]


def test_a_holder_that_keeps_renewing_keeps_the_lead_however_long_another_waits(
    coord: client.CoordinationV1Api, lease_name: str
) -> None:
    clock = Clock()
    a = elector(coord, lease_name, "sched-a", clock)
    b = elector(coord, lease_name, "sched-b", clock)
    for _ in range(12):  # a minute, renewing every 5 s
        assert a.try_once()
        assert not b.try_once()
        clock.advance(5)
    assert spec(coord, lease_name)["holderIdentity"] == "sched-a"


def test_the_wait_is_the_lease_duration_the_record_states_not_the_waiters_own(
    coord: client.CoordinationV1Api, lease_name: str
) -> None:
    clock = Clock()
    a = elector(coord, lease_name, "sched-a", clock, lease_s=30, renew_s=20, retry_s=2)
    b = elector(coord, lease_name, "sched-b", clock)  # 15 s by its own flags
    a.try_once()
    assert spec(coord, lease_name)["leaseDurationSeconds"] == 30
    b.try_once()
    clock.advance(20)
    assert not b.try_once()
    clock.advance(10)
    assert b.try_once()


def test_a_leader_that_cannot_renew_stops_acting_at_its_renew_deadline(
    kube: tuple[ApiServer, client.ApiClient], coord: client.CoordinationV1Api, lease_name: str
) -> None:
    clock = Clock()
    a = elector(coord, lease_name, "sched-a", clock)
    assert a.try_once()
    kube[0].fail_next("get", "leases", 500, times=3)
    clock.advance(4)
    assert a.try_once()  # the read failed, but its renewal at 0 s still holds
    clock.advance(4)
    assert a.try_once()
    clock.advance(2)  # 10 s since the last renewal: the renew deadline
    assert not a.try_once() and not a.leading()
    assert spec(coord, lease_name)["holderIdentity"] == "sched-a"  # nobody took it yet
    clock.advance(1)
    assert a.try_once()  # the API is back and the lease still its own: it leads again


class CutOff:
    """A replica's client of the API server, which fails like a lost network while
    ``cut``."""

    def __init__(self, api: client.CoordinationV1Api) -> None:
        self.api, self.cut = api, False

    def __getattr__(self, name: str) -> Any:
        call = getattr(self.api, name)

        def maybe(*args: Any, **kw: Any) -> Any:
            if self.cut:
                raise MaxRetryError(None, "/leases", "cut off")  # type: ignore[arg-type]
            return call(*args, **kw)

        return maybe


def test_the_old_leader_has_stopped_before_the_new_one_takes_over(
    coord: client.CoordinationV1Api, lease_name: str
) -> None:
    clock = Clock()
    link = CutOff(coord)
    a = elector(link, lease_name, "sched-a", clock)
    b = elector(coord, lease_name, "sched-b", clock)
    a.try_once()
    b.try_once()
    link.cut = True  # a is cut off from here on; b is not
    stopped_at = took_at = None
    while clock.now < 20:
        clock.advance(0.5)
        if stopped_at is None and not a.try_once():
            stopped_at = clock.now
        if took_at is None and b.try_once():
            took_at = clock.now
    assert stopped_at == 10.0 and took_at == 15.0
    assert not a.leading() and b.leading()


def test_a_replace_that_lost_the_race_is_refused_and_the_winner_keeps_the_lease(
    coord: client.CoordinationV1Api, lease_name: str
) -> None:
    clock = Clock()
    a = elector(coord, lease_name, "sched-a", clock)
    a.try_once()

    class Racing:
        """b's API: right after b reads the lease, a renews it."""

        def __init__(self) -> None:
            self.raced = False

        def __getattr__(self, name: str) -> Any:
            return getattr(coord, name)

        def read_namespaced_lease(self, *args: Any, **kw: Any) -> Any:
            answer = coord.read_namespaced_lease(*args, **kw)
            if self.raced:
                a.try_once()
            return answer

    racing = Racing()
    b = elector(racing, lease_name, "sched-b", clock)
    b.try_once()
    clock.advance(15)
    racing.raced = True
    assert not b.try_once()  # it read a record a whole lease old, but a renewed meanwhile
    assert a.leading() and spec(coord, lease_name)["holderIdentity"] == "sched-a"


def test_release_hands_the_lease_over_at_once(
    coord: client.CoordinationV1Api, lease_name: str
) -> None:
    clock = Clock()
    a = elector(coord, lease_name, "sched-a", clock)
    b = elector(coord, lease_name, "sched-b", clock)
    a.try_once()
    b.try_once()
    a.release()
    assert not a.leading()
    s = spec(coord, lease_name)
    assert (s["holderIdentity"], s["leaseDurationSeconds"]) == ("", 1)
    assert b.try_once()  # no lease to wait out
    assert spec(coord, lease_name)["leaseTransitions"] == 1


def test_a_replica_that_does_not_lead_releases_nothing(
    kube: tuple[ApiServer, client.ApiClient], coord: client.CoordinationV1Api, lease_name: str
) -> None:
    clock = Clock()
    a = elector(coord, lease_name, "sched-a", clock)
    b = elector(coord, lease_name, "sched-b", clock)
    a.try_once()
    b.try_once()
    before = kube[0].requests
    b.release()
    assert kube[0].requests == before
    assert spec(coord, lease_name)["holderIdentity"] == "sched-a"


def test_release_leaves_a_lease_someone_else_took_alone(
    coord: client.CoordinationV1Api, lease_name: str
) -> None:
    a_clock, b_clock = Clock(), Clock()
    a = elector(coord, lease_name, "sched-a", a_clock)
    b = elector(coord, lease_name, "sched-b", b_clock)
    a.try_once()
    b.try_once()
    b_clock.advance(15)
    assert b.try_once()
    assert a.leading()  # by a's clock it renewed a moment ago (its clock is wrong)
    a.release()
    assert spec(coord, lease_name)["holderIdentity"] == "sched-b" and not a.leading()


def test_a_leader_cut_off_when_it_releases_stops_leading_without_an_error(
    coord: client.CoordinationV1Api, lease_name: str
) -> None:
    link = CutOff(coord)
    a = elector(link, lease_name, "sched-a", Clock())
    a.try_once()
    link.cut = True
    a.release()
    assert not a.leading()
    assert spec(coord, lease_name)["holderIdentity"] == "sched-a"  # left to run out


# every interleaving, against an in-memory Lease


class MemoryLeases:
    """One Lease with a resourceVersion; replace with a stale one is 409, as the API
    server answers. ``down`` holds the replicas cut off from it."""

    def __init__(self) -> None:
        self.body: dict[str, Any] | None = None
        self.rv = 0
        self.down: set[str] = set()

    def _store(self, body: dict[str, Any]) -> None:
        self.rv += 1
        self.body = json.loads(json.dumps(body))
        self.body["metadata"]["resourceVersion"] = str(self.rv)

    def read(self) -> Any:
        if self.body is None:
            raise ApiException(status=404, reason="Not Found")
        return SimpleNamespace(data=json.dumps(self.body).encode())

    def create(self, body: dict[str, Any]) -> None:
        if self.body is not None:
            raise ApiException(status=409, reason="AlreadyExists")
        self._store(body)

    def replace(self, body: dict[str, Any]) -> None:
        assert self.body is not None
        if body["metadata"].get("resourceVersion") != self.body["metadata"]["resourceVersion"]:
            raise ApiException(status=409, reason="Conflict")
        self._store(body)


class Link:
    """One replica's view of the Lease API, which fails while it is cut off."""

    def __init__(self, leases: MemoryLeases, who: str) -> None:
        self.leases, self.who = leases, who

    def _check(self) -> None:
        if self.who in self.leases.down:
            raise MaxRetryError(None, "/lease", "cut off")  # type: ignore[arg-type]

    def read_namespaced_lease(self, name: str, namespace: str, **_: Any) -> Any:
        self._check()
        return self.leases.read()

    def create_namespaced_lease(self, namespace: str, body: dict[str, Any], **_: Any) -> None:
        self._check()
        self.leases.create(body)

    def replace_namespaced_lease(
        self, name: str, namespace: str, body: dict[str, Any], **_: Any
    ) -> None:
        self._check()
        self.leases.replace(body)


Step = tuple[str, str, float]
steps = st.one_of(
    st.tuples(st.just("try"), st.sampled_from("ab"), st.just(0.0)),
    st.tuples(st.just("wait"), st.just(""), st.floats(0.1, 8.0)),
    st.tuples(st.sampled_from(["cut", "heal"]), st.sampled_from("ab"), st.just(0.0)),
    st.tuples(st.just("release"), st.sampled_from("ab"), st.just(0.0)),
)


def wall_follows(clock: Clock) -> Any:
    """The module's ``time`` with wall time following ``clock`` (renewTime is written from
    wall time; a fake clock keeps two renewals from sharing a microsecond)."""
    return SimpleNamespace(time=lambda: 1.7e9 + clock.now, monotonic=clock)


@settings(max_examples=80, deadline=None)
@given(st.lists(steps, min_size=1, max_size=60))
def test_two_replicas_never_lead_at_once_whatever_happens(script: list[Step]) -> None:
    clock, leases = Clock(), MemoryLeases()
    replicas = {w: elector(Link(leases, w), "l", w, clock) for w in "ab"}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(leader_module, "time", wall_follows(clock))
        for kind, who, seconds in script:
            if kind == "try":
                replicas[who].try_once()
            elif kind == "wait":
                clock.advance(seconds)
            elif kind == "cut":
                leases.down.add(who)
            elif kind == "heal":
                leases.down.discard(who)
            else:
                replicas[who].release()
            assert not (replicas["a"].leading() and replicas["b"].leading()), kind


@settings(max_examples=40, deadline=None)
@given(st.floats(0.1, 14.0), st.floats(0.5, 2.0))
def test_a_cut_off_leader_is_replaced_a_lease_after_it_was_last_seen(
    cut_after: float, every: float
) -> None:
    clock, leases = Clock(), MemoryLeases()
    a = elector(Link(leases, "a"), "l", "a", clock)
    b = elector(Link(leases, "b"), "l", "b", clock)
    took: float | None = None
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(leader_module, "time", wall_follows(clock))
        while clock.now < 60 and took is None:
            if clock.now >= cut_after:
                leases.down.add("a")
            a.try_once()
            if b.try_once():
                took = clock.now
            clock.advance(every)
    assert took is not None
    last_renewal = max(t for t in frange(0.0, cut_after, every))
    # b first sees a's last record within one step of it, and waits 15 s from then
    assert last_renewal + 15 <= took <= last_renewal + 15 + 2 * every


def frange(start: float, stop: float, step: float) -> Iterator[float]:
    """The clock readings of a loop stepping ``step`` from ``start`` while below ``stop``
    (accumulated as the loop does, so float sums agree)."""
    now = start
    while now < stop:
        yield now
        now += step

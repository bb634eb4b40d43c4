"""The in-memory world the passes read stays the store's live part exactly, whatever happens:
after any sequence of submissions, starts, exits, failures, preemptions, silent and
returning nodes, cordons, drains, spot notices and cancellations, the mirror equals one
loaded afresh from the store, the world a pass builds from it equals the world built from
that fresh copy, and no GPU was ever held by two allocations at once."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sched_builders import Bench, event

from boltforge.control.jobs.cancel import cancel_jobs
from boltforge.control.nodes import quarantine, spot
from boltforge.control.scheduling.world import Caches, load_world
from boltforge.control.store.invariants import double_allocations
from boltforge.control.store.mirror import Mirror
from boltforge.control.store.models import JobRow

HOSTS = 3
NODES = [f"host-{i}" for i in range(HOSTS)]
SIZES = (4, 8, 16)
PRIORITIES = ("low", "normal", "high")

Step = tuple[str, int]


def live_jobs(b: Bench, *states: str) -> list[str]:
    with b.mirror.reading():
        return sorted(j.id for j in b.mirror.jobs.values() if j.state in states)


def submit(b: Bench, n: int) -> None:
    b.submit(f"j{n}", SIZES[n % 3], team=("research", "nlp")[n % 2], priority=PRIORITIES[n % 3])


def finish(b: Bench, n: int, code: int) -> None:
    jobs = live_jobs(b, "running", "scheduled")
    if jobs:
        b.exit_all(jobs[n % len(jobs)], code)


def checkpoint_out(b: Bench, n: int) -> None:
    """Every replica told to stop checkpoints and exits."""
    for rep in b.replicas(state="stopping"):
        b.report(rep.node, [event(rep, "exited", b.clock(), exit_code=0, checkpoint_s=1.0)])


def silence(b: Bench, n: int, seconds: float) -> None:
    """Time passes; every node but one heartbeats."""
    b.clock.advance(seconds)
    b.beat_all(but=[NODES[n % HOSTS]])


def come_back(b: Bench, n: int) -> None:
    """A dead node registers again, running nothing."""
    name = NODES[n % HOSTS]
    if b.node(name).state == "dead":
        b.register(name, rack=f"r{(n % HOSTS) // 2}")


def quarantine_step(b: Bench, n: int) -> None:
    name = NODES[n % HOSTS]
    now = b.clock()
    action = (n // HOSTS) % 3
    if action == 0:
        b.write(lambda s: quarantine.cordon(s, name))
    elif action == 1:
        b.write(lambda s: quarantine.drain(s, name, now))
    else:
        b.write(lambda s: quarantine.uncordon(s, name))
    b.sched.wake()


def notice(b: Bench, n: int) -> None:
    name = NODES[n % HOSTS]
    now = b.clock()
    b.write(lambda s: spot.notice(s, name, 5.0 + n, now))
    b.sched.wake()


def cancel(b: Bench, n: int) -> None:
    jobs = live_jobs(b, "pending", "requeued", "scheduled", "running", "preempting")
    if not jobs:
        return
    target = jobs[n % len(jobs)]

    def change(s: object) -> None:
        from sqlalchemy.orm import Session

        assert isinstance(s, Session)
        row = s.get(JobRow, target)
        assert row is not None
        cancel_jobs(s, [row], "ann", b.clock())

    b.write(change)
    b.sched.wake()


ACTIONS: dict[str, Callable[[Bench, int], None]] = {
    "submit": submit,
    "start": lambda b, n: b.start_all(),
    "finish": lambda b, n: finish(b, n, 0),
    "fail": lambda b, n: finish(b, n, 1),
    "checkpoint": checkpoint_out,
    "quiet": lambda b, n: silence(b, n, 7.0),
    "lease-lost": lambda b, n: silence(b, n, 16.0),
    "come-back": come_back,
    "quarantine": quarantine_step,
    "notice": notice,
    "cancel": cancel,
    "later": lambda b, n: b.clock.advance(30.0),
}

steps = st.lists(
    st.tuples(st.sampled_from(sorted(ACTIONS)), st.integers(0, 11)), min_size=1, max_size=8
)


def busy(b: Bench) -> None:
    """The fleet every sequence starts from: three jobs running, a fourth waiting."""
    for n in (0, 1, 5):
        submit(b, n)  # 4 GPUs low, 8 normal, 16 high
    b.settle()
    b.start_all()
    submit(b, 2)  # 16 GPUs low: waits
    b.settle()


def worlds_agree(b: Bench) -> None:
    """The world a pass builds from the live mirror is the one a fresh mirror gives."""
    fresh = Mirror()
    with b.db.session() as s:
        fresh.load(s)
    now = b.clock()
    mine = load_world(b.mirror, now, Caches(), hold_s=b.sched.recovery_hold_s)
    theirs = load_world(fresh, now, Caches(), hold_s=b.sched.recovery_hold_s)
    assert mine.state.allocations == theirs.state.allocations
    assert np.array_equal(mine.state.free, theirs.state.free)
    assert np.array_equal(mine.state.cordoned, theirs.state.cordoned)
    assert [j.id for j in mine.pending] == [j.id for j in theirs.pending]
    assert mine.ports == theirs.ports


@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(plan=steps)
def test_the_mirror_equals_the_store_after_any_sequence_of_events(plan: list[Step]) -> None:
    with tempfile.TemporaryDirectory() as tmp, Bench(Path(tmp), hosts=HOSTS) as b:
        busy(b)
        for kind, n in plan:
            ACTIONS[kind](b, n)
            b.settle()  # checks the mirror after every pass
            b.mirror_agrees()
            worlds_agree(b)
        with b.db.session() as s:
            assert double_allocations(s) == []

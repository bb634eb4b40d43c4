"""The node-side contract on its own: a backend that runs replicas in memory, driven by
``NodeDriver`` against the real server app in-process (fake clock). Whatever the number of
nodes, the desired states come in one long-poll, the leases are renewed in one heartbeat
and the events go in one report; what does not go through is sent later, in order."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pytest
from control_kit import Fleet, make_spec
from node_kit import Counting, MemoryNodes, agent_client

from boltforge.agent.client import Unreachable
from boltforge.node.converge import NEVER_STARTED, never_started
from boltforge.node.driver import NodeDriver
from boltforge.node.follower import ReportOutbox
from boltforge.wire.agent import Lease


class Bench:
    """The server, two memory nodes and the driver that speaks for them."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self.nodes = MemoryNodes("m0", "m1")
        self.loop = asyncio.new_event_loop()
        self.server = Counting(agent_client(fleet))
        self.driver = NodeDriver(self.server, self.nodes, wait_s=0.0)

    def run(self, work: Callable[[], Awaitable[None]]) -> None:
        self.loop.run_until_complete(work())

    def step(self, poll: bool = True) -> None:
        """The server's passes run, the driver takes its intent (``poll``) and steps."""
        self.fleet.settle()
        if poll:
            self.run(self.driver.poll)
        self.run(self.driver.step)
        self.fleet.settle()

    def state(self, job: str) -> str:
        return self.fleet.job(job).state


@pytest.fixture
def bench(tmp_path: Path) -> Iterator[Bench]:
    with Fleet(tmp_path, hosts=0) as fleet:
        b = Bench(fleet)
        b.step(poll=False)  # registers both nodes
        try:
            yield b
        finally:
            b.loop.close()


def test_a_job_runs_to_its_end_on_a_memory_backend(bench: Bench) -> None:
    job = bench.fleet.submit(make_spec("train", 16))
    bench.step()
    assert sorted(bench.nodes.replicas()) == [("m0", f"{job}.1.0"), ("m1", f"{job}.1.1")]
    for node, replica in bench.nodes.replicas():
        bench.nodes.up(node, replica, bench.fleet.clock())
    bench.step()
    assert bench.state(job) == "running"
    for node, replica in bench.nodes.replicas():
        bench.nodes.exit(node, replica, bench.fleet.clock())
    bench.step()
    assert bench.state(job) == "succeeded"
    bench.step()
    assert bench.nodes.replicas() == []  # an epoch that ended never runs again


def test_every_node_is_followed_with_one_call_per_duty(bench: Bench) -> None:
    job = bench.fleet.submit(make_spec("train", 16))
    bench.server.calls.clear()
    bench.step()
    for node, replica in bench.nodes.replicas():
        bench.nodes.up(node, replica, bench.fleet.clock())
    bench.step(poll=False)
    assert ("desired", ("m0", "m1")) in bench.server.calls  # both states in one answer
    assert bench.server.calls.count(("reports", ("m0", "m1"))) == 1
    assert bench.state(job) == "running"


def test_heartbeats_renew_every_lease_together_listing_what_changed(bench: Bench) -> None:
    bench.server.calls.clear()
    bench.driver.heartbeats.reset()
    bench.step(poll=False)
    assert bench.server.calls == [("heartbeats", ("m0", "m1"))]
    bench.step(poll=False)  # not due again yet
    assert bench.server.count("heartbeats") == 1


def test_a_stopped_replica_gets_its_grace_and_reports_its_checkpoint(bench: Bench) -> None:
    job = bench.fleet.submit(make_spec("train", 8, checkpoint={"grace": "45s"}))
    bench.step()
    [(node, replica)] = bench.nodes.replicas()
    bench.nodes.up(node, replica, bench.fleet.clock())
    bench.step()
    bench.fleet.post(f"/v1/jobs/{job}/cancel", {})
    bench.step()
    bench.step()  # asked again while it stops: nothing more
    assert [a for a in bench.nodes.asked if a[0] == "stop"] == [("stop", node, replica, "45.0")]
    bench.nodes.checkpointed(node, replica, bench.fleet.clock())
    bench.step()
    assert bench.state(job) == "cancelled"


def test_a_replica_stopped_before_it_started_is_reported_once_and_never_run(
    bench: Bench,
) -> None:
    job = bench.fleet.submit(make_spec("train", 8))
    bench.fleet.settle()
    bench.run(bench.driver.poll)  # told to run it, but not yet stepped
    bench.fleet.post(f"/v1/jobs/{job}/cancel", {})
    bench.step()
    bench.step()
    assert [a for a in bench.nodes.asked if a[0] == "start"] == []
    [row] = bench.fleet.replicas()
    assert (row.state, row.started_at) == ("exited", None)
    assert bench.state(job) == "cancelled"


def test_reports_that_did_not_go_through_are_sent_later_in_order(bench: Bench) -> None:
    job = bench.fleet.submit(make_spec("train", 8))
    bench.step()
    [(node, replica)] = bench.nodes.replicas()
    bench.nodes.up(node, replica, bench.fleet.clock())
    bench.server.fail_reports = 1
    with pytest.raises(Unreachable):
        bench.run(bench.driver.step)
    assert [e.kind for e in bench.driver.outbox[node]] == ["started"]
    bench.nodes.exit(node, replica, bench.fleet.clock(), code=3)
    bench.step(poll=False)
    assert bench.driver.outbox[node] == []
    detail = bench.fleet.job(job)
    assert (detail.state, detail.exit_code) == ("failed", 3)


def test_a_node_whose_session_was_lost_keeps_its_events_until_it_registers_again(
    bench: Bench,
) -> None:
    job = bench.fleet.submit(make_spec("train", 8))
    bench.step()
    [(node, replica)] = bench.nodes.replicas()
    stale = bench.driver.leases[node]
    bench.run(bench.driver.register)  # nothing changed: the sessions stay
    assert bench.driver.leases[node] == stale
    bench.driver.registered.pop(node)  # as if its inventory changed: registered again
    bench.run(bench.driver.register)
    bench.driver.leases[node] = stale  # but the driver still sends with the old session
    bench.nodes.up(node, replica, bench.fleet.clock())
    bench.run(bench.driver.step)
    assert node not in bench.driver.leases
    assert [e.kind for e in bench.driver.outbox[node]] == ["started"]
    bench.step(poll=False)  # registers again, then sends what waited
    assert bench.driver.outbox[node] == []
    assert bench.state(job) == "running"


def test_the_skip_event_says_the_replica_never_ran(bench: Bench) -> None:
    job = bench.fleet.submit(make_spec("train", 8))
    bench.fleet.settle()
    bench.run(bench.driver.poll)
    bench.fleet.post(f"/v1/jobs/{job}/cancel", {})
    bench.fleet.settle()
    bench.run(bench.driver.poll)
    bench.server.fail_reports = 1  # keep the report in the outbox to read it
    with pytest.raises(Unreachable):
        bench.run(bench.driver.step)
    [event] = [e for node in ("m0", "m1") for e in bench.driver.outbox[node]]
    assert (event.kind, event.detail, event.signal) == ("exited", NEVER_STARTED, None)


def test_a_batch_put_back_goes_ahead_of_what_was_queued_since() -> None:
    outbox = ReportOutbox()
    lease = Lease(node="m0", session="s", lease_s=15, heartbeat_s=5)
    first, later = (never_started(f"j.1.{r}", "j", 1, at=float(r)) for r in (0, 1))
    outbox.add("m0", first)
    outbox.add("m1", first)  # no lease: it waits
    batch = outbox.take({"m0": lease})
    assert list(batch) == ["m0"] and outbox["m0"] == [] and bool(outbox)
    outbox.add("m0", later)
    outbox.put_back(batch)
    assert outbox["m0"] == [first, later]


def test_a_running_driver_rides_out_a_report_that_did_not_go_through(bench: Bench) -> None:
    job = bench.fleet.submit(make_spec("train", 8))
    bench.server.fail_reports = 1

    async def until_running() -> None:
        task = asyncio.create_task(bench.driver.run(every_s=0.01))
        try:
            for _ in range(2000):
                await asyncio.sleep(0.01)
                for node, replica in bench.nodes.replicas():
                    if not bench.nodes.held[node][replica].up:
                        bench.nodes.up(node, replica, bench.fleet.clock())
                if bench.server.fail_reports == 0 and bench.server.count("reports"):
                    break
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    bench.run(until_running)
    bench.fleet.settle()
    assert bench.state(job) == "running"

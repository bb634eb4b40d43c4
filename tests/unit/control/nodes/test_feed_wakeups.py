"""The state feed (``control/nodes/feed.py``) through its group-commit writer: what each kind
of observation wakes. A registration changes the fleet (a full pass, its node converged,
an audit entry); a heartbeat wakes nothing unless a node comes back or leaves; a start
report wakes no pass but an exit does; a report in a stale session is refused whole."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from sched_builders import Bench, event, inventory
from sqlalchemy import select

from boltforge.control.auth import Caller
from boltforge.control.nodes.agents import SessionMismatch
from boltforge.control.nodes.feed import Feed
from boltforge.control.nodes.reports import read_ahead
from boltforge.control.store.batch import Batcher
from boltforge.control.store.models import AuditRow, NodeRow
from boltforge.spec.errors import SpecError
from boltforge.wire.agent import AgentReport, Heartbeat, Registration

T = TypeVar("T")
AGENTS = Caller("agents", "agent", None, "test")


@pytest.fixture
def feed(tmp_path: Path) -> Iterator[tuple[Bench, Feed]]:
    with Bench(tmp_path, hosts=2) as b:
        b.settle()
        writes = Batcher(b.db, b.sched.lock, "test-agent-writes", read_ahead)
        try:
            yield b, Feed(writes, b.sched, b.terms)
        finally:
            writes.close()


def run(step: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(step)


def converged(b: Bench) -> set[str]:
    return set().union(*b.backend.converged) if b.backend.converged else set()


def test_a_registration_asks_for_a_full_pass_and_is_audited(feed: tuple[Bench, Feed]) -> None:
    b, f = feed
    reg = Registration(inventory=inventory("host-5", rack="r2"))
    lease = run(f.register(reg, AGENTS, b.clock()))
    assert lease.node == "host-5" and b.node("host-5").session == lease.session
    assert b.sched.wanted() == (0, True)
    assert "host-5" in converged(b)
    with b.db.session() as s:
        [entry] = s.scalars(select(AuditRow).where(AuditRow.action == "register"))
        assert (entry.who, entry.target) == ("agents", "host-5")
        assert entry.detail == {"gpus": 8, "pool": "h100"}


def test_a_refused_registration_stores_nothing_and_wakes_nothing(
    feed: tuple[Bench, Feed],
) -> None:
    b, f = feed
    reg = Registration(inventory=inventory("host-5", gpus=4, nvlink_island=4))
    with pytest.raises(SpecError):
        run(f.register(reg, AGENTS, b.clock()))
    assert b.sched.wanted() == (0, False)
    with b.db.session() as s:
        assert s.get(NodeRow, "host-5") is None
        assert list(s.scalars(select(AuditRow))) == []


def test_a_plain_heartbeat_wakes_nothing(feed: tuple[Bench, Feed]) -> None:
    b, f = feed
    before = len(b.backend.converged)
    lease = run(f.heartbeat("host-0", Heartbeat(session=b.sessions["host-0"]), b.clock()))
    assert lease.node == "host-0"
    assert b.sched.wanted() == (0, False)
    assert len(b.backend.converged) == before


def test_a_node_back_from_suspect_asks_for_a_pass(feed: tuple[Bench, Feed]) -> None:
    b, f = feed

    def suspect(s: Any) -> None:
        s.get(NodeRow, "host-1").state = "suspect"

    b.write(suspect)
    run(f.heartbeat("host-1", Heartbeat(session=b.sessions["host-1"]), b.clock()))
    assert b.sched.wanted() == (0, True)
    assert b.backend.converged[-1] == {"host-1"}


def test_a_heartbeat_in_a_stale_session_is_refused(feed: tuple[Bench, Feed]) -> None:
    b, f = feed
    with pytest.raises(SessionMismatch):
        run(f.heartbeat("host-0", Heartbeat(session="old"), b.clock()))


def test_a_batch_of_heartbeats_wakes_the_loop_only_for_what_changed(
    feed: tuple[Bench, Feed],
) -> None:
    b, f = feed
    quiet = {n: Heartbeat(session=b.sessions[n]) for n in ("host-0", "host-1")}
    renewed = run(f.heartbeats({**quiet, "ghost": Heartbeat(session="x")}, b.clock()))
    assert sorted(renewed.leases) == ["host-0", "host-1"] and renewed.lost == ["ghost"]
    assert b.sched.wanted() == (0, False)

    leaving = {"host-0": Heartbeat(session=b.sessions["host-0"], leaving=True)}
    run(f.heartbeats(leaving, b.clock()))  # ready to suspect: nothing to converge yet
    back = {"host-0": Heartbeat(session=b.sessions["host-0"])}
    renewed = run(f.heartbeats(back, b.clock()))
    assert renewed.touched.nodes == {"host-0"}
    assert b.sched.wanted() == (0, True)


def test_a_start_report_wakes_no_pass_but_an_exit_does(feed: tuple[Bench, Feed]) -> None:
    b, f = feed
    job = b.place("train", 8)
    [rep] = b.replicas(job)
    session = b.sessions[rep.node]
    started = AgentReport(session=session, events=[event(rep, "started", b.clock(), pid=1)])
    refused, touched = run(f.report(rep.node, started, b.clock()))
    assert refused == [] and touched.jobs == {job}
    assert b.sched.wanted() == (0, False)
    assert b.job(job).state == "running"
    exited = AgentReport(session=session, events=[event(rep, "exited", b.clock(), exit_code=0)])
    run(f.report(rep.node, exited, b.clock()))
    assert b.sched.wanted() == (0, True)
    assert b.job(job).state == "succeeded"


def test_a_report_in_a_stale_session_changes_nothing(feed: tuple[Bench, Feed]) -> None:
    b, f = feed
    job = b.place("train", 8)
    [rep] = b.replicas(job)
    stale = AgentReport(session="old", events=[event(rep, "exited", b.clock(), exit_code=1)])
    with pytest.raises(SessionMismatch):
        run(f.report(rep.node, stale, b.clock()))
    assert b.job(job).state == "scheduled"


def test_the_items_of_a_report_refused_are_named(feed: tuple[Bench, Feed]) -> None:
    b, f = feed
    job = b.place("train", 8)
    [rep] = b.replicas(job)
    wrong = event(rep, "started", b.clock()).model_copy(update={"epoch": 9})
    body = AgentReport(session=b.sessions[rep.node], events=[wrong])
    refused, touched = run(f.report(rep.node, body, b.clock()))
    assert refused == [rep.id] and touched.jobs == set()

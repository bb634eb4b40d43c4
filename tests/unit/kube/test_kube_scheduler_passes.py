"""The Kubernetes scheduler's passes, part two: the server's intent carried out (a gang bound
whole or not at all, replicas to stop evicted, with retries when a budget refuses), what
the kubelet did reported back (started, exited, evicted, lost), gangs that are gone
cancelled, and what happens when a replica takes or loses the lead. Driven pass by pass
against in-memory collaborators (``kube_sched_rig``)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any, cast

import pytest
from kube_sched_rig import Rig, racks, rig
from kube_unit_kit import kgroup, knode, kpod, rspec

from boltforge.kube.gangs import GangKey
from boltforge.kube.model import JOB, REPLICA
from boltforge.kube.scheduler import NOT_FROM_KUBE
from boltforge.node.converge import NEVER_STARTED
from boltforge.wire.agent import DesiredChanges, DesiredState


@pytest.fixture
def r(monkeypatch: pytest.MonkeyPatch) -> Rig:
    return rig(monkeypatch)


def submitted(r: Rig, gang: str, size: int, **kw: Any) -> str:
    """A gang of ``size`` pods on a fleet of 4 nodes, submitted: its job."""
    r.nodes(*racks(("r1", ["n1", "n2"]), ("r2", ["n3", "n4"])))
    r.gang(gang, size, **kw)
    r.passes()
    return r.job_of(gang)


def place(r: Rig, job: str, nodes: list[str], *, epoch: int = 1, role: str = "gpu8") -> None:
    """The server placed ``job``'s replica ``rank`` on ``nodes[rank]``."""
    for rank, node in enumerate(nodes):
        r.wants(node, rspec(job, epoch, rank, role=role))


def placed_pods(r: Rig, job: str, nodes: list[str]) -> None:
    """``submitted`` then ``place``d and bound, the pods as the informer sees them after."""
    place(r, job, nodes)
    r.passes()
    for name, (node, notes) in r.writes.bound.items():
        pod = r.pods[f"research/{name}"]
        r.put(
            kpod(
                name,
                uid=pod.uid,
                node=node,
                group=pod.pod_group,
                replica=notes[REPLICA],
                job=notes[JOB],
            )
        )


# a gang bound whole


def test_a_placed_gang_has_each_pod_bound_to_its_node_and_says_so(r: Rig) -> None:
    job = submitted(r, "llm", 2)
    place(r, job, ["n1", "n2"])
    r.passes()
    assert r.writes.bound == {
        "llm-0": ("n1", {REPLICA: f"{job}.1.0", JOB: job}),
        "llm-1": ("n2", {REPLICA: f"{job}.1.1", JOB: job}),
    }
    assert sorted(r.writes.events("Scheduled")) == [
        (
            f"llm-{i}",
            f"Boltforge placed research/llm-{i} on n{i + 1}: gang research/llm "
            f"(job {job}, 2 pods on 2 nodes in rack r1)",
        )
        for i in range(2)
    ]


def test_a_gang_spread_over_racks_names_them_all(r: Rig) -> None:
    job = submitted(r, "llm", 2)
    place(r, job, ["n1", "n3"])
    r.passes()
    (_, text), _ = r.writes.events("Scheduled")
    assert text.endswith("2 pods on 2 nodes in rack r1,r2)")


def test_nothing_is_bound_until_every_replica_has_a_pod(r: Rig) -> None:
    job = submitted(r, "llm", 2)
    place(r, job, ["n1", "n2", "n3"])  # a third replica, for a pod not there yet
    r.passes()
    assert r.writes.bound == {}
    r.put(kpod("llm-2", group="llm"))
    r.passes()
    assert sorted(r.writes.bound) == ["llm-0", "llm-1", "llm-2"]


def test_a_bound_replica_is_not_bound_again(r: Rig) -> None:
    job = submitted(r, "llm", 2)
    placed_pods(r, job, ["n1", "n2"])
    r.writes.bound.clear()
    r.passes(3)
    assert r.writes.bound == {} and r.writes.events("Scheduled") != []


def test_a_binding_refused_is_retried_on_the_next_pass(r: Rig) -> None:
    job = submitted(r, "llm", 2)
    r.writes.refuse_bind["llm-1"] = "500: try later"
    place(r, job, ["n1", "n2"])
    r.passes()
    assert sorted(r.writes.bound) == ["llm-0"]
    assert [p for p, _ in r.writes.events("Scheduled")] == ["llm-0"]
    del r.writes.refuse_bind["llm-1"]
    r.passes()
    assert sorted(r.writes.bound) == ["llm-0", "llm-1"]
    assert set(r.sched.state.placed) == {f"{job}.1.0", f"{job}.1.1"}


def test_each_role_gets_its_own_pods(r: Rig) -> None:
    r.nodes(*racks(("r1", ["n1", "n2"])))
    r.put(kpod("w0", group="g"), kpod("w1", group="g"), kpod("launcher", group="g", gpus=0))
    r.groups(kgroup("g", 3))
    r.passes()
    job = r.job_of("g")
    r.wants("n1", rspec(job, 1, 0), rspec(job, 1, 2, role="cpu"))
    r.wants("n2", rspec(job, 1, 1))
    r.passes()
    assert {p: n for p, (n, _) in r.writes.bound.items()} == {
        "w0": "n1",
        "w1": "n2",
        "launcher": "n1",
    }
    assert r.writes.bound["launcher"][1][REPLICA] == f"{job}.1.2"


def test_a_new_epoch_binds_the_pods_the_controller_made_again(r: Rig) -> None:
    job = submitted(r, "llm", 1)
    placed_pods(r, job, ["n1"])
    r.drop("llm-0")  # evicted and gone; its Job made a new pod
    r.put(kpod("llm-0b", group="llm"))
    r.clear()
    r.passes()
    r.wants("n2", rspec(job, 2, 0))
    r.passes()
    assert r.writes.bound["llm-0b"] == ("n2", {REPLICA: f"{job}.2.0", JOB: job})


# jobs that are not pods


def test_a_job_submitted_outside_kubernetes_fails_once_with_the_fix(r: Rig) -> None:
    r.nodes(knode("n1"))
    r.passes()
    r.wants("n1", rspec("j-x", 1, 0, command=("python", "train.py")))
    r.passes(3)
    (event,) = r.agents.events("n1")
    assert (event.replica, event.kind, event.detail) == ("j-x.1.0", "failed", NOT_FROM_KUBE)
    assert r.writes.bound == {}


def test_a_kubernetes_job_whose_gang_is_unknown_is_left_alone(r: Rig) -> None:
    r.nodes(knode("n1"))
    r.passes()
    r.wants("n1", rspec("j-old", 1, 0))  # a pod job from before; its gang is not ours
    r.passes(2)
    assert r.agents.events() == [] and r.writes.bound == {}


# replicas to stop


def test_a_replica_to_stop_has_its_pod_evicted_once_with_the_grace_asked(r: Rig) -> None:
    job = submitted(r, "llm", 1)
    placed_pods(r, job, ["n1"])
    r.clear()
    r.wants("n1", rspec(job, 1, 0, action="stop", grace_s=42))
    r.passes(3)
    assert r.writes.evicted == [("llm-0", 42)]
    assert [s.state for s in r.sched.state.statuses("n1")] == ["stopping"]


def test_an_eviction_that_failed_says_why_on_the_pod_and_is_retried_after_5_s(r: Rig) -> None:
    job = submitted(r, "llm", 1)
    placed_pods(r, job, ["n1"])
    r.writes.refuse_evict["llm-0"] = "503: the API server is busy"
    r.clear()
    r.wants("n1", rspec(job, 1, 0, action="stop"))
    r.passes()
    ((pod, text),) = r.writes.events("EvictionBlocked")
    assert pod == "llm-0"
    assert text == (
        "Boltforge could not evict it for a more important gang: 503: the API server is busy"
    )
    assert ("llm-0", "EvictionBlocked", text, "Warning") in r.writes.said
    r.clock.advance(4.9)
    r.passes()
    assert len(r.writes.events("EvictionBlocked")) == 1  # not yet
    del r.writes.refuse_evict["llm-0"]
    r.clock.advance(0.1)
    r.passes()
    assert r.writes.evicted == [("llm-0", 30.0)]


def test_a_replica_stopped_before_its_pod_was_bound_is_reported_stopped_once(r: Rig) -> None:
    r.nodes(knode("n1"))
    r.passes()
    r.wants("n1", rspec("j-9", 1, 0, action="stop"))
    r.passes(3)
    (event,) = r.agents.events("n1")
    assert (event.replica, event.kind, event.detail) == ("j-9.1.0", "exited", NEVER_STARTED)
    assert event.signal is None and r.writes.evicted == []


# what the kubelet did


def test_a_running_pod_is_reported_started_once(r: Rig) -> None:
    job = submitted(r, "llm", 1)
    placed_pods(r, job, ["n1"])
    pod = r.pods["research/llm-0"]
    running = kpod("llm-0", uid=pod.uid, node="n1", phase="Running", group="llm")
    r.put(running)
    r.passes(3)
    assert r.agents.kinds(f"{job}.1.0") == ["started"]


@pytest.mark.parametrize(
    ("phase", "codes", "code"),
    [("Succeeded", (0,), 0), ("Failed", (3,), 3), ("Failed", (), 1), ("Succeeded", (), 0)],
    ids=["succeeded", "failed-with-code", "failed-without-code", "succeeded-without-code"],
)
def test_a_finished_pod_is_reported_exited_with_its_code(
    r: Rig, phase: str, codes: tuple[int, ...], code: int
) -> None:
    job = submitted(r, "llm", 1)
    placed_pods(r, job, ["n1"])
    pod = r.pods["research/llm-0"]
    r.put(kpod("llm-0", uid=pod.uid, node="n1", phase=phase, exit_codes=codes, group="llm"))
    r.passes(2)
    replica = f"{job}.1.0"
    assert r.agents.kinds(replica) == ["started", "exited"]  # started first, never seen running
    (exited,) = [e for e in r.agents.events() if e.kind == "exited"]
    assert exited.exit_code == code and exited.signal is None
    assert r.sched.state.statuses("n1") == []


def test_a_pod_gone_after_its_eviction_exited_by_the_checkpoint_signal(r: Rig) -> None:
    job = submitted(r, "llm", 1)
    placed_pods(r, job, ["n1"])
    pod = r.pods["research/llm-0"]
    r.put(kpod("llm-0", uid=pod.uid, node="n1", phase="Running", group="llm"))
    r.clear()
    r.wants("n1", rspec(job, 1, 0, action="stop"))
    r.passes()
    r.clock.advance(7.5)
    r.drop("llm-0")
    r.passes()
    replica = f"{job}.1.0"
    assert r.agents.kinds(replica) == ["started", "exited"]
    exited = r.agents.events()[-1]
    assert exited.signal == 15 and exited.checkpoint_s == pytest.approx(7.5)
    assert replica not in r.sched.state.placed


def test_an_evicted_pod_that_went_is_reported_exited_once_while_its_stop_is_still_wanted(
    r: Rig,
) -> None:
    job = submitted(r, "llm", 1)
    placed_pods(r, job, ["n1"])
    r.clear()
    r.wants("n1", rspec(job, 1, 0, action="stop"))
    r.passes()
    r.drop("llm-0")
    r.passes(3)  # the server has not yet taken the stop back
    assert r.agents.kinds(f"{job}.1.0") == ["started", "exited"]


def test_a_pod_deleted_by_someone_else_is_to_run_again(r: Rig) -> None:
    job = submitted(r, "llm", 1)
    placed_pods(r, job, ["n1"])
    r.drop("llm-0")
    r.passes()
    kinds = r.agents.kinds(f"{job}.1.0")
    assert kinds == ["started", "exited"]
    exited = r.agents.events()[-1]
    assert (exited.signal, exited.by_node) == (9, True)


def test_a_replica_whose_pod_ended_is_not_bound_again_while_still_listed_to_run(
    r: Rig,
) -> None:
    """A pod that failed and went (its controller deleted it) ends its replica for good: a
    pod its controller made for the next attempt waits for a job of its own, even though the
    server's desired state still lists the ended replica (an exit changes no intent)."""
    job = submitted(r, "llm", 2)
    placed_pods(r, job, ["n1", "n2"])
    failed = r.pods["research/llm-1"]
    r.put(kpod("llm-1", uid=failed.uid, node="n2", phase="Failed", exit_codes=[1], group="llm"))
    r.passes()
    r.drop("llm-1")
    r.put(kpod("llm-1-b", group="llm"))  # the next attempt's pod
    r.passes(2)
    assert "llm-1-b" not in r.writes.bound
    assert r.agents.kinds(f"{job}.1.1") == ["started", "exited"]


def test_a_pod_replaced_under_the_same_name_counts_as_gone(r: Rig) -> None:
    job = submitted(r, "llm", 1)
    placed_pods(r, job, ["n1"])
    r.put(kpod("llm-0", group="llm"))  # a new uid: a new pod
    r.passes()
    assert r.agents.kinds(f"{job}.1.0") == ["started", "exited"]


def test_a_pod_that_finished_and_then_went_is_not_reported_twice(r: Rig) -> None:
    job = submitted(r, "llm", 1)
    placed_pods(r, job, ["n1"])
    pod = r.pods["research/llm-0"]
    r.put(kpod("llm-0", uid=pod.uid, node="n1", phase="Succeeded", group="llm"))
    r.passes()
    r.drop("llm-0")
    r.passes(2)
    assert r.agents.kinds(f"{job}.1.0") == ["started", "exited"]


# reports


def test_reports_of_a_node_whose_session_was_lost_are_kept_and_sent_after_it_registers(
    r: Rig,
) -> None:
    job = submitted(r, "llm", 1)
    placed_pods(r, job, ["n1"])
    r.agents.session_lost = {"n1"}
    r.drop("llm-0")
    r.passes()
    assert r.agents.sent == [] and "n1" not in r.sched.state.leases
    r.agents.session_lost = set()
    r.passes()
    ((node, report),) = r.agents.sent
    assert node == "n1" and report.session == "s-n1-2"  # its new session
    assert [e.kind for e in report.events] == ["started", "exited"]


def test_events_of_a_node_without_a_lease_wait_for_one(r: Rig) -> None:
    job = submitted(r, "llm", 1)
    placed_pods(r, job, ["n1"])
    r.nodes(knode("n1", ready=False), *racks(("r1", ["n2"])))
    r.drop("llm-0")
    r.passes(2)
    assert r.agents.sent == []
    assert [e.kind for e in r.sched.state.outbox["n1"]] == ["started", "exited"]


# gangs that are gone


def test_a_gang_whose_pods_and_pod_group_are_gone_has_its_job_cancelled(r: Rig) -> None:
    job = submitted(r, "llm", 2)
    r.drop("llm-0", "llm-1")
    r.passes()
    assert r.jobs.cancelled == []  # its PodGroup is still there
    r.groups()
    r.passes(2)
    assert r.jobs.cancelled == [job] and r.sched.state.job_of == {}
    assert job not in r.sched.state.gang_of


def test_a_gone_gang_whose_job_already_ended_is_only_forgotten(r: Rig) -> None:
    job = submitted(r, "llm", 1)
    r.jobs.states[job] = "succeeded"
    r.drop("llm-0")
    r.groups()
    r.passes()
    assert r.jobs.cancelled == [] and r.sched.state.job_of == {}


def test_a_gone_gang_whose_job_the_server_does_not_know_is_forgotten(r: Rig) -> None:
    job = submitted(r, "llm", 1)
    del r.jobs.states[job]
    r.drop("llm-0")
    r.groups()
    r.passes()
    assert r.jobs.cancelled == [] and r.sched.state.job_of == {}


# leading


def test_a_new_leader_adopts_every_bound_pod_and_forgets_the_last_ones_state(r: Rig) -> None:
    r.nodes(*racks(("r1", ["n1", "n2"])))
    r.put(
        kpod("w0", node="n1", phase="Running", replica="j-4.2.0", job="j-4", group="g"),
        kpod("w1", node="n2", phase="Pending", replica="j-4.2.1", job="j-4", group="g"),
        kpod("done", node="n2", phase="Succeeded", replica="j-3.1.0", job="j-3"),
        kpod("free", group="h"),
    )
    r.sched.state.told.said["x"] = "old words"
    r.lead()
    state = r.sched.state
    assert sorted(state.placed) == ["j-4.2.0", "j-4.2.1"]
    assert state.placed["j-4.2.0"].started and not state.placed["j-4.2.1"].started
    assert state.job_of == {GangKey("research", "podgroup", "g"): "j-4"}
    assert state.told.said == {}
    r.passes()
    assert r.agents.kinds("j-4.2.0") == []  # already running when adopted: nothing new


def test_the_lead_changes_hands_when_the_elector_says_so(r: Rig) -> None:
    answers = iter([True, True, False])
    done = threading.Event()

    class Elector:
        retry_s = 0.0

        def try_once(self) -> bool:
            answer = next(answers, None)
            if answer is None:
                done.set()
                return False
            return answer

    r.put(kpod("w0", node="n1", phase="Running", replica="j-4.2.0", job="j-4", group="g"))
    r.sched.leading = False
    seen: list[tuple[bool, int]] = []

    async def go() -> None:
        task = asyncio.create_task(r.sched._elect(cast(Any, Elector())))
        while not done.is_set():
            seen.append((r.sched.leading, len(r.sched.state.placed)))
            await asyncio.sleep(0)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(go())
    assert (True, 1) in seen  # it led, having adopted the bound pod
    assert not r.sched.leading and r.sched.state.placed == {}  # then stopped and forgot


def test_the_desired_states_follow_the_servers_changes_for_its_own_nodes(r: Rig) -> None:
    r.nodes(knode("n1"), knode("n2"))
    spec = rspec("j-1", 1, 0)
    r.agents.changes = [
        DesiredChanges(
            seq=5,
            full=True,
            nodes=[
                DesiredState(node="n1", version=1, replicas=[spec]),
                DesiredState(node="slurm-7", version=1, replicas=[spec]),  # not a k8s node
            ],
        ),
        DesiredChanges(seq=6, nodes=[DesiredState(node="n2", version=2, replicas=[spec])]),
        DesiredChanges(seq=9, full=True, nodes=[]),
    ]
    held: list[list[str]] = []  # the nodes with desired states at each long-poll
    poll = r.agents.desired_changes

    async def recording(since: int, wait_s: float) -> DesiredChanges:
        held.append(sorted(r.sched.state.desired.nodes))
        return await poll(since, wait_s)

    r.agents.desired_changes = recording  # type: ignore[method-assign]

    async def go() -> None:
        task = asyncio.create_task(r.sched._follow_desired())
        while len(r.agents.asked) < 4:
            await asyncio.sleep(0)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    r.sched.state.desired.put("stale", [spec])
    asyncio.run(go())
    assert r.agents.asked == [-1, 5, 6, 9]  # each poll from the last change seen
    # a full answer replaces everything; a partial one adds to it; other backends' nodes
    # are not this scheduler's
    assert held == [["stale"], ["n1"], ["n1", "n2"], []]
    assert r.sched.state.desired.wanted("run") == {}  # the index follows the last answer

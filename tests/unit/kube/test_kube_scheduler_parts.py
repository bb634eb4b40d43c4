"""The Kubernetes scheduler's passes, part one: nodes in (registration, cordons, leases let
go, heartbeats), gangs in (what is submitted, once, and what is refused), and the words
each waiting pod gets. Driven pass by pass against in-memory collaborators
(``kube_sched_rig``); the real API server's side is in test_kube_actions.py and the whole
loop in tests/integration/test_kubernetes.py."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from kube_sched_rig import Rig, racks, rig
from kube_unit_kit import knode, kpod, rspec
from kubernetes.client.exceptions import ApiException

from boltforge.agent.client import Unreachable
from boltforge.client import ApiFailure
from boltforge.kube import model
from boltforge.kube.gangs import GangKey, gangs
from boltforge.kube.scheduler import Options, _assign
from boltforge.kube.translate import Labels
from boltforge.testing.kube_builders import pdb_json
from boltforge.wire.jobs import Problem


@pytest.fixture
def r(monkeypatch: pytest.MonkeyPatch) -> Rig:
    return rig(monkeypatch)


TAINT = [{"key": "maintenance", "effect": "NoSchedule"}]


# nodes


def test_every_ready_node_registers_once_with_its_inventory(r: Rig) -> None:
    r.nodes(*racks(("r1", ["n1", "n2"]), ("r2", ["n3"])), knode("sick", ready=False))
    r.passes(3)
    regs = {reg.inventory.name: reg for reg in r.agents.registered}
    assert sorted(regs) == ["n1", "n2", "n3"]
    n3 = regs["n3"]
    assert (n3.inventory.rack, n3.inventory.gpus, n3.inventory.gpu) == ("r2", 8, "h100")
    assert n3.agent_version == "k8s" and n3.running == []


def test_after_a_failed_pass_the_next_one_looks_at_every_node_not_only_what_changed(
    r: Rig,
) -> None:
    r.nodes(*racks(("r1", ["n1", "n2"])))
    r.agents.register_error = OSError("the server is away")
    with pytest.raises(OSError):
        r.passes()
    r.agents.register_error = None
    r.passes()  # no node changed since the failed pass
    assert set(r.sched.state.leases) == {"n1", "n2"}


def test_a_pass_with_nothing_changed_registers_nothing_again(r: Rig) -> None:
    r.nodes(*racks(("r1", ["n1", "n2"])))
    r.passes(3)
    assert [reg.inventory.name for reg in r.agents.registered] == ["n1", "n2"]


def test_a_node_that_stops_being_ready_is_let_go_and_registers_again_when_ready(r: Rig) -> None:
    r.nodes(*racks(("r1", ["n1", "n2"])))
    r.passes(every_s=5)
    r.nodes(knode("n1"), knode("n2", ready=False))
    r.passes(2, every_s=5)
    assert set(r.sched.state.leases) == {"n1"}
    first, *later = r.agents.beats
    assert sorted(first) == ["n1", "n2"]
    assert later and all(sorted(beat) == ["n1"] for beat in later)  # its lease runs out
    r.nodes(*racks(("r1", ["n1", "n2"])))
    r.passes()
    assert [reg.inventory.name for reg in r.agents.registered].count("n2") == 2


def test_a_node_deleted_from_kubernetes_is_let_go(r: Rig) -> None:
    r.nodes(*racks(("r1", ["n1", "n2"])))
    r.passes()
    r.nodes(knode("n1"))
    r.passes()
    assert set(r.sched.state.leases) == {"n1"}


def test_a_node_registers_again_with_what_it_runs(r: Rig) -> None:
    r.nodes(knode("n1"))
    r.put(kpod("w0", node="n1", phase="Running", replica="j-1.1.0", job="j-1", group="g"))
    r.lead()
    r.passes()
    (reg,) = r.agents.registered
    assert [(s.replica, s.state) for s in reg.running] == [("j-1.1.0", "running")]


@pytest.mark.parametrize(
    "blocked",
    [{"unschedulable": True}, {"taints": TAINT}, {"taints": [{"key": "x", "effect": "NoExecute"}]}],
    ids=["cordoned", "no-schedule", "no-execute"],
)
def test_a_blocked_node_is_cordoned_once_and_uncordoned_when_freed(
    r: Rig, blocked: dict[str, object]
) -> None:
    r.nodes(knode("n1", **blocked), knode("n2"))
    r.passes(3)
    assert r.jobs.cordoned == ["n1"] and r.jobs.uncordoned == []
    r.nodes(knode("n1"), knode("n2"))
    r.passes(2)
    assert r.jobs.uncordoned == ["n1"]


def test_a_gpu_taint_or_a_soft_one_does_not_cordon(r: Rig) -> None:
    gpu = [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]
    soft = [{"key": "x", "effect": "PreferNoSchedule"}]
    r.nodes(knode("n1", taints=gpu), knode("n2", taints=soft))
    r.passes()
    assert r.jobs.cordoned == []


def test_a_taint_the_options_tolerate_does_not_cordon(monkeypatch: pytest.MonkeyPatch) -> None:
    r = rig(monkeypatch, Options(labels=Labels(tolerated=("maintenance",))))
    r.nodes(knode("n1", taints=TAINT))
    r.passes()
    assert r.jobs.cordoned == []


def test_a_blocked_node_that_is_not_ready_is_not_cordoned(r: Rig) -> None:
    r.nodes(knode("n1", unschedulable=True, ready=False))
    r.passes()
    assert r.jobs.cordoned == [] and r.agents.registered == []


# heartbeats


def test_heartbeats_go_together_when_due_with_what_each_node_runs(r: Rig) -> None:
    r.nodes(*racks(("r1", ["n1", "n2"])))
    r.put(kpod("w0", node="n1", phase="Running", replica="j-1.1.0", job="j-1", group="g"))
    r.lead()
    r.passes(2)  # due at once, and not again in the same instant
    (beat,) = r.agents.beats
    assert sorted(beat) == ["n1", "n2"]
    assert beat["n1"].session == "s-n1-1"
    assert [s.replica for s in beat["n1"].running] == ["j-1.1.0"] and beat["n2"].running == []
    r.clock.advance(4.9)  # the leases ask for a heartbeat every 5 s
    r.passes()
    assert len(r.agents.beats) == 1
    r.clock.advance(0.1)
    r.passes()
    assert len(r.agents.beats) == 2


def test_a_heartbeat_lists_what_a_node_runs_when_it_changed_and_all_of_it_every_30_s(
    r: Rig,
) -> None:
    r.nodes(*racks(("r1", ["n1", "n2"])))
    r.put(kpod("w0", node="n1", phase="Running", replica="j-1.1.0", job="j-1", group="g"))
    r.put(kpod("w1", node="n2", phase="Running", replica="j-2.1.0", job="j-2", group="h"))
    r.lead()
    r.passes(every_s=5)  # the first heartbeat lists everything

    def listed() -> dict[str, list[tuple[str, str]]]:
        beat = r.agents.beats[-1]
        return {n: [(s.replica, s.state) for s in b.running] for n, b in beat.items()}

    assert listed() == {"n1": [("j-1.1.0", "running")], "n2": [("j-2.1.0", "running")]}
    r.passes(every_s=5)
    assert listed() == {"n1": [], "n2": []}  # nothing changed: the leases are renewed
    r.wants("n1", rspec("j-1", 1, 0, action="stop"))
    r.passes(every_s=5)  # evicted: n1's replica is stopping
    assert listed() == {"n1": [("j-1.1.0", "stopping")], "n2": []}
    r.passes(3, every_s=5)
    assert listed() == {"n1": [], "n2": []}
    r.passes(every_s=5)  # 30 s since the last full one
    assert listed() == {"n1": [("j-1.1.0", "stopping")], "n2": [("j-2.1.0", "running")]}


def test_a_node_the_server_lost_registers_again_on_the_next_pass(r: Rig) -> None:
    r.nodes(*racks(("r1", ["n1", "n2"])))
    r.passes(every_s=5)
    r.agents.lost = ["n2"]
    r.passes()
    assert set(r.sched.state.leases) == {"n1"}
    r.agents.lost = []
    r.passes()
    assert [reg.inventory.name for reg in r.agents.registered].count("n2") == 2


def test_failed_heartbeats_do_not_fail_the_pass_and_are_sent_when_next_due(r: Rig) -> None:
    r.nodes(knode("n1"))
    r.agents.beat_error = Unreachable("server down")
    r.passes(2)
    r.clock.advance(4.9)
    r.agents.beat_error = None
    r.passes()
    assert r.agents.beats == [] and set(r.sched.state.leases) == {"n1"}
    r.clock.advance(0.1)
    r.passes()
    assert len(r.agents.beats) == 1


def test_a_replica_the_server_says_to_stop_in_a_heartbeat_is_evicted(r: Rig) -> None:
    r.nodes(knode("n1"))
    r.put(kpod("w0", node="n1", phase="Running", replica="j-1.1.0", job="j-1", group="g"))
    r.lead()
    r.passes(every_s=5)
    r.agents.stop = {"n1": ["j-1.1.0", "not-mine.1.0"]}
    r.passes(2, every_s=5)
    assert r.writes.evicted == [("w0", None)]  # once, with the pod's own grace


# gangs in


def test_a_whole_gang_is_submitted_once_as_a_job(r: Rig) -> None:
    r.nodes(*racks(("r1", ["n1", "n2"])))
    r.gang("llm", 2, grace_s=90)
    r.passes(3)
    ((spec, source, key),) = r.jobs.submitted
    assert spec["name"] == "research-llm" and spec["team"] == "research"
    assert [(x["name"], x["replicas"], x["gpus"]) for x in spec["roles"]] == [("gpu8", 2, 8)]
    assert spec["checkpoint"] == {"grace": "90s"} and spec["priority"] == "normal"
    assert spec["command"] == ["kubernetes-pod"] and spec["preemptible"] is True
    assert source == "kubernetes gang research/llm"
    assert key == "k8s/research/podgroup/llm/pg-llm"
    assert r.job_of("llm") == "j-1"


def test_a_gang_waits_for_all_its_pods_before_it_is_submitted(r: Rig) -> None:
    r.nodes(knode("n1"))
    r.put(kpod("llm-0", group="llm"))
    r.groups(model.PodGroup("research", "llm", "u", 2))
    r.passes()
    assert r.jobs.submitted == []
    r.put(kpod("llm-1", group="llm"))
    r.passes()
    assert len(r.jobs.submitted) == 1


def test_a_gangs_priority_comes_from_its_priority_class(r: Rig) -> None:
    r.nodes(knode("n1"))
    r.classes(model.PriorityClass("prod", 5_000_000, {}))
    r.gang("llm", 1, priority_class="prod")
    r.passes()
    assert r.jobs.submitted[0][0]["priority"] == "high"


def test_a_pod_without_a_grace_gets_the_schedulers_default(monkeypatch: pytest.MonkeyPatch) -> None:
    r = rig(monkeypatch, Options(grace_s=12.0))
    r.nodes(knode("n1"))
    obj = kpod("solo")
    r.put(model.pod({**_raw(obj), "spec": {"schedulerName": "boltforge", "containers": []}}))
    r.passes()
    assert r.jobs.submitted[0][0]["checkpoint"] == {"grace": "12s"}


def _raw(pod: model.KubePod) -> dict[str, object]:
    return {"metadata": {"name": pod.name, "namespace": pod.namespace, "uid": pod.uid}}


def test_a_gang_a_disruption_budget_protects_is_submitted_not_preemptible(r: Rig) -> None:
    r.nodes(knode("n1"), knode("n2"))
    r.gang("llm", 2, labels={"app": "llm"})
    r.budgets(model.budget(pdb_json("keep", {"app": "llm"}, min_available=1)))
    r.passes()
    assert r.jobs.submitted[0][0]["preemptible"] is False


def test_a_pod_larger_than_any_node_is_refused_and_told_why(r: Rig) -> None:
    r.nodes(knode("n1", gpus=8))
    r.gang("big", 1, gpus=16)
    r.passes()
    assert r.jobs.submitted == []
    ((pod, reason, text),) = r.writes.conditions
    assert (pod, reason) == ("big-0", "Unschedulable")
    assert text.startswith("boltforge: refused: pod big-0 asks for 16 GPUs")
    assert "largest node has 8" in text
    assert r.writes.events("FailedScheduling") == [("big-0", text)]


def test_a_gang_refused_as_too_big_is_submitted_once_a_node_large_enough_joins(r: Rig) -> None:
    r.nodes(knode("n1", gpus=8))
    r.gang("big", 1, gpus=16)
    r.passes(2)
    assert r.jobs.submitted == []
    r.nodes(knode("n1", gpus=8), knode("n2", gpus=16))
    r.passes()
    assert len(r.jobs.submitted) == 1 and r.sched.state.refused == {}


def test_pods_of_one_role_asking_different_sizes_are_refused(r: Rig) -> None:
    r.nodes(knode("n1"))
    r.put(kpod("a", group="g", gpus=8, labels={"boltforge.io/role": "w"}))
    r.put(kpod("b", group="g", gpus=4, labels={"boltforge.io/role": "w"}))
    r.groups(model.PodGroup("research", "g", "u", 2))
    r.passes()
    assert r.jobs.submitted == []
    assert (
        "role w ask for different resources"
        in r.sched.state.refused[GangKey("research", "podgroup", "g")]
    )


def test_a_gang_the_server_refuses_says_the_servers_words_and_each_problem(r: Rig) -> None:
    r.nodes(knode("n1"))
    r.gang("llm", 1)
    problems = [Problem(field="team", message="over quota"), Problem(field="gpus", message="x")]
    r.jobs.refuse = ApiFailure(422, "rejected", problems)
    r.passes()
    (_, _, text), *_ = r.writes.conditions
    assert text == "boltforge: refused: rejected (team: over quota; gpus: x)"
    r.jobs.refuse = ApiFailure(403, "not allowed")
    r.clock.advance(2)
    r.passes()
    assert r.writes.conditions[-1][2] == "boltforge: refused: not allowed"


def test_a_refused_gang_that_is_fixed_is_submitted(r: Rig) -> None:
    r.nodes(knode("n1"))
    r.gang("llm", 1)
    r.jobs.refuse = ApiFailure(422, "rejected")
    r.passes()
    r.jobs.refuse = None
    r.passes()
    assert len(r.jobs.submitted) == 1 and r.sched.state.refused == {}


def test_a_server_error_on_submit_fails_the_pass(r: Rig) -> None:
    r.nodes(knode("n1"))
    r.gang("llm", 1)
    r.jobs.refuse = ApiFailure(503, "unavailable")
    with pytest.raises(ApiFailure):
        r.passes()
    assert r.sched.state.job_of == {} and r.sched.state.refused == {}


def test_a_gang_whose_pods_are_all_bound_is_not_submitted_again(r: Rig) -> None:
    r.nodes(knode("n1"))
    r.put(kpod("w0", node="n1", phase="Running", replica="j-7.1.0", job="j-7", group="g"))
    r.groups(model.PodGroup("research", "g", "u", 1))
    r.lead()
    r.passes()
    assert r.jobs.submitted == []
    assert r.sched.state.job_of == {GangKey("research", "podgroup", "g"): "j-7"}


# words


def test_each_waiting_pod_is_told_why_once_until_the_reason_changes(r: Rig) -> None:
    r.nodes(knode("n1"))
    r.put(kpod("llm-0", group="llm"), kpod("llm-1", group="llm"))
    r.groups(model.PodGroup("research", "llm", "u", 3))
    r.passes()
    why = (
        "boltforge: waiting for its gang: 2 of the 3 pods its PodGroup llm needs exist; "
        "nothing is bound until all do"
    )
    assert sorted(r.writes.conditions) == [
        ("llm-0", "GangIncomplete", why),
        ("llm-1", "GangIncomplete", why),
    ]
    assert {(p, k) for p, reason, _, k in r.writes.said if reason == "FailedScheduling"} == {
        ("llm-0", "Warning"),
        ("llm-1", "Warning"),
    }
    r.passes(3, every_s=2)
    assert len(r.writes.conditions) == 2  # the same words are not said again
    r.put(kpod("llm-2", group="llm"))
    r.jobs.queue["j-1"] = (2, "capacity")
    r.passes(every_s=2)
    r.passes()
    waiting = "boltforge: waiting: capacity"  # its place in line is not in the words
    assert {c for c in r.writes.conditions[2:]} == {
        (f"llm-{i}", "SchedulerQueued", waiting) for i in range(3)
    }


def test_words_are_said_no_more_often_than_the_options_ask(r: Rig) -> None:
    r.nodes(knode("n1"))
    r.put(kpod("a", group="g"))
    r.passes()  # the first words: the PodGroup does not exist
    assert r.writes.conditions[-1][1] == "GangIncomplete"
    r.groups(model.PodGroup("research", "g", "u", 2))
    r.clock.advance(1.9)
    r.passes()
    assert len(r.writes.conditions) == 1  # too soon to say the new words
    r.clock.advance(0.1)
    r.passes()
    assert len(r.writes.conditions) == 2 and "1 of the 2 pods" in r.writes.conditions[-1][2]


def test_a_pending_job_without_a_place_in_line_waits_for_the_next_pass(r: Rig) -> None:
    r.nodes(knode("n1"))
    r.gang("llm", 1)
    r.passes(every_s=2)
    r.passes()
    assert r.writes.conditions == [("llm-0", "SchedulerQueued", "boltforge: waiting: next pass")]


def test_a_running_job_or_one_the_queue_does_not_list_is_not_explained(r: Rig) -> None:
    r.nodes(knode("n1"))
    r.gang("a", 1)
    r.gang("b", 1)
    r.passes()  # both submitted; the words ran before the jobs existed
    r.jobs.states = {"j-1": "running"}  # j-2 is no longer listed
    r.writes.conditions.clear()
    r.passes(every_s=2)
    r.passes()
    assert r.writes.conditions == []


def test_every_waiting_gang_is_explained_however_many_jobs_a_listing_shows(r: Rig) -> None:
    """The scheduler asks for its waiting jobs by id, not for the first of everyone's."""
    r.jobs.shown = 1
    r.nodes(knode("n1"))
    for name in ("a", "b", "c"):
        r.gang(name, 1)
    r.passes()
    r.passes(every_s=2)
    said = {pod for pod, reason, _ in r.writes.conditions if reason == "SchedulerQueued"}
    assert said == {"a-0", "b-0", "c-0"}


def test_a_job_list_that_fails_leaves_the_pods_unexplained_until_it_works(r: Rig) -> None:
    r.nodes(knode("n1"))
    r.gang("llm", 1)
    listing = r.jobs.jobs

    def down(state: str | None = None, ids: Sequence[str] = ()) -> None:
        raise ApiFailure(0, "unreachable")

    r.jobs.jobs = down  # type: ignore[method-assign]
    r.passes(every_s=2)
    assert r.writes.conditions == []
    r.jobs.jobs = listing  # type: ignore[method-assign]
    r.passes()
    assert r.writes.conditions == [("llm-0", "SchedulerQueued", "boltforge: waiting: next pass")]


def test_words_no_pod_waits_for_are_not_said(r: Rig) -> None:
    r.nodes(knode("n1"))
    r.put(kpod("done", group="g", node="n1", phase="Succeeded"))
    r.groups(model.PodGroup("research", "g", "u", 2))
    r.passes()
    assert r.writes.conditions == [] and r.writes.said == []


def test_a_write_kubernetes_refuses_does_not_stop_the_others(r: Rig) -> None:
    r.nodes(knode("n1"))
    r.put(kpod("a", group="g"), kpod("b", group="g"))
    r.groups(model.PodGroup("research", "g", "u", 3))

    def refuse(pod: model.KubePod, reason: str, message: str) -> None:
        raise ApiException(status=403, reason="Forbidden")

    r.writes.unschedulable = refuse  # type: ignore[method-assign]
    r.passes()
    assert sorted(p for p, _ in r.writes.events("FailedScheduling")) == ["a", "b"]


# which pod runs which replica


def test_replicas_take_waiting_pods_of_their_role_in_rank_order() -> None:
    pods = [kpod(f"w{i}", group="g") for i in (2, 0, 1)] + [kpod("launch", group="g", gpus=0)]
    (gang,) = gangs(pods, {}).values()
    todo = {
        "j.1.2": ("n3", rspec("j", 1, 2)),
        "j.1.0": ("n1", rspec("j", 1, 0)),
        "j.1.3": ("n4", rspec("j", 1, 3, role="cpu")),
        "j.1.1": ("n2", rspec("j", 1, 1)),
    }
    out = _assign(todo, gang, set())
    assert out is not None
    assert {r: p.name for r, p in out.items()} == {
        "j.1.0": "w0",
        "j.1.1": "w1",
        "j.1.2": "w2",
        "j.1.3": "launch",
    }


def test_no_pod_is_assigned_unless_every_replica_gets_one() -> None:
    pods = [kpod("w0", group="g"), kpod("w1", group="g")]
    (gang,) = gangs(pods, {}).values()
    todo = {f"j.1.{i}": (f"n{i}", rspec("j", 1, i)) for i in range(3)}
    assert _assign(todo, gang, set()) is None
    two = {f"j.1.{i}": (f"n{i}", rspec("j", 1, i)) for i in range(2)}
    assert _assign(two, gang, {pods[0].uid}) is None  # w0 already runs a replica
    assert _assign({"j.1.0": ("n0", rspec("j", 1, 0, role="cpu"))}, gang, set()) is None


def test_a_gang_of_mixed_sizes_in_one_role_gets_no_pods() -> None:
    pods = [
        kpod("a", group="g", gpus=8, labels={"boltforge.io/role": "w"}),
        kpod("b", group="g", gpus=4, labels={"boltforge.io/role": "w"}),
    ]
    (gang,) = gangs(pods, {}).values()
    assert _assign({"j.1.0": ("n0", rspec("j", 1, 0, role="w"))}, gang, set()) is None

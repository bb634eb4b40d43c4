"""What a pod asks of its node is honoured: its nodeSelector, required node affinity and
tolerations decide which nodes (and so which pools) its gang may use, or refuse it with the
reason; scheduling gates hold it back; init containers and overhead count in its request; a
taint its pods tolerate does not cordon the node; and a pod its kubelet refused is placed
again, not failed. Scenarios as data, against the parsed objects and the rig's passes."""

from __future__ import annotations

from typing import Any

import pytest
from kube_sched_rig import Rig, rig
from kube_unit_kit import knode, kpod, raw_pod
from test_kube_scheduler_passes import placed_pods, submitted

from boltforge.kube import model
from boltforge.kube.fit import why_not
from boltforge.kube.gangs import GangKey
from boltforge.kube.scheduler import Options
from boltforge.kube.taints import Taint, Toleration, parse
from boltforge.kube.translate import Labels

A100 = "NVIDIA-A100-SXM4-80GB"
DEDICATED = [{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}]
TOLERATES = [{"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}]


def expr(key: str, op: str, *values: str) -> dict[str, Any]:
    return {"key": key, "operator": op, "values": list(values)}


# which node a pod may run on

NODE = knode("gpu-7", rack="r2", labels={"tier": "3", "zone": "a"})
FIT_CASES: list[tuple[str, dict[str, Any], str | None]] = [
    ("selector matches", {"node_selector": {"zone": "a"}}, None),
    ("selector differs", {"node_selector": {"zone": "b"}}, "nodeSelector zone=b does not match"),
    ("In", {"affinity": [[expr("zone", "In", "a", "b")]]}, None),
    ("NotIn", {"affinity": [[expr("zone", "NotIn", "a")]]}, "required node affinity"),
    ("Exists", {"affinity": [[expr("tier", "Exists")]]}, None),
    ("DoesNotExist", {"affinity": [[expr("tier", "DoesNotExist")]]}, "required node affinity"),
    ("Gt", {"affinity": [[expr("tier", "Gt", "2")]]}, None),
    ("Lt", {"affinity": [[expr("tier", "Lt", "3")]]}, "required node affinity"),
    ("Gt of a word", {"affinity": [[expr("zone", "Gt", "2")]]}, "required node affinity"),
    ("all of a term", {"affinity": [[expr("zone", "In", "a"), expr("x", "Exists")]]}, "affinity"),
    ("any term", {"affinity": [[expr("x", "Exists")], [expr("zone", "In", "a")]]}, None),
]


@pytest.mark.parametrize(("asks", "why"), [c[1:] for c in FIT_CASES], ids=[c[0] for c in FIT_CASES])
def test_selectors_and_affinity_decide_where_a_pod_may_run(
    asks: dict[str, Any], why: str | None
) -> None:
    said = why_not(kpod("p", **asks), NODE)
    assert said == why if why is None else why in (said or "")


def test_match_fields_select_by_node_name() -> None:
    obj = raw_pod("p")
    term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["gpu-7"]}]}
    required = {"nodeSelectorTerms": [term]}
    obj["spec"]["affinity"] = {
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required}
    }
    pod = model.pod(obj)
    assert why_not(pod, NODE) is None
    assert why_not(pod, knode("gpu-8")) == "required node affinity does not match"


TAINT_CASES: list[tuple[str, dict[str, str], list[dict[str, str]], bool]] = [
    ("equal", DEDICATED[0], TOLERATES, True),
    ("other value", DEDICATED[0], [{**TOLERATES[0], "value": "cpu"}], False),
    ("exists", DEDICATED[0], [{"key": "dedicated", "operator": "Exists"}], True),
    ("any effect", DEDICATED[0], [{"key": "dedicated", "operator": "Exists", "effect": ""}], True),
    ("other effect", DEDICATED[0], [{**TOLERATES[0], "effect": "NoExecute"}], False),
    ("everything", DEDICATED[0], [{"operator": "Exists"}], True),
    ("no-execute", {"key": "k", "effect": "NoExecute"}, [], False),
    ("soft", {"key": "k", "effect": "PreferNoSchedule"}, [], True),
]


@pytest.mark.parametrize(
    ("taint", "tolerations", "may"), [c[1:] for c in TAINT_CASES], ids=[c[0] for c in TAINT_CASES]
)
def test_tolerations_match_taints_as_the_kubelet_does(
    taint: dict[str, str], tolerations: list[dict[str, str]], may: bool
) -> None:
    pod = kpod("p", tolerations=tolerations)
    assert (why_not(pod, knode("n", taints=[taint])) is None) == may


@pytest.mark.parametrize(
    ("text", "toleration"),
    [
        ("dedicated=gpu:NoSchedule", Toleration("dedicated", "Equal", "gpu", "NoSchedule")),
        ("nvidia.com/gpu:NoSchedule", Toleration("nvidia.com/gpu", "Exists", "", "NoSchedule")),
        ("nvidia.com/gpu", Toleration("nvidia.com/gpu", "Exists", "", "")),
    ],
)
def test_a_tolerated_taint_is_written_key_value_effect(text: str, toleration: Toleration) -> None:
    assert parse(text) == toleration
    assert toleration.matches(Taint(toleration.key, "NoSchedule", toleration.value))


@pytest.mark.parametrize("text", ["", "=gpu:NoSchedule", "dedicated:Never"])
def test_a_tolerated_taint_that_is_not_one_says_the_form(text: str) -> None:
    with pytest.raises(ValueError, match="KEY\\[=VALUE\\]:EFFECT"):
        parse(text)


# what a pod asks


def test_init_containers_and_overhead_count_as_the_kubelet_counts_them() -> None:
    obj = raw_pod("p", gpus=0)
    spec = obj["spec"]
    spec["containers"] = [
        {"name": "a", "resources": {"requests": {"cpu": "2", "memory": "4Gi"}}},
        {"name": "b", "resources": {"requests": {"cpu": "1", "memory": "4Gi"}}},
    ]
    spec["initContainers"] = [
        {"name": "fetch", "resources": {"requests": {"cpu": "6", "memory": "1Gi"}}},
        {"name": "side", "restartPolicy": "Always", "resources": {"requests": {"memory": "2Gi"}}},
    ]
    spec["overhead"] = {"cpu": "250m", "memory": "1Gi"}
    p = model.pod(obj)
    assert p.cpus == 6.25  # the init container's 6 over the containers' 3, plus overhead
    assert p.memory_gb == 11.0  # 4 + 4 + the sidecar's 2, over the init's 1, plus 1


# gangs given only the nodes they may use


@pytest.fixture
def r(monkeypatch: pytest.MonkeyPatch) -> Rig:
    return rig(monkeypatch)


def mixed_fleet(r: Rig, **kw: Any) -> None:
    """Two H100 nodes in rack r1, two A100 nodes in rack r2."""
    a100 = {"product": A100, "rack": "r2"}
    r.nodes(
        knode("h1", **kw), knode("h2", **kw), knode("a1", **a100, **kw), knode("a2", **a100, **kw)
    )


def test_a_gang_is_given_the_pools_its_selector_allows(r: Rig) -> None:
    mixed_fleet(r)
    r.put(kpod("solo", node_selector={"nvidia.com/gpu.product": A100}))
    r.put(kpod("free"))
    r.passes()
    pools = {spec["name"]: spec.get("pools") for spec, _, _ in r.jobs.submitted}
    assert pools == {"research-solo": ["k8s-a100"], "research-free": None}


def test_a_gang_whose_nodes_share_a_pool_with_others_is_refused_with_the_fix(r: Rig) -> None:
    mixed_fleet(r)
    r.put(kpod("solo", affinity=[[expr("kubernetes.io/hostname", "In", "h1")]]))
    r.put(kpod("named", affinity=[[expr("topology.boltforge.io/rack", "In", "r1")]]))
    r.passes()
    assert [spec["name"] for spec, _, _ in r.jobs.submitted] == ["research-named"]
    why = r.sched.state.refused[GangKey("research", "pod", "solo")]
    assert "0 of 4 nodes fit (4 nodes: required node affinity does not match)" in why


def test_a_gang_that_fits_part_of_a_pool_says_to_give_those_nodes_their_own(r: Rig) -> None:
    r.nodes(knode("h1", labels={"zone": "a"}), knode("h2", labels={"zone": "b"}))
    r.put(kpod("solo", node_selector={"zone": "a"}))
    r.passes()
    why = r.sched.state.refused[GangKey("research", "pod", "solo")]
    assert "The 1 nodes its pods may run on (h1) share pool k8s-h100".lower() in why.lower()
    assert "node label boltforge.io/pool" in why


def test_a_dedicated_taint_its_pods_tolerate_cordons_nothing(r: Rig) -> None:
    mixed_fleet(r, taints=DEDICATED)
    r.put(kpod("solo", tolerations=TOLERATES))
    r.passes(2)
    assert r.jobs.cordoned == []
    assert [spec.get("pools") for spec, _, _ in r.jobs.submitted] == [None]


def test_a_pod_that_does_not_tolerate_the_fleets_taint_is_refused_with_the_taint(r: Rig) -> None:
    mixed_fleet(r, taints=DEDICATED)
    r.put(kpod("tolerant", tolerations=TOLERATES), kpod("intolerant"))
    r.passes()
    why = r.sched.state.refused[GangKey("research", "pod", "intolerant")]
    assert "4 nodes: taint dedicated=gpu:NoSchedule is not tolerated" in why
    assert r.jobs.cordoned == []


def test_a_pod_alone_on_a_fleet_cordoned_for_its_taint_is_refused_not_submitted(r: Rig) -> None:
    mixed_fleet(r, taints=DEDICATED)
    r.passes()  # no pod tolerates the taint: every node is cordoned
    r.put(kpod("intolerant"))
    r.passes()
    assert r.jobs.submitted == []
    assert (
        "taint dedicated=gpu:NoSchedule"
        in r.sched.state.refused[GangKey("research", "pod", "intolerant")]
    )


def test_a_taint_no_pod_tolerates_cordons_until_one_does(r: Rig) -> None:
    r.nodes(knode("h1", taints=DEDICATED), knode("h2"))
    r.passes()
    assert r.jobs.cordoned == ["h1"]
    r.put(kpod("solo", tolerations=TOLERATES))
    r.passes()
    assert r.jobs.uncordoned == ["h1"]


def test_a_taint_a_running_pod_tolerates_does_not_cordon_once_it_is_bound(r: Rig) -> None:
    r.nodes(knode("h1", taints=DEDICATED), knode("h2"))
    r.put(kpod("solo", tolerations=TOLERATES))
    r.passes()
    r.put(kpod("solo", node="h1", phase="Running", tolerations=TOLERATES))
    r.passes(2)
    assert r.jobs.cordoned == []


def test_taints_the_options_tolerate_keep_no_pod_off(monkeypatch: pytest.MonkeyPatch) -> None:
    r = rig(monkeypatch, Options(labels=Labels(tolerated=("dedicated=gpu:NoSchedule",))))
    mixed_fleet(r, taints=DEDICATED)
    r.put(kpod("solo"))
    r.passes()
    assert r.jobs.cordoned == [] and len(r.jobs.submitted) == 1


# scheduling gates


def test_a_gated_pod_is_not_scheduled_until_its_gates_are_removed(r: Rig) -> None:
    r.nodes(knode("n1"))
    r.put(kpod("llm-0", gang=("llm", 2)), kpod("llm-1", gang=("llm", 2), gates=("quota",)))
    r.passes()
    assert r.jobs.submitted == []
    assert "1 more held by scheduling gates quota" in r.writes.conditions[0][2]
    assert {p for p, _, _ in r.writes.conditions} == {"llm-0"}  # the gated pod is not told
    r.put(kpod("llm-1", gang=("llm", 2)))
    r.passes()
    assert len(r.jobs.submitted) == 1


# the kubelet's refusal


@pytest.mark.parametrize(
    "reason", ["OutOfnvidia.com/gpu", "NodeAffinity", "OutOfcpu", "UnexpectedAdmissionError"]
)
def test_a_pod_its_kubelet_refused_is_placed_again_not_failed(r: Rig, reason: str) -> None:
    job = submitted(r, "llm", 1)
    placed_pods(r, job, ["n1"])
    pod = r.pods["research/llm-0"]
    refused = (reason, "Pod was rejected: Node didn't have enough resource")
    r.put(kpod("llm-0", uid=pod.uid, node="n1", group="llm", refused=refused))
    r.passes(2)
    (exited,) = [e for e in r.agents.events() if e.kind == "exited"]
    assert (exited.by_node, exited.exit_code, exited.signal) == (True, None, None)
    assert f"refused it: {reason}" in exited.detail
    assert [p for p, _ in r.writes.events("KubeletRefused")] == ["llm-0"]

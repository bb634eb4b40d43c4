"""Which pods are one gang, when a gang may be placed, the key that keeps two scheduler
replicas from submitting it twice, and when a PodDisruptionBudget protects it from
preemption."""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kube_unit_kit import kgroup, kpod

from boltforge.kube import model
from boltforge.kube.gangs import GangIndex, GangKey, PodGang, gangs, key_of, preemptible
from boltforge.kube.model import GANG, GANG_SIZE, Budget
from boltforge.testing.kube_builders import pdb_json


def budget(name: str, match: dict[str, str], **kw: object) -> Budget:
    return model.budget(pdb_json(name, match, **kw))  # type: ignore[arg-type]


# membership


def test_a_pod_group_label_wins_over_a_gang_annotation_and_a_lone_pod_is_its_own_gang() -> None:
    both = kpod("a", group="llm", gang=("pair", 2))
    annotated = kpod("b", gang=("pair", 2))
    alone = kpod("c")
    assert key_of(both) == GangKey("research", "podgroup", "llm")
    assert key_of(annotated) == GangKey("research", "gang", "pair")
    assert key_of(alone) == GangKey("research", "pod", "c")
    assert str(key_of(both)) == "research/llm"


def test_gangs_of_the_same_name_in_two_namespaces_are_two_gangs() -> None:
    pods = [
        kpod("w0", group="llm", namespace="team-a"),
        kpod("w1", group="llm", namespace="team-a"),
        kpod("w0", group="llm", namespace="team-b"),
    ]
    groups = {"team-a/llm": kgroup("llm", 2, namespace="team-a")}
    found = gangs(pods, groups)
    a = found[GangKey("team-a", "podgroup", "llm")]
    b = found[GangKey("team-b", "podgroup", "llm")]
    assert [p.name for p in a.pods] == ["w0", "w1"] and a.min_member == 2 and a.not_ready() is None
    assert b.min_member is None  # team-b has no PodGroup llm
    assert "PodGroup llm does not exist in namespace team-b" in (b.not_ready() or "")


def test_a_gang_takes_its_pod_groups_min_member_and_uid() -> None:
    found = gangs([kpod("w0", group="g")], {"research/g": kgroup("g", 3, uid="uid-g")})
    g = found[GangKey("research", "podgroup", "g")]
    assert (g.min_member, g.group_uid) == (3, "uid-g")


@pytest.mark.parametrize(
    ("size", "min_member"),
    [("4", 4), ("1", 1), ("0", 1), ("-2", 1), ("four", 1), ("", 1)],
    ids=["4", "1", "0", "negative", "words", "empty"],
)
def test_an_annotation_gangs_size_is_at_least_one_and_unreadable_means_one(
    size: str, min_member: int
) -> None:
    obj = kpod("a", gang=("g", 2))
    pod = model.pod(
        {
            "metadata": {
                "name": obj.name,
                "namespace": obj.namespace,
                "annotations": {GANG: "g", GANG_SIZE: size},
            }
        }
    )
    (gang,) = gangs([pod], {}).values()
    assert gang.min_member == min_member


def test_an_annotation_gang_without_a_size_is_ready_with_one_pod() -> None:
    pod = model.pod({"metadata": {"name": "a", "annotations": {GANG: "g"}}})
    (gang,) = gangs([pod], {}).values()
    assert gang.min_member == 1 and gang.not_ready() is None


# readiness


def test_only_unbound_live_pods_wait_and_they_wait_in_name_order() -> None:
    pods = [
        kpod("w3", group="g"),
        kpod("w1", group="g"),
        kpod("w2", group="g", node="n1"),
        kpod("w4", group="g", deleting=True),
        kpod("w5", group="g", phase="Failed"),
        kpod("w0", group="g", phase="Succeeded"),
    ]
    (gang,) = gangs(pods, {"research/g": kgroup("g", 2)}).values()
    assert [p.name for p in gang.waiting] == ["w1", "w3"]
    assert len(gang.pods) == 6


def test_a_gang_counts_only_its_waiting_pods_toward_its_min_member() -> None:
    pods = [kpod("w0", group="g"), kpod("w1", group="g", node="n1"), kpod("w2", group="g")]
    (gang,) = gangs(pods, {"research/g": kgroup("g", 3)}).values()
    why = gang.not_ready() or ""
    assert "2 of the 3 pods its PodGroup g needs exist" in why
    assert "nothing is bound until all do" in why


def test_an_annotation_gang_says_which_annotation_sets_its_size() -> None:
    (gang,) = gangs([kpod("a", gang=("pair", 3))], {}).values()
    assert gang.not_ready() == (
        "waiting for its gang: 1 of the 3 pods its boltforge.io/gang-size of gang pair needs "
        "exist; nothing is bound until all do"
    )


def test_a_missing_pod_group_says_how_to_fix_it() -> None:
    (gang,) = gangs([kpod("a", group="ghost")], {}).values()
    why = gang.not_ready() or ""
    assert why.startswith("PodGroup ghost does not exist in namespace research")
    assert "create it (scheduling.x-k8s.io/v1alpha1) or remove the pod-group label" in why


# keys and names


def test_a_pod_groups_uid_anchors_the_idempotency_key() -> None:
    (gang,) = gangs([kpod("a", group="g")], {"research/g": kgroup("g", 1, uid="u-7")}).values()
    assert gang.idempotency_key() == "k8s/research/podgroup/g/u-7"


def test_without_a_pod_group_the_key_hashes_the_waiting_pods_uids() -> None:
    pods = [kpod("a", gang=("pair", 2), uid="u1"), kpod("b", gang=("pair", 2), uid="u2")]
    (gang,) = gangs(pods, {}).values()
    key = gang.idempotency_key()
    assert key.startswith("k8s/research/gang/pair/") and len(key.rsplit("/", 1)[1]) == 32
    again = [*pods, kpod("c", gang=("pair", 2), uid="u3")]
    (bigger,) = gangs(again, {}).values()
    assert bigger.idempotency_key() != key  # a different set of pods is a different gang
    bound = [kpod("a", gang=("pair", 2), uid="u1"), kpod("b", gang=("pair", 2), uid="u2")]
    bound.append(kpod("z", gang=("pair", 2), uid="u9", node="n1"))
    (with_bound,) = gangs(bound, {}).values()
    assert with_bound.idempotency_key() == key  # only the waiting pods count


@settings(max_examples=60, deadline=None)
@given(st.lists(st.uuids(), min_size=1, max_size=12, unique=True), st.randoms())
def test_the_idempotency_key_is_the_same_whichever_order_the_pods_are_seen(
    uids: list[object], rnd: random.Random
) -> None:
    pods = [kpod(f"p{i}", gang=("g", len(uids)), uid=str(u)) for i, u in enumerate(uids)]
    shuffled = list(pods)
    rnd.shuffle(shuffled)
    (first,) = gangs(pods, {}).values()
    (second,) = gangs(shuffled, {}).values()
    assert first.idempotency_key() == second.idempotency_key()


def test_a_long_idempotency_key_is_cut_at_200_characters() -> None:
    gang = PodGang(GangKey("ns", "podgroup", "x" * 300), group_uid="u")
    key = gang.idempotency_key()
    assert len(key) == 200 and key.startswith("k8s/ns/podgroup/xxx")


@pytest.mark.parametrize(
    ("namespace", "name", "job"),
    [
        ("research", "llm", "research-llm"),
        ("Research", "LLM_Pretrain", "research-llm_pretrain"),
        ("ns", "a" * 80, ("ns-" + "a" * 80)[:63]),
        ("--", "--", "gang"),
    ],
    ids=["plain", "case", "long", "nothing-left"],
)
def test_a_gangs_job_name_is_a_boltforge_name(namespace: str, name: str, job: str) -> None:
    assert PodGang(GangKey(namespace, "podgroup", name)).job_name() == job


# preemption


def gang_of(pods: list[model.KubePod], min_member: int = 1) -> PodGang:
    (gang,) = gangs(pods, {"research/g": kgroup("g", min_member)}).values()
    return gang


def test_a_budget_that_counts_other_pods_too_can_still_refuse_the_gang() -> None:
    mine = [kpod(f"w{i}", group="g", labels={"app": "x"}) for i in range(2)]
    others = [kpod(f"o{i}", labels={"app": "x"}) for i in range(3)]
    gang = gang_of(mine)
    everyone = mine + others
    assert not preemptible(gang, [budget("one", {"app": "x"}, min_available="80%")], everyone)
    assert preemptible(gang, [budget("two", {"app": "x"}, min_available=3)], everyone)


def test_a_budget_in_another_namespace_or_selecting_none_of_the_gang_does_not_protect_it() -> None:
    mine = [kpod(f"w{i}", group="g", labels={"app": "x"}) for i in range(2)]
    gang = gang_of(mine)
    elsewhere = budget("b", {"app": "x"}, min_available="100%", namespace="other")
    unrelated = budget("c", {"app": "y"}, min_available="100%")
    assert preemptible(gang, [elsewhere, unrelated], mine)


def test_pods_being_deleted_are_not_counted_as_available() -> None:
    mine = [kpod(f"w{i}", group="g", labels={"app": "x"}) for i in range(2)]
    leaving = [kpod(f"o{i}", labels={"app": "x"}, deleting=True) for i in range(4)]
    gang = gang_of(mine)
    # Counting the leaving pods, min 2 of 6 would let both go; without them none may go.
    assert not preemptible(gang, [budget("b", {"app": "x"}, min_available=2)], mine + leaving)


def test_an_empty_selector_budget_covers_the_whole_namespace() -> None:
    mine = [kpod(f"w{i}", group="g") for i in range(2)]
    gang = gang_of(mine)
    everything = Budget("research", "all", {}, None, "1")
    assert not preemptible(gang, [everything], mine)
    assert preemptible(gang, [Budget("research", "all", {}, None, "2")], mine)


def test_a_gang_with_no_budgets_is_preemptible() -> None:
    mine = [kpod(f"w{i}", group="g") for i in range(4)]
    assert preemptible(gang_of(mine), [], mine)


# kept current from change sets

POD = st.tuples(
    st.sampled_from(["p0", "p1", "p2", "p3", "p4", "p5"]),
    st.sampled_from(["a", "b"]),  # namespace
    st.sampled_from(["group", "gang", "alone"]),
    st.sampled_from(["x", "y"]),  # the group or gang it names
    st.integers(0, 3),  # the gang size it annotates
    st.booleans(),  # bound
)
STEP = st.one_of(
    st.tuples(st.just("put"), POD),
    st.tuples(st.just("drop"), st.sampled_from(["a/p0", "a/p1", "b/p2", "a/p3", "b/p4"])),
    st.tuples(st.just("group"), st.sampled_from(["a/x", "b/x", "a/y"]), st.integers(0, 4)),
)


def _pod(name: str, ns: str, how: str, target: str, size: int, bound: bool) -> model.KubePod:
    grouping: dict[str, object] = {}
    if how == "group":
        grouping["group"] = target
    elif how == "gang":
        grouping["gang"] = (target, size)
    return kpod(name, namespace=ns, node="n1" if bound else "", **grouping)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(STEP, max_size=5), max_size=8))
def test_a_gang_index_fed_change_sets_matches_gangs_worked_out_from_scratch(
    passes: list[list[tuple[Any, ...]]],
) -> None:
    pods: dict[str, model.KubePod] = {}
    groups: dict[str, model.PodGroup] = {}
    index = GangIndex()
    index.update(pods, None, groups, None)
    for steps in passes:
        changed, changed_groups = set(), set()
        for step in steps:
            if step[0] == "put":
                pod = _pod(*step[1])
                pods[pod.path] = pod
                changed.add(pod.path)
            elif step[0] == "drop":
                pods.pop(step[1], None)
                changed.add(step[1])
            else:
                path, size = step[1], step[2]
                ns, name = path.split("/")
                if size:
                    groups[path] = kgroup(name, size, namespace=ns)
                else:
                    groups.pop(path, None)
                changed_groups.add(path)
        kept = index.update(pods, changed, groups, changed_groups)
        assert _shape(kept) == _shape(gangs(pods.values(), groups))


def _shape(found: dict[GangKey, PodGang]) -> dict[GangKey, tuple[object, ...]]:
    return {k: (sorted(p.uid for p in g.pods), g.min_member, g.group_uid) for k, g in found.items()}


def test_pods_of_one_gang_that_annotate_different_sizes_wait_for_the_largest() -> None:
    pods = [kpod("w0", gang=("pair", 2)), kpod("w1", gang=("pair", 3))]
    (gang,) = gangs(pods, {}).values()
    assert gang.min_member == 3 and "2 of the 3 pods" in (gang.not_ready() or "")

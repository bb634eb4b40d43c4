"""A cluster without the PodGroup CRD: the PodGroup list answers 404, which the informer takes
as "not installed" (synced and empty, said once, listed again later), so the scheduler
syncs, places gangs of annotations, and tells pods that name a PodGroup that the CRD is
missing and how to install it. The CRD ships in ``deploy/kubernetes/`` with the group,
version and plural the scheduler lists."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import yaml
from kube_sched_rig import Rig, rig
from kube_unit_kit import knode, kpod
from kubernetes.client.exceptions import ApiException
from test_kube_informer import Listed, Script, Stream, obj

from boltforge.kube.informer import Informer
from boltforge.kube.scheduler import CRD_MISSING

CRD = Path(__file__).resolve().parents[3] / "deploy" / "kubernetes" / "podgroup-crd.yaml"


def not_found() -> ApiException:
    return ApiException(status=404, reason="Not Found")


def informer_of(script: Script, changes: list[int]) -> Informer[dict[str, object]]:
    inf: Informer[dict[str, object]] = Informer(
        "podgroups", script, dict, lambda: changes.append(1), absent="CRD missing", recheck_s=0
    )
    script.informer = inf
    return inf


def test_a_kind_that_is_not_served_syncs_empty_and_says_so_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    calls: list[int] = []

    def lister(**_: object) -> object:
        calls.append(1)
        if len(calls) == 3:
            inf.stop()
        raise not_found()

    inf: Informer[dict[str, object]] = Informer(
        "podgroups", lister, dict, lambda: None, absent="CRD missing", recheck_s=0
    )
    with caplog.at_level(logging.ERROR, "boltforge.kube"):
        inf.run()
    assert len(calls) == 3  # listed again and again, not once and given up
    assert inf.synced.is_set() and inf.absent and inf.snapshot() == {}
    assert [r.message for r in caplog.records] == ["podgroups: CRD missing"]


def test_a_crd_installed_later_is_listed_and_watched() -> None:
    script, changes = Script(not_found(), Listed([obj("llm", 3)], 10), Stream()), list[int]()
    inf = informer_of(script, changes)
    inf.run()
    assert not inf.absent and sorted(inf.snapshot()) == ["ns/llm"]
    assert script.versions()[:3] == ["list", "list", "10"]


@pytest.fixture
def r(monkeypatch: pytest.MonkeyPatch) -> Rig:
    return rig(monkeypatch)


def test_without_the_crd_annotation_gangs_are_placed_and_podgroup_pods_say_why(r: Rig) -> None:
    r.sched.groups.absent = True
    r.nodes(knode("n1"), knode("n2"))
    r.put(kpod("a-0", gang=("a", 2)), kpod("a-1", gang=("a", 2)))
    r.put(kpod("llm-0", group="llm"), kpod("llm-1", group="llm"))
    r.passes()
    assert [spec["name"] for spec, _, _ in r.jobs.submitted] == ["research-a"]
    said = {(p, why) for p, why, _ in r.writes.conditions if p.startswith("llm")}
    assert said == {("llm-0", "PodGroupCRDMissing"), ("llm-1", "PodGroupCRDMissing")}
    text = next(t for p, _, t in r.writes.conditions if p == "llm-0")
    assert text == f"boltforge: {CRD_MISSING}"
    assert "kubectl apply -f deploy/kubernetes/podgroup-crd.yaml" in text


def test_the_shipped_crd_is_the_api_the_scheduler_lists() -> None:
    crd = yaml.safe_load(CRD.read_text())
    spec = crd["spec"]
    assert crd["kind"] == "CustomResourceDefinition"
    assert crd["metadata"]["name"] == "podgroups.scheduling.x-k8s.io"
    assert (spec["group"], spec["names"]["plural"], spec["names"]["kind"]) == (
        "scheduling.x-k8s.io",
        "podgroups",
        "PodGroup",
    )
    (version,) = spec["versions"]
    assert version["name"] == "v1alpha1" and version["served"] and version["storage"]
    fields = version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    assert fields["minMember"]["type"] == "integer"

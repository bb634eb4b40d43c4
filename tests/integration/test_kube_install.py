"""What an admin installs (``deploy/kubernetes/``) applied with ``kubectl apply`` to the real
API server, in the order docs/kubernetes.md gives: every object is accepted and created; the
priority class resolves on the Deployments' pods; the ServiceAccount and its bindings grant
what the scheduler needs and no more; the pods stay Pending while no node can take them and,
once a kwok node can, the default scheduler binds them and kwok reports them Running (kwok
runs no container); ``kubectl delete -f`` removes every object. Then Boltforge's own image
(``deploy/images/build-boltforge.sh``) is built once and ``bolt`` run inside it, where a
container engine can run (skipped elsewhere unless BOLT_REQUIRE_CONTAINERS=1, as in CI)."""

from __future__ import annotations

import os
import subprocess
import tomllib
from collections.abc import Iterator
from typing import Any

import kubernetes.client as client
import pytest
import yaml

from boltforge.testing.containers import containers_conf, engine_problem
from boltforge.testing.processes import wait_until
from boltforge.testing.realkube import MANIFESTS, REPO, RealKube, kwok_node

NS = "boltforge-system"
SA = f"system:serviceaccount:{NS}:boltforge-scheduler"
# The order of docs/kubernetes.md's install: the namespace and the cluster-wide kinds
# before what lives in them or uses them.
ORDER = (
    "namespace.yaml",
    "priorityclass.yaml",
    "podgroup-crd.yaml",
    "rbac.yaml",
    "config.yaml",
    "server.yaml",
    "scheduler.yaml",
)
BUILD = REPO / "deploy" / "images" / "build-boltforge.sh"
VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
IMAGE = f"localhost/boltforge:{VERSION}"
NODE = "manifests-0"


def documents() -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for name in ORDER:
        docs += [d for d in yaml.safe_load_all((MANIFESTS / name).read_text()) if d]
    return docs


def files() -> list[str]:
    return [a for name in ORDER for a in ("-f", str(MANIFESTS / name))]


def test_the_install_order_covers_every_manifest() -> None:
    assert sorted(ORDER) == sorted(p.name for p in MANIFESTS.glob("*.yaml"))


def test_the_deployments_run_the_image_the_build_script_makes() -> None:
    images = {
        d["metadata"]["name"]: [c["image"] for c in d["spec"]["template"]["spec"]["containers"]]
        for d in documents()
        if d["kind"] == "Deployment"
    }
    assert images == {"boltforge-server": [IMAGE], "boltforge-scheduler": [IMAGE]}


@pytest.fixture(scope="module")
def applied(real_kube_session: RealKube) -> Iterator[tuple[RealKube, str]]:
    """The manifests applied to a cluster that held none of their objects and no node (a
    test before may have applied some: they are deleted first); the CRD is put back at the
    end for the tests that follow."""
    kube = real_kube_session
    kube.kubectl("delete", "--ignore-not-found", "--wait", "--timeout=120s", *files())
    kube.delete_nodes()
    out = kube.apply(*(MANIFESTS / name for name in ORDER))
    try:
        yield kube, out
    finally:
        kube.kubectl("delete", "--ignore-not-found", "--wait", "--timeout=120s", *files())
        for node in kube.nodes():
            if node["metadata"]["name"] == NODE:
                kube.core.delete_node(NODE)
        kube.install_crds()


def test_every_object_is_created(applied: tuple[RealKube, str]) -> None:
    kube, out = applied
    for doc in documents():
        kind, name = doc["kind"].lower(), doc["metadata"]["name"]
        assert any(
            line.endswith(f"/{name} created") and line.split("/")[0].startswith(kind)
            for line in out.splitlines()
        ), f"{kind}/{name} not created:\n{out}"
        where = ["-n", doc["metadata"]["namespace"]] if "namespace" in doc["metadata"] else []
        kube.kubectl("get", f"{kind}/{name}", *where)  # raises if absent
    crd = kube.kubectl(
        "wait", "--for=condition=Established", "--timeout=60s", "crd/podgroups.scheduling.x-k8s.io"
    )
    assert "condition met" in crd.stdout


def test_the_priority_class_resolves_on_the_pods(applied: tuple[RealKube, str]) -> None:
    kube, _ = applied

    def pods() -> list[client.V1Pod] | None:
        got = kube.core.list_namespaced_pod(NS).items
        return got if len(got) == 3 else None  # one server, two schedulers

    for pod in wait_until(pods, 120, "the ReplicaSets to create three pods"):
        assert pod.spec.priority_class_name == "boltforge-critical"
        assert pod.spec.priority == 1_000_000_000
        assert pod.spec.preemption_policy == "PreemptLowerPriority"
        assert pod.spec.containers[0].image == IMAGE
        if pod.metadata.labels["app"] == "boltforge-scheduler":
            assert pod.spec.service_account_name == "boltforge-scheduler"
            assert "--token-file=/var/run/secrets/boltforge/token" in pod.spec.containers[0].args


def test_the_service_account_may_do_what_the_scheduler_does_and_no_more(
    applied: tuple[RealKube, str],
) -> None:
    kube, _ = applied
    kube.kubectl("get", "serviceaccount/boltforge-scheduler", "-n", NS)
    for kind in ("clusterrolebinding", "rolebinding"):
        name = (
            "boltforge-scheduler" if kind == "clusterrolebinding" else "boltforge-scheduler-lease"
        )
        where = ["-n", NS] if kind == "rolebinding" else []
        binding = kube.kubectl("get", f"{kind}/{name}", *where, "-o", "yaml").stdout
        subjects = yaml.safe_load(binding)["subjects"]
        assert subjects == [
            {"kind": "ServiceAccount", "name": "boltforge-scheduler", "namespace": NS}
        ]

    def can(*args: str) -> bool:
        done = kube.kubectl("auth", "can-i", f"--as={SA}", *args, check=False)
        return done.stdout.strip() == "yes"

    for allowed in (
        ("watch", "nodes"),
        ("list", "pods", "-A"),
        ("create", "pods", "--subresource=binding", "-n", "default"),
        ("create", "pods", "--subresource=eviction", "-n", "default"),
        ("patch", "pods", "--subresource=status", "-n", "default"),
        ("create", "events", "-n", "default"),
        ("watch", "podgroups.scheduling.x-k8s.io", "-A"),
        ("list", "priorityclasses"),
        ("watch", "jobs.batch", "-A"),
        ("list", "poddisruptionbudgets", "-A"),
        ("update", "leases", "-n", NS),
    ):
        assert can(*allowed), allowed
    for refused in (
        ("create", "pods", "-n", "default"),
        ("delete", "pods", "-n", "default"),
        ("patch", "nodes"),
        ("delete", "jobs.batch", "-n", "default"),
        ("get", "secrets", "-n", NS),
        ("update", "leases", "-n", "default"),
    ):
        assert not can(*refused), refused


def test_the_pods_stay_pending_until_a_node_can_take_them(applied: tuple[RealKube, str]) -> None:
    kube, _ = applied

    def unschedulable() -> bool:
        pods = kube.core.list_namespaced_pod(NS).items
        conditions = [
            {c.type: c for c in p.status.conditions or []}.get("PodScheduled") for p in pods
        ]
        return len(pods) == 3 and all(
            c is not None and c.status == "False" and c.reason == "Unschedulable"
            for c in conditions
        )

    wait_until(unschedulable, 120, "the default scheduler to find no node for the pods")
    assert all(p.status.phase == "Pending" for p in kube.core.list_namespaced_pod(NS).items)
    apps = client.AppsV1Api(kube.api)
    for name in ("boltforge-server", "boltforge-scheduler"):
        assert not apps.read_namespaced_deployment(name, NS).status.available_replicas

    # A node kwok runs: the default scheduler binds them (Boltforge's own pods are not the
    # Boltforge scheduler's to place) and kwok reports them Running without a container.
    kube.add_nodes([kwok_node(NODE, gpus=0, rack=None)])

    def running() -> bool:
        pods = kube.core.list_namespaced_pod(NS).items
        return len(pods) == 3 and all(
            p.status.phase == "Running" and p.spec.node_name == NODE for p in pods
        )

    wait_until(running, 120, "the pods to be bound to the kwok node and Running")

    def available() -> bool:
        return all(
            (apps.read_namespaced_deployment(name, NS).status.available_replicas or 0) == want
            for name, want in (("boltforge-server", 1), ("boltforge-scheduler", 2))
        )

    wait_until(available, 120, "the Deployments to count their pods available")


def test_delete_removes_every_object(applied: tuple[RealKube, str]) -> None:
    kube, _ = applied
    out = kube.kubectl("delete", "--wait", "--timeout=120s", *files()).stdout
    for doc in documents():
        kind, name = doc["kind"].lower(), doc["metadata"]["name"]
        assert any(line.endswith(f'"{name}" deleted') for line in out.splitlines()), out
        where = ["-n", doc["metadata"]["namespace"]] if "namespace" in doc["metadata"] else []
        gone = kube.kubectl("get", f"{kind}/{name}", *where, check=False)
        assert gone.returncode != 0 and "NotFound" in gone.stderr, (kind, name, gone.stderr)


# --- the image ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """``IMAGE`` built by ``deploy/images/build-boltforge.sh`` on podman; the environment
    that selects podman's configuration for this host."""
    env = containers_conf(tmp_path_factory.mktemp("podman"))
    problem = engine_problem(env)
    if problem is not None:
        if os.environ.get("BOLT_REQUIRE_CONTAINERS") == "1":
            raise RuntimeError(f"a container engine is required here: {problem}")
        pytest.skip(problem)
    env = {**os.environ, **env}
    built = subprocess.run(
        ["bash", str(BUILD), "podman"], capture_output=True, text=True, env=env, timeout=900
    )
    assert built.returncode == 0, f"{built.stdout}\n{built.stderr}"
    assert f"built {IMAGE}" in built.stdout
    yield env


def podman(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["podman", *args], capture_output=True, text=True, env=env, timeout=300, check=False
    )


def test_the_image_runs_bolt_as_nobody_under_tini(image: dict[str, str]) -> None:
    conf = podman(image, "image", "inspect", IMAGE, "--format", "{{json .Config}}")
    assert conf.returncode == 0, conf.stderr
    config = yaml.safe_load(conf.stdout)
    assert config["Entrypoint"] == ["/usr/bin/tini", "--"]
    assert config["User"] == "65534:65534"
    run = podman(
        image, "run", "--rm", "-e", "COLUMNS=200", IMAGE, "bolt", "kube-scheduler", "--help"
    )
    assert run.returncode == 0, run.stderr
    for option in ("--token-file", "--lease-namespace", "--scheduler-name"):
        assert option in run.stdout
    who = podman(image, "run", "--rm", IMAGE, "python3", "-c", VERSION_AND_USER)
    assert who.returncode == 0, who.stderr
    assert who.stdout.split() == [VERSION, "65534", "tini"]


# boltforge's version, the user id, and the name of PID 1 (the process that gets SIGTERM)
VERSION_AND_USER = (
    "import os, boltforge; print(boltforge.__version__, os.getuid(), "
    "open('/proc/1/comm').read().strip())"
)


def test_sigterm_reaches_bolt_through_tini(image: dict[str, str]) -> None:
    name = f"boltforge-sigterm-{os.getpid()}"
    started = podman(
        image, "run", "-d", "--name", name, IMAGE, "bolt", "server", "--host", "127.0.0.1"
    )
    assert started.returncode == 0, started.stderr
    try:
        # `podman stop` sends SIGTERM to PID 1 (tini), which passes it on to bolt; with a
        # long grace, only a bolt that ends on SIGTERM lets the container stop by itself.
        def started_up() -> bool:
            logs = podman(image, "logs", name)
            return "admin token" in logs.stdout + logs.stderr

        wait_until(started_up, 120, "bolt server to start")
        stopped = podman(image, "stop", "--time", "120", name)
        assert stopped.returncode == 0, stopped.stderr
        code = podman(image, "inspect", name, "--format", "{{.State.ExitCode}}").stdout.strip()
        assert code in ("0", "143"), code  # ended by the signal, not killed (137)
    finally:
        podman(image, "rm", "--force", name)

"""A real Kubernetes control plane for tests and benchmarks, on loopback: etcd,
kube-apiserver (TLS, RBAC, service-account tokens), kube-controller-manager, optionally the
default kube-scheduler, and kwok faking the kubelets of any number of GPU nodes.

The binaries are built from their Go modules by ``testenv/kube/build.sh`` at the releases
pinned in ``testenv/kube/versions.env``, into a cache outside the work tree; this module only
runs them. Certificates and the service-account signing key are made at start-up. Every
process logs into the control plane's folder (``RealKube.root``), which is kept.

Nodes are ordinary Node objects with the ``kwok.x-k8s.io/node: fake`` annotation: kwok marks
them Ready, renews their Leases, moves pods bound to them to Running, deletes them when they
are deleted, and ends them when a test annotates them (``testenv/kube/kwok-stages.yaml``).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import ssl
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import httpx
import kubernetes.client as client
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from boltforge import tls
from boltforge.kube.connect import api_client
from boltforge.testing.postgres import free_port
from boltforge.testing.processes import Proc, spawn, wait_until

REPO = Path(__file__).resolve().parents[2]
TESTENV = REPO / "testenv" / "kube"
BUILD = TESTENV / "build.sh"
STAGES = TESTENV / "kwok-stages.yaml"
MANIFESTS = REPO / "deploy" / "kubernetes"
BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")
KWOK_ANNOTATION = "kwok.x-k8s.io/node"
EXIT_ANNOTATION = "kwok.boltforge.io/exit"
SCHEDULER_SA = ("boltforge-system", "boltforge-scheduler")
SCHEDULER_USER = "system:serviceaccount:boltforge-system:boltforge-scheduler"
SERVER_AUTH, CLIENT_AUTH = ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH
# The API server's names: loopback, and the in-cluster service's address and name.
SERVING_HOSTS = ("127.0.0.1", "10.96.0.1", "localhost", "kubernetes.default.svc")
# The API server's audit log records every request of the scheduler's ServiceAccount, once
# each (when its answer is complete), and nothing of anyone else's.
AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived", "ResponseStarted"],
    "rules": [
        {"level": "Metadata", "users": [SCHEDULER_USER]},
        {"level": "None"},
    ],
}


class KubeNotBuilt(RuntimeError):
    """The control plane's binaries are not in the cache."""


def bin_dir() -> Path:
    """Where ``build.sh`` puts (or has put) the binaries: ``$BOLT_KUBE_BIN`` if set."""
    if env := os.environ.get("BOLT_KUBE_BIN"):
        return Path(env)
    out = subprocess.run(
        ["bash", str(BUILD), "--print"], capture_output=True, text=True, check=True, timeout=30
    )
    return Path(out.stdout.strip().splitlines()[-1])


def missing() -> list[str]:
    """The binaries that are not built yet (none when the control plane can start)."""
    where = bin_dir()
    return [b for b in BINARIES if not os.access(where / b, os.X_OK)]


def drain(response: Any) -> None:
    """Read a raw (``_preload_content=False``) answer to its end and give its connection back
    to the pool (released unread, the connection would carry the answer into the next
    request)."""
    response.read()
    response.release_conn()


def kubectl_path() -> str:
    found = os.environ.get("BOLT_KUBECTL") or shutil.which("kubectl")
    if found is None:
        raise KubeNotBuilt("kubectl is not installed (apt-get install kubernetes-client)")
    return found


# --- certificates -------------------------------------------------------------------------


def _name(cn: str, org: str | None = None) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, cn)]
    if org:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, org))
    return x509.Name(attrs)


@dataclass(frozen=True)
class Pki:
    """The control plane's certificates and keys, as files under ``root``."""

    root: Path

    @property
    def ca(self) -> Path:
        return self.root / tls.CA_CERT

    @property
    def serving(self) -> tuple[Path, Path]:
        return self.root / "apiserver.crt", self.root / "apiserver.key"

    @property
    def admin(self) -> tuple[Path, Path]:
        return self.root / "admin.crt", self.root / "admin.key"

    @property
    def sa(self) -> tuple[Path, Path]:
        """The service-account signing key and its public half."""
        return self.root / "sa.key", self.root / "sa.pub"

    @classmethod
    def make(cls, root: Path) -> Pki:
        """A CA (``tls.new_ca``), the API server's serving certificate, a client certificate
        of ``system:masters`` for the admin, and the service-account signing key, written
        under ``root`` (keys 0600)."""
        root.mkdir(parents=True, exist_ok=True)
        pki = cls(root)
        ca, ca_key = tls.new_ca(root, "boltforge-test-ca")
        leaves = (
            (pki.serving, _name("kube-apiserver"), SERVER_AUTH, SERVING_HOSTS),
            (pki.admin, _name("boltforge-admin", "system:masters"), CLIENT_AUTH, ()),
        )
        for (crt, key_path), subject, usage, hosts in leaves:
            cert, key = tls.issue(ca, ca_key, subject, usage, hosts)
            crt.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
            key_path.write_bytes(tls.key_pem(key))
            key_path.chmod(0o600)
        sa_key = ec.generate_private_key(ec.SECP256R1())
        pki.sa[0].write_bytes(tls.key_pem(sa_key))
        pki.sa[0].chmod(0o600)
        pki.sa[1].write_bytes(
            sa_key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )
        return pki


def write_kubeconfig(
    path: Path, url: str, ca: Path, *, user: dict[str, str], name: str = "realkube"
) -> Path:
    """A kubeconfig of one cluster, one user (``client-certificate``/``client-key`` or
    ``token``) and one current context."""
    conf = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": name, "cluster": {"server": url, "certificate-authority": str(ca)}}],
        "users": [{"name": name, "user": user}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": name}}],
        "current-context": name,
    }
    path.write_text(yaml.safe_dump(conf))
    path.chmod(0o600)
    return path


# --- nodes --------------------------------------------------------------------------------


def kwok_node(
    name: str,
    *,
    gpus: int = 8,
    rack: str | None = "r1",
    product: str = "NVIDIA-H100-80GB-HBM3",
    labels: dict[str, str] | None = None,
    taints: list[dict[str, str]] | None = None,
    unschedulable: bool = False,
) -> dict[str, Any]:
    """A Node that kwok runs: ``gpus`` ``nvidia.com/gpu`` allocatable (none when 0), GPU
    Feature Discovery's labels and Boltforge's rack label (none when ``rack`` is None).
    kwok writes its conditions, addresses and node info when it takes it up."""
    all_labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux"}
    if gpus:
        all_labels |= {
            "nvidia.com/gpu.product": product,
            "nvidia.com/gpu.memory": "81559",
            "nvidia.com/gpu.count": str(gpus),
        }
    if rack is not None:
        all_labels["topology.boltforge.io/rack"] = rack
    all_labels |= labels or {}
    resources = {"cpu": "96", "memory": "1000Gi", "pods": "110"}
    if gpus:
        resources["nvidia.com/gpu"] = str(gpus)
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": all_labels,
            "annotations": {KWOK_ANNOTATION: "fake"},
        },
        "spec": {"unschedulable": unschedulable, "taints": taints or []},
        "status": {"allocatable": dict(resources), "capacity": dict(resources)},
    }


def node_ready(node: dict[str, Any]) -> bool:
    """Ready, and no longer tainted not-ready by the node lifecycle controller."""
    conds = (node.get("status") or {}).get("conditions") or []
    taints = (node.get("spec") or {}).get("taints") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conds) and not any(
        t["key"] == "node.kubernetes.io/not-ready" for t in taints
    )


# --- the control plane --------------------------------------------------------------------


@dataclass
class RealKube:
    """A running control plane. ``admin_kubeconfig`` is cluster-admin (``system:masters``
    client certificate); ``scheduler_kubeconfig`` is the ``boltforge-scheduler``
    ServiceAccount's token, bound by the repository's RBAC manifests only."""

    root: Path
    bins: Path
    pki: Pki
    url: str = ""
    etcd_url: str = ""
    procs: dict[str, Proc] = field(default_factory=dict)
    startup_s: dict[str, float] = field(default_factory=dict)
    _apiserver_args: list[str] = field(default_factory=list)

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def admin_kubeconfig(self) -> Path:
        return self.root / "admin.kubeconfig"

    @cached_property
    def api(self) -> client.ApiClient:
        """An admin client (its connections are kept)."""
        return api_client(str(self.admin_kubeconfig))

    @property
    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.api)

    def http(self) -> httpx.Client:
        """An admin HTTP client of the API server, for raw paths (``/version``)."""
        ctx = ssl.create_default_context(cafile=str(self.pki.ca))
        ctx.load_cert_chain(*map(str, self.pki.admin))
        return httpx.Client(base_url=self.url, verify=ctx, timeout=10)

    def version(self) -> dict[str, Any]:
        with self.http() as h:
            got: dict[str, Any] = h.get("/version").raise_for_status().json()
            return got

    # processes

    def _spawn(self, name: str, args: list[str]) -> Proc:
        self.logs.mkdir(parents=True, exist_ok=True)
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(self.root)}
        proc = spawn([str(self.bins / args[0]), *args[1:]], self.logs / f"{name}.log", env)
        self.procs[name] = proc
        return proc

    def _check_alive(self, name: str) -> None:
        proc = self.procs[name]
        if not proc.alive():
            raise RuntimeError(f"{name} exited ({proc.popen.returncode}):\n{self.tail(name)}")

    def tail(self, name: str, lines: int = 30) -> str:
        path = self.logs / f"{name}.log"
        if not path.exists():
            return ""
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    def start(self, *, scheduler: bool = False, timeout: float = 120.0) -> RealKube:
        t0 = time.monotonic()
        etcd_port, peer_port, api_port = free_port(), free_port(), free_port()
        etcd_url = self.etcd_url = f"http://127.0.0.1:{etcd_port}"
        peer_url = f"http://127.0.0.1:{peer_port}"
        self._spawn(
            "etcd",
            [
                "etcd",
                "--name=default",
                f"--data-dir={self.root / 'etcd'}",
                f"--listen-client-urls={etcd_url}",
                f"--advertise-client-urls={etcd_url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=default={peer_url}",
                "--unsafe-no-fsync",
                "--log-level=warn",
            ],
        )

        def etcd_healthy() -> bool:
            self._check_alive("etcd")
            try:
                health = httpx.get(f"{etcd_url}/health", timeout=2).json().get("health")
                return bool(health == "true")
            except (httpx.HTTPError, ValueError):
                return False

        wait_until(etcd_healthy, timeout, "etcd to be healthy")
        self.startup_s["etcd"] = time.monotonic() - t0
        self.url = f"https://127.0.0.1:{api_port}"
        crt, key = self.pki.serving
        sa_key, sa_pub = self.pki.sa
        self._apiserver_args = [
            "kube-apiserver",
            f"--etcd-servers={etcd_url}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={api_port}",
            f"--tls-cert-file={crt}",
            f"--tls-private-key-file={key}",
            f"--client-ca-file={self.pki.ca}",
            f"--service-account-key-file={sa_pub}",
            f"--service-account-signing-key-file={sa_key}",
            "--service-account-issuer=https://kubernetes.default.svc",
            "--authorization-mode=Node,RBAC",
            "--service-cluster-ip-range=10.96.0.0/16",
            f"--cert-dir={self.root / 'apiserver-certs'}",
            f"--audit-policy-file={self._audit_policy()}",
            f"--audit-log-path={self.audit_log}",
            "--audit-log-format=json",
            "--profiling=false",
            "--endpoint-reconciler-type=none",
        ]
        self._spawn("kube-apiserver", self._apiserver_args)
        admin_crt, admin_key = self.pki.admin
        write_kubeconfig(
            self.admin_kubeconfig,
            self.url,
            self.pki.ca,
            user={"client-certificate": str(admin_crt), "client-key": str(admin_key)},
        )

        self._wait_ready(timeout)
        self.startup_s["kube-apiserver"] = time.monotonic() - t0
        conf = str(self.admin_kubeconfig)
        self._spawn(
            "kube-controller-manager",
            [
                "kube-controller-manager",
                f"--kubeconfig={conf}",
                f"--authentication-kubeconfig={conf}",
                f"--authorization-kubeconfig={conf}",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                f"--secure-port={free_port()}",
                f"--cert-dir={self.root / 'kcm-certs'}",
                f"--service-account-private-key-file={sa_key}",
                f"--root-ca-file={self.pki.ca}",
                "--use-service-account-credentials=true",
                "--kube-api-qps=200",
                "--kube-api-burst=400",
                "--concurrent-gc-syncs=20",
            ],
        )
        if scheduler:
            self._spawn(
                "kube-scheduler",
                [
                    "kube-scheduler",
                    f"--kubeconfig={conf}",
                    f"--authentication-kubeconfig={conf}",
                    f"--authorization-kubeconfig={conf}",
                    "--leader-elect=false",
                    "--bind-address=127.0.0.1",
                    f"--secure-port={free_port()}",
                    f"--cert-dir={self.root / 'scheduler-certs'}",
                ],
            )
        self._spawn(
            "kwok",
            [
                "kwok",
                f"--kubeconfig={conf}",
                f"--config={STAGES}",
                f"--manage-nodes-with-annotation-selector={KWOK_ANNOTATION}=fake",
                f"--server-address=127.0.0.1:{free_port()}",
                "--cidr=10.244.0.0/16",
                "--node-ip=10.1.0.1",
                "--node-lease-duration-seconds=40",
            ],
        )

        # The default ServiceAccount that pods need is written by the controller manager.
        def default_sa() -> bool:
            self._check_alive("kube-controller-manager")
            return self._has_default_sa("default")

        wait_until(default_sa, timeout, "the controller manager to create a ServiceAccount")
        self.startup_s["ready"] = time.monotonic() - t0
        return self

    @property
    def audit_log(self) -> Path:
        return self.logs / "audit.log"

    def _audit_policy(self) -> Path:
        path = self.root / "audit-policy.yaml"
        path.write_text(yaml.safe_dump(AUDIT_POLICY))
        return path

    def audited(self, user: str = SCHEDULER_USER) -> Counter[tuple[str, str]]:
        """The requests ``user`` (by default the scheduler's ServiceAccount) has made, by
        verb and resource (``pods/eviction`` for a subresource), from the API server's audit
        log: the same across API server restarts."""
        counts: Counter[tuple[str, str]] = Counter()
        if not self.audit_log.exists():
            return counts
        with self.audit_log.open() as f:
            for line in f:
                try:
                    event = json.loads(line)
                except ValueError:  # a line being written
                    continue
                if (event.get("user") or {}).get("username") != user:
                    continue
                ref = event.get("objectRef") or {}
                resource = ref.get("resource", "")
                if ref.get("subresource"):
                    resource += "/" + ref["subresource"]
                counts[(event.get("verb", ""), resource)] += 1
        return counts

    def _wait_ready(self, timeout: float) -> None:
        def ready() -> bool:
            self._check_alive("kube-apiserver")
            try:
                with self.http() as h:
                    return h.get("/readyz").status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(ready, timeout, "kube-apiserver to be ready")

    def _has_default_sa(self, namespace: str) -> bool:
        try:
            self.core.read_namespaced_service_account("default", namespace)
            return True
        except client.ApiException as e:
            if e.status == 404:
                return False
            raise

    def stop(self) -> None:
        for name in reversed(list(self.procs)):
            proc = self.procs[name]
            if proc.alive():
                proc.stop(grace=10)
        self.procs.clear()

    def alive(self) -> list[str]:
        """The processes that are running (all of them, while all is well)."""
        return [n for n, p in self.procs.items() if p.alive()]

    # objects

    def kubectl(
        self, *args: str, kubeconfig: Path | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        cmd = [kubectl_path(), "--kubeconfig", str(kubeconfig or self.admin_kubeconfig), *args]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        if check and done.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} failed ({done.returncode}): {done.stderr}")
        return done

    def apply(self, *paths: Path) -> str:
        """``kubectl apply -f`` each of ``paths``, as the cluster's admin."""
        args = [a for p in paths for a in ("-f", str(p))]
        return self.kubectl("apply", *args).stdout

    def namespace(self, name: str) -> str:
        """Create namespace ``name`` (if missing) and wait for its default ServiceAccount,
        without which pods are refused."""
        with contextlib.suppress(client.ApiException):
            self.core.create_namespace({"metadata": {"name": name}})
        wait_until(lambda: self._has_default_sa(name), 60, f"namespace {name}'s ServiceAccount")
        return name

    def delete_namespace(self, name: str, wait: bool = True) -> None:
        try:
            self.core.delete_namespace(name)
        except client.ApiException as e:
            if e.status != 404:
                raise
        if wait:
            wait_until(lambda: not self._exists_namespace(name), 120, f"namespace {name} gone")

    def _exists_namespace(self, name: str) -> bool:
        try:
            self.core.read_namespace(name)
            return True
        except client.ApiException as e:
            if e.status == 404:
                return False
            raise

    def add_nodes(self, nodes: Iterable[dict[str, Any]], timeout: float = 300.0) -> list[str]:
        """Create ``nodes`` (``kwok_node``s) and wait until kwok has made them all Ready."""
        nodes = list(nodes)

        def create(node: dict[str, Any]) -> None:
            drain(self.core.create_node(node, _preload_content=False))

        with ThreadPoolExecutor(16) as pool:
            list(pool.map(create, nodes))
        names = [n["metadata"]["name"] for n in nodes]
        want = set(names)

        def all_ready() -> bool:
            for name in ("kwok", "kube-controller-manager"):
                self._check_alive(name)
            return want <= {n["metadata"]["name"] for n in self.nodes() if node_ready(n)}

        wait_until(all_ready, timeout, f"{len(want)} kwok nodes to be Ready")
        return names

    def delete_nodes(self, timeout: float = 120.0) -> None:
        """Delete every node, and wait until they are gone (with the pods bound to them)."""
        drain(self.core.delete_collection_node(_preload_content=False))
        wait_until(lambda: not self.nodes(), timeout, "the nodes to go")

    def nodes(self) -> list[dict[str, Any]]:
        """Every node, as the API server's JSON."""
        reply = self.core.list_node(_preload_content=False)
        items: list[dict[str, Any]] = json.loads(reply.data)["items"]
        return items

    def end_pod(self, name: str, namespace: str, exit_code: int = 0) -> None:
        """The pod's containers exit with ``exit_code`` (kwok moves it to Succeeded or
        Failed)."""
        patch = {"metadata": {"annotations": {EXIT_ANNOTATION: str(exit_code)}}}
        self.core.patch_namespaced_pod(name, namespace, patch)

    def install_crds(self) -> None:
        """Apply ``deploy/kubernetes/podgroup-crd.yaml`` unless PodGroups are served, and
        wait until they are (a test may have removed the CRD)."""
        try:
            crd = client.ApiextensionsV1Api(self.api).read_custom_resource_definition(
                "podgroups.scheduling.x-k8s.io"
            )
            conditions = crd.status.conditions or []
            if any(c.type == "Established" and c.status == "True" for c in conditions):
                return
        except client.ApiException as e:
            if e.status != 404:
                raise
        self.apply(MANIFESTS / "podgroup-crd.yaml")
        self.kubectl(
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "crd/podgroups.scheduling.x-k8s.io",
        )

    def jobset(self) -> contextlib.AbstractContextManager[Proc]:
        """The JobSet controller and its CRD on this control plane, for a ``with`` block
        (``realkube_jobset.jobset_controller``)."""
        from boltforge.testing.realkube_jobset import jobset_controller

        return jobset_controller(self)

    def compact(self) -> int:
        """Compact etcd's history up to now (what kube-apiserver does every five minutes),
        after one more write, so that no watch can resume from a version seen before; the
        revision compacted to."""
        cm = {"metadata": {"name": "boltforge-compaction-mark"}, "data": {"at": str(time.time())}}
        try:
            self.core.replace_namespaced_config_map(cm["metadata"]["name"], "default", cm)
        except client.ApiException as e:
            if e.status != 404:
                raise
            self.core.create_namespaced_config_map("default", cm)
        with httpx.Client(base_url=self.etcd_url, timeout=10) as etcd:
            # etcd's gRPC gateway: a range of one key answers with the store's revision
            head = etcd.post("/v3/kv/range", json={"key": "AA=="}).raise_for_status().json()
            revision = int(head["header"]["revision"])
            etcd.post(
                "/v3/kv/compaction", json={"revision": revision, "physical": True}
            ).raise_for_status()
        return revision

    def restart_apiserver(self, timeout: float = 120.0) -> None:
        """Stop kube-apiserver and start it again on the same port and etcd: every watch
        is cut, and clients resume from what the new one's watch cache holds."""
        proc = self.procs["kube-apiserver"]
        proc.stop(grace=20)
        self._spawn("kube-apiserver", self._apiserver_args)
        self._wait_ready(timeout)

    def scheduler_kubeconfig(self, path: Path, *, seconds: int = 3600) -> Path:
        """Apply ``deploy/kubernetes/namespace.yaml`` and ``rbac.yaml``, request a token of
        the ``boltforge-scheduler`` ServiceAccount (TokenRequest API) and write a kubeconfig
        that uses it: what the scheduler may do is what the manifests grant (applied each
        time, so what a test changed in them is undone)."""
        self.apply(MANIFESTS / "namespace.yaml", MANIFESTS / "rbac.yaml")
        ns, name = SCHEDULER_SA
        token = self.service_account_token(ns, name, seconds=seconds)
        return write_kubeconfig(path, self.url, self.pki.ca, user={"token": token})

    def service_account_token(self, namespace: str, name: str, *, seconds: int = 3600) -> str:
        request = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest"}
        request["spec"] = {"expirationSeconds": seconds}  # type: ignore[assignment]
        reply = self.core.create_namespaced_service_account_token(
            name, namespace, request, _preload_content=False
        )
        token: str = json.loads(reply.data)["status"]["token"]
        return token


@contextlib.contextmanager
def real_kube(root: Path | None = None, *, scheduler: bool = False) -> Iterator[RealKube]:
    """A started control plane under ``root`` (a new temporary folder when None, kept
    afterwards for its logs); stopped on exit. Raises ``KubeNotBuilt`` when
    ``testenv/kube/build.sh`` has not been run."""
    bins = bin_dir()
    if absent := [b for b in BINARIES if not os.access(bins / b, os.X_OK)]:
        raise KubeNotBuilt(
            f"{', '.join(absent)} not built in {bins}. To fix: testenv/kube/build.sh"
        )
    root = root or Path(tempfile.mkdtemp(prefix="realkube-"))
    kube = RealKube(root, bins, Pki.make(root / "pki"))
    try:
        kube.start(scheduler=scheduler)
        yield kube
    finally:
        kube.stop()

"""The JobSet controller (``sigs.k8s.io/jobset``) beside a ``RealKube`` control plane.

``testenv/kube/build.sh`` builds the controller from its Go module, with the module's JobSet
CRD copied beside it, into a cache directory of its own (``build.sh --print-jobset``). This
module only runs it: it applies the CRD, starts the controller on loopback with the admin's
kubeconfig (no leader election, no metrics endpoint, its own certificate management off),
and registers its JobSet defaulting and validating webhooks by URL with a serving
certificate made here, so that JobSets are defaulted and checked as in a cluster. The
controller's pod webhooks are not registered: they intercept every pod of the cluster and
act only on JobSets that ask for exclusive placement."""

from __future__ import annotations

import base64
import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import kubernetes.client as client
import yaml

from boltforge import tls
from boltforge.testing.postgres import free_port
from boltforge.testing.processes import Proc, wait_until

if TYPE_CHECKING:
    from boltforge.testing.realkube import RealKube

NAME = "jobset-controller"
CRD = "jobsets.jobset.x-k8s.io"
CRD_FILE = "jobsets-crd.yaml"
WEBHOOKS = "boltforge-test-jobset"  # the names of both webhook configurations
MUTATE = "/mutate-jobset-x-k8s-io-v1alpha2-jobset"
VALIDATE = "/validate-jobset-x-k8s-io-v1alpha2-jobset"


def jobset_dir() -> Path:
    """Where ``build.sh`` puts (or has put) the controller (``bin/jobset-controller``) and
    the CRD: ``$BOLT_JOBSET_DIR`` if set."""
    if env := os.environ.get("BOLT_JOBSET_DIR"):
        return Path(env)
    build = Path(__file__).resolve().parents[2] / "testenv" / "kube" / "build.sh"
    out = subprocess.run(
        ["bash", str(build), "--print-jobset"],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    return Path(out.stdout.strip().splitlines()[-1])


def jobset_missing() -> list[str]:
    """What of the controller and its CRD is not built yet (nothing when it can run)."""
    where = jobset_dir()
    absent = [] if os.access(where / "bin" / NAME, os.X_OK) else [NAME]
    return absent + ([] if (where / CRD_FILE).is_file() else [CRD_FILE])


def install_crd(kube: RealKube, where: Path) -> None:
    """Apply the JobSet CRD (server-side: it is too large for the last-applied
    annotation) and wait until JobSets are served."""
    kube.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(where / CRD_FILE))
    crds = client.ApiextensionsV1Api(kube.api)

    def established() -> bool:
        conditions = crds.read_custom_resource_definition(CRD).status.conditions or []
        return any(c.type == "Established" and c.status == "True" for c in conditions)

    wait_until(established, 60, "JobSets to be served")


def _config(home: Path, webhook_port: int, probe_port: int) -> tuple[Path, Path]:
    """The controller's configuration file, and the CA that signed its serving
    certificate."""
    certs = tls.make_certificates(home / "certs", ("127.0.0.1",))
    serving = home / "serving"
    serving.mkdir(mode=0o700, exist_ok=True)
    shutil.copyfile(certs.cert, serving / "tls.crt")
    shutil.copyfile(certs.key, serving / "tls.key")
    conf = {
        "apiVersion": "config.jobset.x-k8s.io/v1alpha1",
        "kind": "Configuration",
        "internalCertManagement": {"enable": False},
        "leaderElection": {"leaderElect": False},
        "webhook": {"port": webhook_port, "host": "127.0.0.1", "certDir": str(serving)},
        "metrics": {"bindAddress": "0"},
        "health": {"healthProbeBindAddress": f"127.0.0.1:{probe_port}"},
    }
    path = home / "config.yaml"
    path.write_text(yaml.safe_dump(conf))
    return path, certs.ca


def _webhook(name: str, url: str, ca: bytes, operations: list[str]) -> dict[str, Any]:
    return {
        "name": name,
        "admissionReviewVersions": ["v1"],
        "clientConfig": {"url": url, "caBundle": base64.b64encode(ca).decode()},
        "failurePolicy": "Fail",
        "sideEffects": "None",
        "rules": [
            {
                "apiGroups": ["jobset.x-k8s.io"],
                "apiVersions": ["v1alpha2"],
                "operations": operations,
                "resources": ["jobsets"],
            }
        ],
    }


def _register(kube: RealKube, port: int, ca: bytes) -> None:
    api = client.AdmissionregistrationV1Api(kube.api)
    base = f"https://127.0.0.1:{port}"
    _unregister(kube)
    api.create_mutating_webhook_configuration(
        {
            "metadata": {"name": WEBHOOKS},
            "webhooks": [_webhook("mjobset.kb.io", base + MUTATE, ca, ["CREATE"])],
        }
    )
    api.create_validating_webhook_configuration(
        {
            "metadata": {"name": WEBHOOKS},
            "webhooks": [_webhook("vjobset.kb.io", base + VALIDATE, ca, ["CREATE", "UPDATE"])],
        }
    )


# A JobSet only the controller's defaulting webhook gives ``spec.network``: created as a
# dry run, it shows whether the API server calls the webhook yet.
PROBE = {
    "apiVersion": "jobset.x-k8s.io/v1alpha2",
    "kind": "JobSet",
    "metadata": {"name": "boltforge-webhook-probe", "namespace": "default"},
    "spec": {
        "replicatedJobs": [
            {
                "name": "probe",
                "template": {
                    "spec": {
                        "template": {
                            "spec": {
                                "restartPolicy": "Never",
                                "containers": [{"name": "probe", "image": "probe"}],
                            }
                        }
                    }
                },
            }
        ]
    },
}


def _defaulted(kube: RealKube) -> bool:
    """Whether a JobSet created now is defaulted by the controller's webhook (the API server
    takes up new webhook configurations a moment after they are created, and may still call
    the URL of a controller stopped before: an error)."""
    try:
        made = client.CustomObjectsApi(kube.api).create_namespaced_custom_object(
            "jobset.x-k8s.io", "v1alpha2", "default", "jobsets", PROBE, dry_run="All"
        )
    except client.ApiException:
        return False
    return bool((made.get("spec") or {}).get("network"))


def _unregister(kube: RealKube) -> None:
    api = client.AdmissionregistrationV1Api(kube.api)
    for delete in (
        api.delete_mutating_webhook_configuration,
        api.delete_validating_webhook_configuration,
    ):
        try:
            delete(WEBHOOKS)
        except client.ApiException as e:
            if e.status != 404:
                raise


@contextlib.contextmanager
def jobset_controller(kube: RealKube, timeout: float = 120.0) -> Iterator[Proc]:
    """The JobSet controller running against ``kube`` (its log is ``jobset-controller`` in
    ``kube.logs``), with the CRD installed and its JobSet webhooks registered and called by
    the API server; on exit the webhooks are removed (a JobSet made then is neither defaulted
    nor checked) and the controller stopped. The CRD stays. Raises ``KubeNotBuilt`` when it
    is not built."""
    from boltforge.testing.realkube import KubeNotBuilt

    where = jobset_dir()
    if absent := jobset_missing():
        raise KubeNotBuilt(
            f"{', '.join(absent)} not built in {where}. To fix: testenv/kube/build.sh"
        )
    install_crd(kube, where)
    home = kube.root / "jobset"
    home.mkdir(parents=True, exist_ok=True)
    webhook_port, probe_port = free_port(), free_port()
    config, ca = _config(home, webhook_port, probe_port)
    proc = kube._spawn(
        NAME,
        [str(where / "bin" / NAME), f"--kubeconfig={kube.admin_kubeconfig}", f"--config={config}"],
    )
    try:

        def ready() -> bool:
            kube._check_alive(NAME)
            try:
                return httpx.get(f"http://127.0.0.1:{probe_port}/readyz", timeout=2).is_success
            except httpx.HTTPError:
                return False

        wait_until(ready, timeout, "the JobSet controller to be ready")
        _register(kube, webhook_port, ca.read_bytes())
        wait_until(lambda: _defaulted(kube), timeout, "the API server to call JobSet's webhook")
        yield proc
    finally:
        with contextlib.suppress(Exception):
            _unregister(kube)
        proc.stop(grace=10)
        kube.procs.pop(NAME, None)

"""The real Kubernetes control plane for the tests (``boltforge.testing.realkube``): one per
test session, started on first use, stopped at the end. Skipped where the binaries are not
built (``testenv/kube/build.sh``), unless CI requires them (BOLT_REQUIRE_KUBE=1). A failed
test that used it shows where the control plane's logs are and the tail of each."""

from __future__ import annotations

import os
from collections.abc import Generator, Iterator
from typing import Any

import pytest

from boltforge.testing.realkube import KubeNotBuilt, RealKube, kubectl_path, missing, real_kube

__all__ = ["RealKube", "real_kube_session", "require_real_kube"]


def require_real_kube() -> None:
    try:
        absent = missing()
        kubectl_path()
    except (KubeNotBuilt, OSError) as e:
        absent, why = ["kubectl"], str(e)
    else:
        why = f"{', '.join(absent)} not built. To fix: testenv/kube/build.sh"
    if not absent:
        return
    if os.environ.get("BOLT_REQUIRE_KUBE") == "1":
        raise RuntimeError(f"the real Kubernetes control plane is required here: {why}")
    pytest.skip(f"no real Kubernetes control plane: {why}")


@pytest.fixture(scope="session")
def real_kube_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealKube]:
    """etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok, shared by
    every test of the session; a test cleans up what it creates."""
    require_real_kube()
    with real_kube(tmp_path_factory.mktemp("realkube"), scheduler=True) as kube:
        yield kube


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[Any]
) -> Generator[None, Any]:
    outcome = yield
    report = outcome.get_result()
    kube = getattr(item, "funcargs", {}).get("real_kube_session")
    if not report.failed or not isinstance(kube, RealKube):
        return
    parts = [f"logs in {kube.logs}; running: {', '.join(kube.alive()) or 'none'}"]
    for name in kube.procs or ("etcd", "kube-apiserver", "kube-controller-manager", "kwok"):
        parts.append(f"--- {name} (last lines)\n{kube.tail(name, 15)}")
    report.sections.append(("real Kubernetes control plane", "\n".join(parts)))

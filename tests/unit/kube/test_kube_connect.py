"""Where the scheduler's API client comes from: the kubeconfig it is given, else
``$KUBECONFIG`` or ``~/.kube/config``, else the pod's service account when it runs in a
pod; with a connection pool big enough for a gang's bindings at once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes.config as kconfig
import pytest
import yaml
from kubernetes.client import Configuration
from kubernetes.config.config_exception import ConfigException

from boltforge.kube.connect import POOL, api_client
from boltforge.testing.kubeapi import write_kubeconfig


def two_contexts(path: Path) -> Path:
    """A kubeconfig with clusters ``one`` (current) and ``two``."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": n, "cluster": {"server": f"http://127.0.0.1:{port}"}}
            for n, port in (("one", 6001), ("two", 6002))
        ],
        "users": [{"name": "u", "user": {"token": "t0k"}}],
        "contexts": [{"name": n, "context": {"cluster": n, "user": "u"}} for n in ("one", "two")],
        "current-context": "one",
    }
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture
def outside(monkeypatch: pytest.MonkeyPatch) -> None:
    """Not in a pod and no ``$KUBECONFIG``."""
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("KUBECONFIG", raising=False)


@pytest.fixture
def in_a_pod(monkeypatch: pytest.MonkeyPatch) -> list[Configuration]:
    """Running in a pod: the service account's configuration is what ``load_incluster_config``
    would load (recorded here, as there is no service account on this machine)."""
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.delenv("KUBECONFIG", raising=False)
    loaded: list[Configuration] = []

    def load(client_configuration: Configuration, **_: Any) -> None:
        client_configuration.host = "https://10.96.0.1:443"
        loaded.append(client_configuration)

    monkeypatch.setattr(kconfig, "load_incluster_config", load)
    return loaded


def test_a_kubeconfig_gives_its_server_and_token_and_a_big_pool(
    tmp_path: Path, outside: None
) -> None:
    path = write_kubeconfig("http://127.0.0.1:6443", tmp_path / "kc")
    api = api_client(str(path))
    conf = api.configuration
    assert conf.host == "http://127.0.0.1:6443"
    assert conf.api_key.get("authorization") == "Bearer fake-token"
    assert conf.connection_pool_maxsize == POOL == 64


def test_a_context_picks_the_cluster(tmp_path: Path, outside: None) -> None:
    path = str(two_contexts(tmp_path / "kc"))
    assert api_client(path).configuration.host == "http://127.0.0.1:6001"
    assert api_client(path, context="two").configuration.host == "http://127.0.0.1:6002"


def test_a_missing_context_is_a_config_error(tmp_path: Path, outside: None) -> None:
    with pytest.raises(ConfigException):
        api_client(str(two_contexts(tmp_path / "kc")), context="three")


def test_in_a_pod_without_a_kubeconfig_the_service_account_is_used(
    in_a_pod: list[Configuration],
) -> None:
    api = api_client()
    assert api.configuration.host == "https://10.96.0.1:443"
    assert in_a_pod == [api.configuration]
    assert api.configuration.connection_pool_maxsize == POOL


def test_in_a_pod_a_kubeconfig_given_still_wins(
    tmp_path: Path, in_a_pod: list[Configuration]
) -> None:
    path = write_kubeconfig("http://127.0.0.1:7000", tmp_path / "kc")
    assert api_client(str(path)).configuration.host == "http://127.0.0.1:7000"
    assert in_a_pod == []


def test_in_a_pod_kubeconfig_in_the_environment_wins_over_the_service_account(
    tmp_path: Path, in_a_pod: list[Configuration], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write_kubeconfig("http://127.0.0.1:7001", tmp_path / "kc")
    monkeypatch.setenv("KUBECONFIG", str(path))
    monkeypatch.setattr("kubernetes.config.kube_config.KUBE_CONFIG_DEFAULT_LOCATION", str(path))
    assert api_client().configuration.host == "http://127.0.0.1:7001"
    assert in_a_pod == []


def test_an_empty_service_host_is_not_a_pod(
    tmp_path: Path, in_a_pod: list[Configuration], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write_kubeconfig("http://127.0.0.1:7002", tmp_path / "kc")
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "")
    monkeypatch.setattr("kubernetes.config.kube_config.KUBE_CONFIG_DEFAULT_LOCATION", str(path))
    assert api_client().configuration.host == "http://127.0.0.1:7002"
    assert in_a_pod == []


def test_with_no_kubeconfig_anywhere_and_no_pod_it_is_a_config_error(
    tmp_path: Path, outside: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    missing = str(tmp_path / "nothing-here")
    monkeypatch.setattr("kubernetes.config.kube_config.KUBE_CONFIG_DEFAULT_LOCATION", missing)
    with pytest.raises(ConfigException):
        api_client()

"""A client of the Kubernetes API: from a kubeconfig, or in-cluster from the pod's service
account, with a connection pool big enough for a gang's bindings at once."""

from __future__ import annotations

import os

import kubernetes.client as client
import kubernetes.config as config

POOL = 64


def api_client(kubeconfig: str | None = None, context: str | None = None) -> client.ApiClient:
    """The kubeconfig ``kubeconfig`` (else ``$KUBECONFIG`` or ``~/.kube/config``), or the
    in-cluster service account when there is no kubeconfig and the process runs in a pod.
    Raises ``kubernetes.config.ConfigException`` when neither is there."""
    conf = client.Configuration()
    if kubeconfig is None and _in_cluster():
        config.load_incluster_config(client_configuration=conf)
    else:
        config.load_kube_config(config_file=kubeconfig, context=context, client_configuration=conf)
    conf.connection_pool_maxsize = POOL
    return client.ApiClient(conf)


def _in_cluster() -> bool:
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST")) and not os.environ.get("KUBECONFIG")

"""An in-memory stand-in for kube-apiserver, for tests and benchmarks: no real API server
can run here, so this one speaks its wire protocol (JSON over HTTP/1.1) to the real
``kubernetes`` Python client and to kubectl.

Serves: core ``v1`` nodes, pods (with ``status``, ``binding`` and ``eviction``), bindings,
events and namespaces (implicit: any namespace used exists); ``policy/v1``
poddisruptionbudgets; ``scheduling.k8s.io/v1`` priorityclasses; ``coordination.k8s.io/v1``
leases; and the custom resource ``scheduling.x-k8s.io/v1alpha1`` podgroups (with
``status``). Get, list, watch, create, update, patch (merge, strategic merge, JSON patch),
delete and deletecollection, with label and field selectors, optimistic concurrency on
``resourceVersion`` (one global counter), graceful pod deletion, PodDisruptionBudgets that
the Eviction API honours, a kubelet emulation that runs bound pods and removes deleted
ones, legacy API discovery and server-side Tables for kubectl.

Watches (``?watch=true``) stream one JSON event per line: from ``resourceVersion=N`` they
replay the changes after N kept in a bounded log (``log_size``, default 10,000), from none
or ``0`` they start with ADDED for every object; a version older than the log is one ERROR
event (410 Expired, "too old resource version: N (M)") and the end of the stream. The
Python client 35.0.0's ``Watch().stream`` meets that ERROR by watching once more from the
same version and, given 410 again, raises ``ApiException(status=410)`` (with
``timeout_seconds`` given it raises at once); reading the stream itself
(``_preload_content=False``) shows the ERROR event. ``drop_watches()`` cuts every watch
connection mid-stream (the client's read fails: urllib3 ``ProtocolError``, "Response ended
prematurely"); ``drop_watches(abrupt=False)`` ends every stream cleanly, after which
``Watch().stream`` (without ``timeout_seconds``) watches again from the last version it
saw.

A binding (and an eviction) answers 201 with a ``Status``, as kube-apiserver does: the
Python client's ``create_namespaced_binding`` cannot read that as a ``V1Binding`` and
raises ``ValueError`` (after the binding is made) unless called with
``_preload_content=False``, as against a real cluster.

kubectl (1.20 and 1.32 tried) needs no flags beyond ``--kubeconfig`` (tests also pass
``--cache-dir`` into their temporary directory, to keep its discovery cache out of
``$HOME``): ``get`` (server-side Tables for pods, nodes and the rest; ``-o wide`` adds a
pod's IP and node; ``-w`` works), ``describe`` (conditions and events), ``create -f``,
``apply -f`` and ``delete`` work. ``/openapi/v2`` serves a document with no models, so
kubectl's client-side validation passes everything (``--validate=false`` is not needed,
and harmless); ``kubectl explain`` does not work.

Not implemented: authentication and authorization (any token or none), admission beyond
pod priority, validation of object contents, protobuf and CBOR, server-side apply, OpenAPI
schemas, aggregated discovery (the legacy documents are served, which kubectl 1.20 and 1.32
both use), paging (``limit`` and ``continue`` are ignored), dry run, garbage collection and
namespace deletion's cascade, ``events.k8s.io``, and any controller beyond the kubelet and
disruption ones.

Usage (see ``ApiServer`` for the handle)::

    with ApiServer() as kube:
        path = kube.kubeconfig(tmp / "kubeconfig")
        ...  # kubernetes.config.load_kube_config(config_file=str(path)); kubectl --kubeconfig
        kube.requests[("create", "bindings")]
        kube.fail_next("create", "bindings", 500)
        kube.drop_watches()
        kube.compact()
        kube.kubelet = False
"""

from boltforge.testing.kubeapi.cluster import Cluster, Settings
from boltforge.testing.kubeapi.server import ApiServer
from boltforge.testing.kubeapi.serving import write_kubeconfig

__all__ = ["ApiServer", "Cluster", "Settings", "write_kubeconfig"]

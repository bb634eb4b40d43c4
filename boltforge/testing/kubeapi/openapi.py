"""The smallest OpenAPI v2 document kubectl accepts, so that ``kubectl create -f`` and
``kubectl apply -f`` work without ``--validate=false``.

kubectl validates what it sends against ``/openapi/v2`` (1.20 always; 1.32 when the server
does not advertise field validation through ``/openapi/v3``, which here answers 404), and
fails when that document cannot be had. A document that defines no models makes it skip
validation of every kind ("resource is not present, let's just skip validation"), and, for
``apply``, fall back to the strategic-merge metadata compiled into it. kubectl asks for the
gnostic protobuf encoding (``application/com.github.proto-openapi.spec.v2@v1.0+protobuf``,
answered as ``...spec.v2.v1.0+protobuf`` as kube-openapi does), written here by hand:
``Document{swagger: "2.0", info: {title, version}}``; anything else gets the same document
as JSON."""

from __future__ import annotations

from boltforge.testing.kubeapi.objects import JSON

PROTOBUF = "com.github.proto-openapi.spec.v2"
SERVED_AS = "application/com.github.proto-openapi.spec.v2.v1.0+protobuf"  # no "@" for Go's mime


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


DOCUMENT: JSON = {
    "swagger": "2.0",
    "info": {"title": "Kubernetes", "version": "v1.30.0"},
    "paths": {},
    "definitions": {},
}
ENCODED = _field(1, b"2.0") + _field(2, _field(1, b"Kubernetes") + _field(2, b"v1.30.0"))


def v2(accept: str) -> tuple[bytes | JSON, str]:
    """The document and its content type, for a request that accepts ``accept``."""
    if PROTOBUF in accept:
        return ENCODED, SERVED_AS
    return DOCUMENT, "application/json"

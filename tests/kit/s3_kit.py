"""An S3-compatible endpoint for the artifact store's tests: moto's S3 server, on loopback.

No S3-compatible server (MinIO, Ceph's RADOS Gateway) installs here from Debian or PyPI, so
the tests use moto's server, a stand-in that speaks S3's REST protocol over HTTP and is driven
by the real boto3 client the server uses. It does not verify ``ChecksumSHA256`` on arrival, so
the store's own sha256 check is what these tests exercise.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import boto3
import pytest
from moto.server import ThreadedMotoServer

CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "boltforge-test",
    "AWS_SECRET_ACCESS_KEY": "boltforge-test-secret",
    "AWS_DEFAULT_REGION": "us-east-1",
}


@dataclass
class S3:
    """A running endpoint and a fresh bucket on it."""

    endpoint: str
    bucket: str
    client: Any

    def keys(self, prefix: str = "") -> list[str]:
        """Every object's key under ``prefix`` (which is cut off), sorted."""
        found = self.client.list_objects_v2(Bucket=self.bucket, Prefix=prefix)
        return sorted(o["Key"][len(prefix) :] for o in found.get("Contents", []))


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def s3(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> S3:
    """A new, empty bucket; boto3 in this process finds the credentials in the environment."""
    for name, value in CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    client = boto3.client("s3", endpoint_url=s3_endpoint)
    bucket = f"arts-{uuid.uuid4().hex[:12]}"
    client.create_bucket(Bucket=bucket)
    return S3(s3_endpoint, bucket, client)

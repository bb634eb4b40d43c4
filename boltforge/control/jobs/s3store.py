"""Artifacts in an S3-compatible bucket (AWS S3, MinIO, Ceph's RADOS Gateway, ...):
``bolt server --artifacts-url s3://bucket/prefix [--artifacts-endpoint URL]``.

The layout is the directory store's under the prefix: ``<prefix>/<job>/files/<rank>/<path>``
and ``<prefix>/<job>/manifest.json`` (``control/jobs/artifacts.py``). An upload is hashed into
a local temporary file first and sent to the bucket only when its sha256 matches the agent's;
the object carries that sha256 twice: as its ``sha256`` metadata, and as the S3 checksum
(``ChecksumSHA256``), which a store that supports checksums verifies on arrival. Downloads
stream from the bucket through the server, so members never need credentials for it.

Credentials and region come from boto3's standard chain (``AWS_ACCESS_KEY_ID`` and
``AWS_SECRET_ACCESS_KEY``, ``AWS_PROFILE``, an instance role...); the endpoint from
``--artifacts-endpoint`` or ``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL``. boto3 comes with
the ``s3`` extra (``pip install 'boltforge[s3]'``).
"""

from __future__ import annotations

import base64
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from boltforge.control.jobs.artifacts import CHUNK, ArtifactStore, StoreError, job_folder


def parse_url(url: str) -> tuple[str, str]:
    """The bucket and key prefix (no trailing slash; may be empty) of ``s3://bucket/prefix``;
    raises ``StoreError`` for any other URL."""
    parts = urlparse(url)
    if parts.scheme != "s3" or not parts.netloc or parts.query or parts.fragment:
        raise StoreError(
            f"--artifacts-url {url!r}: expected s3://BUCKET or s3://BUCKET/PREFIX. To fix: "
            "name the bucket, e.g. s3://ml-artifacts/boltforge"
        )
    return parts.netloc, parts.path.strip("/")


class S3Store(ArtifactStore):
    """Artifacts as objects under ``prefix`` in ``bucket``, through ``client`` (a boto3 S3
    client); ``spool`` is where uploads are hashed before they are sent (the system's
    temporary directory by default)."""

    def __init__(self, client: Any, bucket: str, prefix: str, spool: Path | None = None) -> None:
        super().__init__()
        self.client, self.bucket, self.prefix, self.spool = client, bucket, prefix, spool

    @classmethod
    def connect(cls, url: str, endpoint: str | None = None) -> S3Store:
        """The store at ``url`` (see ``parse_url``), its bucket checked reachable; raises
        ``StoreError`` naming the fix when boto3 is missing or the bucket cannot be read."""
        bucket, prefix = parse_url(url)
        try:
            import boto3
            from botocore.config import Config
            from botocore.exceptions import BotoCoreError, ClientError
        except ImportError:
            raise StoreError(
                "--artifacts-url needs boto3. To fix: pip install 'boltforge[s3]'"
            ) from None
        config = Config(retries={"max_attempts": 5, "mode": "standard"})
        try:
            client = boto3.client("s3", endpoint_url=endpoint or None, config=config)
            client.head_bucket(Bucket=bucket)
        except (BotoCoreError, ClientError) as e:
            where = f" at {endpoint}" if endpoint else ""
            raise StoreError(
                f"--artifacts-url {url}: bucket {bucket}{where} cannot be used ({e}). To fix: "
                "create the bucket, or give credentials that may read and write it "
                "(AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY or AWS_PROFILE), and "
                "--artifacts-endpoint for a store other than AWS"
            ) from None
        return cls(client, bucket, prefix)

    def _key(self, job: str, *rest: str) -> str:
        return "/".join(p for p in (self.prefix, job_folder(job), *rest) if p)

    def _spool(self, job: str, name: str) -> tuple[int, str]:
        return tempfile.mkstemp(dir=self.spool, prefix="boltforge-upload-")

    def _keep(self, job: str, name: str, tmp: Path, sha256: str) -> None:
        checksum = base64.b64encode(bytes.fromhex(sha256)).decode()
        with tmp.open("rb") as body:
            self.client.put_object(
                Bucket=self.bucket,
                Key=self._key(job, "files", name),
                Body=body,
                Metadata={"sha256": sha256},
                ChecksumSHA256=checksum,
            )

    def _chunks(self, job: str, name: str) -> Iterator[bytes]:
        reply = self.client.get_object(Bucket=self.bucket, Key=self._key(job, "files", name))
        body = reply["Body"]
        try:
            yield from body.iter_chunks(CHUNK)
        finally:
            body.close()

    def _read_manifest(self, job: str) -> bytes | None:
        try:
            reply = self.client.get_object(Bucket=self.bucket, Key=self._key(job, "manifest.json"))
        except self.client.exceptions.NoSuchKey:
            return None
        data: bytes = reply["Body"].read()
        return data

    def _write_manifest(self, job: str, data: bytes) -> None:
        key = self._key(job, "manifest.json")
        self.client.put_object(
            Bucket=self.bucket, Key=key, Body=data, ContentType="application/json"
        )

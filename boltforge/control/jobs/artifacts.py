"""Job artifacts: the files a job declares as ``outputs``, which the node's agent collects after
each replica and the server keeps, each with its sha256, checked end to end.

Two stores keep them, with one layout: ``<job>/files/<rank>/<path>`` and ``<job>/manifest.json``,
the list of the job's artifacts with their size, sha256, replica and epoch.

- ``DirectoryStore`` (the default): under a directory (``bolt server --artifacts-dir``, by
  default ``artifacts`` beside the checkpoints).
- ``S3Store`` (``control/jobs/s3store.py``): in an S3-compatible bucket under a prefix
  (``bolt server --artifacts-url s3://bucket/prefix``).

An upload is written to a temporary file while its hash is computed, and kept (renamed into
place or uploaded, then the manifest replaced whole) only when the hash matches the one the
agent sent: a reader sees the old artifact or the new one, never a part. A later epoch's file
of the same rank and path replaces the earlier one. Downloads carry the recorded sha256
(``X-Sha256``), which ``bolt artifacts`` checks against what it received.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import tempfile
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Iterator
from pathlib import Path, PurePosixPath

from boltforge.wire.jobs import Artifact

MAX_BYTES = 4 << 30
CHUNK = 1 << 20
SHA256 = re.compile(r"^[0-9a-f]{64}$")


class BadArtifact(ValueError):
    """An upload the store refuses: a bad name or hash, a hash mismatch, or too large."""


class StoreError(RuntimeError):
    """An artifact store that cannot be used (a bad URL, a bucket not reachable); the
    message names the option and the fix."""


def artifact_name(rank: int, path: str) -> str:
    """The name of output ``path`` (as the job declared it, under its mount or working dir)
    of rank ``rank``: ``<rank>/<path>``, relative and normalized. Raises ``BadArtifact`` for
    a path that leaves its root (``..``) or is empty."""
    parts = [p for p in PurePosixPath(path).parts if p not in ("/", ".")]
    if not parts or ".." in parts:
        raise BadArtifact(f"artifact path {path!r} must name a file under its root, without ..")
    return "/".join([str(rank), *parts])


class ArtifactStore(ABC):
    """Where artifacts are kept (see the module docstring). Thread-safe; one server writes
    (the leader), so the manifest's read-modify-write is guarded by a lock of the process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()

    def list(self, job: str) -> list[Artifact]:
        """``job``'s artifacts, by name (empty when it has none)."""
        raw = self._read_manifest(job)
        if raw is None:
            return []
        return sorted((Artifact.model_validate(a) for a in json.loads(raw)), key=lambda a: a.name)

    def find(self, job: str, name: str) -> Artifact | None:
        """Artifact ``name`` of ``job`` (None when there is none)."""
        return next((a for a in self.list(job) if a.name == name), None)

    def open(self, job: str, name: str) -> tuple[Artifact, Iterator[bytes]] | None:
        """Artifact ``name`` of ``job`` and its bytes, in chunks (None when there is none)."""
        found = self.find(job, name)
        return None if found is None else (found, self._chunks(job, name))

    async def put(
        self,
        job: str,
        replica: str,
        epoch: int,
        name: str,
        sha256: str,
        chunks: AsyncIterator[bytes],
    ) -> Artifact:
        """Store ``chunks`` as artifact ``name`` of ``job`` if their sha256 is ``sha256``.
        Raises ``BadArtifact`` (nothing kept) on a bad hash, a mismatch or past ``MAX_BYTES``."""
        if not SHA256.match(sha256):
            raise BadArtifact("X-Sha256 must be the file's sha256 as 64 lowercase hex digits")
        fd, tmp = self._spool(job, name)
        try:
            size, digest = await _write(fd, chunks)
            if digest != sha256:
                raise BadArtifact(
                    f"artifact {name}: the sha256 of what arrived ({digest}) is not the one "
                    f"sent ({sha256}); nothing was kept. To fix: send it again"
                )
            await asyncio.to_thread(self._keep, job, name, Path(tmp), sha256)
        finally:
            Path(tmp).unlink(missing_ok=True)
        found = Artifact(
            name=name, size=size, sha256=sha256, replica=replica, epoch=epoch, at=time.time()
        )
        await asyncio.to_thread(self._record, job, found)
        return found

    def _record(self, job: str, found: Artifact) -> None:
        with self._lock:
            kept = {a.name: a for a in self.list(job)}
            kept[found.name] = found
            data = [a.model_dump() for a in sorted(kept.values(), key=lambda a: a.name)]
            self._write_manifest(job, json.dumps(data).encode())

    @abstractmethod
    def _spool(self, job: str, name: str) -> tuple[int, str]:
        """A new temporary file for an upload of ``name``: its descriptor and path."""

    @abstractmethod
    def _keep(self, job: str, name: str, tmp: Path, sha256: str) -> None:
        """Keep the checked file ``tmp`` as artifact ``name`` (``tmp`` may be moved away)."""

    @abstractmethod
    def _chunks(self, job: str, name: str) -> Iterator[bytes]:
        """The bytes of kept artifact ``name``."""

    @abstractmethod
    def _read_manifest(self, job: str) -> bytes | None:
        """``job``'s manifest as stored, None when it has none."""

    @abstractmethod
    def _write_manifest(self, job: str, data: bytes) -> None:
        """Replace ``job``'s manifest whole with ``data``."""


class DirectoryStore(ArtifactStore):
    """Artifacts in files under ``root``."""

    def __init__(self, root: Path) -> None:
        super().__init__()
        self.root = root

    def _spool(self, job: str, name: str) -> tuple[int, str]:
        target = self._files(job) / name
        target.parent.mkdir(parents=True, exist_ok=True)
        return tempfile.mkstemp(dir=target.parent, prefix=".upload-")

    def _keep(self, job: str, name: str, tmp: Path, sha256: str) -> None:
        os.replace(tmp, self._files(job) / name)

    def _chunks(self, job: str, name: str) -> Iterator[bytes]:
        with (self._files(job) / name).open("rb") as f:
            while chunk := f.read(CHUNK):
                yield chunk

    def _read_manifest(self, job: str) -> bytes | None:
        manifest = self._manifest_path(job)
        return manifest.read_bytes() if manifest.exists() else None

    def _write_manifest(self, job: str, data: bytes) -> None:
        manifest = self._manifest_path(job)
        tmp = manifest.with_suffix(".tmp")
        tmp.write_bytes(data)
        os.replace(tmp, manifest)

    def _files(self, job: str) -> Path:
        return self.root / job_folder(job) / "files"

    def _manifest_path(self, job: str) -> Path:
        return self.root / job_folder(job) / "manifest.json"


def open_store(
    directory: Path, url: str | None = None, endpoint: str | None = None
) -> ArtifactStore:
    """The store for a server: the bucket of ``url`` (``s3://bucket[/prefix]``, at
    ``endpoint`` when given) when there is one, else ``directory``. Raises ``StoreError``
    when the bucket cannot be used."""
    if url:
        from boltforge.control.jobs.s3store import S3Store

        return S3Store.connect(url, endpoint)
    return DirectoryStore(directory)


def job_folder(job: str) -> str:
    """The folder (or key prefix) of ``job``'s artifacts: its id, made safe as a name."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", job).lstrip(".") or "_"


async def _write(fd: int, chunks: AsyncIterator[bytes]) -> tuple[int, str]:
    """Write ``chunks`` to ``fd`` (closed after): the size and the sha256 of what was written."""
    digest, size = hashlib.sha256(), 0
    with os.fdopen(fd, "wb") as out:
        async for chunk in chunks:
            size += len(chunk)
            if size > MAX_BYTES:
                raise BadArtifact(f"an artifact may hold at most {MAX_BYTES >> 30} GiB")
            digest.update(chunk)
            out.write(chunk)
    return size, digest.hexdigest()

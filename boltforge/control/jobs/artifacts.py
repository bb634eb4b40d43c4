"""Job artifacts: the files a job declares as ``outputs``, which the node's agent collects after
each replica and the server keeps, each with its sha256, checked end to end.

On disk, under the store's root (``bolt server --artifacts-dir``, by default ``artifacts``
beside the checkpoints): ``<job>/files/<rank>/<path>`` and ``<job>/manifest.json``, the list
of the job's artifacts with their size, sha256, replica and epoch. A file is written to a
temporary name while its hash is computed, and kept (renamed into place, then the manifest
replaced whole) only when the hash matches the one the agent sent: a reader sees the old
artifact or the new one, never a part. A later epoch's file of the same rank and path
replaces the earlier one.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path, PurePosixPath

from boltforge.wire.jobs import Artifact

MAX_BYTES = 4 << 30
SHA256 = re.compile(r"^[0-9a-f]{64}$")


class BadArtifact(ValueError):
    """An upload the store refuses: a bad name or hash, a hash mismatch, or too large."""


def artifact_name(rank: int, path: str) -> str:
    """The name of output ``path`` (as the job declared it, under its mount or working dir)
    of rank ``rank``: ``<rank>/<path>``, relative and normalized. Raises ``BadArtifact`` for
    a path that leaves its root (``..``) or is empty."""
    parts = [p for p in PurePosixPath(path).parts if p not in ("/", ".")]
    if not parts or ".." in parts:
        raise BadArtifact(f"artifact path {path!r} must name a file under its root, without ..")
    return "/".join([str(rank), *parts])


class ArtifactStore:
    """The artifacts of every job under ``root`` (see the module docstring). Thread-safe."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._lock = threading.Lock()

    def list(self, job: str) -> list[Artifact]:
        """``job``'s artifacts, by name (empty when it has none)."""
        manifest = self._manifest_path(job)
        if not manifest.exists():
            return []
        data = json.loads(manifest.read_text())
        return sorted((Artifact.model_validate(a) for a in data), key=lambda a: a.name)

    def find(self, job: str, name: str) -> tuple[Artifact, Path] | None:
        """Artifact ``name`` of ``job`` and where it is on disk (None when there is none)."""
        found = next((a for a in self.list(job) if a.name == name), None)
        return None if found is None else (found, self._files(job) / name)

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
        target = self._files(job) / name
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".upload-")
        try:
            size, digest = await _write(fd, chunks)
            if digest != sha256:
                raise BadArtifact(
                    f"artifact {name}: the sha256 of what arrived ({digest}) is not the one "
                    f"sent ({sha256}); nothing was kept. To fix: send it again"
                )
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        found = Artifact(
            name=name, size=size, sha256=sha256, replica=replica, epoch=epoch, at=time.time()
        )
        self._record(job, found)
        return found

    def _record(self, job: str, found: Artifact) -> None:
        with self._lock:
            kept = {a.name: a for a in self.list(job)}
            kept[found.name] = found
            data = [a.model_dump() for a in sorted(kept.values(), key=lambda a: a.name)]
            manifest = self._manifest_path(job)
            tmp = manifest.with_suffix(".tmp")
            tmp.write_text(json.dumps(data))
            os.replace(tmp, manifest)

    def _files(self, job: str) -> Path:
        return self.root / _safe(job) / "files"

    def _manifest_path(self, job: str) -> Path:
        return self.root / _safe(job) / "manifest.json"


def _safe(job: str) -> str:
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

"""Artifacts: the outputs a replica's job declared (``outputs:``), collected when the replica
ends and sent to the server, each with its sha256.

``collect`` runs after the replica ended and before its scratch directory is removed: each
declared path (a file, or a directory walked whole) is linked, else copied, into the spool,
``<spool>/<replica>/<path>``. A container's paths are read through its mounts (``/scratch``,
``/bolt/checkpoint``; a relative path is under its working directory, ``/scratch`` unless the
job set one); a process's are under its working directory, or absolute. Symbolic links are
never followed, and a path that resolves outside its root is skipped; a process that ran as
its team's user (``identity``) has only the files that user owns collected: a replica cannot
make the agent send a host file that is not its own.

The spool is the queue: ``send_spooled`` sends each file (sha256 in ``X-Sha256``) and removes
it once the server kept it, or refused it for good (the replica is unknown there, or the
upload was bad); a failure to reach the server leaves it for the next try, so outputs survive
a server restart and an agent restart alike.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from boltforge.agent.processes import safe_name
from boltforge.wire.agent import ReplicaSpec

log = logging.getLogger("boltforge.agent")

SPOOL = "artifacts"
CHUNK = 1 << 20


@dataclass(frozen=True, slots=True)
class Roots:
    """Where a replica's paths are on the host: ``mounts`` maps a path as the replica sees
    it (``/scratch``) to the host's; ``workdir`` is the replica's working directory as it sees
    it; ``container``: paths outside the mounts are the image's, not collectable;
    ``owner``: the uid whose files alone are collected (None: any)."""

    mounts: dict[str, Path]
    workdir: str
    container: bool
    owner: int | None = None

    def host_path(self, path: str) -> Path | None:
        """``path`` (as the replica sees it) on the host, or None when it is not readable
        from there (inside a container's image)."""
        seen = PurePosixPath(path if path.startswith("/") else f"{self.workdir}/{path}")
        for inside, outside in self.mounts.items():
            if seen == PurePosixPath(inside) or PurePosixPath(inside) in seen.parents:
                return outside / seen.relative_to(inside)
        return None if self.container else Path(seen)

    def root_of(self, host: Path) -> Path:
        """The host directory ``host`` must stay under (its mount, else its workdir or /)."""
        for outside in self.mounts.values():
            if host == outside or outside in host.parents:
                return outside
        return Path(self.workdir) if Path(self.workdir) in host.parents else Path("/")


def collect(spec: ReplicaSpec, roots: Roots, spool: Path) -> list[str]:
    """Put ``spec``'s declared outputs into ``spool`` (see the module docstring). Returns a
    note for each declared path that was not collected (empty when all were)."""
    notes = []
    for declared in spec.outputs:
        host = roots.host_path(declared)
        if host is None:
            notes.append(f"output {declared} is not under /scratch or /bolt/checkpoint")
            continue
        found = [f for f in _files(host, roots.root_of(host)) if _owned(f[0], roots.owner)]
        if not found:
            notes.append(f"output {declared} was not found")
        for source, rel in found:
            target = spool / safe_name(spec.replica) / _name(declared, rel)
            _place(source, target)
    return notes


def _name(declared: str, rel: str) -> str:
    """The artifact path: the declared path (without its leading /), then the file's place
    inside it when it is a directory."""
    parts = [p for p in PurePosixPath(declared).parts if p not in ("/", ".")]
    return "/".join(parts + ([rel] if rel else []))


def _files(host: Path, root: Path) -> Iterator[tuple[Path, str]]:
    """The regular files at ``host`` (itself, or under it), each with its path relative to
    it; nothing that is a symbolic link or resolves outside ``root``."""
    if host.is_symlink() or not _inside(host, root):
        return
    if host.is_file():
        yield host, ""
        return
    for folder, dirs, names in os.walk(host, followlinks=False):
        here = Path(folder)
        dirs[:] = [d for d in dirs if not (here / d).is_symlink()]
        for name in names:
            path = here / name
            if not path.is_symlink() and path.is_file():
                yield path, path.relative_to(host).as_posix()


def _owned(path: Path, owner: int | None) -> bool:
    """Whether ``path`` (not followed) belongs to ``owner`` (None: anyone's will do)."""
    if owner is None:
        return True
    try:
        return path.lstat().st_uid == owner
    except OSError:
        return False


def _inside(path: Path, root: Path) -> bool:
    try:
        resolved = path.resolve(strict=True)
    except OSError:
        return False
    real_root = root.resolve()
    return resolved == real_root or real_root in resolved.parents


def _place(source: Path, target: Path) -> None:
    """Link ``source`` at ``target`` (a copy across file systems)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    target.unlink(missing_ok=True)
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)


# Sends one file: (replica, artifact path, file, sha256) -> True once the server kept it or
# refused it for good, False to try again later.
Send = Callable[[str, str, Path, str], Awaitable[bool]]


async def send_spooled(spool: Path, send: Send) -> int:
    """Send every spooled file (see the module docstring); how many left the spool."""
    sent = 0
    if not spool.is_dir():
        return 0
    for folder in sorted(p for p in spool.iterdir() if p.is_dir()):
        for path in sorted(p for p in folder.rglob("*") if p.is_file()):
            rel = path.relative_to(folder).as_posix()
            if not await send(folder.name, rel, path, sha256_of(path)):
                return sent
            path.unlink(missing_ok=True)
            sent += 1
        _prune(folder)
    return sent


def _prune(folder: Path) -> None:
    """Remove ``folder``'s empty directories, itself included."""
    for sub in sorted((p for p in folder.rglob("*") if p.is_dir()), reverse=True):
        if not any(sub.iterdir()):
            sub.rmdir()
    if not any(folder.iterdir()):
        folder.rmdir()


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()

"""Cleanup after a replica's main process exited, before its exit is reported (and so before
the server offers its GPUs again): the processes it left in its process group, and its shared
memory files in ``/dev/shm``.

Which shared memory files are the replica's:

- those whose names start with its ``BOLT_SHM_PREFIX`` (``bolt-<job>-<replica>-e<epoch>-``,
  in its environment for whatever names its own segments), and
- those its leftover processes still had open or mapped when cleanup began,

in both cases only files owned by the user the replica ran as, and, for
the second kind, only once no process outside the group holds them. A file the replica made
under another name and closed before it exited cannot be told from another replica's on a
shared host, and is left alone; so is a process that left the group (``setsid``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

SHM = Path("/dev/shm")
PROC = Path("/proc")
ORPHAN_GRACE_S = 2.0
# The longest checkpoint grace for replicas a killed agent left running (``leftovers``).
LEFTOVER_GRACE_S = 30.0
POLL_S = 0.05


@dataclass(slots=True)
class Cleanup:
    """What cleanup did: the leftover ``orphans`` (pids) it ended, whether any needed
    SIGKILL, the ``shm`` files it removed, epilog failures, declared ``outputs`` it could not
    collect, and how long it all took.
    ``what`` names the orphans in ``describe``."""

    orphans: list[int] = field(default_factory=list)
    killed: bool = False
    shm: list[str] = field(default_factory=list)
    epilog: str = ""
    outputs: list[str] = field(default_factory=list)
    seconds: float = 0.0
    what: str = "leftover process(es)"

    def describe(self) -> str:
        """One line for the exit report; empty when there was nothing to clean."""
        parts = []
        if self.orphans:
            how = "SIGKILL" if self.killed else "SIGTERM"
            parts.append(f"ended {len(self.orphans)} {self.what} ({how})")
        if self.shm:
            parts.append(f"removed {len(self.shm)} /dev/shm file(s): {', '.join(self.shm)}")
        if self.epilog:
            parts.append(f"epilog {self.epilog}")
        parts += self.outputs
        if not parts:
            return ""
        return f"cleanup in {self.seconds:.2f} s: " + "; ".join(parts)


def group_members(pgid: int, proc: Path = PROC) -> list[int]:
    """The live (not zombie) processes in group ``pgid``, from ``/proc``."""
    found = []
    for entry in _pids(proc):
        try:
            stat = (proc / str(entry) / "stat").read_text()
        except OSError:
            continue
        fields = stat.rpartition(")")[2].split()
        if len(fields) > 2 and fields[2] == str(pgid) and fields[0] != "Z":
            found.append(entry)
    return found


def held_shm(pids: Iterable[int], shm: Path = SHM, proc: Path = PROC) -> set[Path]:
    """The files under ``shm`` that ``pids`` have open or mapped."""
    held: set[Path] = set()
    root = str(shm).rstrip("/") + "/"
    for pid in pids:
        base = proc / str(pid)
        links = _links(base / "fd")
        try:
            maps = [line.split(None, 5)[-1] for line in (base / "maps").read_text().splitlines()]
        except OSError:
            maps = []
        for name in links + maps:
            if name.startswith(root):
                held.add(Path(name.removesuffix(" (deleted)")))
    return held


async def end_group(pgid: int, grace_s: float = ORPHAN_GRACE_S) -> tuple[list[int], bool]:
    """End what is left in process group ``pgid``: SIGTERM, then SIGKILL after ``grace_s``
    (a grace of 0: SIGKILL at once). Returns the pids found and whether SIGKILL was needed.
    Without ``/proc`` the group just gets SIGKILL and no pids are reported."""
    if not PROC.is_dir():
        _signal(pgid, signal.SIGKILL)
        return [], False
    members = group_members(pgid)
    if not members:
        return [], False
    if grace_s > 0:
        _signal(pgid, signal.SIGTERM)
        if await _emptied(pgid, grace_s):
            return members, False
    _signal(pgid, signal.SIGKILL)
    await _emptied(pgid, 1.0)
    return members, True


def remove_shm(
    prefix: str, held: set[Path], shm: Path = SHM, *, uid: int | None = None
) -> list[str]:
    """Remove the replica's shared memory files (see the module docstring); the names
    removed. ``held``: what its leftover processes had open or mapped; ``uid``: the user it
    ran as (default: the agent's)."""
    if not shm.is_dir():
        return []
    uid = os.getuid() if uid is None else uid
    mine = {p for p in shm.iterdir() if p.name.startswith(prefix)}
    others = held - mine
    if others:
        others -= held_shm(_pids(PROC), shm)
    removed = []
    for path in sorted(mine | others):
        try:
            if path.lstat().st_uid == uid and not path.is_dir():
                path.unlink()
                removed.append(path.name)
        except OSError:
            continue
    return removed


def _links(fds: Path) -> list[str]:
    """Where a process's open file descriptors point (those still open when read)."""
    out = []
    try:
        entries = list(fds.iterdir())
    except OSError:
        return []
    for fd in entries:
        with contextlib.suppress(OSError):
            out.append(os.readlink(fd))
    return out


def _pids(proc: Path) -> list[int]:
    try:
        return [int(p.name) for p in proc.iterdir() if p.name.isdigit()]
    except OSError:
        return []


def _signal(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


async def _emptied(pgid: int, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while group_members(pgid):
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(POLL_S)
    return True

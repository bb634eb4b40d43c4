"""Replicas left running by an agent that was killed (SIGKILL, a crash): the record of what
the agent launched, and how a restarted agent tells its leftovers from other processes.

The record is ``replicas.json`` in the agent's work dir: every replica the agent launched and
has not yet seen exit and cleaned up after (its spec, pid, process group, the process's start
time, from field 22 of ``/proc/<pid>/stat``, and the boot it ran in), and until when the
node's lease last held, on the wall clock. It is rewritten whole on every launch and exit,
and on every lease renewal while replicas run, through a temporary file and ``os.replace``:
a reader finds the old record or the new one, never a mix. It is not fsynced: it only
matters while the host stays up, since a reboot ends the replicas anyway.

A restarted agent ends its leftovers before it registers; it does not adopt them. A replica
that is not the agent's child cannot be waited for, so its exit code is lost, and an exit
with no code would read as a success to the server; the agent ends them instead (see
``Runtime.end_leftovers``). A recorded replica is still running (``find``) when its pid is
alive in the same boot with the same start time, so a reused pid is never taken for it; or,
once that process is gone, while a process in its group still carries the replica's
``BOLT_JOB_ID``, ``BOLT_REPLICA`` and ``BOLT_EPOCH`` in its environment. A replica launched
in the instant before the agent was killed, before its record was written, is not found.
"""

from __future__ import annotations

import logging
import os
from enum import Enum
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from boltforge.agent.cleanup import PROC, group_members
from boltforge.agent.identity import Identity
from boltforge.agent.processes import marks
from boltforge.wire.agent import ReplicaSpec

log = logging.getLogger("boltforge.agent")

RECORD_NAME = "replicas.json"
START_FIELD = 22  # starttime in /proc/<pid>/stat: clock ticks after boot


class Launched(BaseModel):
    """One replica the agent launched: its spec, its process (``pid``, leader of group
    ``pgid``), that process's start time (None where ``/proc`` cannot tell) and boot, and
    the user it ran as (``uid`` None: the agent's own)."""

    model_config = ConfigDict(extra="forbid")

    spec: ReplicaSpec
    pid: int
    pgid: int
    start: int | None = None
    boot: str = ""
    user: str = ""
    uid: int | None = None
    gid: int | None = None


class Saved(BaseModel):
    """The record as saved: the launched replicas, and until when (seconds since the epoch)
    the node's lease held when the record was last written (None: never registered)."""

    model_config = ConfigDict(extra="forbid")

    lease_until: float | None = None
    replicas: list[Launched] = []


class Found(Enum):
    """What a recorded replica's process is now (see ``find``)."""

    RUNNING = "still running"
    GROUP = "exited, but processes of its group still run"
    GONE = "no longer running"
    REUSED = "no longer running (its pid is another process now, left alone)"
    UNKNOWN = "of a previous boot or an unknown start time, left alone"

    @property
    def leftover(self) -> bool:
        return self in (Found.RUNNING, Found.GROUP)


class LaunchRecord:
    """The durable list of the replicas this agent launched, at ``path``. ``add`` and
    ``remove`` keep it as replicas start and end; ``renewed`` notes the lease; ``read``
    returns what a previous run of the agent saved. A write that fails is logged: the agent
    keeps running its replicas, which a later restart may then not find."""

    def __init__(self, path: Path, proc: Path = PROC) -> None:
        self.path, self.proc = path, proc
        self.lease_until: float | None = None
        self._entries: dict[tuple[str, int], Launched] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def add(self, spec: ReplicaSpec, pid: int, identity: Identity | None = None) -> Launched:
        """Record ``spec``'s process ``pid`` (just launched, not yet reaped, running as
        ``identity``) and save."""
        try:
            pgid = os.getpgid(pid)
        except OSError:
            pgid = pid
        entry = Launched(
            spec=spec,
            pid=pid,
            pgid=pgid,
            start=process_start(pid, self.proc),
            boot=boot_id(self.proc),
            user=identity.user if identity else "",
            uid=identity.uid if identity else None,
            gid=identity.gid if identity else None,
        )
        self._entries[(spec.replica, spec.epoch)] = entry
        self.save()
        return entry

    def remove(self, replica: str, epoch: int) -> None:
        """Forget a replica that exited and was cleaned up after, and save."""
        if self._entries.pop((replica, epoch), None) is not None:
            self.save()

    def renewed(self, lease_until: float) -> None:
        """Note that the lease holds until ``lease_until`` (wall clock); saved while
        replicas run."""
        self.lease_until = lease_until
        if self._entries:
            self.save()

    def read(self) -> Saved:
        """What the file holds: empty when there is none; empty, with a warning, when it
        cannot be read or parsed."""
        try:
            return Saved.model_validate_json(self.path.read_bytes())
        except FileNotFoundError:
            return Saved()
        except (OSError, ValidationError) as e:
            log.warning("cannot read the replica record %s (%s); ignoring it", self.path, e)
            return Saved()

    def save(self) -> None:
        """Write the record atomically: a temporary file beside it, then ``os.replace``."""
        saved = Saved(lease_until=self.lease_until, replicas=list(self._entries.values()))
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as out:
                out.write(saved.model_dump_json())
            os.replace(tmp, self.path)
        except OSError as e:
            log.warning("cannot write the replica record %s: %s", self.path, e)
            tmp.unlink(missing_ok=True)


def find(entry: Launched, proc: Path = PROC) -> Found:
    """What became of ``entry``'s replica (see the module docstring). Touches nothing."""
    if entry.start is None or entry.boot != boot_id(proc):
        return Found.UNKNOWN
    start = process_start(entry.pid, proc)
    if start is not None:
        return Found.RUNNING if start == entry.start else Found.REUSED
    spec = entry.spec
    if any(carries(pid, spec, proc) for pid in group_members(entry.pgid, proc)):
        return Found.GROUP
    return Found.GONE


def grace_for(entry: Launched, lease_until: float | None, max_grace_s: float, now: float) -> float:
    """The checkpoint grace a leftover gets: its spec's, at most ``max_grace_s``, and no more
    than the lease had left at ``now`` (past it the server may have restarted the job
    elsewhere, and a checkpoint written then would overwrite the newer one); 0: no
    checkpoint signal, SIGKILL at once."""
    left = 0.0 if lease_until is None else lease_until - now
    return max(0.0, min(entry.spec.grace_s, max_grace_s, left))


def process_start(pid: int, proc: Path = PROC) -> int | None:
    """When process ``pid`` started (clock ticks after boot); None when there is no such
    process, it is a zombie, or ``/proc`` cannot tell."""
    try:
        stat = (proc / str(pid) / "stat").read_text()
    except OSError:
        return None
    fields = stat.rpartition(")")[2].split()  # fields from 3 (state) on
    index = START_FIELD - 3
    if len(fields) <= index or fields[0] in ("Z", "X") or not fields[index].isdigit():
        return None
    return int(fields[index])


def boot_id(proc: Path = PROC) -> str:
    """This boot's id (empty where ``/proc`` has none)."""
    try:
        return (proc / "sys" / "kernel" / "random" / "boot_id").read_text().strip()
    except OSError:
        return ""


def carries(pid: int, spec: ReplicaSpec, proc: Path = PROC) -> bool:
    """Whether process ``pid``'s environment names ``spec``'s job, replica and epoch."""
    try:
        env = set((proc / str(pid) / "environ").read_bytes().split(b"\0"))
    except OSError:
        return False
    return {f"{k}={v}".encode() for k, v in marks(spec).items()} <= env

"""The replicas on this node: starting, stopping (checkpoint signal, grace, kill), reaping, and
collecting their output into the outbox.

Every launch is written to the launch record (``leftovers``) and every replica is struck from
it once it exited and was cleaned up after. An agent restarted after it was killed (SIGKILL,
a crash) ends, before it registers, the replicas its previous run left running
(``end_leftovers``): checkpoint signal to each one's process group, a grace (its spec's,
capped by ``--leftover-grace``, and only what the lease had left), SIGKILL, then the usual
cleanup; each is reported ``exited`` by the node (``by_node``), so its job requeues and
resumes from its last checkpoint. It does not adopt them: it could not wait for a process
that is not its child, so their exit codes would be lost."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from collections.abc import Callable, Coroutine, Mapping
from pathlib import Path
from typing import Any

from boltforge.agent.artifacts import SPOOL, Roots, collect
from boltforge.agent.cleanup import (
    LEFTOVER_GRACE_S,
    Cleanup,
    end_group,
    group_members,
    held_shm,
    remove_shm,
)
from boltforge.agent.containers import (
    ENGINE_ERRORS,
    SCRATCH,
    Engine,
    container_env,
    container_name,
    engine_error,
    exit_words,
    gpu_devices,
    hand_over,
    mounts,
    remove_files,
    write_env_file,
)
from boltforge.agent.containers import exit_fields as container_exit
from boltforge.agent.hooks import run_scripts
from boltforge.agent.identity import Identities, Identity
from boltforge.agent.leftovers import (
    RECORD_NAME,
    Found,
    Launched,
    LaunchRecord,
    find,
    grace_for,
)
from boltforge.agent.outbox import Outbox
from boltforge.agent.preflight import NodeHooks, Preflight
from boltforge.agent.processes import (
    exit_fields,
    hook_env,
    launch,
    prepare,
    replica_env,
    replica_paths,
    shm_prefix,
    signal_group,
    spawn,
    without_secrets,
)
from boltforge.agent.replica import Replica
from boltforge.agent.sharing import gpus_used, mig_device
from boltforge.node.converge import never_started
from boltforge.wire.agent import ReplicaSpec, ReplicaStatus

log = logging.getLogger("boltforge.agent")

LEFT_BY_KILLED_AGENT = "process(es) left running when the agent was killed"


class AgentRuntime:
    """Owns the node's replica processes. ``live`` maps replica names to the replica running
    (or stopping) under that name; ``finished`` holds every ``(replica, epoch)`` that has run
    to exit or failed to start, which is never started again. ``on_exit`` is called after each
    exit, so the agent can start what waited for it. ``preflight`` checks the node before
    each start; ``hooks.epilogs`` run after each exit, with the cleanup (see ``_watch``).
    ``record`` lists the replicas launched and not yet cleaned up after (``leftovers``).
    ``engine``: the container engine that runs the replicas whose spec names an image
    (``containers``); None: such replicas fail to start here. ``identities``: which user a
    replica without an image runs as (``identity``; None: the agent's own, as an embedding
    that isolates otherwise wants; ``bolt agent`` always passes its own)."""

    def __init__(
        self,
        work_dir: Path,
        outbox: Outbox,
        on_exit: Callable[[], None],
        env: Mapping[str, str] | None = None,
        preflight: Preflight | None = None,
        hooks: NodeHooks | None = None,
        engine: Engine | None = None,
        identities: Identities | None = None,
    ) -> None:
        self.work_dir = work_dir
        self.identities = identities or Identities.agents_own()
        self.engine = engine
        self.outbox = outbox
        self.on_exit = on_exit
        self.preflight = preflight
        self.hooks = hooks or NodeHooks()
        base = os.environ if env is None else env
        self.env = without_secrets(base)
        self.live: dict[str, Replica] = {}
        self.draining: list[Replica] = []
        self.finished: set[tuple[str, int]] = set()
        self.record = LaunchRecord(work_dir / RECORD_NAME)
        self._tasks: set[asyncio.Task[None]] = set()

    def epochs(self) -> dict[str, int]:
        return {name: r.spec.epoch for name, r in self.live.items()}

    def statuses(self) -> list[ReplicaStatus]:
        return [r.status() for r in self.live.values()]

    async def start(self, spec: ReplicaSpec) -> None:
        """Run the node's preflight, then launch ``spec`` and report ``started``; or report
        ``failed`` when the preflight fails (``preflight``, with the evidence: it is never
        launched) or it cannot start. Either way that epoch is then finished: it is not
        tried again here."""
        paths = replica_paths(self.work_dir, spec)
        replica = Replica(spec, paths)
        try:
            if not spec.image:
                replica.identity = await asyncio.to_thread(self.identities.for_team, spec.team)
            env = replica_env(spec, paths, self.env, replica.identity)
            env = await self._on_mig_device(spec, env)
            prepare(paths, replica.identity)
            if not await self._preflight(replica, env):
                return
            if spec.image:
                replica.process = await self._launch_container(replica, env)
            else:
                replica.process = await launch(spec, paths, env, replica.identity)
        except (OSError, ValueError) as e:
            self._not_started(replica, f"could not start: {e}{_as_whom(replica, e)}")
            return
        self.live[spec.replica] = replica
        self.record.add(spec, replica.process.pid, replica.identity)
        log.info("started replica %s (epoch %d) as pid %s", spec.replica, spec.epoch, replica.pid)
        self.outbox.add_event(replica.event("started", time.time(), pid=replica.pid))
        self._spawn(self._watch(replica))

    async def _on_mig_device(self, spec: ReplicaSpec, env: dict[str, str]) -> dict[str, str]:
        """``env`` with ``CUDA_VISIBLE_DEVICES`` naming the replica's MIG device by UUID when
        it holds a MIG instance and NVML is here (else as it is: declared GPUs). Raises
        ``ValueError`` when NVML shows no instance where the scheduler placed it."""
        share = spec.share
        nvml = self.preflight.nvml if self.preflight is not None else None
        if share is None or not share.profile or nvml is None:
            return env
        try:
            uuid = await asyncio.to_thread(mig_device, nvml, share.gpu, share.start)
        except Exception as e:  # NVML's errors are module-specific classes
            raise ValueError(f"NVML could not name GPU {share.gpu}'s MIG devices: {e}") from e
        if uuid is None:
            raise ValueError(
                f"GPU {share.gpu} has no MIG instance at slice {share.start} for "
                f"{share.profile}. To fix: cut the GPU as its pool's mig_layout says "
                "(nvidia-smi mig, or nvidia-mig-manager) and restart the agent"
            )
        return {**env, "CUDA_VISIBLE_DEVICES": uuid}

    async def _launch_container(
        self, replica: Replica, env: Mapping[str, str]
    ) -> asyncio.subprocess.Process:
        """Start ``replica`` as a container (see ``containers``). Raises ``ValueError`` when
        this node runs no engine or lacks the image, ``OSError`` when the engine cannot
        start."""
        spec, engine = replica.spec, self.engine
        if engine is None:
            raise ValueError(
                f"image {spec.image}: this node runs replicas as processes, not containers. "
                "To fix: run its agent with --runtime podman (or docker)"
            )
        if not spec.command:
            raise ValueError("the replica has no command")
        if not await engine.image_present(str(spec.image)):
            raise ValueError(
                f"image {spec.image} is not on this node and no registry is asked. To fix: "
                f"load or build it here (`{engine.kind} load`, `{engine.kind} build`) or name "
                "one the node has"
            )
        files = replica.paths
        devices = gpu_devices(gpus_used(spec))
        hand_over(files, engine.user)
        write_env_file(files.env_file, container_env(spec, env, devices))
        name = container_name(spec)
        await engine.remove(name)  # one of this name left by an agent that was killed
        argv = engine.run_argv(spec, name, files, devices)
        return await spawn(argv, replica.paths.log, self.env)

    async def _preflight(self, replica: Replica, env: Mapping[str, str]) -> bool:
        """Whether ``replica`` may start; reports it ``failed`` when it may not."""
        if self.preflight is None:
            return True
        hook = hook_env(replica.spec, replica.paths, "prolog", replica.identity)
        hook["CUDA_VISIBLE_DEVICES"] = env["CUDA_VISIBLE_DEVICES"]  # a MIG device's UUID
        verdict = await self.preflight.run(gpus_used(replica.spec), hook)
        if not verdict.ok:
            self._not_started(replica, f"preflight failed: {verdict.evidence}", preflight=True)
        return verdict.ok

    def _not_started(self, replica: Replica, detail: str, preflight: bool = False) -> None:
        spec = replica.spec
        self.finished.add((spec.replica, spec.epoch))
        log.warning("replica %s (epoch %d) %s", spec.replica, spec.epoch, detail)
        event = replica.event("failed", time.time(), detail=detail, preflight=preflight)
        self.outbox.add_event(event)

    def skip(self, spec: ReplicaSpec) -> None:
        """Report ``spec`` as exited without running it: it was told to stop before it
        started here (that epoch is then finished)."""
        self.finished.add((spec.replica, spec.epoch))
        event = never_started(spec.replica, spec.job, spec.epoch)
        log.info("replica %s (epoch %d) %s", spec.replica, spec.epoch, event.detail)
        self.outbox.add_event(event)

    def stop(self, name: str, grace_s: float | None = None, by_node: bool = False) -> None:
        """Send the checkpoint signal (SIGTERM) to the replica's process group, then SIGKILL
        after ``grace_s`` (default: its spec's) if it is still there; a grace of 0 kills it at
        once, with no checkpoint. ``by_node``: the agent stops it on its own (its exit is
        reported so). Stopping a replica that is already stopping (unless to kill it now), or
        not live, does nothing."""
        replica = self.live.get(name)
        if replica is None or replica.pid is None:
            return
        if replica.term_at is not None and grace_s != 0:
            return
        replica.by_node = replica.by_node or by_node
        if grace_s == 0:
            replica.term_at = replica.term_at or time.monotonic()
            log.info("killing replica %s (SIGKILL, no grace)", name)
            self._kill(replica)
            return
        grace = replica.spec.grace_s if grace_s is None else grace_s
        replica.term_at = time.monotonic()
        log.info("stopping replica %s (SIGTERM, %.1fs grace)", name, grace)
        signal_group(replica.pid, signal.SIGTERM)
        self._spawn(self._kill_after(replica, grace))

    def stop_all(self, grace_s: float | None = None) -> None:
        """Stop every live replica on the agent's own account (``by_node``)."""
        for name in list(self.live):
            self.stop(name, grace_s, by_node=True)

    def busy_gpus(self) -> set[int]:
        """The GPUs held by this node's live processes (running or still stopping)."""
        return {g for r in self.live.values() for g in gpus_used(r.spec)}

    async def wait_all(self, timeout_s: float) -> None:
        """Wait until every live replica has exited; SIGKILL what is left after ``timeout_s``."""
        waiting = [asyncio.create_task(r.done.wait()) for r in self.live.values()]
        if not waiting:
            return
        _, pending = await asyncio.wait(waiting, timeout=timeout_s)
        for replica in list(self.live.values()):
            if replica.pid is not None:
                self._kill(replica)
        if pending:
            await asyncio.wait(pending, timeout=5.0)

    def collect(self) -> bool:
        """Read new output and progress of every replica into the outbox; forget exited
        replicas once everything they wrote has been read. True when anything was read."""
        got = False
        for replica in self.live.values():
            got |= replica.collect(self.outbox)
        keep = []
        for replica in self.draining:
            read = replica.collect(self.outbox)
            got |= read
            if read or not (self.outbox.log_room() and self.outbox.progress_room()):
                keep.append(replica)
        self.draining = keep
        return got

    async def _watch(self, replica: Replica) -> None:
        assert replica.process is not None and replica.pid is not None
        code = await replica.process.wait()
        ended = time.monotonic()
        detail = await self._container_words(replica, code)
        cleanup = await self._clean(replica, code)
        if cleanup:
            log.info("replica %s: %s", replica.name, cleanup)
        replica.done.set()
        contained = self._engine_for(replica) is not None
        exit_code, sig = container_exit(code) if contained else exit_fields(code)
        held = None if replica.term_at is None else round(ended - replica.term_at, 3)
        replica.collect(self.outbox)
        event = replica.event(
            "exited",
            time.time(),
            pid=replica.pid,
            exit_code=exit_code,
            signal=sig,
            checkpoint_s=held,
            by_node=replica.by_node,
            cleanup=cleanup,
            detail=detail,
        )
        self.outbox.add_event(event)
        log.info("replica %s exited (code %s, signal %s)", replica.name, exit_code, sig)
        if self.live.get(replica.name) is replica:
            del self.live[replica.name]
        self.record.remove(replica.spec.replica, replica.spec.epoch)
        self.finished.add((replica.spec.replica, replica.spec.epoch))
        self.draining.append(replica)
        self.on_exit()

    def _engine_for(self, replica: Replica) -> Engine | None:
        """The engine ``replica`` runs on: this node's, when its spec names an image."""
        return self.engine if replica.spec.image else None

    async def _container_words(self, replica: Replica, code: int) -> str:
        """What a container's exit means, in words (see ``containers.exit_words``); empty
        for a process, or an exit that needs none."""
        engine = self._engine_for(replica)
        if engine is None:
            return ""
        name = container_name(replica.spec)
        oom = code == 137 and not replica.killed and await engine.oom_killed(name)
        said = engine_error(replica.paths.log) if code in ENGINE_ERRORS else ""
        return exit_words(code, replica.killed, replica.spec.memory_gb, oom, said)

    async def _clean(self, replica: Replica, code: int) -> str:
        """After ``replica``'s main process exited with ``code``: end what it left in its
        process group, remove its shared memory files (see ``cleanup``), then run the
        epilogs. What was done, in words (empty when nothing was)."""
        assert replica.pid is not None
        began = time.monotonic()
        held = held_shm(group_members(replica.pid))
        done = Cleanup()
        done.orphans, done.killed = await end_group(replica.pid)
        await self._after_exit(replica, held, done, code)
        done.seconds = time.monotonic() - began
        return done.describe()

    async def _after_exit(
        self, replica: Replica, held: set[Path], done: Cleanup, code: int | None
    ) -> None:
        """Once nothing of ``replica`` runs: remove its shared memory files (its prefix's,
        and ``held``, those its processes had open), then run the epilogs, with
        ``BOLT_EXIT_CODE`` unless ``code`` is unknown (None). Notes both in ``done``. First
        its declared outputs go to the artifact spool (``artifacts.collect``), then a
        container is removed, with its scratch directory and env file."""
        done.outputs = collect(replica.spec, self._roots(replica), self.work_dir / SPOOL)
        if (engine := self._engine_for(replica)) is not None:
            await engine.remove(container_name(replica.spec))
            remove_files(replica.paths)
        elif replica.identity is not None:
            remove_files(replica.paths)  # its scratch folder (HOME)
        owner = replica.identity.uid if replica.identity else os.getuid()
        done.shm = remove_shm(shm_prefix(replica.spec), held, uid=owner)
        if not self.hooks.epilogs:
            return
        env = hook_env(replica.spec, replica.paths, "epilog", replica.identity, code)
        results = await run_scripts(self.hooks.epilogs, env, self.hooks.timeout_s)
        done.epilog = next((r.evidence for r in results if not r.ok), "")

    def _roots(self, replica: Replica) -> Roots:
        """Where ``replica``'s declared outputs are on this host."""
        spec = replica.spec
        if self._engine_for(replica) is not None:
            return Roots(mounts(replica.paths), spec.cwd or SCRATCH, container=True)
        owner = replica.identity.uid if replica.identity else None
        return Roots({}, spec.cwd or os.getcwd(), container=False, owner=owner)

    # replicas left running by a previous run of the agent

    async def end_leftovers(self, max_grace_s: float = LEFTOVER_GRACE_S) -> int:
        """End the replicas a previous run of this agent left running when it was killed
        (``leftovers.find``), all at once: each process group gets the checkpoint signal and
        a grace (``grace_for``: its spec's, at most ``max_grace_s``, within what the lease
        had left), then SIGKILL, then the usual cleanup. Each is reported ``exited`` by the
        node (``by_node``, exit code unknown, what was done as ``cleanup``) and is finished
        here. Recorded replicas no longer running are cleaned up after, and reported by
        nothing (the server writes them off when the node registers without them); a pid
        now used by another process is left alone. Then the record is emptied. Returns how
        many were ended. Call before registering."""
        saved = self.record.read()
        if not saved.replicas:
            return 0
        now = time.time()
        ending, gone = [], []
        for entry in saved.replicas:
            found = find(entry, self.record.proc)
            if found.leftover:
                grace = grace_for(entry, saved.lease_until, max_grace_s, now)
                ending.append(self._end_leftover(entry, grace))
                continue
            log.info("%s, recorded by the agent's previous run: %s", _which(entry), found.value)
            if found is not Found.UNKNOWN:
                gone.append(self._clean_gone(entry))
        count = len(ending)
        await asyncio.gather(*ending, *gone)
        self.record.save()
        return count

    async def _end_leftover(self, entry: Launched, grace_s: float) -> None:
        """End one leftover's process group (see ``end_leftovers``) and report it."""
        spec = entry.spec
        how = f"SIGTERM, {grace_s:.1f} s grace" if grace_s > 0 else "SIGKILL: its lease ran out"
        log.warning(
            "%s was left running when the agent was killed: ending it (%s)", _which(entry), how
        )
        replica = Replica(spec, replica_paths(self.work_dir, spec), _identity(entry))
        held = held_shm(group_members(entry.pgid))
        done = Cleanup(what=LEFT_BY_KILLED_AGENT)
        began = time.monotonic()
        done.orphans, done.killed = await end_group(entry.pgid, grace_s)
        took = time.monotonic() - began
        await self._after_exit(replica, held, done, None)
        done.seconds = time.monotonic() - began
        cleanup = done.describe()
        log.info("replica %s: %s", spec.replica, cleanup or "it had exited meanwhile")
        event = replica.event(
            "exited",
            time.time(),
            pid=entry.pid,
            checkpoint_s=round(took, 3) if grace_s > 0 else None,
            by_node=True,
            detail="left running when the agent was killed; ended when it started again",
            cleanup=cleanup,
        )
        self.outbox.add_event(event)
        self.finished.add((spec.replica, spec.epoch))

    async def _clean_gone(self, entry: Launched) -> None:
        """Clean up after a recorded replica that ended while the agent was not running."""
        replica = Replica(entry.spec, replica_paths(self.work_dir, entry.spec), _identity(entry))
        done = Cleanup()
        began = time.monotonic()
        await self._after_exit(replica, set(), done, None)
        done.seconds = time.monotonic() - began
        if cleanup := done.describe():
            log.info("replica %s: %s", entry.spec.replica, cleanup)

    async def _kill_after(self, replica: Replica, grace_s: float) -> None:
        try:
            await asyncio.wait_for(replica.done.wait(), grace_s)
        except TimeoutError:
            if replica.pid is not None and not replica.done.is_set():
                log.warning("replica %s outlived its %.1fs grace; SIGKILL", replica.name, grace_s)
                self._kill(replica)

    def _kill(self, replica: Replica) -> None:
        """SIGKILL ``replica``: its process group, and its container through the engine
        (the engine's client cannot pass SIGKILL on)."""
        assert replica.pid is not None
        replica.killed = True
        if (engine := self._engine_for(replica)) is not None:
            self._spawn(engine.kill(container_name(replica.spec)))
        else:
            signal_group(replica.pid, signal.SIGKILL)

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._finished_task)

    def _finished_task(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("replica task failed", exc_info=task.exception())

    def cancel_tasks(self) -> None:
        for task in list(self._tasks):
            task.cancel()


def _as_whom(replica: Replica, error: Exception) -> str:
    """For a replica refused a file as its team's user: who it ran as, and the fix."""
    if replica.identity is None or not isinstance(error, PermissionError):
        return ""
    return (
        f" (it runs as user {replica.identity.user}, who may not reach it. To fix: put the "
        "command, its interpreter and its cwd where every user may read them, not under /root)"
    )


def _identity(entry: Launched) -> Identity | None:
    """The user a recorded replica ran as (None: the agent's own)."""
    if entry.uid is None or entry.gid is None:
        return None
    return Identity(entry.user, entry.uid, entry.gid)


def _which(entry: Launched) -> str:
    """``entry``'s replica in words, for the log."""
    return f"replica {entry.spec.replica} (epoch {entry.spec.epoch}, pid {entry.pid})"

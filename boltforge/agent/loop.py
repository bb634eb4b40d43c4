"""The agent loop: register, then heartbeat, long-poll the desired state and converge on it,
monitor the replicas and send reports, all at once, until asked to stop.

Who does what:

1. ``_heartbeats`` registers (retrying with backoff until the server answers) and renews the
   lease every ``heartbeat_s``; a 409 means the session is gone, so it registers again, saying
   what the node still runs.
2. ``_poll_desired`` long-polls ``desired?since=V`` and wakes the converger on every answer.
3. ``_converge_loop`` starts and stops replicas so the node matches the desired state.
4. ``_monitor`` reads replicas' output into the outbox and fences: once no heartbeat has been
   answered for ``lease_s`` it stops every replica (the server may have given their GPUs to
   another job) and drops the session, so the next heartbeat registers again.
5. ``_send_reports`` sends the outbox in order; what fails to send is retried.

Before any of them, the agent ends what a previous run of it, killed with SIGKILL or
crashed, left running (``AgentRuntime.end_leftovers``), so that it registers with a node that runs
nothing the server does not know of; the lease's end is kept in the launch record for that.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from boltforge import __version__
from boltforge.agent.activity import sample_gpus
from boltforge.agent.artifacts import SPOOL, send_spooled
from boltforge.agent.cleanup import LEFTOVER_GRACE_S
from boltforge.agent.client import (
    AgentClientError,
    Backoff,
    Refused,
    ServerClient,
    SessionLost,
    StoreAway,
)
from boltforge.agent.containers import Engine
from boltforge.agent.identity import Identities
from boltforge.agent.lease import LeaseClock, Session
from boltforge.agent.outbox import Batch, Outbox
from boltforge.agent.preflight import NodeHooks, Preflight
from boltforge.agent.runtime import AgentRuntime
from boltforge.node.converge import plan
from boltforge.wire.agent import (
    GpuActivity,
    Heartbeat,
    Inventory,
    Lease,
    Registration,
    ReplicaSpec,
)

log = logging.getLogger("boltforge.agent")

EXIT_OK = 0
EXIT_REFUSED = 2
FENCE_LATE_S = 1.0
ARTIFACT_POLL_S = 1.0


class Agent:
    """One node's agent. ``run()`` returns 0 once ``request_stop()`` was called and the
    replicas have stopped gracefully, or 2 when the server refuses the registration for good
    (bad token, invalid inventory). ``poll_wait_s`` is the long-poll wait; ``tick_s`` how
    often output is read and the lease checked; ``hooks`` the prolog and epilog scripts run
    around each replica (see ``preflight``); ``leftover_grace_s`` the longest checkpoint
    grace given to replicas a killed run of the agent left running (see ``leftovers``);
    ``engine`` the container engine for replicas with an image (see ``containers``);
    ``identities`` the users replicas without one run as (see ``identity``; None: the
    agent's own)."""

    def __init__(
        self,
        client: ServerClient,
        inventory: Inventory,
        work_dir: Path,
        *,
        poll_wait_s: float = 30.0,
        tick_s: float = 0.2,
        max_backoff_s: float = 10.0,
        hooks: NodeHooks | None = None,
        leftover_grace_s: float = LEFTOVER_GRACE_S,
        engine: Engine | None = None,
        identities: Identities | None = None,
    ) -> None:
        self.client, self.inventory = client, inventory
        self.leftover_grace_s = leftover_grace_s
        self.poll_wait_s, self.tick_s, self.max_backoff_s = poll_wait_s, tick_s, max_backoff_s
        self._report_again_in: float | None = None  # the Retry-After of a store away
        self.outbox = Outbox()
        hooks = hooks or NodeHooks()
        self.runtime = AgentRuntime(
            work_dir,
            self.outbox,
            on_exit=self._wake_converge,
            preflight=Preflight(inventory, hooks),
            hooks=hooks,
            engine=engine,
            identities=identities,
        )
        self.session: Session | None = None
        self.lease = LeaseClock()
        self.desired: list[ReplicaSpec] | None = None
        self.since = 0
        self._registered = asyncio.Event()
        self._wake = asyncio.Event()
        self._stop = asyncio.Event()
        self._closing = False
        self._fenced = False
        self._converging = asyncio.Lock()

    def request_stop(self) -> None:
        """Stop the replicas gracefully and make ``run()`` return 0. Call from the loop's thread."""
        self._stop.set()

    async def run(self) -> int:
        await self.runtime.end_leftovers(self.leftover_grace_s)
        loops = {
            name: asyncio.create_task(work(), name=name) for name, work in self._loops().items()
        }
        stop = asyncio.create_task(self._stop.wait())
        try:
            done, _ = await asyncio.wait(
                [*loops.values(), stop], return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            await self._shutdown(loops)
            stop.cancel()
        return _exit_code(done)

    def _loops(self) -> dict[str, Callable[[], Coroutine[Any, Any, None]]]:
        return {
            "heartbeats": self._heartbeats,
            "desired": self._poll_desired,
            "converge": self._converge_loop,
            "monitor": self._monitor,
            "reports": self._send_reports,
            "artifacts": self._send_artifacts,
        }

    async def _shutdown(self, loops: dict[str, asyncio.Task[None]]) -> None:
        """Stop starting, stop the replicas (grace, then kill), flush reports, close."""
        self._closing = True
        async with self._converging:  # a launch under way finishes first, then nothing starts
            for name in ("desired", "converge"):
                loops[name].cancel()
        self.runtime.stop_all()
        grace = max((r.spec.grace_s for r in self.runtime.live.values()), default=0.0)
        await self.runtime.wait_all(grace + 2.0)
        await self._drain(timeout_s=5.0, loops=loops)
        for task in loops.values():
            task.cancel()
        await asyncio.gather(*loops.values(), return_exceptions=True)
        self.runtime.cancel_tasks()
        await self.client.aclose()

    async def _drain(self, timeout_s: float, loops: dict[str, asyncio.Task[None]]) -> None:
        """Give the report loop up to ``timeout_s`` to send what is left."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and not loops["reports"].done():
            self.runtime.collect()
            if self.session is None or not (self.outbox or self.runtime.draining):
                return
            await asyncio.sleep(self.tick_s)

    # 1. registration and heartbeats

    async def _heartbeats(self) -> None:
        while True:
            session = self.session or await self._register()
            if await self._heartbeat(session):
                await asyncio.sleep(session.heartbeat_s)

    async def _register(self) -> Session:
        backoff = Backoff(max_s=self.max_backoff_s)
        while True:
            running = self.runtime.statuses() + self.outbox.unreported_exits()
            body = Registration(
                inventory=self.inventory, running=running, agent_version=__version__
            )
            sent = time.monotonic()
            try:
                return self._registered_with(await self.client.register(body), sent)
            except Refused:
                raise
            except AgentClientError as e:
                log.warning("cannot register yet: %s; retrying", e)
            await asyncio.sleep(backoff.next())

    def _registered_with(self, lease: Lease, sent_at: float) -> Session:
        session = Session.of(lease)
        self.session, self._fenced = session, False
        self._renew(lease, sent_at)
        self.since = min(self.since, max(lease.desired_version - 1, 0))
        log.info("registered as node %s (lease %.1fs)", session.node, session.lease_s)
        self._apply_stops(lease.stop)
        self._registered.set()
        self._wake_converge()
        return session

    async def _gpu_activity(self) -> list[GpuActivity]:
        """Each GPU's activity where NVML checks this node (see ``preflight``), else none."""
        preflight = self.runtime.preflight
        if preflight is None or preflight.nvml is None:
            return []
        return await asyncio.to_thread(sample_gpus, preflight.nvml, self.inventory.gpus)

    async def _heartbeat(self, session: Session) -> bool:
        """Renew the lease once. False when the session is gone (register again now)."""
        running = self.runtime.statuses() + self.outbox.unreported_exits()
        gpus = await self._gpu_activity()
        body = Heartbeat(session=session.id, running=running, gpus=gpus, leaving=self._closing)
        sent = time.monotonic()
        try:
            lease = await self.client.heartbeat(session.node, body, max(session.heartbeat_s, 1.0))
        except SessionLost as e:
            log.warning("session lost (%s); registering again", e)
            self._lose(session)
            return False
        except AgentClientError as e:
            log.warning("heartbeat not answered: %s", e)
            return self.session is session
        if self.session is not session:
            return False
        self._renew(lease, sent)
        self._apply_stops(lease.stop)
        return True

    def _renew(self, lease: Lease, sent_at: float) -> None:
        """Renew the lease clock, and note in the launch record until when (wall clock) the
        lease holds: a restart after a crash gives leftovers only that long to checkpoint."""
        self.lease.renew(lease, sent_at)
        assert self.lease.renewed_at is not None
        left = self.lease.renewed_at + self.lease.lease_s - time.monotonic()
        self.runtime.record.renewed(time.time() + left)

    def _apply_stops(self, names: list[str]) -> None:
        for name in names:
            self.runtime.stop(name)

    def _lose(self, session: Session) -> None:
        if self.session is session:
            self.session = None
            self._registered.clear()

    async def _wait_session(self) -> Session:
        while self.session is None:
            await self._registered.wait()
        return self.session

    # 2-3. desired state and convergence

    async def _poll_desired(self) -> None:
        backoff = Backoff(max_s=self.max_backoff_s)
        while True:
            session = await self._wait_session()
            try:
                state = await self.client.desired(session.node, self.since, self.poll_wait_s)
            except AgentClientError as e:
                if isinstance(e, SessionLost) or (isinstance(e, Refused) and e.status == 404):
                    self._lose(session)  # unknown node or session: register again
                log.warning("desired state: %s", e)
                await asyncio.sleep(backoff.next())
                continue
            backoff.reset()
            self.since, self.desired = state.version, state.replicas
            self._wake_converge()

    def _wake_converge(self) -> None:
        self._wake.set()

    async def _converge_loop(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            await self._converge()

    async def _converge(self) -> None:
        async with self._converging:
            if self.desired is None:
                return
            todo = plan(
                self.desired,
                self.runtime.epochs(),
                self.runtime.finished,
                self.runtime.busy_gpus(),
            )
            for name, grace in todo.stop.items():
                self.runtime.stop(name, grace)
            for spec in todo.skip:
                self.runtime.skip(spec)
            for spec in todo.start:
                if self.session is None or self._closing or self._fenced:
                    return
                await self.runtime.start(spec)
                if self._fenced:  # the lease ran out while it was starting
                    self.runtime.stop(spec.replica, by_node=True)

    # 4. monitoring and fencing

    async def _monitor(self) -> None:
        while True:
            self.runtime.collect()
            now = time.monotonic()
            if not self._fenced and self.lease.expired(now):
                self._fence(late=self.lease.overdue(now) > FENCE_LATE_S)
            await asyncio.sleep(self.tick_s)

    def _fence(self, late: bool) -> None:
        """Stop every replica: the server may have given their GPUs to another job. Noticed
        ``late`` (the agent itself was not running when the lease ran out), the server has
        restarted their jobs elsewhere, so they are killed with no checkpoint (it would
        overwrite the newer one); else they get the checkpoint signal and their grace."""
        log.warning(
            "no heartbeat answered for %.1fs: %s %d replica(s), registering again",
            self.lease.lease_s,
            "killing" if late else "stopping",
            len(self.runtime.live),
        )
        self._fenced = True
        self.runtime.stop_all(0 if late else None)
        if self.session is not None:
            self._lose(self.session)

    # 6. artifacts

    async def _send_artifacts(self) -> None:
        """Send the spooled outputs of ended replicas (``artifacts``), while registered."""
        spool = self.runtime.work_dir / SPOOL
        while True:
            await asyncio.sleep(ARTIFACT_POLL_S)
            if self.session is not None and spool.is_dir() and any(spool.iterdir()):
                await send_spooled(spool, self._send_artifact)

    async def _send_artifact(self, replica: str, name: str, path: Path, sha256: str) -> bool:
        """One spooled file to the server: True once it is kept or refused for good."""
        session = self.session
        if session is None:
            return False
        try:
            await self.client.upload_artifact(session.node, replica, name, path, sha256)
        except Refused as e:
            log.warning("artifact %s of replica %s refused: %s; dropped", name, replica, e)
        except AgentClientError as e:
            log.info("artifact %s of replica %s not sent yet: %s", name, replica, e)
            return False
        return True

    # 5. reports

    async def _send_reports(self) -> None:
        backoff = Backoff(max_s=self.max_backoff_s)
        while True:
            session = await self._wait_session()
            batch = self.outbox.batch(session.id)
            if batch is None:
                await asyncio.sleep(self.tick_s)
            elif await self._send(session, batch):
                backoff.reset()
            else:  # the server's store away: when it asked; else: backing off
                again, self._report_again_in = self._report_again_in, None
                await asyncio.sleep(again if again is not None else backoff.next())

    async def _send(self, session: Session, batch: Batch) -> bool:
        """Send one batch. True when the server took it (or refused it for good)."""
        try:
            reply = await self.client.report(session.node, batch.report)
        except SessionLost:
            self._lose(session)
            return False
        except StoreAway as e:
            log.info("report held while the server's store is away: %s", e)
            self._report_again_in = e.retry_after
            return False
        except Refused as e:
            taken = batch.events + batch.logs + batch.progress
            log.error("report refused, dropping its %d item(s): %s", taken, e)
        except AgentClientError as e:
            log.warning("report not sent: %s; will retry", e)
            return False
        else:
            if reply.refused:
                log.info("server refused stale report items: %s", ", ".join(reply.refused))
        self.outbox.commit(batch)
        return True


def _exit_code(done: set[asyncio.Task[Any]]) -> int:
    for task in done:
        error = None if task.cancelled() else task.exception()
        if isinstance(error, Refused):
            log.error("the server refused this node: %s", error)
            return EXIT_REFUSED
        if error is not None:
            raise error
    return EXIT_OK

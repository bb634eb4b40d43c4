"""The Slurm bridge: Slurm's nodes and held jobs in, the control plane's intent out.

Each pass (at once when a node's desired state changes or the wake file is touched; else
every ``busy_poll_s`` while something the bridge did is under way, a gang started but not
yet running or one being stopped, and every ``poll_s`` otherwise) it:

1. reads ``squeue`` (and, every ``nodes_every_s``, ``sinfo``) for the managed partitions;
2. registers each responding node with its inventory and what it runs, and renews every
   node's lease in one batched heartbeat (``node.follower.Heartbeats``); a node Slurm says
   is down is let go: the gangs with a replica there are reported ended by their node
   (Slurm ends or requeues its jobs) and, once that report went out, its lease is dropped,
   so the server marks it dead; a draining node is cordoned; what jobs Boltforge does not
   run hold on each node (another partition's, on a node several partitions share: Slurm's
   allocation there less that of the bridge's own jobs) goes with its heartbeats
   (``held_by_others``), and the server places nothing on those GPUs, CPUs or memory;
3. submits each held job it has not seen as a gang (a job it cannot take gets the reason
   in its comment and stays held); the Boltforge job id is kept in the job's admin comment,
   so a restarted bridge finds it again and nothing is submitted twice;
4. carries out the desired states: a gang whose replicas are all bound is started on
   exactly their nodes; a replica to stop gets ``SIGTERM`` (the checkpoint signal) and,
   once its job ended or its grace ran out, its job is requeued held; a job sent with
   ``bolt submit`` (no Slurm job stands for it) gets one made for each placement
   (``launch.py``), submitted as the Slurm user its team maps to (``identity.py``), ended
   rather than requeued when stopped; a gang stopped before Slurm started it is reported
   as never started (``node.converge.never_started``);
5. reports what Slurm did to the jobs it started: running, finished (with the exit code),
   ended with a node; every node's events go in one batched report
   (``node.follower.ReportOutbox``);
6. writes why each job waits, or where it went, into its comment (``squeue -o "%i %k"``).

The desired states of all the nodes come from one long-poll beside the passes
(``node.follower.DesiredFollower``), each answer waking a pass.

The Slurm nodes' replicas outlive their leases (``Inventory.replicas_outlive_lease``): a
bridge away for any length of time ends no job. Started again, it finds the jobs Slurm
runs from their admin comments and registers each node listing them, and the server takes
them back as they were (same epoch, no restart).

A job's replicas map to its nodes: replica ``J.E.r`` runs on the ``r``-th node of the
gang. The bridge never decides where anything runs; it only does what the server's desired
states say, and says what happened.

Identity: a job sent with ``sbatch`` stays its sender's (the bridge never submits it again,
only pins, releases, signals and requeues it, which keep its user). A job the bridge makes
runs as its team's Slurm user, never as root, the bridge's own user or another team's; a
team with no usable user, or a replica the batch script cannot carry safely, fails with the
reason and the fix, and nothing is submitted for it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from contextlib import suppress
from pathlib import Path

from boltforge.agent.client import AgentClientError, ServerClient
from boltforge.client import ApiFailure, Client
from boltforge.node.converge import never_started
from boltforge.node.follower import DesiredFollower, Heartbeats
from boltforge.slurm import words
from boltforge.slurm.commands import Slurm, SlurmError
from boltforge.slurm.gang import TAG, BridgeState, SlurmGang, job_comment, parse_admin_comment
from boltforge.slurm.identity import (
    NoIdentity,
    RunAs,
    TeamUsers,
    parse_config,
    submit_prefix,
    unchecked_accounts,
)
from boltforge.slurm.launch import Unlaunchable, batch_script, gpus_per_node
from boltforge.slurm.model import SlurmJob, SlurmNode
from boltforge.slurm.translate import (
    COMMAND,
    Untranslatable,
    check_whole_nodes,
    inventory,
    job_spec,
    priority_class,
)
from boltforge.slurm.words import JobView, qos_note, refusal_comment, sbatch_words
from boltforge.wire.agent import (
    DesiredChanges,
    Lease,
    Registration,
    ReplicaEvent,
    ReplicaSpec,
    ReplicaStatus,
)
from boltforge.wire.jobs import TERMINAL, JobSummary, SubmitRequest

log = logging.getLogger("boltforge.slurm")

RUNNING = frozenset({"RUNNING", "COMPLETING", "CONFIGURING"})
OTHERS = "held_by_others"  # the health fact the server reads (``control.scheduling.world``)
SHARED_NODE = (
    "on Slurm each replica of a job needs a node of its own, and two of this job's replicas "
    "were placed on one node; ask for whole nodes (gpus a multiple of the node's GPUs)"
)

IMAGE_HINT = (  # fits a comment (250 characters) with a team name of up to 20
    "a batch script runs outside any container, and this server takes containerized work "
    "only (--require-image or `images:`). To fix: the admin exempts team {team} "
    "(teams.{team}.images: {{require: false}})"
)
MAKE_RETRY_S = 30.0  # how long a failing sbatch of a made job is tried again before it fails
MAKE_AGAIN_S = 2.0  # and how often

DEFER_S = 5.0  # how long a woken pass may put off the sinfo read and the comments
BUSY_POLL_S = 0.1  # how often squeue is read while a start or a stop is under way
DETAIL_EVERY_S = 10.0  # how often a waiting job's detail (why preemption is out) is read again
ROOM_REASONS = frozenset({"capacity", "topology", "preemption-budget"})  # waits for room
WAKE_CHECK_S = 0.005  # how often the wake file is looked at (a stat: next to nothing)
FRESH_S = 1.0  # how old a squeue read a pass the server's decision woke may act on


def _changed_at(path: Path) -> int | None:
    """When ``path`` last changed (None: it does not exist or cannot be read)."""
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return None


class SlurmBridge:
    """Runs until cancelled. ``agents`` speaks the agent protocol for every Slurm node;
    ``api`` is the job API (submits, reasons, cordons); both need an admin token.
    ``team_users`` maps a ``bolt submit`` job's team to the Slurm user its Slurm jobs run
    as; without one, no such job runs (each fails, naming ``--team-user``)."""

    def __init__(
        self,
        slurm: Slurm,
        agents: ServerClient,
        api: Client,
        partitions: Sequence[str],
        *,
        topology: dict[str, str] | None = None,
        default_team: str = "default",
        team_users: TeamUsers | None = None,
        grace_s: float = 60.0,
        poll_s: float = 2.0,
        busy_poll_s: float = BUSY_POLL_S,
        wake_file: Path | None = None,
        nodes_every_s: float = 2.0,
        comments_every_s: float = 2.0,
        wait_s: float = 20.0,
        qos_classes: Mapping[str, str] | None = None,
    ) -> None:
        self.slurm, self.agents, self.api = slurm, agents, api
        self.partitions = list(partitions)
        self.topology = topology or {}
        self.default_team, self.grace_s = default_team, grace_s
        self.team_users = team_users or TeamUsers()
        # (Boltforge job, epoch) whose sbatch fails -> (since when, when to try again)
        self._make_failing: dict[tuple[str, int], tuple[float, float]] = {}
        self.poll_s, self.nodes_every_s, self.wait_s = poll_s, nodes_every_s, wait_s
        self.busy_poll_s = min(busy_poll_s, poll_s)
        self.wake_file = wake_file
        self.comments_every_s = comments_every_s
        self.qos_classes = dict(qos_classes or {})
        self._unmapped_qos: set[str] = set()  # QOS names already logged as naming no class
        # Boltforge job -> (its waiting reason, the server's waiting detail, when read)
        self._detail: dict[str, tuple[str, tuple[str, ...], float]] = {}
        self.state = BridgeState()
        self.jobs: dict[str, SlurmJob] = {}
        self.nodes: dict[str, SlurmNode] = {}
        self._wake = asyncio.Event()
        self.desired = DesiredFollower(agents, wait_s)
        self.heartbeats = Heartbeats(agents, full_every_s=0.0)  # each lists what runs
        self._following: asyncio.Task[None] | None = None  # the desired-state long-poll
        self._next_nodes = 0.0
        self._next_comments = 0.0
        self._letting_go: set[str] = set()  # down nodes whose lease goes after the next flush
        self._others: dict[str, str] = {}  # node -> what jobs not Boltforge's hold there
        self._read_at = -FRESH_S  # when squeue was last read (when that read began)
        self._file_woke = False  # the wake file changed since that read began
        self._other_jobs: list[SlurmJob] = []  # other partitions' jobs the last squeue listed
        # node -> GPUs, CPUs, memory Slurm gave jobs not Boltforge's there, at the last sinfo
        self._allocated_to_others: dict[str, tuple[int, int, float]] = {}

    async def run(self) -> None:
        await self._say_if_accounts_unchecked()
        watch = self.wake_file
        tasks = [asyncio.create_task(self._watch(watch))] if watch is not None else []
        read_at, woken = 0.0, False
        try:
            while True:
                self._wake.clear()  # a wake during the pass calls the next one at once
                try:
                    if woken or time.monotonic() >= read_at:
                        await self.step(woken)
                        read_at = time.monotonic() + self._next_read_s()
                    else:  # only the leases are due: no squeue
                        await self._heartbeats()
                except (SlurmError, AgentClientError, ApiFailure, OSError) as e:
                    log.warning("bridge pass failed, retrying: %s", e)
                    await asyncio.sleep(1.0)
                woken = await self._sleep_until(read_at)
        finally:
            tasks += [self._following] if self._following is not None else []
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _sleep_until(self, read_at: float) -> bool:
        """Wait for a wake (True), or until ``read_at`` or the next heartbeat, whichever
        comes first (False): the leases are renewed on time however long ``poll_s`` is."""
        renew_at = self.heartbeats.next_at if self.state.leases else read_at
        with suppress(TimeoutError):  # not wait_for: on 3.11 it can swallow a cancel
            async with asyncio.timeout(max(0.0, min(read_at, renew_at) - time.monotonic())):
                await self._wake.wait()
                return True
        return False

    def _next_read_s(self) -> float:
        """How long until the next pass when nothing wakes one: ``busy_poll_s`` while a gang
        the bridge started is not yet seen running, or one it stops has not ended, or a made
        job's ``sbatch`` is to be tried again; ``poll_s`` otherwise (each pass is one
        ``REQUEST_JOB_INFO`` to slurmctld)."""
        gangs = self.state.gangs.values()
        busy = any(not g.started or g.stop_by is not None for g in gangs) or self._make_failing
        return self.busy_poll_s if busy else self.poll_s

    async def _say_if_accounts_unchecked(self) -> None:
        """Warn, once at start, when Slurm lets any user name any account (an ``sbatch``
        job's team): the bridge cannot tell a job's real team then."""
        try:
            why = unchecked_accounts(parse_config(await self.slurm.config()))
        except (SlurmError, OSError) as e:
            log.warning("could not read Slurm's configuration: %s", e)
            return
        if why is not None:
            log.warning("%s", why)

    async def _watch(self, path: Path) -> None:
        """Wake a pass as soon as ``path`` changes (``job_submit.lua`` touches it for every
        job it holds), rather than at the next poll. A missing file wakes nothing."""
        seen = _changed_at(path)
        while True:
            await asyncio.sleep(WAKE_CHECK_S)
            now = _changed_at(path)
            if now != seen:
                seen = now
                self._file_woke = True
                self._wake.set()

    async def step(self, woken: bool = False) -> None:
        """One pass (see the module docstring). A ``woken`` pass (a new job, a decision of
        the server) defers the ``sinfo`` read and the comments, when due, by up to
        ``DEFER_S``, so what woke it is acted on first; a pass on the poll never does. A
        pass only the server's decision woke acts on the last ``squeue`` read when that is
        less than ``FRESH_S`` old and the wake file is watched (``_fresh``)."""
        now = time.monotonic()
        file_woke, self._file_woke = self._file_woke, False  # a touch during the read counts
        if not (woken and self._fresh(now, file_woke)):
            managed, self._other_jobs = await self.slurm.jobs_and_others(self.partitions)
            self.jobs = {j.id: j for j in managed}
            self._read_at = now
        self._adopt()
        read_nodes = self._due(self._next_nodes, now, woken and bool(self.nodes))
        if read_nodes:
            self.nodes = {n.name: n for n in await self.slurm.nodes(self.partitions)}
        self._count_others(read_nodes)
        if read_nodes:
            await self._sync_nodes()
            self._next_nodes = now + self.nodes_every_s
        await self._intake()
        await self._start_gangs()
        await self._stop_gangs()
        await self._observe()
        await self._heartbeats()
        await self._flush()
        if self._due(self._next_comments, now, woken):
            await self._comments()
            self._next_comments = now + self.comments_every_s

    def _fresh(self, now: float, file_woke: bool) -> bool:
        """Whether the last ``squeue`` read still says how the bridge's jobs stand: less
        than ``FRESH_S`` old, and the wake file did not change since it began
        (``file_woke``): only the server's decision woke this pass.
        Between reads, the bridge's jobs change only when a job is held (the submit plugin
        touches the wake file), ends (``wake.sh`` does), or starts (what the bridge released
        is read again every ``busy_poll_s``): so a decision, such as a preemption, is acted
        on at once, without another read."""
        watched = self.wake_file is not None
        return watched and not file_woke and now - self._read_at < FRESH_S

    @staticmethod
    def _due(at: float, now: float, defer: bool) -> bool:
        """Whether periodic work due ``at`` runs at ``now``: when due, unless ``defer`` and
        it is less than ``DEFER_S`` overdue."""
        return now >= at + (DEFER_S if defer else 0.0)

    # nodes

    def _adopt(self) -> None:
        """Learn Boltforge ids and started gangs from admin comments (after a restart)."""
        for sid, job in self.jobs.items():
            if sid in self.state.bf_of:
                continue
            bf, gang = parse_admin_comment(job.admin_comment)
            if bf is not None:
                self.state.bf_of[sid] = bf
            if gang is not None:
                self.state.last_epoch[sid] = gang.epoch
                if gang.made:
                    self.state.made[sid] = (gang.job, gang.epoch)
                if job.state in RUNNING:
                    self.state.gangs[sid] = gang

    def _count_others(self, read_nodes: bool) -> None:
        """What jobs Boltforge does not run hold on each node (those of other partitions, on
        nodes several share; a job of a managed partition its plugin did not hold): the
        larger of what this pass's ``squeue`` lists of them there and, from the last
        ``sinfo`` read (``read_nodes``: this pass's), Slurm's allocation there less that
        of the bridge's own running jobs (which also counts jobs ``squeue`` does not list).
        A change goes to the server with a heartbeat sent at once."""
        listed: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
        ours: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
        for job in [*self.jobs.values(), *self._other_jobs]:
            if job.state not in RUNNING:
                continue
            mine = job.id in self.state.bf_of or job.id in self.state.made
            for where in job.nodes:
                for i, amount in enumerate(job.per_node()):
                    (ours if mine else listed)[where][i] += amount
        if read_nodes:
            self._allocated_to_others = {
                name: (
                    max(node.alloc_gpus - round(ours[name][0]), 0),
                    max(node.alloc_cpus - round(ours[name][1]), 0),
                    max(node.alloc_memory_gb - ours[name][2], 0.0),
                )
                for name, node in self.nodes.items()
            }
        others: dict[str, str] = {}
        for name in self.nodes:
            seen = self._allocated_to_others.get(name, (0, 0, 0.0))
            gpus, cpus, memory = listed[name]
            held = (max(seen[0], round(gpus)), max(seen[1], round(cpus)), max(seen[2], memory))
            if any(held):
                others[name] = f"gpus={held[0]},cpus={held[1]},memory_gb={round(held[2], 3):g}"
        if others != self._others:
            for name in sorted(set(others) | set(self._others)):
                if others.get(name) != self._others.get(name):
                    said = others.get(name, "nothing")
                    log.info("jobs not Boltforge's hold %s on node %s", said, name)
            self._others = others
            self.heartbeats.next_at = 0.0  # the server learns it now, not at the next beat

    def _health(self, node: str) -> dict[str, str]:
        """The health facts each heartbeat of ``node`` carries: what others hold there."""
        held = self._others.get(node)
        return {OTHERS: held} if held else {}

    def _statuses(self, node: str) -> list[ReplicaStatus]:
        return [s for g in self.state.gangs.values() for s in g.statuses(node)]

    async def _sync_nodes(self) -> None:
        for name, node in self.nodes.items():
            if not node.responding:
                self._let_go(name, node.state)
                continue
            if name not in self.state.leases:
                await self._register(node)
            await self._cordon(node)

    def _let_go(self, name: str, why: str) -> None:
        """Node ``name`` is down in Slurm (``why``): each gang with a replica there is
        reported ended by its node (Slurm ends or requeues its job; its next placement gets
        it held again), and the node's lease is dropped once that report went out."""
        if name not in self.state.leases or name in self._letting_go:
            return
        for sid, gang in list(self.state.gangs.items()):
            if name not in gang.replicas.values() or gang.stop_by is not None:
                continue
            if not gang.started:
                self._queue(gang.events("started"))
            self._queue(gang.events("exited", by_node=True))
            del self.state.gangs[sid]
        self._letting_go.add(name)
        log.warning("node %s is %s in Slurm: letting it go", name, why)

    async def _register(self, node: SlurmNode) -> None:
        inv = inventory(node, self.partitions[0], self.topology.get(node.name))
        reg = Registration(inventory=inv, running=self._statuses(node.name), agent_version="slurm")
        lease = await self.agents.register(reg)
        self._leased(node.name, lease)
        if self._following is None:
            self._following = asyncio.create_task(self.desired.follow(self._desired_changed))
        log.info(
            "registered Slurm node %s (%d x %s, rack %s)", node.name, inv.gpus, inv.gpu, inv.rack
        )

    def _leased(self, node: str, lease: Lease) -> None:
        self.state.leases[node] = lease
        for replica in lease.stop:
            self._stop_replica(replica)

    async def _cordon(self, node: SlurmNode) -> None:
        if node.draining and node.name not in self.state.cordoned:
            await asyncio.to_thread(self.api.cordon, node.name)
            self.state.cordoned.add(node.name)
        elif not node.draining and node.name in self.state.cordoned:
            await asyncio.to_thread(self.api.uncordon, node.name)
            self.state.cordoned.discard(node.name)

    async def _heartbeats(self) -> None:
        """Every node's heartbeat in one call when the first is due, each listing what its
        node runs; a node whose session was lost registers again on the next pass."""
        leases = self.state.leases
        now = time.monotonic()
        if not self.heartbeats.due(leases, now):
            return
        reply = await self.heartbeats.renew(leases, self._statuses, (), now, self._health)
        for node in reply.lost:
            leases.pop(node, None)
            self._next_nodes = 0.0  # register again on the next pass
        for node, lease in reply.leases.items():
            self._leased(node, lease)

    def _desired_changed(self, changes: DesiredChanges) -> None:
        """Keep the desired states of the Slurm nodes (a full answer replaces them all)
        and wake a pass."""
        if changes.full:
            self.state.desired = {}
        for st in changes.nodes:
            if st.node in self.nodes or st.node in self.state.leases:
                self.state.desired[st.node] = st.replicas
        self._wake.set()

    # jobs in

    async def _intake(self) -> None:
        for sid, job in self.jobs.items():
            if not job.held or sid in self.state.bf_of or sid in self.state.refused:
                continue
            if not job.comment.startswith(TAG):
                continue  # held by its user or an admin, not by Boltforge's plugin
            await self._submit(job)

    async def _submit(self, job: SlurmJob) -> None:
        try:
            check_whole_nodes(job, max((n.gpus for n in self.nodes.values()), default=0))
            spec = job_spec(job, self.default_team, self.grace_s, self.qos_classes)
            req = SubmitRequest(spec=spec, source=f"slurm job {job.id}")
            key = f"slurm-{job.id}-{job.submit_time}"
            reply = await asyncio.to_thread(self.api.submit, req, key)
        except Untranslatable as e:
            await self._refuse(job, str(e))
            return
        except ApiFailure as e:
            if e.status >= 500:
                raise
            await self._refuse(job, _refusal(e, job.account or self.default_team))
            return
        bf = reply.job.id
        self.state.bf_of[job.id] = bf
        await self.slurm.admin_comment(job.id, job_comment(bf))
        log.info("Slurm job %s is Boltforge job %s", job.id, bf)

    async def _refuse(self, job: SlurmJob, why: str) -> None:
        self.state.refused.add(job.id)
        await self.slurm.comment(job.id, refusal_comment(why))
        log.warning("Slurm job %s refused: %s", job.id, why)

    # intent out

    def _wanted(self, action: str) -> dict[tuple[str, int], dict[str, str]]:
        """The replicas each node is to run (or stop), by (Boltforge job, epoch)."""
        out: dict[tuple[str, int], dict[str, str]] = defaultdict(dict)
        for node, specs in self.state.desired.items():
            for spec in specs:
                if spec.action == action:
                    out[(spec.job, spec.epoch)][spec.replica] = node
        return out

    async def _start_gangs(self) -> None:
        made = set(self.state.made.values())
        sid_of = {bf: sid for sid, bf in self.state.bf_of.items() if sid not in self.state.made}
        for (bf, epoch), placed in self._wanted("run").items():
            sid = sid_of.get(bf)
            if sid is None and (bf, epoch) not in made and self._not_from_slurm(bf, epoch):
                await self._make(bf, epoch, placed)
                continue
            job = self.jobs.get(sid) if sid else None
            if sid is None or job is None or len(placed) < job.node_count:
                continue
            if epoch <= self.state.last_epoch.get(sid, 0):
                continue  # started already: what is asked is what runs (or just ended)
            if sid in self.state.gangs or job.state in RUNNING:
                continue  # the previous epoch is still leaving
            ordered = dict(sorted(placed.items(), key=lambda kv: int(kv[0].rsplit(".", 1)[1])))
            gang = SlurmGang(bf, epoch, ordered)
            if job.finished:
                await self.slurm.requeue_held(sid)
            await self.slurm.admin_comment(sid, gang.admin_comment())
            await self.slurm.start_on(sid, list(ordered.values()))
            self.state.gangs[sid] = gang
            self.state.last_epoch[sid] = epoch
            log.info(
                "started Slurm job %s (%s epoch %d) on %s",
                sid,
                bf,
                epoch,
                ",".join(ordered.values()),
            )

    def _not_from_slurm(self, bf: str, epoch: int) -> bool:
        """A job bound to these nodes that no Slurm job stands for (``bolt submit`` to a
        Slurm-backed server), not refused already."""
        if (bf, epoch) in self.state.foreign:
            return False
        specs = [s for ss in self.state.desired.values() for s in ss if s.job == bf]
        return bool(specs) and all(s.command[:1] != [COMMAND] for s in specs)

    async def _make(self, bf: str, epoch: int, placed: dict[str, str]) -> None:
        """Start an epoch of a ``bolt submit`` job: a held Slurm job running its replicas
        (``launch.py``), pinned to the nodes they were bound to and released."""
        specs = {
            node: spec
            for node, desired in self.state.desired.items()
            for spec in desired
            if spec.action == "run" and spec.job == bf and spec.epoch == epoch
        }
        if len(specs) < len(placed):
            self._fail(bf, epoch, placed, SHARED_NODE)
            return
        failing = self._make_failing.get((bf, epoch))
        if failing is not None and time.monotonic() < failing[1]:
            return  # its last sbatch failed a moment ago
        try:
            script = batch_script(specs)
            who = self.team_users.run_as(await self._team(bf))
        except (Unlaunchable, NoIdentity) as e:
            self._fail(bf, epoch, placed, f"refused by the Slurm bridge: {e}")
            return
        sid = await self._sbatch(bf, epoch, placed, specs, script, who)
        if sid is None:
            return
        ordered = dict(sorted(placed.items(), key=lambda kv: int(kv[0].rsplit(".", 1)[1])))
        gang = SlurmGang(bf, epoch, ordered, made=True)
        self.state.bf_of[sid], self.state.made[sid] = bf, (bf, epoch)
        await self.slurm.admin_comment(sid, gang.admin_comment())
        await self.slurm.start_on(sid, list(ordered.values()))
        self.state.gangs[sid], self.state.last_epoch[sid] = gang, epoch
        log.info(
            "made Slurm job %s for %s epoch %d on %s as %s",
            sid,
            bf,
            epoch,
            ",".join(specs),
            who.user,
        )

    async def _sbatch(
        self,
        bf: str,
        epoch: int,
        placed: dict[str, str],
        specs: dict[str, ReplicaSpec],
        script: str,
        who: RunAs,
    ) -> str | None:
        """``sbatch`` the held Slurm job of a made epoch as ``who``; its id. None when Slurm
        refused it: tried again on later passes for ``MAKE_RETRY_S`` (the controller may be
        restarting), then the epoch fails with Slurm's words."""
        gpus = gpus_per_node(specs)
        cwd = next((s.cwd for s in specs.values() if s.cwd), None) or who.home  # slurm-ID.out
        try:
            sid = await self.slurm.submit_held(
                self.partitions[0], len(specs), gpus, f"bolt-{bf}", script, cwd,
                as_user=submit_prefix(who),
            )  # fmt: skip
        except (SlurmError, OSError) as e:
            now = time.monotonic()
            since = self._make_failing.get((bf, epoch), (now, now))[0]
            self._make_failing[(bf, epoch)] = (since, now + MAKE_AGAIN_S)
            log.warning("sbatch of %s epoch %d as %s failed: %s", bf, epoch, who.user, e)
            if now - since >= MAKE_RETRY_S:
                self._fail(bf, epoch, placed, f"Slurm refused its job (as {who.user}): {e}")
            return None
        self._make_failing.pop((bf, epoch), None)
        return sid

    async def _team(self, bf: str) -> str:
        """The team of Boltforge job ``bf``, as the server says (the desired state does not
        carry it)."""
        return (await asyncio.to_thread(self.api.job, bf)).team

    def _fail(self, bf: str, epoch: int, placed: dict[str, str], why: str) -> None:
        """Report an epoch the bridge will not run as failed, with ``why`` (the job's
        reason), and never try it again."""
        self._queue(SlurmGang(bf, epoch, placed).events("failed", detail=why))
        self.state.foreign.add((bf, epoch))
        self._make_failing.pop((bf, epoch), None)
        log.warning("%s epoch %d not run: %s", bf, epoch, why)

    def _stop_replica(self, replica: str) -> None:
        for gang in self.state.gangs.values():
            if replica in gang.replicas and gang.stop_by is None:
                gang.stop_by = time.monotonic()  # no grace: the server moved past it

    async def _stop_gangs(self) -> None:
        for (bf, epoch), placed in self._wanted("stop").items():
            gangs = [g for g in self.state.gangs.values() if (g.job, g.epoch) == (bf, epoch)]
            for gang in gangs:
                if gang.stop_by is None:
                    gang.stop_by = time.monotonic() + self._grace(placed)
            if not gangs and (bf, epoch) not in self.state.unstarted:
                # Bound but never started in Slurm (cancelled or bumped before its start):
                # nothing runs, so it has stopped already.
                self.state.unstarted.add((bf, epoch))
                for replica, node in placed.items():
                    self.state.outbox.add(node, never_started(replica, bf, epoch))
        for sid, gang in list(self.state.gangs.items()):
            if gang.stop_by is None:
                continue
            job = self.jobs.get(sid)
            if gang.signalled_at is None and job is not None and job.state in RUNNING:
                await self.slurm.signal(sid, full=not gang.made)  # made: its step runs it
                gang.signalled_at = time.monotonic()
                log.info("sent SIGTERM to Slurm job %s (%s epoch %d)", sid, gang.job, gang.epoch)
            ended = job is None or job.finished or job.state == "PENDING"
            if ended or time.monotonic() >= gang.stop_by:
                await self._stopped(sid, gang, job)

    def _grace(self, placed: dict[str, str]) -> float:
        specs = [s for n in set(placed.values()) for s in self.state.desired.get(n, [])]
        return max((s.grace_s for s in specs if s.replica in placed), default=self.grace_s)

    async def _stopped(self, sid: str, gang: SlurmGang, job: SlurmJob | None) -> None:
        """A stopped gang's job ended, or its grace ran out: requeue it held for its next
        placement (or cancel it when its Boltforge job was cancelled), and report the exit."""
        detail = await asyncio.to_thread(self.api.job, gang.job)
        if job is None or job.state == "CANCELLED":
            pass  # gone, or its user cancelled it in Slurm meanwhile: it stays so
        elif gang.made:  # its next epoch gets a Slurm job of its own, on its own nodes
            if not job.finished:
                self.state.cancelled.add(sid)
                await self.slurm.cancel(sid)
        elif detail.state in TERMINAL:
            if not job.finished:
                await self.slurm.cancel(sid)
        elif job.state == "PENDING":  # released, but Slurm had not started it yet
            if not job.held:
                await self.slurm.hold(sid)
        else:
            await self.slurm.requeue_held(sid)
        took = time.monotonic() - gang.signalled_at if gang.signalled_at else None
        code = job.exit_code if job is not None and job.finished else None
        sig = job.signal if job is not None and job.finished else (None if code is not None else 15)
        self._queue(gang.events("exited", exit_code=code, signal=sig, checkpoint_s=took))
        del self.state.gangs[sid]

    # state back

    async def _observe(self) -> None:
        for sid, gang in list(self.state.gangs.items()):
            job = self.jobs.get(sid)
            if gang.stop_by is not None:
                continue
            if job is None:
                continue  # not listed in this read; Slurm keeps finished jobs a while
            if job.state in RUNNING and not gang.started:
                gang.started = True
                self._queue(gang.events("started"))
            elif job.finished:
                by_node = job.state in ("NODE_FAIL", "BOOT_FAIL")
                if not gang.started:
                    self._queue(gang.events("started"))
                self._queue(
                    gang.events(
                        "exited", exit_code=job.exit_code, signal=job.signal, by_node=by_node
                    )
                )
                del self.state.gangs[sid]
                log.info("Slurm job %s ended: %s (exit %s)", sid, job.state, job.exit_status)
        await self._slurm_side_changes()

    async def _slurm_side_changes(self) -> None:
        """A job its user cancelled in Slurm is cancelled in Boltforge; a job Slurm requeued
        on its own (a node failure) is held again, to be placed by Boltforge."""
        for sid, bf in self.state.bf_of.items():
            job = self.jobs.get(sid)
            if job is None:
                continue
            if job.state == "CANCELLED" and sid not in self.state.cancelled:
                self.state.cancelled.add(sid)
                try:
                    await asyncio.to_thread(self.api.cancel, bf)
                except ApiFailure as e:
                    log.info("cancel of %s: %s", bf, e)
            elif job.state == "PENDING" and not job.held and sid not in self.state.gangs:
                await self.slurm.hold(sid)

    def _queue(self, events: dict[str, list[ReplicaEvent]]) -> None:
        self.state.outbox.add_all(events)

    async def _flush(self) -> None:
        """Every node's waiting events in one call; a node whose session was lost keeps its
        events for after it registers again."""
        for node in await self.state.outbox.send(self.agents, self.state.leases):
            self.state.leases.pop(node, None)
        for node in self._letting_go:
            self.state.leases.pop(node, None)  # its last events went out: the lease runs out
        self._letting_go.clear()

    # words back

    async def _comments(self) -> None:
        mapped = {bf: sid for sid, bf in self.state.bf_of.items() if sid in self.jobs}
        if not mapped:
            return
        listed = await asyncio.to_thread(self.api.jobs, ids=sorted(mapped))
        self._detail = {bf: d for bf, d in self._detail.items() if bf in mapped}
        await self._cancel_ended({s.id for s in listed.jobs})
        for summary in listed.jobs:
            sid = mapped.get(summary.id)
            if sid is None:
                continue
            text = words.job_comment(await self._view(summary, self.jobs[sid]))
            if text and self.state.comments.get(sid) != text:
                await self.slurm.comment(sid, text)
                self.state.comments[sid] = text

    async def _cancel_ended(self, live: set[str]) -> None:
        """A held job whose Boltforge job ended without running (``bolt cancel``) is
        cancelled in Slurm too, so nothing is left held for ever."""
        for sid, bf in self.state.bf_of.items():
            job = self.jobs.get(sid)
            if job is None or not job.held or bf in live or sid in self.state.cancelled:
                continue
            detail = await asyncio.to_thread(self.api.job, bf)
            if detail.state in TERMINAL:
                self.state.cancelled.add(sid)
                await self.slurm.cancel(sid)
                log.info("Slurm job %s cancelled: Boltforge job %s is %s", sid, bf, detail.state)

    async def _view(self, summary: JobSummary, job: SlurmJob) -> JobView:
        """What the comment of ``job`` says, from the server's ``summary`` of it, the
        server's waiting detail when preemption may be what keeps it waiting
        (``_waiting_detail``), and the bridge's own note on its QOS."""
        detail = await self._waiting_detail(summary)
        note = self._qos_note(job)
        return JobView(
            state=summary.state,
            reason=summary.reason,
            nodes=summary.nodes,
            position=summary.position,
            detail=detail,
            slurm_running=job.state == "RUNNING",
            notes=(note,) if note else (),
        )

    async def _waiting_detail(self, summary: JobSummary) -> tuple[str, ...]:
        """The server's waiting detail (``bolt explain``'s lines) of a job that waits for
        room, which names what ruled preemption out; read again when its reason changes or
        ``DETAIL_EVERY_S`` passed, none for a job that does not wait for room."""
        if summary.state not in words.WAITING or summary.reason not in ROOM_REASONS:
            self._detail.pop(summary.id, None)
            return ()
        now = time.monotonic()
        known = self._detail.get(summary.id)
        if known is not None and known[0] == summary.reason and now - known[2] < DETAIL_EVERY_S:
            return known[1]
        detail = tuple((await asyncio.to_thread(self.api.job, summary.id)).waiting)
        self._detail[summary.id] = (summary.reason, detail, now)
        return detail

    def _qos_note(self, job: SlurmJob) -> str:
        """The note of a job whose QOS names no priority class; logged once per QOS."""
        qos = job.requested_qos
        if not qos or priority_class(qos, self.qos_classes) is not None:
            return ""
        if qos not in self._unmapped_qos:
            self._unmapped_qos.add(qos)
            log.warning("QOS %s names no priority class: its jobs run as normal (--qos-class)", qos)
        return qos_note(qos, None)


def _refusal(e: ApiFailure, team: str) -> str:
    """The comment of a Slurm job the server refused: its words and each problem's; a job
    refused by the image policy is told what a Slurm user can do about it."""
    fixes = "; ".join(f"{p.field}: {p.message}" for p in e.problems)
    if any(p.field.endswith("image") for p in e.problems):
        return IMAGE_HINT.format(team=team)
    return sbatch_words(f"{e.message}{' (' + fixes + ')' if fixes else ''}")

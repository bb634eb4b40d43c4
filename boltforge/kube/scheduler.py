"""The Kubernetes scheduler: pods that name ``schedulerName: boltforge`` placed as gangs.

Informers (``informer.py``) keep Nodes, the scheduler's Pods, PodGroups, Jobs (``owners.py``),
PriorityClasses and PodDisruptionBudgets in memory. While this replica holds the Lease
(``leader.py``), each pass:

1. registers every Ready node with its inventory (``translate.inventory``) over the agent
   protocol, and again whenever that inventory changes (GPUs, GPU feature discovery's and
   topology labels that arrive after the node is Ready), and renews their leases in one
   batched heartbeat (``node.follower.Heartbeats``), sent beside the pass so that binding
   never waits for it; a node that is not Ready is let go (its lease runs out and the
   server writes its replicas off); an unschedulable node, or one with a taint none of the
   scheduler's pods tolerates, is cordoned;
2. submits each gang whose pods are all there (``gangs.py``; gated pods do not count) as a
   Boltforge job limited to the pools whose nodes its pods may run on (``fit.py``), keyed so
   a gang is never submitted twice, whichever replica submits it, and submitted again as its
   next attempt when its job ended and its controller made new pods;
3. carries out the server's intent, which it follows with one long-poll for all nodes
   (``node.follower.DesiredFollower``, as the Slurm bridge does): a gang bound to nodes has
   its pods bound there through ``pods/binding`` (all of them, or none until every pod
   exists); the pods of the replicas to stop are evicted together through the Eviction
   API, unless their PodDisruptionBudgets refuse it now (``budgets.py``: then they wait for
   the budgets to change);
4. reports what the kubelet did (beside the pass, one sending at a time, through the shared
   ``node.follower.ReportOutbox``): Running is ``started``, Succeeded or Failed is
   ``exited`` with the exit code, a pod its kubelet refused is ``exited`` by its node
   (requeued), a pod gone after its eviction is ``exited`` by the checkpoint signal;
5. writes why each waiting pod waits (``words.py``: ``PodScheduled=False`` and a
   ``FailedScheduling`` event) and, for every pod it binds, a ``Scheduled`` event naming the
   placement.

``stop`` (SIGTERM, ``shutdown.py``) ends the loop and releases the Lease. The scheduler never
decides where anything runs: the server's core does, as for every other backend
(``control/nodes/backend.py``)."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any

from kubernetes.client import (
    ApiClient,
    BatchV1Api,
    CoreV1Api,
    CustomObjectsApi,
    PolicyV1Api,
    SchedulingV1Api,
)
from kubernetes.client.exceptions import ApiException

from boltforge.agent.client import AgentClientError, ServerClient
from boltforge.client import ApiFailure, Client
from boltforge.kube import model, words
from boltforge.kube.actions import KubeWrites
from boltforge.kube.budgets import blocked, protection
from boltforge.kube.desired import Wanted
from boltforge.kube.fit import Fitter
from boltforge.kube.gangs import GangIndex, GangKey, PodGang, key_of
from boltforge.kube.informer import Informer
from boltforge.kube.leader import LeaderElector
from boltforge.kube.model import JOB, REPLICA, KubePod
from boltforge.kube.nodes import NodeSync
from boltforge.kube.owners import job as indexed_job
from boltforge.kube.state import Placed, SchedulerState, adopted, replica_event
from boltforge.kube.translate import (
    COMMAND,
    FitsNowhere,
    Labels,
    Unplaceable,
    job_spec,
    priority,
    shape,
)
from boltforge.node.converge import never_started
from boltforge.node.follower import DesiredFollower, Heartbeats
from boltforge.wire.agent import DesiredChanges, ReplicaSpec
from boltforge.wire.jobs import TERMINAL, SubmitRequest

log = logging.getLogger("boltforge.kube")
CRD_MISSING = (
    "the PodGroup CRD (podgroups.scheduling.x-k8s.io, v1alpha1) is not installed: gangs of "
    "boltforge.io/gang annotations are placed, pods that name a PodGroup wait. To fix: "
    "kubectl apply -f deploy/kubernetes/podgroup-crd.yaml"
)
JOBS_MISSING = "the batch/v1 Jobs API is not served: an indexed Job's pods wait as one gang"
LISTED = ",".join(["pending", "scheduled", *sorted(TERMINAL)])  # the states ``_words`` asks about
MAX_ATTEMPTS = 1000  # of one gang (``_submit``)
BLOCKED_RETRY_S = 60.0  # a blocked eviction is asked again after this, or a budget's change
NOT_FROM_KUBE = (
    "these nodes are scheduled through Kubernetes, which runs only pods; create the job's "
    "pods with schedulerName: boltforge"
)


@dataclass(frozen=True)
class Options:
    """How the scheduler runs (``bolt kube scheduler`` flags)."""

    scheduler_name: str = "boltforge"
    labels: Labels = field(default_factory=Labels)
    node_selector: str = ""
    grace_s: float = 30.0
    poll_s: float = 0.5
    words_every_s: float = 2.0
    wait_s: float = 20.0
    workers: int = 32


class KubeScheduler:
    """Runs until cancelled (see the module docstring). ``agents`` speaks the agent protocol
    for every node and ``api`` is the job API, both with an admin token; ``elector`` decides
    who acts (None: this replica always does)."""

    def __init__(
        self,
        client: ApiClient,
        agents: ServerClient,
        api: Client,
        identity: str,
        options: Options | None = None,
        elector: LeaderElector | None = None,
    ) -> None:
        options = options or Options()
        self.agents, self.api, self.options, self.elector = agents, api, options, elector
        self.identity = identity
        self.writes = KubeWrites(client, identity)
        self.state = SchedulerState()
        self.leading = elector is None
        self._wake = asyncio.Event()
        self._stopping = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pool = ThreadPoolExecutor(options.workers, thread_name_prefix="kube-write")
        self._words_pool = ThreadPoolExecutor(4, thread_name_prefix="kube-words")
        self._beside: dict[str, asyncio.Future[None]] = {}  # "beat", "report", "words"
        self._unplaced_at = -1  # ``state.unplaced`` when ``_unstarted`` was last rebuilt
        self.desired = DesiredFollower(agents, options.wait_s)
        self.heartbeats = Heartbeats(agents)
        self._unstarted: Wanted = {}
        self._pruned_at = -1
        self._next_words = 0.0
        self._index = GangIndex()
        self._full = True  # the next pass looks at everything, not only what changed
        self._largest = 0  # GPUs of the largest node
        self.node_sync = NodeSync(agents, api, options.labels)
        self._fitter: Fitter | None = None  # for this pass (``_fit``)
        core = CoreV1Api(client)
        custom = CustomObjectsApi(client)
        pods_of = {"field_selector": f"spec.schedulerName={options.scheduler_name}"}
        nodes_of = {"label_selector": options.node_selector} if options.node_selector else {}
        self.nodes = Informer("nodes", core.list_node, model.node, self.poke, selectors=nodes_of)
        self.pods = Informer(
            "pods", core.list_pod_for_all_namespaces, model.pod, self.poke, selectors=pods_of
        )
        self.groups = Informer(
            "podgroups",
            _custom_lister(custom, "scheduling.x-k8s.io", "v1alpha1", "podgroups"),
            model.pod_group,
            self.poke,
            absent=CRD_MISSING,
        )
        self.classes = Informer(
            "priorityclasses",
            SchedulingV1Api(client).list_priority_class,
            model.priority_class,
            self.poke,
        )
        self.budgets = Informer(
            "poddisruptionbudgets",
            PolicyV1Api(client).list_pod_disruption_budget_for_all_namespaces,
            model.budget,
            self.poke,
        )
        self.jobs = Informer(
            "jobs",
            BatchV1Api(client).list_job_for_all_namespaces,
            indexed_job,
            self.poke,
            absent=JOBS_MISSING,
        )
        self.informers: list[Informer[Any]] = [
            self.nodes,
            self.pods,
            self.groups,
            self.jobs,
            self.classes,
            self.budgets,
        ]

    def stop(self) -> None:
        """Ask ``run`` to return (from any thread or a signal handler): it finishes the pass
        under way, then cleans up as on a cancel, releasing the Lease."""
        self._stopping.set()
        self.poke()

    def poke(self) -> None:
        """Wake the loop (from any thread)."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._wake.set)

    async def run(self) -> None:
        self._loop = asyncio.get_running_loop()
        for informer in self.informers:
            informer.start()
        tasks: list[asyncio.Future[None]] = [asyncio.create_task(self._follow_desired())]
        if self.elector is not None:
            tasks.append(asyncio.create_task(self._elect(self.elector)))
        try:
            await asyncio.to_thread(_wait_synced, self.informers, self._stopping)
            if self.leading and not self._stopping.is_set():
                self._take_over()
            while not self._stopping.is_set():
                if self.leading:
                    try:
                        await self.step()
                    except (AgentClientError, ApiFailure, ApiException, OSError) as e:
                        log.warning("scheduler pass failed, retrying: %s", e)
                        await asyncio.sleep(1.0)
                with suppress(TimeoutError):  # not wait_for: on 3.11 it can swallow a cancel
                    async with asyncio.timeout(self.options.poll_s):
                        await self._wake.wait()
                self._wake.clear()
        finally:
            tasks += self._beside.values()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for informer in self.informers:
                informer.stop()
            if self.elector is not None:
                await asyncio.to_thread(self.elector.release)
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._words_pool.shutdown(wait=False, cancel_futures=True)

    async def _elect(self, elector: LeaderElector) -> None:
        while True:
            leading = await asyncio.to_thread(elector.try_once)
            if leading and not self.leading:
                self._take_over()
            elif not leading and self.leading:
                log.warning("%s stopped acting: it does not hold the lease", self.identity)
                self._forget_all()
            self.leading = leading
            self._wake.set()
            await asyncio.sleep(elector.retry_s)

    def _forget_all(self) -> None:
        self.state = SchedulerState()
        self._unplaced_at = -1
        self._pruned_at = -1
        self._full = True
        self.heartbeats.reset()

    def _take_over(self) -> None:
        """Start leading: forget the last leader's sessions, adopt the bound pods."""
        self._forget_all()
        for pod in self.pods.snapshot().values():
            placed = adopted(pod)
            if placed is not None:
                self.state.place(placed)
                self.state.link(key_of(pod), placed.job)
        log.info("%s leads: adopted %d bound pods", self.identity, len(self.state.placed))

    async def step(self) -> None:
        """One pass (see the module docstring). It looks only at the nodes, pods and
        PodGroups that changed since the last pass, unless that pass failed."""
        nodes, nodes_changed = self.nodes.changes()
        pods, pods_changed = self.pods.changes()
        groups, groups_changed = self.groups.changes()
        jobs, jobs_changed = self.jobs.changes()
        if self._full:
            nodes_changed = pods_changed = groups_changed = jobs_changed = None
        self._full = True  # until this pass has got through
        all_gangs = self._index.update(
            pods, pods_changed, groups, groups_changed, jobs, jobs_changed
        )
        full = pods_changed is None or groups_changed is None or jobs_changed is None
        keys = None if full else self._index.touched
        if nodes_changed is None or nodes_changed:
            self._largest = max((n.gpus for n in nodes.values()), default=0)
            self.node_sync.taints_of(nodes)
        if pods_changed is None or pods_changed:
            nodes_changed = self.node_sync.tolerations_of(all_gangs, nodes_changed)
        await self.node_sync.sync(self.state, nodes, nodes_changed)
        self._fitter = None
        await self._intake(all_gangs, keys, pods)
        await self._start(all_gangs)
        self._budgets_moved()
        await self._stop()
        self._observe(pods, pods_changed)
        self._beat()
        self._report()
        await self._forget(all_gangs, keys, groups)
        self._full = False
        now = time.monotonic()
        if now >= self._next_words and not self._busy("words"):
            self._next_words = now + self.options.words_every_s
            self._beside["words"] = asyncio.ensure_future(self._words(all_gangs))

    def _busy(self, slot: str) -> bool:
        """Whether the work beside the pass in ``slot`` is still under way (one at a time)."""
        task = self._beside.get(slot)
        return task is not None and not task.done()

    # nodes

    def _fit(self) -> Fitter:
        """Which nodes gangs may use, this pass (``NodeSync.fitter``)."""
        if self._fitter is None:
            self._fitter = self.node_sync.fitter(self.state, self.nodes.snapshot())
        return self._fitter

    def _beat(self) -> None:
        """Renew every node's lease when due, beside the pass rather than in it (a fleet's
        heartbeats take the server a while, and binding must not wait for them)."""
        if self._busy("beat") or not self.heartbeats.due(self.state.leases, time.monotonic()):
            return
        self._beside["beat"] = asyncio.ensure_future(self._heartbeats())

    async def _heartbeats(self) -> None:
        try:
            await self._renew()
        except (AgentClientError, ApiException, OSError) as e:
            log.warning("heartbeats failed, retrying when next due: %s", e)

    async def _renew(self) -> None:
        """Every node's heartbeat in one call (``node.follower.Heartbeats``), each listing
        what its node runs when that changed since the last one was sent; a lost node
        registers again on the next pass, and a replica a lease says to stop is evicted."""
        state = self.state
        sent, state.moved = state.moved, set()
        try:
            reply = await self.heartbeats.renew(
                state.leases, state.statuses, sent, time.monotonic()
            )
        except BaseException:
            state.moved |= sent
            raise
        for name in reply.lost:
            state.drop_lease(name)  # registered again on the next pass
        for lease in reply.leases.values():
            for replica in lease.stop:
                placed = state.placed.get(replica)
                if placed is not None and placed.evicted_at is None:
                    await self._evict(placed, None)

    # gangs in

    async def _intake(
        self,
        all_gangs: Mapping[GangKey, PodGang],
        keys: set[GangKey] | None,
        pods: Mapping[str, KubePod],
    ) -> None:
        """Submit the gangs that are ready and not yet submitted: of the gangs ``keys``
        (None: every one) and those refused before, which are tried again every pass (a
        node large enough may have joined, or the server's reason gone)."""
        state = self.state
        todo = all_gangs if keys is None else keys | set(state.refused) | state.ended_gangs
        for key in todo:
            gang = all_gangs.get(key)
            if key in state.ended_gangs and gang is not None and gang.waiting:
                self._next_attempt(key)
            if gang is None or key in self.state.job_of or not gang.waiting or gang.not_ready():
                continue
            try:
                spec = self._spec(gang, pods, self._largest)
            except Unplaceable as e:
                self.state.refused[key] = str(e)
                if isinstance(e, FitsNowhere):
                    self.state.fits_nowhere.add(key)
                continue
            self.state.refused.pop(key, None)
            self.state.fits_nowhere.discard(key)
            req = SubmitRequest(spec=spec, source=f"kubernetes gang {key}")
            try:
                job = await self._submit(key, gang, req)
            except ApiFailure as e:
                if e.status >= 500:
                    raise
                fixes = "; ".join(f"{p.field}: {p.message}" for p in e.problems)
                self.state.refused[key] = f"{e.message}{' (' + fixes + ')' if fixes else ''}"
                continue
            self.state.link(key, job)
            self.state.submitted_pods[key] = {p.uid for p in gang.waiting}
            log.info("gang %s is Boltforge job %s", key, job)

    async def _submit(self, key: GangKey, gang: PodGang, req: SubmitRequest) -> str:
        """Submit ``gang`` as attempt ``state.attempts[key]``; an attempt whose job has
        already ended (one made before this replica led: the key finds it) moves on to the
        next attempt."""
        state = self.state
        while True:
            attempt = state.attempts.get(key, 0)
            reply = await asyncio.to_thread(self.api.submit, req, gang.idempotency_key(attempt))
            if reply.created or reply.job.state not in TERMINAL or attempt >= MAX_ATTEMPTS:
                return reply.job.id
            state.attempts[key] = attempt + 1

    def _next_attempt(self, key: GangKey) -> None:
        """``key``'s job ended and its gang has pods waiting again (a Job controller made
        new ones): forget that job, so the gang is submitted as its next attempt."""
        state = self.state
        state.ended_gangs.discard(key)
        job = state.job_of.pop(key, None)
        if job is None:
            return
        state.gang_of.pop(job, None)
        state.attempts[key] = state.attempts.get(key, 0) + 1
        log.info("gang %s: job %s ended and new pods wait: a new attempt", key, job)

    def _spec(self, gang: PodGang, pods: Mapping[str, KubePod], largest: int) -> dict[str, Any]:
        waiting = gang.waiting
        grace = max((p.grace_s for p in waiting if p.grace_s is not None), default=None)
        return job_spec(
            gang.job_name(),
            shape(waiting),
            priority_class=priority(waiting[0], self.classes.snapshot()),
            grace_s=grace if grace is not None else self.options.grace_s,
            preemptible=self._preemptible(gang, pods),
            largest_node=largest,
            pools=self._fit().pools(waiting),
        )

    def _preemptible(self, gang: PodGang, pods: Mapping[str, KubePod]) -> bool:
        why = protection(gang.waiting, self.budgets.snapshot().values(), pods.values())
        if why:
            log.info("gang %s is not preemptible: %s", gang.key, why)
        return not why

    # intent out

    def _to_start(self) -> Wanted:
        """The desired replicas to run of the (job, epoch)s that have one not yet bound;
        kept current from the runs whose desired replicas changed, and worked out again
        from every run when a bound pod went."""
        state = self.state
        touched = state.desired.take_touched()
        if self._unplaced_at != state.unplaced:
            self._unplaced_at, touched = state.unplaced, None
        runs, unbound = state.desired.wanted("run"), self._unbound
        if touched is None:
            self._unstarted = {run: wanted for run, wanted in runs.items() if unbound(wanted)}
            return self._unstarted
        for run in touched:
            wanted = runs.get(run)
            if wanted is not None and unbound(wanted):
                self._unstarted[run] = wanted
            else:
                self._unstarted.pop(run, None)
        return self._unstarted

    def _unbound(self, wanted: Mapping[str, Any]) -> list[str]:
        """The replicas of ``wanted`` to bind a pod to: neither bound nor ended. A replica
        whose pod ended stays ended even while the server's desired state still lists it
        (an exit changes no desired state): binding a new pod to it, such as one of the
        gang's next attempt, would run work the server has written off."""
        placed, ended = self.state.placed, self.state.ended
        return [r for r in wanted if r not in placed and r not in ended]

    async def _start(self, all_gangs: Mapping[GangKey, PodGang]) -> None:
        taken: set[str] | None = None
        binds = []
        unstarted = self._to_start()
        for (job, epoch), wanted in list(unstarted.items()):
            todo = {r: wanted[r] for r in self._unbound(wanted)}
            if not todo:
                del unstarted[(job, epoch)]
                continue
            key = self.state.gang_of.get(job)
            if key is None:
                self._foreign(job, todo)
                continue
            gang = all_gangs.get(key)
            taken = self.state.taken() if taken is None else taken
            pods = _assign(todo, gang, taken) if gang is not None else None
            if pods is None:
                continue  # not every pod exists yet: bind none
            for replica, (node, _) in todo.items():
                placed = Placed(replica, job, epoch, pods[replica], node)
                binds.append(placed)
                taken.add(placed.pod.uid)
        results = await asyncio.gather(*(self._bind(p) for p in binds))
        scheduled = [p for p, ok in zip(binds, results, strict=True) if ok]
        if scheduled:
            self._say_scheduled(scheduled)

    async def _bind(self, placed: Placed) -> bool:
        notes = {REPLICA: placed.replica, JOB: placed.job}
        loop = asyncio.get_running_loop()
        why = await loop.run_in_executor(
            self._pool, self.writes.bind, placed.pod, placed.node, notes
        )
        if why is not None:
            log.warning("binding %s to %s failed: %s", placed.pod.name, placed.node, why)
            return False
        self.state.place(placed)
        return True

    def _foreign(self, job: str, todo: Mapping[str, tuple[str, ReplicaSpec]]) -> None:
        if job in self.state.foreign or any(s.command[:1] == [COMMAND] for _, s in todo.values()):
            return
        self.state.foreign.add(job)
        for replica, (node, spec) in todo.items():
            event = replica_event(replica, job, spec.epoch, "failed", detail=NOT_FROM_KUBE)
            self.state.outbox.add(node, event)

    async def _stop(self) -> None:
        """Evict the pods of the replicas to stop; one never bound is reported stopped at
        once, and one whose exit was reported is left alone. A gang whose eviction its
        budgets would refuse now (``budgets.blocked``) is not asked: it waits for the
        budgets to change (``_budgets_moved``), or ``BLOCKED_RETRY_S``."""
        state = self.state
        budgets = None
        evictions = []
        for (job, _epoch), wanted in state.desired.wanted("stop").items():
            due: list[tuple[Placed, ReplicaSpec]] = []
            for replica, (node, spec) in wanted.items():
                placed = state.placed.get(replica)
                if placed is None:
                    if replica not in state.ended:  # never bound: stopped as it is
                        state.ended.add(replica)
                        state.outbox.add(node, never_started(replica, spec.job, spec.epoch))
                elif placed.evicted_at is None and time.monotonic() >= placed.retry_at:
                    due.append((placed, spec))
            if not due:
                continue
            budgets = self.budgets.snapshot().values() if budgets is None else budgets
            why = blocked([p.pod for p, _ in due], budgets)
            if why:
                self._blocked(job, [p for p, _ in due], why)
                continue
            evictions += [self._evict(placed, spec.grace_s) for placed, spec in due]
        await asyncio.gather(*evictions)  # all at once: a victim gang leaves together
        if state.ended and self._pruned_at != state.desired.seq:
            self._pruned_at = state.desired.seq  # forget what the server no longer mentions
            state.ended = {r for r in state.ended if state.desired.lists(r)}

    def _blocked(self, job: str, placed: list[Placed], why: str) -> None:
        """Evicting ``job``'s pods would be refused (``why``): wait, and say so once."""
        again = time.monotonic() + BLOCKED_RETRY_S
        for p in placed:
            p.retry_at = again
        if self.state.blocked.get(job) != why:
            self.state.blocked[job] = why
            log.warning("evicting job %s's pods is blocked: %s", job, why)
            text = (
                f"Boltforge does not evict it for a more important gang: {why}; it asks "
                "again when the budget changes"
            )
            self._say([p.pod for p in placed], "EvictionBlocked", text, "Warning")

    def _budgets_moved(self) -> None:
        """The budgets changed: the blocked evictions are tried again on this pass."""
        _, changed = self.budgets.changes()
        if changed is None or changed:
            for p in self.state.placed.values():
                if p.evicted_at is None and p.job in self.state.blocked:
                    p.retry_at = 0.0
            self.state.blocked.clear()

    async def _evict(self, placed: Placed, grace_s: float | None) -> None:
        loop = asyncio.get_running_loop()
        why = await loop.run_in_executor(self._pool, self.writes.evict, placed.pod, grace_s)
        if why is None:
            placed.evicted_at = time.monotonic()
            self.state.moves(placed)
            log.info("evicted %s (%s)", placed.pod.name, placed.replica)
            return
        if why.split(":", 1)[0] in ("429", "500"):  # a budget refused it (500: two budgets)
            self._blocked(placed.job, [placed], f"the Eviction API refused it: {why}")
            return
        placed.retry_at = time.monotonic() + 5.0
        text = f"Boltforge could not evict it for a more important gang: {why}"
        self._say([placed.pod], "EvictionBlocked", text, "Warning")

    # state back

    def _observe(self, pods: Mapping[str, KubePod], changed: set[str] | None) -> None:
        """What the kubelets did to the placed pods that ``changed`` (None: to every one)."""
        state = self.state
        if changed is None:
            replicas = list(state.placed)
        else:
            replicas = [r for path in changed for r in state.on_pod.get(path, ())]
        for replica in replicas:
            placed = state.placed[replica]
            pod = pods.get(placed.pod.path)
            if pod is placed.pod:
                continue  # the informer replaces a pod that changes: this one did not
            if pod is None or pod.uid != placed.pod.uid:
                self._gone(placed)
                state.unplace(replica)
                state.ended.add(replica)
                continue
            placed.pod = pod
            if pod.phase == "Running" and not placed.started:
                placed.started = True
                self._queue(placed, "started")
            elif pod.refused_by_kubelet and not placed.exited:
                self._refused_by_kubelet(placed, pod)
            elif pod.finished and not placed.exited:
                if not placed.started:
                    placed.started = True
                    self._queue(placed, "started")
                placed.exited = True
                self.state.moves(placed)
                code = pod.exit_code if pod.exit_code is not None else int(pod.phase == "Failed")
                self._queue(placed, "exited", exit_code=code)

    def _refused_by_kubelet(self, placed: Placed, pod: KubePod) -> None:
        """The kubelet refused the pod (``OutOfnvidia.com/gpu``, ``NodeAffinity``...) or
        evicted it: not the job's failure. Reported as stopped by its node, so the job is
        placed again (its node gets no new work until its next heartbeat)."""
        placed.exited = True
        self.state.moves(placed)
        words = f"the kubelet of {placed.node} refused it: {pod.reason}: {pod.message}"
        self._queue(placed, "exited", by_node=True, detail=words[:1000])
        log.warning("pod %s: %s; its gang is placed again", pod.path, words)
        self._say(
            [pod], "KubeletRefused", f"Boltforge: {words}; its gang is placed again", "Warning"
        )

    def _gone(self, placed: Placed) -> None:
        if placed.exited:
            return
        if not placed.started:
            self._queue(placed, "started")
        if placed.evicted_at is not None:
            took = time.monotonic() - placed.evicted_at
            self._queue(placed, "exited", signal=15, checkpoint_s=took)
        else:  # deleted by someone else, or its node went away: to run again
            self._queue(placed, "exited", signal=9, by_node=True)

    def _queue(self, placed: Placed, kind: str, **extra: object) -> None:
        self.state.outbox.add(placed.node, placed.event(kind, **extra))

    def _report(self) -> None:
        """Send the server what the kubelets did, beside the pass (binding must not wait for
        it); events queued meanwhile go with the next sending."""
        if not self._busy("report") and self.state.outbox:
            self._beside["report"] = asyncio.ensure_future(self._reports(self.state))

    async def _reports(self, state: SchedulerState) -> None:
        try:
            await self._flush(state)
        except (AgentClientError, OSError) as e:
            log.warning("reports failed, retrying: %s", e)
            await asyncio.sleep(1.0)
        if state.outbox:
            self._wake.set()

    async def _flush(self, state: SchedulerState) -> None:
        """Every node's waiting events in one call (``node.follower.ReportOutbox``); a node
        whose session was lost keeps its events for after it registers again (on the next
        pass)."""
        for node in await state.outbox.send(self.agents, state.leases):
            state.drop_lease(node)

    async def _forget(
        self,
        all_gangs: Mapping[GangKey, PodGang],
        keys: set[GangKey] | None,
        groups: Mapping[str, model.PodGroup],
    ) -> None:
        """A gang with no pods left and no PodGroup is gone: cancel its job. Looks at the
        gangs ``keys`` (None: every one)."""
        job_of = self.state.job_of
        for key in list(job_of) if keys is None else [k for k in keys if k in job_of]:
            job = job_of[key]
            if key in all_gangs or f"{key.namespace}/{key.name}" in groups:
                continue
            del self.state.job_of[key]
            self.state.gang_of.pop(job, None)
            with suppress(ApiFailure):
                detail = await asyncio.to_thread(self.api.job, job)
                if detail.state not in TERMINAL:
                    await asyncio.to_thread(self.api.cancel, job)
                    log.info("gang %s is gone: cancelled Boltforge job %s", key, job)

    async def _follow_desired(self) -> None:
        """Follow the desired states of every node with one long-poll, while leading."""
        await self.desired.follow(self._desired_changed, lambda: self.leading)

    def _desired_changed(self, changes: DesiredChanges) -> None:
        """Keep the desired states of this scheduler's nodes (a full answer replaces them
        all) and wake the pass."""
        mine = self.nodes.snapshot()
        if changes.full:
            self.state.desired.clear()
        for st in changes.nodes:
            if st.node in mine:
                self.state.desired.put(st.node, st.replicas)
        self._wake.set()

    # words back

    def _say_scheduled(self, placed: list[Placed]) -> None:
        by_job: dict[str, list[Placed]] = defaultdict(list)
        for p in placed:
            by_job[p.job].append(p)
        with self.nodes.lock:
            known = self.nodes.items
            racks = {
                p.node: known[p.node].labels.get(self.options.labels.rack, "")
                for p in placed
                if p.node in known
            }
        for job, members in by_job.items():
            nodes = sorted({p.node for p in members})
            where = sorted({racks.get(n) or "?" for n in nodes})
            gang = self.state.gang_of.get(job)
            for p in members:
                text = (
                    f"Boltforge placed {p.pod.namespace}/{p.pod.name} on {p.node}: gang {gang} "
                    f"(job {job}, {len(members)} pods on {len(nodes)} nodes in rack "
                    f"{','.join(where)})"
                )
                self._say([p.pod], "Scheduled", text)

    def _say(self, pods: list[KubePod], reason: str, text: str, kind: str = "Normal") -> None:
        for pod in pods:
            self._words_pool.submit(_quietly, self.writes.event, pod, reason, text, kind)

    async def _words(self, all_gangs: Mapping[GangKey, PodGang]) -> None:
        """Why each waiting pod waits, as ``PodScheduled=False`` and an event, when it
        changed since it was last said."""
        listed = {}
        job_of = self.state.job_of
        # only submitted jobs with pods waiting have words to say (``_why``)
        mine = sorted({job_of[k] for k, g in all_gangs.items() if k in job_of and g.waiting})
        if mine:
            with suppress(ApiFailure, OSError):
                waiting = await asyncio.to_thread(self.api.jobs, LISTED, ids=mine)
                listed = {j.id: j for j in waiting.jobs}
        ended = {j.id for j in listed.values() if j.state in TERMINAL}
        again = {k for k, j in job_of.items() if j in ended and self._made_again(k, all_gangs)}
        if again:  # their controllers made new pods: submitted again on the next pass
            self.state.ended_gangs |= again
            self._wake.set()
        told, now, asked = self.state.told, time.monotonic(), set[str]()
        for key, gang in all_gangs.items():
            pods = gang.waiting
            asked.update(p.uid for p in pods)
            text, reason = self._why(key, gang, listed)
            if not text:
                continue
            for pod in pods:
                condition, event = told.tell(pod.uid, reason, text, now)
                if condition:
                    self._words_pool.submit(_quietly, self.writes.unschedulable, pod, reason, text)
                if event:
                    self._words_pool.submit(
                        _quietly, self.writes.event, pod, "FailedScheduling", text, "Warning"
                    )
        told.forget(asked)

    def _made_again(self, key: GangKey, all_gangs: Mapping[GangKey, PodGang]) -> bool:
        """Whether ``key``'s gang has a waiting pod its job was not submitted with (a pod
        its controller made after the job ended, not one left waiting when it was
        cancelled)."""
        gang = all_gangs.get(key)
        known = self.state.submitted_pods.get(key)
        return gang is not None and (known is None or any(p.uid not in known for p in gang.waiting))

    def _why(self, key: GangKey, gang: PodGang, listed: Mapping[str, Any]) -> tuple[str, str]:
        """What ``gang``'s waiting pods are told: (message, reason), or ("", "")."""
        state = self.state
        if key in state.refused:
            return words.refused(state.refused[key], key in state.fits_nowhere)
        job = state.job_of.get(key)
        if job is None and key.kind == "podgroup" and self.groups.absent:
            return f"boltforge: {CRD_MISSING}", words.CRD_MISSING
        if job is None:
            return words.incomplete(gang)
        summary = listed.get(job)
        if summary is not None and summary.state == "scheduled" and state.blocked:
            return words.blocked(state.blocked)
        if summary is not None and summary.state in TERMINAL:
            return words.ended(job, summary.state)
        if summary is None or summary.state != "pending":
            return "", ""
        return words.pending(summary)


def _assign(
    todo: Mapping[str, tuple[str, ReplicaSpec]], gang: PodGang, taken: set[str]
) -> dict[str, KubePod] | None:
    """A waiting pod of the right role for each replica to start, in rank order; None when
    some replica has none (the gang is bound whole or not at all)."""
    free: dict[str, list[KubePod]] = defaultdict(list)
    try:
        roles = shape([p for p in gang.waiting if p.uid not in taken]).roles
    except Unplaceable:
        return None
    for role, pods in roles.items():
        free[role].extend(pods)
    out = {}
    for replica, (_, spec) in sorted(todo.items(), key=lambda kv: _rank(kv[0])):
        role = spec.env.get("BOLT_ROLE", "")
        if not free.get(role):
            return None
        out[replica] = free[role].pop(0)
    return out


def _rank(replica: str) -> int:
    return int(replica.rsplit(".", 1)[1])


def _quietly(write: Callable[..., None], *args: Any) -> None:
    try:
        write(*args)
    except (ApiException, OSError) as e:
        log.info("could not write to Kubernetes: %s", e)


def _wait_synced(informers: list[Informer[Any]], stopping: threading.Event) -> None:
    for informer in informers:
        waited = 0
        while not informer.synced.wait(0.5):
            if stopping.is_set():
                return
            waited += 1
            if waited % 10 == 0:
                log.info("waiting for the %s informer's first list", informer.kind)


def _custom_lister(api: CustomObjectsApi, group: str, version: str, plural: str) -> Any:
    def lister(**kwargs: Any) -> Any:
        return api.list_cluster_custom_object(group, version, plural, **kwargs)

    return lister

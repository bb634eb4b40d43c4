"""Inference services beside a training trace: autoscaled against a static provision.

The study replays a training trace on a fleet (``boltforge.sim.engine``) while inference
services take GPUs from the same fleet, and reports what each way of provisioning them gives:
the share of requests served within each service's latency SLO, the GPU-hours serving held,
and what training got done.

**Replicas.** Each replica of a service is a core ``Job`` of class SERVING, not preemptible,
with no time limit and no end, placed by the same scheduling passes as the training jobs (so a
replica that finds no free GPUs may preempt training jobs, within the policy's rules: the
churn budget, a new job's protection, lost work against waiting). A replica serves only
``cold_start_s`` after it started; replicas placed at time 0 count as already warm (the
services were running before the window opens). A host failure stops a replica as it stops
any job: it goes back to the queue and cold-starts again.

**Modes.** ``Mode.AUTOSCALED``: every step of the request trace (``step_s``), each service's
scaler (``boltforge.core.serving.autoscale.decide``) gets the ``Load`` of the step just ended
and its count is applied: scaling up submits replica jobs, scaling down withdraws replicas,
those still pending first, then the most recently started. It starts with the count its
first step's rate asks for at the target utilization. ``Mode.STATIC``: each service holds, for
the whole run, the count that serves its peak rate in the trace at the target utilization
(within its replica range), submitted at time 0. The training trace runs on the rest.

**Load and SLO.** The ready replicas serve each step's requests through the fluid queue of
``boltforge.sim.serving_model``; the ``Load`` a scaler sees is that step's arrival rate, its
backlog and the modelled p99.

**Horizon.** The study covers the request trace, ``[0, horizon_s)``: training jobs submitted
from ``horizon_s`` on are left out, and the replay stops there. Training figures count only
trace jobs: productive GPU-hours include the progress of runs still open at the horizon;
finished jobs and their JCT count jobs that finished within it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum

from boltforge.core.model.gang import Gang, Role
from boltforge.core.model.topology import TopologyTree
from boltforge.core.model.workload import SERVING, Job
from boltforge.core.serving.autoscale import Autoscale, Load, ScaleState, decide
from boltforge.sim.engine import SimConfig, Simulation
from boltforge.sim.execution import evacuated
from boltforge.sim.records import JobRecord, TraceJob
from boltforge.sim.serving_inputs import RequestTrace, ServicesSpec, StudyService
from boltforge.sim.serving_model import serve_step

SERVING_QUEUE = "serving"
REPLICA_PREFIX = "svc:"  # replica job ids: svc:<service>:<number>
HOUR = 3600.0

StepProgress = Callable[[int, int], None]  # (steps done, steps in the request trace)


class Mode(StrEnum):
    """How the services are provisioned."""

    AUTOSCALED = "autoscaled"
    STATIC = "static"


@dataclass(slots=True)
class _Service:
    """One service's scaler, replicas and running tallies."""

    spec: StudyService
    rules: Autoscale
    state: ScaleState
    replicas: list[str] = field(default_factory=list)  # replica job ids, oldest first
    numbered: int = 0
    load: Load | None = None
    backlog: float = 0.0
    starts: dict[str, float] = field(default_factory=dict)  # replica -> start of its run
    offered: float = 0.0
    in_slo: float = 0.0
    gpu_s: float = 0.0
    ready_s: float = 0.0
    wait_s: float = 0.0
    scale_events: int = 0
    cold_starts: int = 0
    counts: list[tuple[float, int]] = field(default_factory=list)  # (time, count) on changes


def replica_job(spec: StudyService, key: str, now: float) -> Job:
    """A replica of ``spec`` as the core sees it: one role of ``gpus_per_replica`` GPUs on one
    host, class SERVING, not preemptible, no time limit, submitted at ``now``; no host holds
    more than half of the service's replicas where others have room (``Job.spread``), as the
    server places them."""
    role = Role("server", 1, spec.gpus_per_replica)
    gang = Gang(key, (role,), team=SERVING_QUEUE, priority=SERVING)
    return Job(
        key,
        gang,
        SERVING_QUEUE,
        now,
        preemptible=False,
        restart_overhead=spec.cold_start_s,
        spread=f"service {spec.name}",
    )


class ServiceControl:
    """The engine's ``Controller`` for the services: every ``period_s`` (the request trace's
    step) it accounts the step just ended and, autoscaled, applies each scaler's count."""

    def __init__(
        self,
        requests: RequestTrace,
        services: ServicesSpec,
        mode: Mode,
        progress: StepProgress | None = None,
    ) -> None:
        self.requests, self.mode, self.progress = requests, mode, progress
        self.services = [
            _Service(spec, spec.rules(), ScaleState(0))
            for spec in services.services
            if spec.name in requests.rates
        ]
        self.replica_ids: set[str] = set()
        self._every = max(1, requests.steps // 200)

    @property
    def period_s(self) -> float:
        return self.requests.step_s

    @property
    def horizon_s(self) -> float:
        return self.requests.horizon_s

    def control(self, sim: Simulation) -> bool:
        """Account the step that ended at ``sim.now`` and, within the trace, set each
        service's count; ask for a full pass while a replica is new or waits."""
        step = round(sim.now / self.requests.step_s)
        submitted = False
        for svc in self.services:
            if step > 0:
                self._account(svc, sim, step - 1)
            if step < self.requests.steps:
                submitted |= self._set_count(svc, sim, step)
        if self.progress is not None and (step % self._every == 0 or step >= self.requests.steps):
            self.progress(min(step, self.requests.steps), self.requests.steps)
        return submitted or any(k in sim.pending for svc in self.services for k in svc.replicas)

    # -- accounting ---------------------------------------------------------------------

    def _account(self, svc: _Service, sim: Simulation, step: int) -> None:
        """Serve step ``step`` (which ends now) with the replicas that were ready in it, and
        keep the ``Load`` the scaler sees next."""
        dt = self.requests.step_s
        begin, end = sim.now - dt, sim.now
        ready_s = 0.0
        for key in svc.replicas:
            live = sim.live.get(key)
            if live is None:
                svc.wait_s += dt if key in sim.pending else 0.0
                continue
            start = live.run.start_time
            svc.wait_s += max(start - begin, 0.0)
            if svc.starts.get(key) != start:
                svc.starts[key] = start
                svc.cold_starts += 1 if start > 0.0 else 0  # placed at 0: warm
            ready = start if start <= 0.0 else start + svc.spec.cold_start_s
            ready_s += max(end - max(begin, ready), 0.0)
            svc.gpu_s += svc.spec.gpus_per_replica * max(end - max(begin, start), 0.0)
        rate = self.requests.rate(svc.spec.name, step)
        spec = svc.spec
        out = serve_step(
            rate,
            ready_s / dt,
            svc.backlog,
            dt,
            spec.rps_per_replica,
            spec.base_latency_ms,
            spec.latency_slo_ms,
        )
        svc.backlog = out.backlog
        svc.offered += out.offered
        svc.in_slo += out.in_slo
        svc.ready_s += ready_s
        svc.load = Load(end, rate, out.backlog, out.p99_ms)

    # -- counts -------------------------------------------------------------------------

    def _set_count(self, svc: _Service, sim: Simulation, step: int) -> bool:
        """Apply the count for step ``step``; returns whether replicas were submitted."""
        if step == 0:
            wanted = self._initial(svc)
            svc.state = ScaleState(wanted, last_busy=sim.now)
        elif self.mode == Mode.STATIC or svc.load is None:
            return False
        else:
            scale = decide(svc.rules, svc.state, svc.load)
            svc.state, wanted = scale.state, scale.replicas
        have = len(svc.replicas)
        if wanted == have:
            return False
        if step > 0:
            svc.scale_events += 1
        svc.counts.append((sim.now, wanted))
        if wanted > have:
            for _ in range(wanted - have):
                self._submit(svc, sim)
            return True
        for key in self._surplus(svc, sim, have - wanted):
            sim.withdraw(key)
            svc.replicas.remove(key)
        return False

    def _initial(self, svc: _Service) -> int:
        """Static: the count for the trace's peak; autoscaled: for the first step's rate."""
        spec, name = svc.spec, svc.spec.name
        if self.mode == Mode.STATIC:
            return spec.static_replicas(self.requests.peak(name))
        rate = self.requests.rate(name, 0)
        need = math.ceil(rate / (spec.rps_per_replica * spec.target_utilization))
        return min(max(need, spec.min_replicas), spec.max_replicas)

    def _submit(self, svc: _Service, sim: Simulation) -> None:
        key = f"{REPLICA_PREFIX}{svc.spec.name}:{svc.numbered}"
        svc.numbered += 1
        sim.submit(replica_job(svc.spec, key, sim.now))
        svc.replicas.append(key)
        self.replica_ids.add(key)

    @staticmethod
    def _surplus(svc: _Service, sim: Simulation, count: int) -> list[str]:
        """The ``count`` replicas to withdraw: pending ones first (newest first), then the
        running ones that started last (the coldest)."""

        def order(key: str) -> tuple[int, float, int]:
            live = sim.live.get(key)
            started = live.run.start_time if live is not None else math.inf
            return (live is None, started, svc.replicas.index(key))

        return sorted(svc.replicas, key=order, reverse=True)[:count]


# -- outcome ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ServiceOutcome:
    """One service over the horizon: requests offered and served within the SLO (its share
    is ``attainment``), GPU-hours its replicas held, mean ready replicas, hours its replicas
    waited to be placed (a replica still waiting at a step's end counts the whole step),
    scale events, replicas cold-started, and its count over time (``(time, count)`` at each
    change)."""

    name: str
    offered: float
    in_slo: float
    attainment: float
    gpu_hours: float
    mean_ready: float
    replica_wait_h: float
    scale_events: int
    cold_starts: int
    counts: tuple[tuple[float, int], ...]


@dataclass(frozen=True, slots=True)
class ModeOutcome:
    """One mode's figures over the horizon (see the module docstring); ``jct_by_job``:
    the JCT (seconds) of each training job that finished, by id."""

    mode: str
    fleet_gpus: int
    horizon_s: float
    services: tuple[ServiceOutcome, ...]
    slo_attainment: float
    serving_gpu_hours: float
    training_productive_gpu_hours: float
    training_lost_gpu_hours: float
    training_submitted: int
    training_finished: int
    training_avg_jct_h: float | None
    training_preemptions: int
    scale_events: int
    cold_starts: int
    replica_wait_h: float
    jct_by_job: dict[str, float] = field(default_factory=dict, compare=False, repr=False)

    def to_json(self) -> dict[str, object]:
        """Plain numbers, rounded for reading, for ``--json``."""
        return {
            "mode": self.mode,
            "fleet_gpus": self.fleet_gpus,
            "horizon_h": round(self.horizon_s / HOUR, 3),
            "slo_attainment": round(self.slo_attainment, 6),
            "serving_gpu_hours": round(self.serving_gpu_hours, 2),
            "training_productive_gpu_hours": round(self.training_productive_gpu_hours, 2),
            "training_lost_gpu_hours": round(self.training_lost_gpu_hours, 2),
            "training_submitted": self.training_submitted,
            "training_finished": self.training_finished,
            "training_avg_jct_h": (
                None if self.training_avg_jct_h is None else round(self.training_avg_jct_h, 3)
            ),
            "training_preemptions": self.training_preemptions,
            "scale_events": self.scale_events,
            "cold_starts": self.cold_starts,
            "replica_wait_h": round(self.replica_wait_h, 3),
            "services": {
                s.name: {
                    "slo_attainment": round(s.attainment, 6),
                    "requests": round(s.offered),
                    "gpu_hours": round(s.gpu_hours, 2),
                    "mean_ready_replicas": round(s.mean_ready, 2),
                    "scale_events": s.scale_events,
                    "cold_starts": s.cold_starts,
                    "replica_wait_h": round(s.replica_wait_h, 3),
                }
                for s in self.services
            },
        }


def run_mode(
    tree: TopologyTree,
    trace: list[TraceJob],
    requests: RequestTrace,
    services: ServicesSpec,
    mode: Mode,
    config: SimConfig,
    progress: StepProgress | None = None,
) -> ModeOutcome:
    """Replay ``trace`` (the jobs submitted within the request trace's horizon) on ``tree``
    under ``config`` with ``services`` provisioned as ``mode`` says, and measure it.
    Raises ``ValueError`` when a replica cannot fit even the empty fleet."""
    host_gpus = int(tree.host_gpus.max(initial=0))
    for spec in services.services:
        if spec.gpus_per_replica > host_gpus:
            raise ValueError(
                f"service {spec.name}: a replica of {spec.gpus_per_replica} GPUs does not fit "
                f"one host of this fleet (at most {host_gpus} GPUs)"
            )
    control = ServiceControl(requests, services, mode, progress)
    window = [t for t in trace if t.submit_s < requests.horizon_s]
    sim = Simulation(tree, window, config, None, control)
    result = sim.run()
    training = [r for r in result.jobs if r.id not in control.replica_ids]
    return _outcome(mode, tree.total_gpus, requests, control, sim, training)


def _outcome(
    mode: Mode,
    fleet_gpus: int,
    requests: RequestTrace,
    control: ServiceControl,
    sim: Simulation,
    training: list[JobRecord],
) -> ModeOutcome:
    horizon = requests.horizon_s
    services = tuple(_service_outcome(svc, horizon) for svc in control.services)
    offered = sum(s.offered for s in services)
    in_slo = sum(s.in_slo for s in services)
    open_useful = sum(
        evacuated(sim.live[r.id].segment, horizon).productive_gpu_s
        for r in training
        if r.id in sim.live
    )
    jct_by_job = {r.id: r.finish_s - r.submit_s for r in training if r.finish_s is not None}
    jct = list(jct_by_job.values())
    return ModeOutcome(
        mode=str(mode),
        fleet_gpus=fleet_gpus,
        horizon_s=horizon,
        services=services,
        slo_attainment=in_slo / offered if offered > 0 else 1.0,
        serving_gpu_hours=sum(s.gpu_hours for s in services),
        training_productive_gpu_hours=(sum(r.productive_gpu_s for r in training) + open_useful)
        / HOUR,
        training_lost_gpu_hours=sum(r.lost_gpu_s for r in training) / HOUR,
        training_submitted=len(training),
        training_finished=len(jct),
        training_avg_jct_h=sum(jct) / len(jct) / HOUR if jct else None,
        training_preemptions=sum(r.preemptions for r in training),
        scale_events=sum(s.scale_events for s in services),
        cold_starts=sum(s.cold_starts for s in services),
        replica_wait_h=sum(s.replica_wait_h for s in services),
        jct_by_job=jct_by_job,
    )


def common_jct_h(outcomes: list[ModeOutcome]) -> tuple[int, list[float | None]]:
    """The training jobs that finished in every mode, and each mode's average JCT (hours)
    over just those (None when there are none): the same jobs, so the figures compare."""
    if not outcomes:
        return 0, []
    common = set(outcomes[0].jct_by_job).intersection(*(o.jct_by_job for o in outcomes[1:]))
    if not common:
        return 0, [None for _ in outcomes]
    return len(common), [
        sum(o.jct_by_job[k] for k in common) / len(common) / HOUR for o in outcomes
    ]


def _service_outcome(svc: _Service, horizon: float) -> ServiceOutcome:
    return ServiceOutcome(
        name=svc.spec.name,
        offered=svc.offered,
        in_slo=svc.in_slo,
        attainment=svc.in_slo / svc.offered if svc.offered > 0 else 1.0,
        gpu_hours=svc.gpu_s / HOUR,
        mean_ready=svc.ready_s / horizon if horizon > 0 else 0.0,
        replica_wait_h=svc.wait_s / HOUR,
        scale_events=svc.scale_events,
        cold_starts=svc.cold_starts,
        counts=tuple(svc.counts),
    )

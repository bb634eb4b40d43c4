"""Simulation results and job records built by hand, for tests of what reads them (metrics,
reports, the console's report pages)."""

from __future__ import annotations

from boltforge.sim.metrics import Metrics, compute
from boltforge.sim.records import JobRecord, Sample, SimResult


def sim(policy: str, stretch: float, n_samples: int = 50) -> SimResult:
    """A 16-GPU run of six jobs over two teams; ``stretch`` slows every finish down."""
    jobs = [
        JobRecord(
            id=f"j{i}",
            team="ml" if i % 2 else "infra",
            gpus=2 + i,
            submit_s=600.0 * i,
            duration_s=3600.0 * (i + 1),
            start_s=600.0 * i + 60,
            finish_s=600.0 * i + 3600.0 * (i + 1) * stretch,
            allocated_gpu_s=(2 + i) * 3600.0 * (i + 1) * stretch,
            productive_gpu_s=(2 + i) * 3600.0 * (i + 1),
            dollars=float(i),
        )
        for i in range(6)
    ]
    samples = [
        Sample(t=900.0 * k, allocated_gpus=k % 16, productive_gpus=(k % 16) * 0.9, queued=k % 5,
               fragmentation=(k % 10) / 10)
        for k in range(n_samples)
    ]  # fmt: skip
    return SimResult(policy=policy, fleet="tiny", total_gpus=16, jobs=jobs, samples=samples)


def build(results: dict[str, SimResult]) -> dict[str, Metrics]:
    return {name: compute(r) for name, r in results.items()}


def rec(
    id: str,
    submit: float,
    start: float | None,
    finish: float | None,
    duration: float = 100.0,
    gpus: int = 1,
    team: str = "a",
    allocated: float = 0.0,
    productive: float = 0.0,
    **kw: float,
) -> JobRecord:
    """A job record; ``kw`` sets the counters (preemptions, lost_gpu_s, dollars, ...)."""
    return JobRecord(
        id=id,
        team=team,
        gpus=gpus,
        submit_s=submit,
        duration_s=duration,
        start_s=start,
        finish_s=finish,
        allocated_gpu_s=allocated,
        productive_gpu_s=productive,
        **kw,  # type: ignore[arg-type]
    )

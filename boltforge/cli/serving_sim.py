"""``bolt simulate-serving``: inference services beside a training trace, autoscaled against a
static provision of the same fleet (``boltforge.sim.serving``), side by side."""

from __future__ import annotations

import time
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import Manager
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich import box
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from boltforge.cli.common import EXIT_BAD_INPUT, console, errors, print_json, spec_errors
from boltforge.core.policy import POLICIES, named
from boltforge.sim.engine import SimConfig
from boltforge.sim.records import TraceJob
from boltforge.sim.serving import HOUR, Mode, ModeOutcome, common_jct_h, run_mode
from boltforge.sim.serving_inputs import (
    RequestTrace,
    ServicesSpec,
    check_match,
    load_services,
    read_requests,
)
from boltforge.sim.traces import TraceError, load_trace
from boltforge.spec.fleet import FleetSpec, load_fleet_spec, parse_fleet

MODES = (Mode.AUTOSCALED, Mode.STATIC)


@dataclass(frozen=True)
class StudyRun:
    """One mode's run, as sent to a worker process."""

    mode: Mode
    fleet: FleetSpec
    trace: list[TraceJob]
    requests: RequestTrace
    services: ServicesSpec
    config: SimConfig


def _replay(run: StudyRun, shared: Any) -> ModeOutcome:
    """Worker: replay one mode, reporting (steps done, steps) into ``shared``."""

    def tick(done: int, total: int) -> None:
        shared[str(run.mode)] = (done, total)

    tree = run.fleet.to_tree()
    return run_mode(tree, run.trace, run.requests, run.services, run.mode, run.config, tick)


def hgx_fleet(hosts: int) -> FleetSpec:
    """A fleet of ``hosts`` HGX H100 hosts of 8 GPUs, 16 hosts per rack and 4 racks per pod,
    as the replay fleets in examples/fleets/eval are."""
    pool = {
        "name": "h100",
        "gpu": "H100-80GB",
        "gpu_memory_gb": 80,
        "gpus_per_host": 8,
        "nvlink_island": 8,
        "cpus": 192,
        "memory_gb": 2048,
        "rails": 8,
        "tier": "reserved",
        "price_per_gpu_hour": 2.20,
        "layout": {"hosts": hosts, "hosts_per_rack": 16, "racks_per_pod": 4},
    }
    return parse_fleet({"name": f"hgx-{hosts * 8}", "pools": [pool]}, "--hosts")


def simulate_serving_command(
    requests: Annotated[
        Path, typer.Option(help="Request-rate trace (CSV: time_s,service,requests_per_s).")
    ],
    services: Annotated[Path, typer.Option(help="Services file (YAML).")],
    trace: Annotated[
        str, typer.Option(help="Training trace (ITP, Philly or Boltforge CSV) or synthetic:N.")
    ],
    fleet: Annotated[
        Path | None, typer.Option(help="Fleet spec (YAML); default: --hosts HGX H100 hosts.")
    ] = None,
    hosts: Annotated[
        int, typer.Option(min=1, help="Without --fleet: this many 8-GPU HGX H100 hosts.")
    ] = 16,
    jobs: Annotated[
        int | None, typer.Option(min=1, help="Replay only the first N training jobs.")
    ] = None,
    format: Annotated[
        str | None, typer.Option("--format", help="itp, philly or csv (default: detect).")
    ] = None,
    policy: Annotated[str, typer.Option(help="Scheduling policy for both modes.")] = "default",
    seed: Annotated[int, typer.Option(help="Seed for host failures and derived teams.")] = 0,
    teams: Annotated[int, typer.Option(help="Teams to derive where the trace has none.")] = 8,
    failures: Annotated[float, typer.Option(help="Host failures per 1,000 GPUs per day.")] = 2.0,
    json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Replay a training trace on a fleet shared with inference services, once with the
    services autoscaled and once with a static provision, and compare.

    Each service replica is a serving-class job placed by the same scheduler as the training
    jobs; autoscaled, each service's scaler sets its count every step of the request trace;
    static, each holds the count its peak rate needs for the whole run. Reported over the
    request trace's horizon: SLO attainment, serving GPU-hours, training productive
    GPU-hours, training jobs finished and their JCT, scale events and cold starts. Exits 2
    on a bad input file or option.
    """
    if policy not in POLICIES:
        _bad(f"--policy: unknown {escape(policy)}; known: {', '.join(POLICIES)}")
    with spec_errors():
        spec = load_fleet_spec(fleet) if fleet is not None else hgx_fleet(hosts)
        rates = read_requests(requests)
        declared = load_services(services)
        check_match(rates, declared, f"{requests} and {services}")
    training = _trace(trace, format, teams, seed, jobs)
    tree = spec.to_tree()
    _check_fits(declared, int(tree.host_gpus.max(initial=0)))
    config = SimConfig(named(policy), seed=seed, failures_per_1000_gpu_day=failures)
    window = [t for t in training if t.submit_s < rates.horizon_s]
    errors.print(
        f"{len(window):,} training jobs within the {rates.horizon_s / HOUR:g} h request trace "
        f"on {spec.name} ({tree.total_gpus:,} GPUs); services: {', '.join(rates.services)}",
        highlight=False,
    )
    runs = [StudyRun(m, spec, window, rates, declared, config) for m in MODES]
    start = time.perf_counter()
    outcomes = _run_all(runs, rates.steps)
    wall = time.perf_counter() - start
    if json:
        both, common = common_jct_h(outcomes)
        modes = {
            o.mode: o.to_json() | {"training_common_avg_jct_h": _round(h)}
            for o, h in zip(outcomes, common, strict=True)
        }
        print_json({"modes": modes, "training_common_jobs": both, "wall_s": round(wall, 2)})
        return
    console.print(comparison_table(outcomes))
    console.print(f"wall {wall:.1f} s", highlight=False)


def _bad(message: str) -> NoReturn:
    errors.print(f"[bold red]error[/] {message}", highlight=False)
    raise typer.Exit(EXIT_BAD_INPUT)


def _trace(path: str, fmt: str | None, teams: int, seed: int, limit: int | None) -> list[TraceJob]:
    try:
        jobs = load_trace(
            path if path.startswith("synthetic:") else Path(path), fmt, teams=teams, seed=seed
        )
    except TraceError as e:
        _bad(escape(str(e)))
    return jobs[:limit] if limit is not None else jobs


def _check_fits(services: ServicesSpec, host_gpus: int) -> None:
    """Exit 2 when a service's replica needs more GPUs than one host of the fleet has."""
    for s in services.services:
        if s.gpus_per_replica > host_gpus:
            _bad(
                f"service {escape(s.name)}: a replica of {s.gpus_per_replica} GPUs does not fit "
                f"one host of this fleet (at most {host_gpus} GPUs). To fix: lower "
                "gpus_per_replica or use a fleet with larger hosts"
            )


def _run_all(runs: list[StudyRun], steps: int) -> list[ModeOutcome]:
    """Each mode in its own process, with a progress bar per mode (steps of the request
    trace replayed) on stderr."""
    columns = (
        TextColumn("{task.description:>10}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    with Manager() as manager, ProcessPoolExecutor(len(runs)) as pool:
        shared = manager.dict()
        futures: list[Future[ModeOutcome]] = [pool.submit(_replay, r, shared) for r in runs]
        with Progress(*columns, console=errors, transient=False) as bars:
            tasks = [bars.add_task(str(r.mode), total=steps) for r in runs]
            while not all(f.done() for f in futures):
                _update(bars, tasks, runs, futures, dict(shared))
                time.sleep(0.2)
            _update(bars, tasks, runs, futures, dict(shared))
        return [f.result() for f in futures]


def _update(
    bars: Progress,
    tasks: list[Any],
    runs: list[StudyRun],
    futures: list[Future[ModeOutcome]],
    shared: dict[str, tuple[int, int]],
) -> None:
    for task, run, future in zip(tasks, runs, futures, strict=True):
        total = bars.tasks[task].total or 0
        done = total if future.done() else shared.get(str(run.mode), (0, 0))[0]
        bars.update(task, completed=done)


def comparison_table(outcomes: list[ModeOutcome]) -> Table:
    """The modes side by side, one figure per row (fits 100 columns for a few services)."""
    first = outcomes[0]
    table = Table(
        title=f"Serving beside training: {first.fleet_gpus:,} GPUs, {first.horizon_s / HOUR:g} h",
        box=box.SIMPLE_HEAD,
        padding=(0, 1),
        pad_edge=False,
    )
    table.add_column("", no_wrap=True)
    for o in outcomes:
        table.add_column(o.mode, justify="right", no_wrap=True)
    for label, cells in _rows(outcomes):
        table.add_row(label, *cells)
    return table


def _rows(outcomes: list[ModeOutcome]) -> list[tuple[str, list[str]]]:
    """(label, one cell per mode) for each figure."""

    def each(fmt: Any) -> list[str]:
        return [fmt(o) for o in outcomes]

    names = [s.name for s in outcomes[0].services]
    rows = [("SLO attainment, all requests", each(lambda o: _pct(o.slo_attainment)))]
    for i, name in enumerate(names):
        rows.append((f"  {name}", each(lambda o, i=i: _pct(o.services[i].attainment))))
    hours = outcomes[0].horizon_s / HOUR
    both, common = common_jct_h(outcomes)
    rows += [
        ("serving GPU-hours", each(lambda o: f"{o.serving_gpu_hours:,.0f}")),
        ("  mean serving GPUs", each(lambda o: f"{o.serving_gpu_hours / hours:.1f}")),
        (
            "training productive GPU-hours",
            each(lambda o: f"{o.training_productive_gpu_hours:,.0f}"),
        ),
        ("training GPU-hours lost", each(lambda o: f"{o.training_lost_gpu_hours:,.0f}")),
        (
            "training jobs finished",
            each(lambda o: f"{o.training_finished:,} of {o.training_submitted:,}"),
        ),
        ("  their average JCT, h", each(lambda o: _hours(o.training_avg_jct_h))),
        (f"  JCT of the {both:,} done in both, h", [_hours(h) for h in common]),
        ("training preemptions", each(lambda o: f"{o.training_preemptions:,}")),
        ("scale events", each(lambda o: f"{o.scale_events:,}")),
        ("replicas cold-started", each(lambda o: f"{o.cold_starts:,}")),
        ("replica-hours waiting for GPUs", each(lambda o: f"{o.replica_wait_h:,.1f}")),
    ]
    return rows


def _pct(share: float) -> str:
    return f"{100.0 * share:.3f}%"


def _round(hours: float | None) -> float | None:
    return None if hours is None else round(hours, 3)


def _hours(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"

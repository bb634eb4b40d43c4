"""``bolt simulate``: replay a trace under several policies side by side and compare them."""

from __future__ import annotations

import os
import shlex
import sys
import time
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import Manager
from pathlib import Path
from typing import Annotated, Any

import typer
from rich import box
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from boltforge.cli.common import EXIT_BAD_INPUT, console, errors, print_json, spec_errors
from boltforge.core.policy import POLICIES, named
from boltforge.sim.engine import SimConfig, simulate
from boltforge.sim.metrics import Metrics, compute, to_json
from boltforge.sim.records import SimResult, TraceJob
from boltforge.sim.report import COLUMNS, comparison_rows, write_report
from boltforge.sim.traces import TraceError, load_trace, offered_load, scale_load
from boltforge.spec.fleet import load_fleet

JSON_KEYS = (
    "jobs",
    "finished",
    "avg_jct_s",
    "median_jct_s",
    "p99_jct_s",
    "avg_queue_s",
    "p99_queue_s",
    "avg_bounded_slowdown",
    "util_allocated",
    "util_productive",
    "util_productive_contended",
    "makespan_s",
    "preemptions",
    "failures",
    "gpu_hours_lost",
    "gpu_hours_slowed",
    "jain_fairness",
    "worst_ftf",
    "avg_fragmentation",
    "dollars",
    "dollars_by_pool",
)


@dataclass(frozen=True)
class Job:
    """One policy's replay, as sent to a worker process."""

    fleet: Path
    trace: list[TraceJob]
    config: SimConfig


def _replay(job: Job, progress: Any) -> SimResult:
    """Worker: load the fleet, replay, report progress into the shared dict."""
    tree = load_fleet(job.fleet)
    name = job.config.policy.name

    def tick(done: int, total: int) -> None:
        progress[name] = (done, total)

    start = time.perf_counter()
    result = simulate(tree, job.trace, job.config, tick)
    result.wall_s = time.perf_counter() - start
    return result


def simulate_command(
    fleet: Annotated[Path, typer.Option(help="Fleet spec (YAML).")],
    trace: Annotated[
        str, typer.Option(help="Trace file (ITP, Philly or Boltforge CSV) or synthetic:N.")
    ],
    policy: Annotated[
        str, typer.Option(help="Comma-separated policies to compare.")
    ] = "default,fifo,slurm-like,tiresias",
    format: Annotated[
        str | None, typer.Option("--format", help="itp, philly or csv (default: detect).")
    ] = None,
    load_scale: Annotated[
        float, typer.Option(help="Compress arrivals by this factor (2: twice the load).")
    ] = 1.0,
    seed: Annotated[int, typer.Option(help="Seed for failures and derived teams.")] = 0,
    teams: Annotated[int, typer.Option(help="Teams to derive where the trace has none.")] = 8,
    failures: Annotated[float, typer.Option(help="Host failures per 1,000 GPUs per day.")] = 2.0,
    checkpoint_interval: Annotated[
        float, typer.Option(help="Seconds between checkpoints.")
    ] = 1800.0,
    restart_overhead: Annotated[float, typer.Option(help="Reload and warm-up seconds.")] = 120.0,
    team_queues: Annotated[
        bool, typer.Option(help="One fair-share queue per team (off: teams share one factor).")
    ] = True,
    limit: Annotated[int | None, typer.Option(help="Replay only the first N jobs.")] = None,
    workers: Annotated[
        int | None,
        typer.Option(min=1, help="Policies replayed at once (default: one per CPU core)."),
    ] = None,
    report: Annotated[
        Path | None, typer.Option(help="Write plots and a summary page here.")
    ] = None,
    json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
    markdown: Annotated[
        bool, typer.Option("--markdown", help="Print the comparison as a Markdown table.")
    ] = False,
) -> None:
    """Replay a trace through the scheduling core under each policy and compare the outcomes.

    Policies run in parallel processes. Exits 2 on a bad fleet, trace or policy name.
    """
    names = _policies(policy)
    with spec_errors():
        tree = load_fleet(fleet)
    jobs = _trace(trace, format, teams, seed, load_scale, limit)
    configs = [
        SimConfig(
            named(n),
            seed=seed,
            checkpoint_interval_s=checkpoint_interval,
            restart_overhead_s=restart_overhead,
            failures_per_1000_gpu_day=failures,
            team_queues=team_queues,
        )
        for n in names
    ]
    load = offered_load(jobs, tree.total_gpus) if len(jobs) > 1 else 0.0
    errors.print(
        f"{len(jobs):,} jobs on {tree.name} ({tree.total_gpus:,} GPUs), offered load {load:.2f}",
        highlight=False,
    )
    start = time.perf_counter()
    results = _run_all(fleet, jobs, configs, workers or os.cpu_count() or 1)
    wall = time.perf_counter() - start
    metrics = {name: compute(results[name]) for name in names}
    if report is not None:
        command = "bolt simulate " + " ".join(shlex.quote(a) for a in sys.argv[2:])
        page = write_report(results, metrics, report, f"{trace} on {tree.name}", command)
        errors.print(f"report: {page}", highlight=False)
    if json:
        print_json(
            {"policies": {n: _json(m) for n, m in metrics.items()}, "wall_s": round(wall, 2)}
        )
        return
    if markdown:
        sys.stdout.write(markdown_table(metrics))
        return
    _print_table(metrics, wall, results)


def _policies(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in POLICIES]
    if unknown or not names:
        errors.print(
            f"[bold red]error[/] --policy: unknown {', '.join(unknown) or '(none given)'}; "
            f"known: {', '.join(POLICIES)}",
            highlight=False,
        )
        raise typer.Exit(EXIT_BAD_INPUT)
    return list(dict.fromkeys(names))


def _trace(
    path: str, fmt: str | None, teams: int, seed: int, scale: float, limit: int | None
) -> list[TraceJob]:
    try:
        jobs = load_trace(
            path if path.startswith("synthetic:") else Path(path), fmt, teams=teams, seed=seed
        )
        if scale != 1.0:
            jobs = scale_load(jobs, scale)
    except TraceError as e:
        errors.print(f"[bold red]error[/] {e}", highlight=False, markup=False)
        raise typer.Exit(EXIT_BAD_INPUT) from None
    return jobs[:limit] if limit is not None else jobs


def _run_all(
    fleet: Path, trace: list[TraceJob], configs: list[SimConfig], workers: int
) -> dict[str, SimResult]:
    """Run each config in its own process (at most ``workers`` at once), with a progress bar
    per policy on stderr. The results do not depend on ``workers``."""
    workers = max(1, min(len(configs), workers))
    columns = (
        TextColumn("{task.description:>12}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    with Manager() as manager, ProcessPoolExecutor(workers) as pool:
        shared = manager.dict()
        futures: dict[str, Future[SimResult]] = {
            c.policy.name: pool.submit(_replay, Job(fleet, trace, c), shared) for c in configs
        }
        with Progress(*columns, console=errors, transient=False) as bars:
            tasks = {n: bars.add_task(n, total=len(trace)) for n in futures}
            while not all(f.done() for f in futures.values()):
                _update(bars, tasks, dict(shared), futures)
                time.sleep(0.2)
            _update(bars, tasks, dict(shared), futures)
        return {name: f.result() for name, f in futures.items()}


def _update(
    bars: Progress,
    tasks: dict[str, Any],
    shared: dict[str, Any],
    futures: dict[str, Future[SimResult]],
) -> None:
    for name, task in tasks.items():
        total = bars.tasks[task].total or 0
        done = total if futures[name].done() else shared.get(name, (0, 0))[0]
        bars.update(task, completed=done)


def _json(m: Metrics) -> dict[str, Any]:
    data = to_json(m)
    return {k: data[k] for k in JSON_KEYS if k in data} | {"wall_s": data.get("wall_s")}


# The comparison columns shown in a terminal (the report page shows them all).
TERMINAL_COLUMNS = (
    ("policy", "policy"),
    ("finished", "done"),
    ("avg_jct_h", "JCT h"),
    ("p99_jct_h", "p99 h"),
    ("avg_queue_h", "wait h"),
    ("util_allocated_pct", "alloc"),
    ("util_productive_pct", "prod"),
    ("preemptions", "bump"),
    ("gpu_hours_lost", "lost h"),
    ("jain", "Jain"),
    ("worst_ftf", "FTF"),
)


def _print_table(metrics: dict[str, Metrics], wall: float, results: dict[str, SimResult]) -> None:
    table = Table(
        title="Policy comparison",
        box=box.SIMPLE_HEAD,
        padding=(0, 1),
        collapse_padding=True,
        pad_edge=False,
    )
    for key, header in TERMINAL_COLUMNS:
        table.add_column(header, justify="left" if key == "policy" else "right", no_wrap=True)
    for row in comparison_rows(metrics):
        table.add_row(*(_short(k, row[k]) for k, _ in TERMINAL_COLUMNS))
    console.print(table)
    rates = ", ".join(f"{n} {len(r.jobs) / max(r.wall_s, 1e-9):,.0f}" for n, r in results.items())
    console.print(f"wall {wall:.1f} s; jobs simulated per second: {rates}", highlight=False)


# The columns of ``--markdown``: every comparison figure but the job counts and dollars.
MARKDOWN_COLUMNS = tuple((k, h) for k, h in COLUMNS if k not in ("jobs", "finished", "dollars"))


def markdown_table(metrics: dict[str, Metrics]) -> str:
    """The comparison as a Markdown table, figures formatted as on the report page."""
    header = [h for _, h in MARKDOWN_COLUMNS]
    lines = [
        "| " + " | ".join(header) + " |",
        "|" + "|".join(["---", *("---:" for _ in header[1:])]) + "|",
    ]
    for row in comparison_rows(metrics):
        lines.append("| " + " | ".join(row[k] for k, _ in MARKDOWN_COLUMNS) + " |")
    return "\n".join(lines) + "\n"


def _short(key: str, text: str) -> str:
    """Ratios to two decimals so the table fits an 80-column terminal."""
    if key in ("jain", "worst_ftf"):
        try:
            return f"{float(text):.2f}"
        except ValueError:
            return text
    return text

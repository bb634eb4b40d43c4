"""``bolt simulate``: replay a trace under several policies, on one fleet or several, side by
side, and compare them."""

from __future__ import annotations

import os
import shlex
import sys
import time
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass, replace
from multiprocessing import Manager
from pathlib import Path
from typing import Annotated, Any

import typer
from rich import box
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from boltforge import gctune
from boltforge.cli.common import EXIT_BAD_INPUT, console, errors, print_json, spec_errors
from boltforge.core.policy import POLICIES, named
from boltforge.sim.costs import COST_COLUMNS, cost_rows
from boltforge.sim.engine import SimConfig, simulate
from boltforge.sim.jobs import with_deadlines, with_elastic
from boltforge.sim.limits import LIMIT_MODELS
from boltforge.sim.metrics import Metrics, compute, to_json
from boltforge.sim.records import SimResult, TraceJob
from boltforge.sim.report import COLUMNS, ELASTIC_KEYS, comparison_rows, write_report
from boltforge.sim.spot import reclaims_of
from boltforge.sim.traces import TraceError, load_trace, offered_load, scale_load
from boltforge.spec.fleet import FleetSpec, load_fleet, load_fleet_spec

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
    "elastic_starts",
    "grows",
    "shrinks",
    "gpu_hours_lost",
    "gpu_hours_slowed",
    "jain_fairness",
    "worst_ftf",
    "avg_fragmentation",
    "dollars",
    "dollars_by_pool",
    "reclaims",
    "jobs_reclaimed",
    "gpu_hours_lost_reclaim",
    "deadline_jobs",
    "deadlines_met",
    "deadline_hit_rate",
)


@dataclass(frozen=True)
class SimulationRun:
    """One run (a policy on a fleet), as sent to a worker process; ``label`` names it."""

    label: str
    fleet: Path
    trace: list[TraceJob]
    config: SimConfig


def _replay(job: SimulationRun, progress: Any) -> SimResult:
    """Worker: load the fleet, replay, report progress into the shared dict. The collector
    runs as ``gctune`` says, with the fleet and the trace set aside as permanent."""
    gctune.tune()
    tree = load_fleet(job.fleet)
    gctune.settle()
    name = job.label

    def tick(done: int, total: int) -> None:
        progress[name] = (done, total)

    start = time.perf_counter()
    result = simulate(tree, job.trace, job.config, tick)
    result.wall_s = time.perf_counter() - start
    return result


def simulate_command(
    fleet: Annotated[
        list[Path], typer.Option(help="Fleet spec (YAML); repeat it to compare fleets.")
    ],
    trace: Annotated[
        str, typer.Option(help="Trace file (ITP, Philly or Boltforge CSV) or synthetic:N.")
    ],
    policy: Annotated[
        str, typer.Option(help="Comma-separated policies to compare.")
    ] = "default,fifo,slurm-like,greedy,tiresias",
    format: Annotated[
        str | None, typer.Option("--format", help="itp, philly or csv (default: detect).")
    ] = None,
    load_scale: Annotated[
        float, typer.Option(help="Compress arrivals by this factor (2: twice the load).")
    ] = 1.0,
    seed: Annotated[
        int, typer.Option(help="Seed for failures, reclaims, deadlines and derived teams.")
    ] = 0,
    teams: Annotated[int, typer.Option(help="Teams to derive where the trace has none.")] = 8,
    failures: Annotated[float, typer.Option(help="Host failures per 1,000 GPUs per day.")] = 2.0,
    checkpoint_interval: Annotated[
        float, typer.Option(help="Seconds between checkpoints.")
    ] = 1800.0,
    restart_overhead: Annotated[float, typer.Option(help="Reload and warm-up seconds.")] = 120.0,
    checkpoint_write: Annotated[
        float, typer.Option(help="Seconds a job needs to checkpoint when a reclaim warns it.")
    ] = 60.0,
    cost_routing: Annotated[
        bool,
        typer.Option(
            help="Cost-aware routing: send each job to its cheapest pool that meets "
            "its deadline (off: pools chosen by fit alone)."
        ),
    ] = False,
    deadline_share: Annotated[
        float, typer.Option(min=0.0, max=1.0, help="Fraction of jobs given a deadline (seeded).")
    ] = 0.0,
    deadline_slack: Annotated[
        float, typer.Option(min=0.0, help="A deadline is submit + slack x runtime.")
    ] = 2.0,
    elastic_share: Annotated[
        float,
        typer.Option(
            help="Fraction of multi-replica jobs made elastic (seeded): each may run at half "
            "to twice its replicas, started smaller, shrunk instead of preempted, grown."
        ),
    ] = 0.0,
    team_queues: Annotated[
        bool, typer.Option(help="One fair-share queue per team (off: teams share one factor).")
    ] = True,
    time_limits: Annotated[
        bool,
        typer.Option(
            help="Give each job a time limit (off: jobs carry none, whatever --limit-model says)."
        ),
    ] = True,
    limit_model: Annotated[
        str,
        typer.Option(
            help="How a job without a limit in the trace gets one: derived (the first round "
            "value covering 1.2 times its runtime) or user (estimates as users give them: "
            "overestimated, rounded to popular values, some at the maximum; seeded).",
        ),
    ] = "derived",
    learned_runtimes: Annotated[
        bool,
        typer.Option(
            help="A job without a time limit expects what finished jobs like it took (off: "
            "it expects nothing)."
        ),
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
    """Replay a trace through the scheduling core under each policy, on each fleet, and compare
    the outcomes.

    Runs go in parallel processes. A spot pool with a ``reclaim`` process loses hosts at random
    (seeded); ``--deadline-share`` gives that fraction of jobs a deadline. With several fleets,
    or with reclaims or deadlines, a cost table (dollars by pool, JCT, deadlines met, what
    reclaims cost) follows the comparison. ``--elastic-share`` makes that fraction of the jobs
    that span hosts elastic on each fleet (``boltforge.sim.jobs.with_elastic``); the figures
    then count elastic starts, grows and shrinks. Exits 2 on a bad fleet, trace, policy name
    or option.
    """
    names = _policies(policy)
    _check_limit_model(limit_model)
    _check_share("--elastic-share", elastic_share, "of multi-replica jobs made elastic")
    specs = _fleets(fleet)
    jobs = _trace(trace, format, teams, seed, load_scale, limit)
    if deadline_share > 0:
        jobs = with_deadlines(jobs, deadline_slack, deadline_share, seed)
    base = SimConfig(
        named(names[0]),
        seed=seed,
        checkpoint_interval_s=checkpoint_interval,
        restart_overhead_s=restart_overhead,
        failures_per_1000_gpu_day=failures,
        team_queues=team_queues,
        checkpoint_write_s=checkpoint_write,
        cost_routing=cost_routing,
        time_limits=time_limits,
        learned_runtimes=learned_runtimes,
        limit_model=limit_model,
    )
    runs = _runs(fleet, specs, names, jobs, base, elastic_share)
    for spec in specs:
        total = spec.to_tree().total_gpus
        load = offered_load(jobs, total) if len(jobs) > 1 else 0.0
        errors.print(
            f"{len(jobs):,} jobs on {spec.name} ({total:,} GPUs), offered load {load:.2f}",
            highlight=False,
        )
    start = time.perf_counter()
    results = _run_all(runs, workers or os.cpu_count() or 1)
    wall = time.perf_counter() - start
    metrics = {run.label: compute(results[run.label]) for run in runs}
    cost = len(specs) > 1 or deadline_share > 0 or any(r.config.reclaims for r in runs)
    if report is not None:
        command = "bolt simulate " + " ".join(shlex.quote(a) for a in sys.argv[2:])
        title = f"{trace} on {', '.join(s.name for s in specs)}"
        page = write_report(results, metrics, report, title, command, cost)
        errors.print(f"report: {page}", highlight=False)
    if json:
        print_json(_json_out(runs, metrics, len(specs) > 1) | {"wall_s": round(wall, 2)})
        return
    if markdown:
        sys.stdout.write(markdown_table(metrics))
        if cost:
            sys.stdout.write("\n" + cost_markdown(metrics))
        errors.print(_wall_line(wall, results), highlight=False)  # stderr: the page is stdout
        return
    _print_table(metrics, wall, results)
    if cost:
        _print_costs(metrics)


def _check_limit_model(model: str) -> None:
    """Exit 2 naming ``--limit-model`` and the known models when ``model`` is not one."""
    if model in LIMIT_MODELS:
        return
    errors.print(
        f"[bold red]error[/] --limit-model: unknown {escape(model)!r}; known: "
        f"{', '.join(LIMIT_MODELS)} (e.g. --limit-model user)",
        highlight=False,
    )
    raise typer.Exit(EXIT_BAD_INPUT)


def _check_share(option: str, value: float, what: str) -> None:
    """Exit 2 naming ``option`` and the fix when ``value`` is not a fraction in [0, 1]."""
    if 0.0 <= value <= 1.0:
        return
    errors.print(
        f"[bold red]error[/] {option}: {value:g} is not between 0 and 1; give the fraction "
        f"{what}, e.g. {option} 0.3 for 30%",
        highlight=False,
    )
    raise typer.Exit(EXIT_BAD_INPUT)


def _fleets(paths: list[Path]) -> list[FleetSpec]:
    """Each fleet spec, validated (exit 2 naming the field on a problem)."""
    with spec_errors():
        return [load_fleet_spec(p) for p in paths]


def _runs(
    paths: list[Path],
    specs: list[FleetSpec],
    names: list[str],
    trace: list[TraceJob],
    base: SimConfig,
    elastic_share: float = 0.0,
) -> list[SimulationRun]:
    """One run per fleet and policy. Labels are the policy names on one fleet, the fleet names
    when one policy runs on several fleets, else ``fleet:policy``; fleets that share a name are
    told apart by file name. With ``elastic_share``, each fleet replays the trace with that
    share of its multi-replica jobs (on that fleet's hosts) elastic, the same for every
    policy."""
    fleet_names = [s.name for s in specs]
    if len(set(fleet_names)) < len(fleet_names):
        fleet_names = [str(p) for p in paths]
    out = []
    for path, spec, fleet_name in zip(paths, specs, fleet_names, strict=True):
        jobs = _elastic(trace, spec, elastic_share, base.seed)
        for n in names:
            config = replace(base, policy=named(n), reclaims=reclaims_of(spec))
            out.append(
                SimulationRun(_label(fleet_name, n, len(specs), len(names)), path, jobs, config)
            )
    return out


def _elastic(trace: list[TraceJob], spec: FleetSpec, share: float, seed: int) -> list[TraceJob]:
    """``trace`` with ``share`` of the jobs that span more than one of ``spec``'s largest hosts
    made elastic (``trace`` itself when ``share`` is 0)."""
    if share <= 0:
        return trace
    tree = spec.to_tree()
    host_gpus = int(tree.host_gpus.max(initial=0))
    if host_gpus <= 0:
        return trace
    return with_elastic(trace, share, seed, host_gpus, tree.total_gpus)


def _label(fleet: str, policy: str, fleets: int, policies: int) -> str:
    if fleets == 1:
        return policy
    return fleet if policies == 1 else f"{fleet}:{policy}"


def _json_out(
    runs: list[SimulationRun], metrics: dict[str, Metrics], several: bool
) -> dict[str, Any]:
    """``{"policies": {...}}`` on one fleet; ``{"runs": {label: {fleet, policy, ...}}}`` on
    several."""
    if not several:
        return {"policies": {n: _json(m) for n, m in metrics.items()}}
    return {
        "runs": {
            r.label: {"fleet": str(r.fleet), "policy": r.config.policy.name}
            | _json(metrics[r.label])
            for r in runs
        }
    }


def _policies(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in POLICIES]
    if unknown or not names:
        errors.print(
            f"[bold red]error[/] --policy: unknown {escape(', '.join(unknown)) or '(none given)'}; "
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
        errors.print(f"[bold red]error[/] {escape(str(e))}", highlight=False)
        raise typer.Exit(EXIT_BAD_INPUT) from None
    return jobs[:limit] if limit is not None else jobs


def _run_all(runs: list[SimulationRun], workers: int) -> dict[str, SimResult]:
    """Run each job in its own process (at most ``workers`` at once), with a progress bar
    per run on stderr. The runs likely to take longest are handed out first (``_heavy``),
    so that no long run starts last while the other workers sit idle. The results depend
    neither on ``workers`` nor on that order."""
    workers = max(1, min(len(runs), workers))
    columns = (
        TextColumn("{task.description:>12}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    with Manager() as manager, ProcessPoolExecutor(workers) as pool:
        shared = manager.dict()
        handed = {r.label: pool.submit(_replay, r, shared) for r in sorted(runs, key=_heavy)}
        futures: dict[str, Future[SimResult]] = {r.label: handed[r.label] for r in runs}
        reported: dict[str, int] = {}  # tenths reported per run, off a terminal
        with Progress(*columns, console=errors, transient=False) as bars:
            tasks = {n: bars.add_task(n, total=len(runs[0].trace)) for n in futures}
            while not all(f.done() for f in futures.values()):
                _update(bars, tasks, dict(shared), futures, reported)
                time.sleep(0.2)
            _update(bars, tasks, dict(shared), futures, reported)
        return {name: f.result() for name, f in futures.items()}


def _heavy(run: SimulationRun) -> tuple[bool, bool, bool]:
    """Sort key handing out the runs by what their passes search, the costliest first: a
    preempting policy searches for victims, one that reserves searches for each reserved
    job's earliest start, and strict order stops at the first job that cannot start."""
    policy = run.config.policy
    return (policy.preemption is None, policy.backfill.depth == 0, policy.order.strict)


def _update(
    bars: Progress,
    tasks: dict[str, Any],
    shared: dict[str, Any],
    futures: dict[str, Future[SimResult]],
    reported: dict[str, int],
) -> None:
    for name, task in tasks.items():
        total = bars.tasks[task].total or 0
        done = total if futures[name].done() else shared.get(name, (0, 0))[0]
        bars.update(task, completed=done)
        if not errors.is_terminal:  # no live bars: a plain line every tenth of a run
            line = progress_line(name, done, total, reported)
            if line:
                errors.print(line, highlight=False)


def progress_line(name: str, done: int, total: int, reported: dict[str, int]) -> str:
    """The line to print when run ``name`` passes another tenth of its jobs (``""`` when it
    has not since the last one; ``reported`` remembers the tenths printed per run)."""
    tenth = 10 * done // total if total else 10
    if tenth <= reported.get(name, 0):
        return ""
    reported[name] = tenth
    return f"{escape(name)}: {done:,} of {total:,} jobs finished ({10 * tenth}%)"


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


def _table(title: str) -> Table:
    """A compact terminal table: a simple header rule, one space between columns."""
    return Table(
        title=title, box=box.SIMPLE_HEAD, padding=(0, 1), collapse_padding=True, pad_edge=False
    )


def _print_table(metrics: dict[str, Metrics], wall: float, results: dict[str, SimResult]) -> None:
    table = _table("Policy comparison")
    for key, header in TERMINAL_COLUMNS:
        table.add_column(header, justify="left" if key == "policy" else "right", no_wrap=True)
    for row in comparison_rows(metrics):
        table.add_row(*(_short(k, row[k]) for k, _ in TERMINAL_COLUMNS))
    console.print(table)
    if _elastic_activity(metrics):
        counts = "; ".join(
            f"{n} {m.elastic_starts} started smaller, {m.grows} grows, {m.shrinks} shrinks"
            for n, m in metrics.items()
        )
        console.print(f"elastic jobs: {counts}", highlight=False)
    console.print(_wall_line(wall, results), highlight=False)


def _wall_line(wall: float, results: dict[str, SimResult]) -> str:
    """How long the replays took: in all, and each run's own time and jobs per second."""
    runs = ", ".join(
        f"{n} {r.wall_s:.1f} ({len(r.jobs) / max(r.wall_s, 1e-9):,.0f})" for n, r in results.items()
    )
    return f"wall {wall:.1f} s; each run, seconds (jobs/s): {runs}"


# The columns of ``--markdown``: every comparison figure but the job counts, dollars and the
# elastic counters (``ELASTIC_COLUMNS``, added at the end when some job started small or resized).
MARKDOWN_COLUMNS = tuple(
    (k, h) for k, h in COLUMNS if k not in ("jobs", "finished", "dollars", *ELASTIC_KEYS)
)
ELASTIC_COLUMNS = tuple((k, h) for k, h in COLUMNS if k in ELASTIC_KEYS)


def _elastic_activity(metrics: dict[str, Metrics]) -> bool:
    """Whether any run started a job below its size or resized one."""
    return any(m.elastic_starts or m.grows or m.shrinks for m in metrics.values())


def markdown_table(metrics: dict[str, Metrics]) -> str:
    """The comparison as a Markdown table, figures formatted as on the report page; the
    elastic counters are the last columns when any run has one above zero."""
    columns = MARKDOWN_COLUMNS + (ELASTIC_COLUMNS if _elastic_activity(metrics) else ())
    header = [h for _, h in columns]
    lines = [
        "| " + " | ".join(header) + " |",
        "|" + "|".join(["---", *("---:" for _ in header[1:])]) + "|",
    ]
    for row in comparison_rows(metrics):
        lines.append("| " + " | ".join(row[k] for k, _ in columns) + " |")
    return "\n".join(lines) + "\n"


def _print_costs(metrics: dict[str, Metrics]) -> None:
    table = _table("Cost, spot reclaims and deadlines")
    for key, header in COST_COLUMNS:
        table.add_column(header, justify="left" if key in ("run", "dollars_by_pool") else "right")
    for row in cost_rows(metrics):
        table.add_row(*(row[k] for k, _ in COST_COLUMNS))
    console.print(table)


def cost_markdown(metrics: dict[str, Metrics]) -> str:
    """The cost table (``COST_COLUMNS``) as Markdown."""
    header = [h for _, h in COST_COLUMNS]
    lines = [
        "| " + " | ".join(header) + " |",
        "|" + "|".join(["---", "---:", "---", *("---:" for _ in header[3:])]) + "|",
    ]
    for row in cost_rows(metrics):
        lines.append("| " + " | ".join(row[k] for k, _ in COST_COLUMNS) + " |")
    return "\n".join(lines) + "\n"


def _short(key: str, text: str) -> str:
    """Ratios to two decimals so the table fits an 80-column terminal."""
    if key in ("jain", "worst_ftf"):
        try:
            return f"{float(text):.2f}"
        except ValueError:
            return text
    return text

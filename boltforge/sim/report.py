"""A self-contained report comparing policies: four PNG plots, ``summary.json`` and ``index.html``.

Plots are drawn with matplotlib's Agg backend on standalone figures (no pyplot, no window, no
global figure state). The HTML page has inline CSS only and names its images by relative file
name, so the output folder can be moved or archived as a whole.
"""

from __future__ import annotations

import html
import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import matplotlib
import numpy as np
import numpy.typing as npt
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import LogFormatter

from boltforge.sim.costs import cost_table_html, plot_cost_vs_jct
from boltforge.sim.metrics import FloatArray, Metrics, TeamMetrics, to_json
from boltforge.sim.records import Sample, SimResult

matplotlib.use("Agg")

IntArray = npt.NDArray[np.int64]

MAX_POINTS = 2000
"""Most points drawn per JCT CDF line; longer series are thinned evenly (first and last kept)."""

BINS = 300
"""Steps per time-series line: each is the time-weighted mean over 1/BINS of the run."""

DAY_S = 86400.0
HOUR_S = 3600.0

PLOTS: tuple[tuple[str, str], ...] = (
    ("utilization.png", "Utilization over time"),
    ("queue.png", "Queue length over time"),
    ("jct_cdf.png", "Job completion time CDF"),
    ("fragmentation.png", "Fragmentation over time"),
)

COST_PLOT = ("cost_jct.png", "Dollars against average JCT")

COLUMNS: tuple[tuple[str, str], ...] = (
    ("policy", "Policy"),
    ("jobs", "Jobs"),
    ("finished", "Finished"),
    ("avg_jct_h", "Avg JCT (h)"),
    ("median_jct_h", "Median JCT (h)"),
    ("p99_jct_h", "P99 JCT (h)"),
    ("avg_queue_h", "Avg queue (h)"),
    ("util_allocated_pct", "Util alloc (%)"),
    ("util_productive_pct", "Util prod (%)"),
    ("util_contended_pct", "Util prod while jobs wait (%)"),
    ("preemptions", "Preemptions"),
    ("elastic_starts", "Elastic starts"),
    ("grows", "Grows"),
    ("shrinks", "Shrinks"),
    ("gpu_hours_lost", "GPU-h lost"),
    ("gpu_hours_slowed", "GPU-h slowed"),
    ("jain", "Jain"),
    ("worst_ftf", "Worst FTF"),
    ("dollars", "Dollars"),
)
"""``(key, header)`` of every column ``comparison_rows`` fills, in display order."""

ELASTIC_KEYS: tuple[str, ...] = ("elastic_starts", "grows", "shrinks")
"""The ``COLUMNS`` that count what elastic jobs did (all zero when no job is elastic)."""

TEAM_COLUMNS: tuple[str, ...] = (
    "Team",
    "Jobs",
    "Finished",
    "Avg JCT (h)",
    "Share received",
    "Entitlement",
    "Mean FTF",
    "GPU-hours",
    "Dollars",
)

MISSING = "-"
"""Shown for a statistic that has no value (e.g. JCT without finished jobs)."""


def write_report(
    results: Mapping[str, SimResult],
    metrics: Mapping[str, Metrics],
    out_dir: Path,
    title: str,
    command: str,
    cost: bool = False,
) -> Path:
    """Write the plots, ``summary.json`` and ``index.html`` into ``out_dir`` (created if
    missing, files overwritten) and return the path of ``index.html``. ``summary.json`` holds
    every metric and the comparison table as displayed (``table``), which the console shows.

    Plots draw every policy of ``results``; the tables and ``summary.json`` every policy of
    ``metrics``, in mapping order. ``cost``: also a cost, spot and deadline table and the plot
    ``cost_jct.png`` (dollars against average JCT per run).
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    plot_utilization(results, out_dir / "utilization.png")
    plot_queue(results, out_dir / "queue.png")
    plot_jct_cdf(results, out_dir / "jct_cdf.png")
    plot_fragmentation(results, out_dir / "fragmentation.png")
    if cost:
        plot_cost_vs_jct(metrics, out_dir / COST_PLOT[0])
    summary = {
        "title": title,
        "command": command,
        "policies": {name: to_json(m) for name, m in metrics.items()},
        "table": {"columns": COLUMNS, "rows": comparison_rows(metrics)},
    }
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    index = out_dir / "index.html"
    index.write_text(render_html(metrics, title, command, cost), encoding="utf-8")
    return index


def comparison_rows(metrics: Mapping[str, Metrics]) -> list[dict[str, str]]:
    """One row per policy, keyed by the ``COLUMNS`` keys, values formatted for display
    (hours and dollars to 2 decimals, percentages to 1, fairness to 3, ``MISSING`` if none)."""
    return [
        {
            "policy": name,
            "jobs": str(m.jobs),
            "finished": str(m.finished),
            "avg_jct_h": _hours(m.avg_jct_s),
            "median_jct_h": _hours(m.median_jct_s),
            "p99_jct_h": _hours(m.p99_jct_s),
            "avg_queue_h": _hours(m.avg_queue_s),
            "util_allocated_pct": f"{100 * m.util_allocated:.1f}",
            "util_productive_pct": f"{100 * m.util_productive:.1f}",
            "util_contended_pct": f"{100 * m.util_productive_contended:.1f}",
            "preemptions": str(m.preemptions),
            "elastic_starts": str(m.elastic_starts),
            "grows": str(m.grows),
            "shrinks": str(m.shrinks),
            "gpu_hours_lost": f"{m.gpu_hours_lost:.2f}",
            "gpu_hours_slowed": f"{m.gpu_hours_slowed:.2f}",
            "jain": _fixed(m.jain_fairness, 3),
            "worst_ftf": _fixed(m.worst_ftf, 3),
            "dollars": f"{m.dollars:,.2f}",
        }
        for name, m in metrics.items()
    ]


def team_rows(m: Metrics) -> list[list[str]]:
    """One row per team of ``m``, cells in ``TEAM_COLUMNS`` order, formatted for display."""
    return [_team_row(name, t) for name, t in m.teams.items()]


def _team_row(name: str, t: TeamMetrics) -> list[str]:
    return [
        name,
        str(t.jobs),
        str(t.finished),
        _hours(t.avg_jct_s),
        f"{100 * t.share_received:.1f}%",
        f"{100 * t.entitlement:.1f}%",
        _fixed(t.mean_ftf, 3),
        f"{t.gpu_hours:,.1f}",
        f"{t.dollars:,.2f}",
    ]


def _fixed(x: float | None, digits: int) -> str:
    return MISSING if x is None else f"{x:.{digits}f}"


def _hours(seconds: float | None) -> str:
    return MISSING if seconds is None else f"{seconds / HOUR_S:.2f}"


# Plots ----------------------------------------------------------------------------------------


def thin(n: int, max_points: int = MAX_POINTS) -> IntArray:
    """Indices of at most ``max_points`` evenly spread items of ``n``, first and last included."""
    if n <= max_points:
        return np.arange(n, dtype=np.int64)
    return np.unique(np.linspace(0, n - 1, max_points).round().astype(np.int64))


def binned(
    samples: Sequence[Sample], value: Callable[[Sample], float], bins: int = BINS
) -> tuple[FloatArray, FloatArray]:
    """``(edges, means)``: the sample series read as a step function (each value holds until
    the next sample) and averaged over ``bins`` equal spans from the first sample to the last;
    ``edges`` are the ``bins + 1`` span boundaries in days. Averaging keeps a plot readable
    where the values flip at every event, and weighs each value by how long it held."""
    ordered = sorted(samples, key=lambda s: s.t)
    if not ordered:
        return np.zeros(0, dtype=np.float64), np.zeros(0, dtype=np.float64)
    ts = np.array([s.t for s in ordered], dtype=np.float64)
    vs = np.array([value(s) for s in ordered], dtype=np.float64)
    lo, hi = float(ts[0]), float(ts[-1])
    if hi <= lo:
        return np.array([lo, lo + HOUR_S], dtype=np.float64) / DAY_S, vs[-1:]
    edges = np.linspace(lo, hi, bins + 1)
    area = np.concatenate(([0.0], np.cumsum(vs[:-1] * np.diff(ts))))  # integral up to each t
    held = np.clip(np.searchsorted(ts, edges, side="right") - 1, 0, len(ts) - 1)
    upto = area[held] + vs[held] * (edges - ts[held])
    means: FloatArray = np.diff(upto) / np.diff(edges)
    return edges / DAY_S, means


def _step_label(edges: FloatArray) -> str:
    """How long each averaged step lasts, for the plot title."""
    if len(edges) < 2:
        return ""
    hours = float(edges[1] - edges[0]) * DAY_S / HOUR_S
    return f" (mean per {hours:.1f} h)" if hours >= 0.1 else ""


def plot_utilization(results: Mapping[str, SimResult], path: Path) -> None:
    """Allocated (solid) and productive (dashed) fraction of the fleet over time per policy."""
    fig, ax = _figure("Utilization", "fraction of GPUs")
    label = ""
    for i, (name, r) in enumerate(results.items()):
        gpus = float(max(r.total_gpus, 1))
        edges, alloc = binned(r.samples, lambda s: float(s.allocated_gpus))
        _, prod = binned(r.samples, lambda s: s.productive_gpus)
        if len(alloc):
            ax.stairs(alloc / gpus, edges, color=f"C{i}", label=f"{name} allocated")
            ax.stairs(prod / gpus, edges, color=f"C{i}", ls="--", label=f"{name} productive")
            label = _step_label(edges)
    ax.set_title("Utilization" + label)
    ax.set_ylim(0, 1.05)
    _save(fig, ax, path)


def plot_queue(results: Mapping[str, SimResult], path: Path) -> None:
    """Queued jobs over time per policy."""
    _plot_samples(results, path, "Queue length", "queued jobs", lambda s: float(s.queued))


def plot_fragmentation(results: Mapping[str, SimResult], path: Path) -> None:
    """Fragmentation index (0 whole blocks .. 1 scattered) over time per policy."""
    _plot_samples(results, path, "Fragmentation", "fragmentation index", lambda s: s.fragmentation)


def plot_jct_cdf(results: Mapping[str, SimResult], path: Path) -> None:
    """Empirical CDF of job completion time (hours, log axis; floored at one second)."""
    fig, ax = _figure("Job completion time CDF", "fraction of finished jobs", "JCT (hours)")
    drawn = False
    for i, (name, r) in enumerate(results.items()):
        jct = [j.finish_s - j.submit_s for j in r.jobs if j.finish_s is not None]
        if not jct:
            continue
        hours = np.sort(np.maximum(np.asarray(jct, dtype=np.float64), 1.0)) / HOUR_S
        keep = thin(len(hours))
        frac = (keep + 1) / len(hours)
        ax.step(hours[keep], frac, where="post", color=f"C{i}", label=name)
        drawn = True
    if drawn:
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(LogFormatter())
        ax.xaxis.set_minor_formatter(LogFormatter(labelOnlyBase=False))
    else:
        ax.text(0.5, 0.5, "no finished jobs", ha="center", va="center", transform=ax.transAxes)
    ax.set_ylim(0, 1.02)
    _save(fig, ax, path)


def _plot_samples(
    results: Mapping[str, SimResult],
    path: Path,
    title: str,
    ylabel: str,
    value: Callable[[Sample], float],
) -> None:
    fig, ax = _figure(title, ylabel)
    label = ""
    for i, (name, r) in enumerate(results.items()):
        edges, means = binned(r.samples, value)
        if len(means):
            ax.stairs(means, edges, color=f"C{i}", label=name)
            label = _step_label(edges)
    ax.set_title(title + label)
    _save(fig, ax, path)


def _figure(title: str, ylabel: str, xlabel: str = "time (days)") -> tuple[Figure, Axes]:
    fig = Figure(figsize=(9, 4.5), layout="constrained")
    ax = fig.add_subplot()
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    return fig, ax


def _save(fig: Figure, ax: Axes, path: Path) -> None:
    """Legend (if anything is labelled) and a PNG without the software-URL metadata."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize="small")
    fig.savefig(path, dpi=110, metadata={"Software": None})


# HTML -----------------------------------------------------------------------------------------

_CSS = """
body { font-family: system-ui, sans-serif; margin: 2rem; color: #222; max-width: 1200px; }
h1 { font-size: 1.5rem; } h2 { font-size: 1.2rem; margin-top: 2rem; }
pre { background: #f4f4f4; padding: .75rem; overflow-x: auto; }
table { border-collapse: collapse; margin: .5rem 0; font-size: .9rem; }
th, td { border: 1px solid #ccc; padding: .25rem .5rem; }
td { text-align: right; } td:first-child, th { text-align: left; }
th { background: #eee; } details { margin: .5rem 0; } summary { cursor: pointer; }
img { max-width: 100%; display: block; margin: 1rem 0; }
"""


def render_html(
    metrics: Mapping[str, Metrics], title: str, command: str, cost: bool = False
) -> str:
    """The ``index.html`` page: title, reproducing command, comparison table, per-team tables
    and the plots (by relative file name); with ``cost``, the cost table and its plot first.
    All text is HTML-escaped."""
    e = html.escape
    rows = comparison_rows(metrics)
    comparison = _table([h for _, h in COLUMNS], [[row[k] for k, _ in COLUMNS] for row in rows])
    teams = "".join(
        f"<details><summary>{e(name)}</summary>{_table(list(TEAM_COLUMNS), team_rows(m))}"
        "</details>\n"
        for name, m in metrics.items()
    )
    plots = "".join(f'<img src="{e(f)}" alt="{e(alt)}">\n' for f, alt in PLOTS)
    costs = ""
    if cost:
        f, alt = COST_PLOT
        costs = (
            f"<h2>Cost, spot reclaims and deadlines</h2>\n{cost_table_html(metrics)}\n"
            f'<img src="{e(f)}" alt="{e(alt)}">\n'
        )
    return (
        "<!DOCTYPE html>\n<html lang='en'>\n<head>\n<meta charset='utf-8'>\n"
        f"<title>{e(title)}</title>\n<style>{_CSS}</style>\n</head>\n<body>\n"
        f"<h1>{e(title)}</h1>\n<p>Reproduce with:</p>\n<pre>{e(command)}</pre>\n"
        f"{costs}<h2>Comparison</h2>\n{comparison}\n<h2>Teams</h2>\n{teams}"
        f"<h2>Plots</h2>\n{plots}</body>\n</html>\n"
    )


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """An HTML table with escaped cells."""
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>\n" for row in rows
    )
    return f"<table>\n<thead><tr>{head}</tr></thead>\n<tbody>\n{body}</tbody>\n</table>"

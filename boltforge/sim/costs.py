"""Cost, spot and deadline figures of several runs side by side: rows, an HTML table, a plot.

Used when runs differ in their fleet (``bolt simulate --fleet A --fleet B``) or when a run has
spot reclaims or deadlines: the rows name each run and give its dollars (in total and by
pool), completion times, deadline hit rate and what spot reclaims cost it.
"""

from __future__ import annotations

import html
from collections.abc import Mapping
from pathlib import Path

from matplotlib.figure import Figure

from boltforge.sim.metrics import Metrics

COST_COLUMNS: tuple[tuple[str, str], ...] = (
    ("run", "Run"),
    ("dollars", "Dollars"),
    ("dollars_by_pool", "Dollars by pool"),
    ("avg_jct_h", "Avg JCT (h)"),
    ("p99_jct_h", "P99 JCT (h)"),
    ("avg_queue_h", "Avg queue (h)"),
    ("deadline_hit", "Deadlines met"),
    ("reclaims", "Reclaims"),
    ("jobs_reclaimed", "Runs reclaimed"),
    ("gpu_hours_lost_reclaim", "GPU-h lost to reclaims"),
)
"""``(key, header)`` of every column ``cost_rows`` fills, in display order."""

MISSING = "-"


def cost_rows(metrics: Mapping[str, Metrics]) -> list[dict[str, str]]:
    """One row per run, keyed by the ``COST_COLUMNS`` keys and formatted for display (dollars
    whole, hours to 2 decimals, the hit rate as a percentage with its counts)."""
    return [_row(name, m) for name, m in metrics.items()]


def _row(name: str, m: Metrics) -> dict[str, str]:
    return {
        "run": name,
        "dollars": f"{m.dollars:,.0f}",
        "dollars_by_pool": " ".join(f"{p} {d:,.0f}" for p, d in m.dollars_by_pool.items()),
        "avg_jct_h": _hours(m.avg_jct_s),
        "p99_jct_h": _hours(m.p99_jct_s),
        "avg_queue_h": _hours(m.avg_queue_s),
        "deadline_hit": hit_rate(m),
        "reclaims": str(m.reclaims),
        "jobs_reclaimed": str(m.jobs_reclaimed),
        "gpu_hours_lost_reclaim": f"{m.gpu_hours_lost_reclaim:,.1f}",
    }


def hit_rate(m: Metrics) -> str:
    """``"93.1% (4,410/4,737)"``, or ``MISSING`` when no job had a deadline."""
    if m.deadline_hit_rate is None:
        return MISSING
    return f"{100 * m.deadline_hit_rate:.1f}% ({m.deadlines_met:,}/{m.deadline_jobs:,})"


def _hours(seconds: float | None) -> str:
    return MISSING if seconds is None else f"{seconds / 3600.0:.2f}"


def cost_table_html(metrics: Mapping[str, Metrics]) -> str:
    """The rows of ``cost_rows`` as an HTML table, every cell escaped."""
    e = html.escape
    head = "".join(f"<th>{e(h)}</th>" for _, h in COST_COLUMNS)
    body = "".join(
        "<tr>" + "".join(f"<td>{e(row[k])}</td>" for k, _ in COST_COLUMNS) + "</tr>\n"
        for row in cost_rows(metrics)
    )
    return f"<table>\n<thead><tr>{head}</tr></thead>\n<tbody>\n{body}</tbody>\n</table>"


def plot_cost_vs_jct(metrics: Mapping[str, Metrics], path: Path) -> None:
    """One labelled point per run: total dollars against average JCT (hours)."""
    fig = Figure(figsize=(7, 4.5), layout="constrained")
    ax = fig.add_subplot()
    ax.set_title("Dollars against average job completion time")
    ax.set_xlabel("average JCT (hours)")
    ax.set_ylabel("dollars")
    for i, (name, m) in enumerate(metrics.items()):
        if m.avg_jct_s is None:
            continue
        x = m.avg_jct_s / 3600.0
        ax.scatter([x], [m.dollars], s=40)
        offset = (6, 4 if i % 2 == 0 else -12)
        ax.annotate(name, (x, m.dollars), textcoords="offset points", xytext=offset)
    ax.grid(True, alpha=0.3)
    ax.margins(0.25)
    fig.savefig(path, dpi=110, metadata={"Software": None})

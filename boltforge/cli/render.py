"""Placement decisions as JSON-ready dicts and as rich tables for people."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from boltforge.core.model.state import FleetState
from boltforge.core.model.topology import TopologyTree
from boltforge.core.placement.explain import describe
from boltforge.core.placement.fragmentation import Fragmentation, measure
from boltforge.core.placement.place import Decision, Outcome
from boltforge.ranges import ranges


def fragmentation_dict(f: Fragmentation) -> dict[str, Any]:
    return {
        "free_gpus": f.free_gpus,
        "index": round(f.index, 4),
        "rack_index": round(f.rack_index, 4),
        "largest_free_host": f.largest_free_host,
        "largest_free_rack": f.largest_free_rack,
        "largest_free_pod": f.largest_free_pod,
    }


def decision_dict(state: FleetState, decision: Decision, now: float, ms: float) -> dict[str, Any]:
    """The ``bolt place --json`` object: ``placed``, ``nodes``, ``cost``, ``explanation``, ..."""
    tree = state.tree
    p = decision.placement
    out: dict[str, Any] = {
        "placed": decision.outcome == Outcome.NOW,
        "outcome": decision.outcome.name.lower(),
        "nodes": p.nodes(tree) if p else {},
        "cost": round(p.cost.total, 6) if p else None,
        "hops": p.cost.hops if p else None,
        "explanation": describe(tree, p) if p else [],
        "reason": "; ".join(decision.reasons),
        "reasons": list(decision.reasons),
        "fixes": list(decision.fixes),
        "decided_ms": round(ms, 3),
    }
    if p:
        out["roles"] = [
            {
                "role": r.role,
                "gpu_type": r.gpu_type,
                "domain": {"level": r.level.name.lower(), "name": r.domain},
                "cost": r.cost.total,
                "hops": r.cost.hops,
                "alternatives": [
                    {
                        "level": a.level.name.lower(),
                        "domain": a.domain,
                        "cost": a.cost,
                        "hosts": a.hosts,
                    }
                    for a in r.alternatives
                ],
            }
            for r in p.roles
        ]
        out["rail_aligned"] = p.rail_aligned
        after = state.copy()
        if decision.outcome == Outcome.LATER:
            for job in decision.waits_for:
                after.release(job)
        before = measure(after)
        after.allocate(p.allocation())
        out["fragmentation"] = {
            "before": fragmentation_dict(before),
            "after": fragmentation_dict(measure(after)),
        }
    if decision.start_time is not None:
        out["start_in_s"] = round(decision.start_time - now, 3)
        out["waits_for"] = list(decision.waits_for)
    return out


def print_decision(console: Console, tree: TopologyTree, data: dict[str, Any]) -> None:
    """Tell a person where the job goes and why, or why not, when, and what to do."""
    outcome = data["outcome"]
    if outcome != "now":
        label = {
            "never": "[bold red]can never fit this fleet[/]",
            "later": "[bold yellow]does not fit now[/]",
        }.get(outcome, "[bold red]does not fit now[/]")
        console.print(label)
        for r in data["reasons"]:
            console.print(f"  - {r}", highlight=False, markup=False)
    if outcome in ("now", "later"):
        if outcome == "now":
            console.print("[bold green]placed (now)[/]")
        else:
            waits = data.get("waits_for") or []
            names = ", ".join(waits[:5]) + (f" and {len(waits) - 5} more" if len(waits) > 5 else "")
            console.print(
                f"[bold yellow]starts in {_human(data['start_in_s'])}[/], once {len(waits)} "
                f"running job(s) end ({names}), here:",
                highlight=False,
            )
        _print_placement(console, data)
    for f in data["fixes"]:
        console.print(f"  To fix: {f}", highlight=False, markup=False)
    console.print(f"[dim]decided in {data['decided_ms']:.1f} ms[/]")


def _print_placement(console: Console, data: dict[str, Any]) -> None:
    table = Table("hosts", "GPUs", box=None, pad_edge=False)
    for hosts, gpus in compact_nodes(data["nodes"]):
        table.add_row(hosts, gpus)
    console.print(table)
    for line in data["explanation"]:
        console.print(line, highlight=False, markup=False)
    before, after = data["fragmentation"]["before"], data["fragmentation"]["after"]
    console.print(
        f"fragmentation index {before['index']:.3f} -> {after['index']:.3f} "
        f"(largest free rack {before['largest_free_rack']} -> {after['largest_free_rack']} GPUs)",
        highlight=False,
    )


def compact_nodes(nodes: dict[str, list[int]]) -> list[tuple[str, str]]:
    """Rows for a placement table: hosts of one rack with the same GPUs share a row.

    ``h100-p0-r02-h00`` .. ``h100-p0-r02-h31`` on GPUs 0-7 become ``h100-p0-r02-h[00-31]``.
    """
    groups: dict[tuple[str, str], list[str]] = {}
    for host, gpus in nodes.items():
        prefix, _, suffix = host.rpartition("-h")
        key = (prefix if suffix.isdigit() else host, ranges(gpus) if gpus else "(CPU only)")
        groups.setdefault(key, []).append(suffix if suffix.isdigit() else "")
    rows = []
    for (prefix, gpu_text), suffixes in groups.items():
        if len(suffixes) == 1:
            name = f"{prefix}-h{suffixes[0]}" if suffixes[0] else prefix
        else:
            width = len(suffixes[0])
            spans = ranges([int(s) for s in suffixes]).split(",")
            name = (
                prefix
                + "-h["
                + ",".join(
                    "-".join(part.zfill(width) for part in span.split("-")) for span in spans
                )
                + "]"
            )
        rows.append((name, gpu_text))
    return rows


def _human(seconds: float) -> str:
    if seconds < 90:
        return f"~{seconds:.0f} s"
    if seconds < 5400:
        return f"~{seconds / 60:.0f} min"
    return f"~{seconds / 3600:.1f} h"

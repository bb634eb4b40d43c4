"""Formatting and rendering helpers of the ``bolt`` command: short times, compact host lists,
tables that fit narrow terminals, cost lines and placement output."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from rich.console import Console
from wire_kit import job_summary

from boltforge.cli.cost import budget_line, cost_table, savings_line, write_csv
from boltforge.cli.nodes import nodes_table, state_text
from boltforge.cli.queue import Row, fold, others_line, queue_table
from boltforge.cli.remote import ago, shorten, span, until
from boltforge.cli.render import _human, compact_nodes, decision_dict, print_decision
from boltforge.cli.top import bar, racks_table, summary
from boltforge.core.model.levels import Level
from boltforge.core.model.state import FleetState
from boltforge.core.placement.modes import place_now
from boltforge.testing.builders import make_fleet, make_gang
from boltforge.wire.cost import BudgetOut, CostReply, CostRow, SavingsOut
from boltforge.wire.jobs import FleetOut, JobSummary, NodeOut, TeamLoad

NOW = 1_800_000_000.0


def rendered(renderable: Any, width: int) -> list[str]:
    console = Console(record=True, width=width, color_system=None)
    console.print(renderable)
    return console.export_text().splitlines()


def plain(markup: str) -> str:
    return Console().render_str(markup).plain


# --- short times ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0 s"),
        (0.2, "1 s"),
        (45, "45 s"),
        (89, "89 s"),
        (90, "2 min"),
        (12 * 60, "12 min"),
        (89 * 60, "89 min"),
        (90 * 60, "1.5 h"),
        (3.5 * 3600, "3.5 h"),
        (47 * 3600, "47.0 h"),
        (48 * 3600, "2 d"),
        (10 * 86400, "10 d"),
        (-30, "30 s"),
    ],
)
def test_a_duration_reads_at_a_glance_in_the_right_unit(seconds: float, text: str) -> None:
    assert span(seconds) == text


@given(st.floats(min_value=0, max_value=1e9, allow_nan=False))
def test_a_duration_always_has_one_of_the_four_units(seconds: float) -> None:
    assert re.fullmatch(r"\d+(\.\d)? (s|min|h|d)", span(seconds))


def test_an_estimated_start_says_now_when_due_and_question_mark_when_unknown() -> None:
    assert until(None, NOW) == "?"
    assert until(NOW + 0.5, NOW) == "now"
    assert until(NOW - 600, NOW) == "now"
    assert until(NOW + 12 * 60, NOW) == "~12 min"
    assert ago(None, NOW) == "-"
    assert ago(NOW - 30, NOW) == "30 s ago"
    assert ago(NOW - 7200, NOW) == "2.0 h ago"


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "~0 s"), (45, "~45 s"), (600, "~10 min"), (7200, "~2.0 h"), (5400, "~1.5 h")],
)
def test_placement_start_times_are_approximate(seconds: float, text: str) -> None:
    assert _human(seconds) == text


@given(st.text(max_size=60), st.integers(min_value=1, max_value=40))
def test_shortened_text_fits_its_width_and_keeps_its_start(text: str, width: int) -> None:
    out = shorten(text, width)
    assert len(out) <= width
    if len(text) <= width:
        assert out == text
    else:
        assert out.endswith("…") and text.startswith(out[:-1])


# --- compact host lists -----------------------------------------------------------------------


def test_hosts_of_one_rack_on_the_same_gpus_share_a_row() -> None:
    eight = list(range(8))
    nodes = {f"h100-p0-r02-h{i:02d}": eight for i in (0, 1, 2, 3, 5)}
    nodes["h100-p0-r02-h06"] = [0, 1]
    nodes["h100-p0-r03-h00"] = eight
    assert compact_nodes(nodes) == [
        ("h100-p0-r02-h[00-03,05]", "0-7"),
        ("h100-p0-r02-h06", "0-1"),
        ("h100-p0-r03-h00", "0-7"),
    ]


def test_hosts_without_gpus_or_numbered_names_are_listed_as_they_are() -> None:
    assert compact_nodes({"login": [], "cpu-h1": []}) == [
        ("login", "(CPU only)"),
        ("cpu-h1", "(CPU only)"),
    ]


def _expand(name: str) -> set[str]:
    m = re.fullmatch(r"(.*)-h\[(.*)\]", name)
    if m is None:
        return {name}
    prefix, spans = m.groups()
    out = set()
    for part in spans.split(","):
        lo, _, hi = part.partition("-")
        width = len(lo)
        for i in range(int(lo), int(hi or lo) + 1):
            out.add(f"{prefix}-h{i:0{width}d}")
    return out


@given(
    st.dictionaries(
        st.tuples(st.integers(0, 3), st.integers(0, 40)),
        st.sampled_from([[0, 1, 2, 3, 4, 5, 6, 7], [0, 1], [4]]),
        min_size=1,
        max_size=30,
    )
)
def test_compact_rows_name_every_host_exactly_once(spots: dict[tuple[int, int], list[int]]) -> None:
    nodes = {f"a100-p0-r{r:02d}-h{h:02d}": gpus for (r, h), gpus in spots.items()}
    rows = compact_nodes(nodes)
    named: list[str] = []
    for name, gpus_text in rows:
        hosts = _expand(name)
        named += hosts
        assert {gpus_text} == {compact_nodes({h: nodes[h]})[0][1] for h in hosts}
    assert sorted(named) == sorted(nodes)


# --- placement output -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def placed() -> tuple[FleetState, dict[str, Any]]:
    tree = make_fleet(racks=2, hosts=4)
    state = FleetState(tree)
    decision = place_now(state, make_gang("train", gpus=16, required=Level.RACK))
    return state, decision_dict(state, decision, now=0.0, ms=1.25)


def test_a_placed_decision_as_json_has_the_documented_keys(
    placed: tuple[FleetState, dict[str, Any]],
) -> None:
    state, data = placed
    data = json.loads(json.dumps(data))
    keys = {"placed", "outcome", "nodes", "cost", "hops", "explanation", "reason", "fixes"}
    assert keys | {"roles", "fragmentation", "decided_ms"} <= data.keys()
    assert data["placed"] is True and data["outcome"] == "now"
    assert sum(len(g) for g in data["nodes"].values()) == 16
    racks = {host.rsplit("-h", 1)[0] for host in data["nodes"]}
    assert len(racks) == 1, "a rack-required gang stays in one rack"
    assert data["fragmentation"]["after"]["free_gpus"] == 64 - 16
    assert data["fragmentation"]["before"]["free_gpus"] == 64
    assert data["decided_ms"] == 1.25
    assert "start_in_s" not in data
    assert len(state.allocations) == 0, "deciding leaves the state as it was"


def test_a_placed_decision_prints_where_and_the_fragmentation_change(
    placed: tuple[FleetState, dict[str, Any]],
) -> None:
    state, data = placed
    console = Console(record=True, width=100, color_system=None)
    print_decision(console, state.tree, data)
    text = console.export_text()
    assert "placed (now)" in text
    assert re.search(r"h100-p0-r\d-h\[\d-\d\]\s+0-7", text)
    assert "fragmentation index" in text and "decided in 1.2 ms" in text
    assert "To fix" not in text


def test_a_gang_that_does_not_fit_now_says_why_and_has_no_nodes() -> None:
    tree = make_fleet(racks=1, hosts=2)
    state = FleetState(tree)
    decision = place_now(state, make_gang("huge", gpus=64))
    data = decision_dict(state, decision, now=0.0, ms=0.5)
    assert data["placed"] is False and data["nodes"] == {} and data["cost"] is None
    assert data["reasons"] and data["reason"] == "; ".join(data["reasons"])
    assert "fragmentation" not in data
    console = Console(record=True, width=100, color_system=None)
    print_decision(console, tree, data)
    text = console.export_text()
    assert "placed (now)" not in text
    assert all(r in text.replace("\n", " ") or r[:40] in text for r in data["reasons"])


def test_a_later_start_names_the_jobs_it_waits_for_and_when() -> None:
    data = {
        "outcome": "later",
        "reasons": ["needs 16 GPUs in one rack; the largest free rack has 8"],
        "start_in_s": 7200,
        "waits_for": [f"j{i}" for i in range(7)],
        "nodes": {"h100-p0-r00-h00": list(range(8)), "h100-p0-r00-h01": list(range(8))},
        "explanation": [],
        "fragmentation": {
            "before": {"index": 0.5, "largest_free_rack": 8},
            "after": {"index": 0.25, "largest_free_rack": 0},
        },
        "fixes": [],
        "decided_ms": 3.0,
    }
    console = Console(record=True, width=200, color_system=None)
    print_decision(console, make_fleet(), data)
    text = console.export_text()
    assert "does not fit now" in text
    assert "starts in ~2.0 h, once 7 running job(s) end (j0, j1, j2, j3, j4 and 2 more)" in text
    assert "h100-p0-r00-h[00-01]" in text
    assert "0.500 -> 0.250" in text and "8 -> 0 GPUs" in text


# --- queue, nodes, top ------------------------------------------------------------------------


def job(id_: str, state: str = "pending", **fields: Any) -> JobSummary:
    return job_summary(id_, state, NOW - 100, **fields)


def test_waiting_array_tasks_fold_into_one_row_at_the_first_tasks_place() -> None:
    jobs = [
        job("7"),
        job("42_3", array_task=3),
        job("9"),
        job("42_4", array_task=4),
        job("42_5", array_task=5),
        job("42_9", array_task=9),
        job("42_1", "running", array_task=1),
    ]
    assert [r.label for r in fold(jobs)] == ["7", "42_[3-5,9]", "9", "42_1"]
    assert [r.label for r in fold([job("8_2", array_task=2)])] == ["8_2"]


@pytest.mark.parametrize("width", [60, 80, 120])
def test_the_queue_table_fits_the_terminal_and_keeps_job_ids_whole(width: int) -> None:
    long = "a-very-long-job-name-" * 5
    rows = [
        Row(job("12345", name=long, team="team-with-a-long-name", reason="capacity " * 8), "12345"),
        Row(job("12346", "running", started_at=NOW - 600, nodes="h100-p0-r00-h[00-31]"), "12346"),
        Row(job("99_[3-99]", estimated_start=NOW + 720), "99_[3-99]"),
    ]
    lines = rendered(queue_table(rows, NOW), width)
    assert all(len(line) <= width for line in lines)
    text = "\n".join(lines)
    for label in ("12345", "12346", "99_[3-99]", "JOBID", "START"):
        assert label in text
    assert "10 min ago" in text and "~12 min" in text
    assert "…" in text, "the long name is cut, not wrapped"


def test_other_teams_are_shown_only_in_aggregate() -> None:
    others = [
        TeamLoad(team="nlp", pending=1, running=2, gpus=16),
        TeamLoad(team="cv", pending=0, running=0, gpus=0),
    ]
    assert others_line(others) == (
        "other teams: nlp 2 running (16 GPUs), 1 pending; cv 0 running (0 GPUs), 0 pending"
    )


def node(name: str, **fields: Any) -> NodeOut:
    base: dict[str, Any] = {
        "name": name,
        "pool": "h100",
        "gpu": "H100-80GB",
        "gpus": 8,
        "gpus_used": 4,
        "pod": "p0",
        "rack": "r00",
        "state": "ready",
        "last_heartbeat": NOW - 3,
    }
    return NodeOut.model_validate(base | fields)


@pytest.mark.parametrize(
    ("fields", "text"),
    [
        ({}, "ready"),
        ({"degraded": True}, "ready, degraded"),
        ({"degraded": True, "state": "dead"}, "dead"),
        ({"reclaim_at": NOW + 60}, "reclaim in 60 s"),
        ({"reclaim_at": NOW - 1}, "reclaimed"),
        ({"reclaim_at": NOW + 60, "state": "dead"}, "reclaimed"),
    ],
)
def test_a_nodes_state_says_degraded_or_when_it_is_reclaimed(
    fields: dict[str, Any], text: str
) -> None:
    assert state_text(node("n", **fields), NOW) == text


def test_the_nodes_table_shows_every_column_of_a_few_nodes_in_80_columns() -> None:
    nodes = [
        node("h100-p0-r00-h00", jobs=["17", "18"]),
        node("h100-p0-r00-h01", state="cordoned", jobs=[], last_heartbeat=None, gpus_used=0),
    ]
    lines = rendered(nodes_table(nodes, NOW), 80)
    assert all(len(line) <= 80 for line in lines)
    text = "\n".join(lines)
    for word in ("NODE", "POOL", "USED", "HEARTBEAT", "h100-p0-r00-h00", "4/8", "0/8", "3 s ago"):
        assert word in text
    assert "17,18" in text and "cordoned" in text


def test_a_node_running_many_jobs_still_shows_its_name_and_gpus_in_use_in_80_columns() -> None:
    nodes = [node("h100-p0-r00-h00", jobs=[f"job-{i}" for i in range(30)])]
    lines = rendered(nodes_table(nodes, NOW), 80)
    assert all(len(line) <= 80 for line in lines)
    text = "\n".join(lines)
    assert "h100-p0-r00-h00" in text and "4/8" in text and "USED" in text
    assert "30: job-0" in text


@given(st.integers(0, 64), st.integers(1, 64), st.integers(1, 32))
def test_a_usage_bar_shows_the_used_share_in_at_most_its_cells(
    used: int, total: int, cells: int
) -> None:
    used = min(used, total)
    text = plain(bar(used, total, cells))
    assert len(text) == min(cells, total)
    full = text.count("█")
    assert abs(full / len(text) - used / total) <= 0.5 / len(text) + 1e-9


def test_an_empty_usage_bar_is_dotted() -> None:
    assert plain(bar(0, 0, 5)) == "·····"


def test_a_big_fleet_shows_one_bar_per_rack() -> None:
    nodes = [node(f"n{r}-{h}", rack=f"r{r:02d}", gpus_used=8) for r in range(5) for h in range(20)]
    text = "\n".join(rendered(racks_table(nodes), 120))
    assert text.count("20 nodes") == 5 and "160/160" in text and "20 ready" in text
    small = "\n".join(rendered(racks_table(nodes[:3]), 120))
    assert "n0-0" in small and "nodes" not in small.replace("NODE", "")


def test_the_top_summary_gives_use_as_a_share_and_the_last_pass() -> None:
    fleet = FleetOut(
        nodes=4,
        nodes_ready=3,
        gpus=32,
        gpus_used=8,
        jobs_running=1,
        jobs_pending=2,
        fragmentation=0.1234,
        last_cycle_ms=None,
        cycles=0,
    )
    assert summary(fleet) == (
        "nodes 3/4 ready   GPUs 8/32 used (25%)   jobs 1 running, 2 pending\n"
        "fragmentation 0.123   last cycle - (0 passes)"
    )
    empty = fleet.model_copy(update={"gpus": 0, "gpus_used": 0, "last_cycle_ms": 2.25})
    assert "(-)" in summary(empty) and "last cycle 2.2 ms" in summary(empty)


# --- cost -------------------------------------------------------------------------------------


def cost_reply(by: str = "team") -> CostReply:
    rows = [
        CostRow(
            key="research",
            team="research",
            project="llm-pretraining-long-name",
            job="101",
            name="a-very-long-job-name-that-does-not-fit",
            jobs=3,
            gpu_hours=1234.5,
            dollars=3086.25,
            productive_gpu_hours=1000.0,
            productive_dollars=2500.0,
        ),
    ]
    others = [CostRow(key="nlp", team="nlp", jobs=1, gpu_hours=10, dollars=25)]
    total = CostRow(
        key="total",
        team="",
        jobs=4,
        gpu_hours=1244.5,
        dollars=3111.25,
        productive_gpu_hours=1000.0,
        productive_dollars=2500.0,
    )
    return CostReply.model_validate(
        {
            "by": by,
            "since": NOW - 86400,
            "until": NOW,
            "rows": rows,
            "others": others,
            "total": total,
        }
    )


@pytest.mark.parametrize("by", ["team", "project", "job"])
def test_the_cost_table_fits_80_columns_and_keeps_the_numbers_whole(by: str) -> None:
    lines = rendered(cost_table(cost_reply(by)), 80)
    assert all(len(line) <= 80 for line in lines)
    text = "\n".join(lines)
    for number in ("1,234.5", "$3,086.25", "$2,500.00", "81%", "TOTAL", "$3,111.25"):
        assert number in text
    if by != "team":
        assert "(other team)" in text


def test_cost_csv_has_one_row_per_group_and_six_decimals(
    capsys: pytest.CaptureFixture[str],
) -> None:
    write_csv(cost_reply("job"))
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("group,team,project,job,name,jobs,gpu_hours")
    assert len(lines) == 3, "groups and other teams, no total"
    assert lines[1].split(",")[6:8] == ["1234.500000", "3086.250000"]


@pytest.mark.parametrize(
    ("state", "spent", "tail"),
    [
        ("ok", 5000.0, "(50%)"),
        ("warn", 8120.0, "(81%), past the soft limit of $8,000.00"),
        ("over", 10000.0, "(100%), at the hard limit: only production work is admitted"),
    ],
)
def test_a_budget_line_says_how_much_is_spent_and_where_it_stands(
    state: str, spent: float, tail: str
) -> None:
    b = BudgetOut.model_validate(
        {
            "team": "nlp",
            "month": "2026-11",
            "monthly": 10000.0,
            "soft": 8000.0,
            "spent": spent,
            "state": state,
        }
    )
    assert plain(budget_line(b)) == f"budget nlp 2026-11: ${spent:,.2f} of $10,000.00 {tail}"


@pytest.mark.parametrize(("saved", "shown"), [(24.0, "$24.00"), (-12.5, "-$12.50")])
def test_savings_show_a_minus_sign_when_the_fleet_cost_more(saved: float, shown: str) -> None:
    s = SavingsOut(
        since=NOW,
        hours=2.0,
        static_dollars=128.0,
        shared_dollars=128.0 - saved,
        saved_dollars=saved,
    )
    line = savings_line(s)
    assert plain(line).startswith(f"saved vs static pools: {shown} (static $128.00")
    assert ("[red]" in line) == (saved < 0)

"""The policy comparison report: plots, summary.json and a self-contained index.html."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sim_kit import build, sim

from boltforge.cli.simulate import MARKDOWN_COLUMNS, markdown_table
from boltforge.sim.metrics import compute
from boltforge.sim.records import Sample, SimResult
from boltforge.sim.report import (
    COLUMNS,
    DAY_S,
    MAX_POINTS,
    binned,
    comparison_rows,
    thin,
    write_report,
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
PLOTS = ("utilization.png", "queue.png", "jct_cdf.png", "fragmentation.png")
COMMAND = "bolt sim run --trace tiny.csv --policy fifo --policy tiresias --seed 7"


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One report written once for the module (rendering is the slow part)."""
    tmp_path = tmp_path_factory.mktemp("report")
    results = {"fifo": sim("fifo", 1.5), "tiresias": sim("tiresias", 1.1, n_samples=5000)}
    return write_report(results, build(results), tmp_path / "out", "Tiny <trace>", COMMAND)


def test_write_report_creates_four_non_empty_pngs(report: Path) -> None:
    for name in PLOTS:
        data = (report.parent / name).read_bytes()
        assert data.startswith(PNG_MAGIC), name


def test_write_report_returns_index_html_in_a_created_folder(report: Path) -> None:
    assert report.name == "index.html" and report.is_file()


def test_summary_json_holds_every_policy_the_title_and_the_command(report: Path) -> None:
    summary = json.loads((report.parent / "summary.json").read_text(encoding="utf-8"))
    assert set(summary["policies"]) == {"fifo", "tiresias"}
    assert summary["title"] == "Tiny <trace>"
    assert summary["command"] == COMMAND
    assert summary["policies"]["fifo"]["finished"] == 6


def test_index_html_names_every_policy_and_the_command_and_links_nothing_external(
    report: Path,
) -> None:
    page = report.read_text(encoding="utf-8")
    assert "fifo" in page and "tiresias" in page
    assert f"<pre>{COMMAND}</pre>" in page
    assert "http://" not in page and "https://" not in page
    for name in PLOTS:
        assert f'src="{name}"' in page


def test_index_html_escapes_text(report: Path) -> None:
    page = report.read_text(encoding="utf-8")
    assert "Tiny &lt;trace&gt;" in page and "<trace>" not in page


def test_index_html_has_a_collapsed_team_table_per_policy(report: Path) -> None:
    page = report.read_text(encoding="utf-8")
    assert page.count("<details>") == 2
    assert "infra" in page and "ml" in page


def test_comparison_rows_have_stable_keys_and_formatted_values() -> None:
    results = {"fifo": sim("fifo", 1.5)}
    (row,) = comparison_rows(build(results))
    assert list(row) == [key for key, _ in COLUMNS]
    assert row["policy"] == "fifo" and row["jobs"] == "6" and row["finished"] == "6"
    assert all(isinstance(v, str) and v for v in row.values())


def test_empty_results_still_produce_a_report(tmp_path: Path) -> None:
    results = {"idle": SimResult(policy="idle", fleet="none", total_gpus=0)}
    index = write_report(results, build(results), tmp_path, "empty", "bolt sim run")
    for name in PLOTS:
        assert (tmp_path / name).read_bytes().startswith(PNG_MAGIC)
    assert "idle" in index.read_text(encoding="utf-8")


def test_long_series_are_thinned_to_at_most_max_points_keeping_both_ends() -> None:
    keep = thin(100_000)
    assert len(keep) <= MAX_POINTS
    assert keep[0] == 0 and keep[-1] == 99_999
    assert list(thin(3)) == [0, 1, 2]


def test_markdown_table_has_a_row_per_policy_with_the_report_figures() -> None:
    metrics = {"fifo": compute(sim("fifo", 2.0)), "default": compute(sim("default", 1.0))}
    lines = markdown_table(metrics).splitlines()
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    assert header == [h for _, h in MARKDOWN_COLUMNS] and header[0] == "Policy"
    assert lines[1].startswith("|---|---:")
    rows = comparison_rows(metrics)
    for line, row in zip(lines[2:], rows, strict=True):
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert cells == [row[k] for k, _ in MARKDOWN_COLUMNS]
    assert [line.split("|")[1].strip() for line in lines[2:]] == ["fifo", "default"]


def test_time_series_are_averaged_over_equal_spans_weighted_by_how_long_each_value_held() -> None:
    # 2 on [0, 10), 10 on [10, 70), 5 on [70, 100]
    samples = [
        Sample(t=t, allocated_gpus=v, productive_gpus=v, queued=0, fragmentation=0.0)
        for t, v in ((0.0, 2), (10.0, 10), (70.0, 5), (100.0, 5))
    ]
    edges, means = binned(list(reversed(samples)), lambda s: float(s.allocated_gpus), bins=2)
    assert list(edges * DAY_S) == pytest.approx([0.0, 50.0, 100.0])
    # [0, 50]: 2*10 + 10*40 = 420 over 50; [50, 100]: 10*20 + 5*30 = 350 over 50
    assert list(means) == pytest.approx([8.4, 7.0])
    assert len(binned([], lambda s: 0.0)[1]) == 0

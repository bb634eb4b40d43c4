"""What is left of the ``bolt`` command once the job, fleet and service commands are tested:
``bolt tour`` tells the documented story step by step; ``bolt top`` refreshes until Ctrl-C;
``bolt admin``'s sizes, row tables, JSON and Ctrl-C; and the parts of ``bolt demo --forge``
that talk to a server, run against the real app in-process (a server that requires images
refuses the plain job; where each job ran and its artifacts)."""

from __future__ import annotations

import hashlib
import io
import re
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
from cli_app_kit import app_client, clean_exit, serve_cli
from control_kit import AGENT, Fleet, make_spec
from rich.console import Console
from rich.progress import Progress
from typer.testing import CliRunner, Result

import boltforge.cli.admin as admin
import boltforge.cli.forgedemo as forgedemo
import boltforge.cli.top as top_module
from boltforge.cli.demo import DemoError
from boltforge.cli.main import app
from boltforge.client import Client
from boltforge.control.nodes.agents import LeaseTerms
from boltforge.control.store.backups import BackupSummary, RestoreSummary
from boltforge.spec.images import ImagePolicy
from boltforge.spec.teams import TeamsSpec

runner = CliRunner()
DAY = 86400.0


def bolt(*args: str | Path) -> Result:
    return runner.invoke(app, [str(a) for a in args])


# --- bolt tour --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tour() -> str:
    """The tour's output once, in a 100-column terminal."""
    patch = pytest.MonkeyPatch()
    patch.setenv("COLUMNS", "100")
    try:
        result = bolt("tour")
    finally:
        patch.undo()
    clean_exit(result, 0)
    return result.stdout


def steps(text: str) -> dict[int, str]:
    """Each numbered step's text, by its number."""
    parts = re.split(r"^(\d+)\. ", text, flags=re.MULTILINE)
    return {int(n): body for n, body in zip(parts[1::2], parts[2::2], strict=True)}


def test_the_tour_has_its_ten_steps_in_order(tour: str) -> None:
    assert list(steps(tour)) == list(range(1, 11))
    assert tour.startswith("lab: 32 GPUs on 4 hosts, 2 racks, 1 pods")


@pytest.mark.parametrize(
    ("step", "outcome", "where"),
    [
        (1, "placed (now)", "inside host h100-p0-r00-h00"),
        (2, "placed (now)", "inside rack h100-p0-r01"),
        (3, "placed (now)", "h100-p0-r00-h01  0-3"),
        (4, "placed (now)", "h100-p0-r00-h01  4-7"),
        (5, "does not fit now", "starts in ~60 min, once 1 running job(s) end (train-16)"),
        (7, "placed (now)", "data-loader: 4 replica(s)"),
        (8, "can never fit this fleet", "To fix: lower min_gpu_memory_gb to 80 or less"),
        (10, "placed (now)", "inside rack"),
    ],
)
def test_each_placement_step_lands_where_its_title_says(
    tour: str, step: int, outcome: str, where: str
) -> None:
    body = steps(tour)[step]
    assert body.splitlines()[1] == outcome
    assert where in body


def test_the_exact_fit_step_leaves_no_fragmentation(tour: str) -> None:
    assert "fragmentation index 1.000 -> 0.000" in steps(tour)[4]


def test_the_big_fleet_is_shown_at_seventy_percent(tour: str) -> None:
    body = steps(tour)[9]
    assert "h100-16k: 16,384 GPUs on 2,048 hosts, 64 racks, 8 pods" in body
    found = re.search(r" (\d+)/16384 ", body)
    assert found is not None, body
    assert 0.25 < int(found.group(1)) / 16384 < 0.35, "about 30% of the GPUs are free"


# --- bolt top, live ---------------------------------------------------------------------------


@pytest.fixture
def small_fleet(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Fleet]:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.delenv("BOLT_SERVER", raising=False)
    monkeypatch.delenv("BOLT_CA", raising=False)
    monkeypatch.setenv("BOLT_TOKEN", "adm")
    monkeypatch.setenv("COLUMNS", "100")
    fleet = Fleet(tmp_path / "fleet", hosts=2, terms=LeaseTerms(2.0, DAY, DAY))
    fleet.clock.now = time.time()
    with fleet:
        serve_cli(fleet, monkeypatch)
        yield fleet


def test_top_redraws_every_interval_until_ctrl_c_and_exits_0(
    small_fleet: Fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    waits: list[float] = []

    def sleep(seconds: float) -> None:
        waits.append(seconds)
        if len(waits) == 3:
            raise KeyboardInterrupt

    monkeypatch.setattr(top_module, "time", SimpleNamespace(sleep=sleep, strftime=time.strftime))
    result = bolt("top", "--interval", "0.5")
    clean_exit(result, 0)
    assert waits == [0.5, 0.5, 0.5]
    assert "GPUs 0/16 used (0%)" in result.stdout


# --- bolt admin -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("n", "shown"),
    [
        (0, "0 B"),
        (812, "812 B"),
        (1023, "1023 B"),
        (1024, "1.0 KiB"),
        (2662, "2.6 KiB"),
        (41 * 1024**2, "41.0 MiB"),
        (3 * 1024**3, "3.0 GiB"),
        (5 * 1024**4, "5120.0 GiB"),
    ],
)
def test_a_backup_size_reads_at_a_glance(n: int, shown: str) -> None:
    assert admin.size(n) == shown


def test_the_rows_table_lists_each_table_then_the_total() -> None:
    out = io.StringIO()
    Console(file=out, width=60, color_system=None).print(
        admin.rows_table({"jobs": 2, "nodes": 4, "tokens": 3})
    )
    lines = [line.split() for line in out.getvalue().splitlines() if line.strip()]
    assert lines[0] == ["TABLE", "ROWS"]
    assert lines[1:4] == [["jobs", "2"], ["nodes", "4"], ["tokens", "3"]]
    assert lines[-1] == ["total", "9"]


def test_the_json_of_a_summary_names_file_and_db_first_and_rows_last() -> None:
    wrote = BackupSummary("/b/x.bak.gz", "sqlite:///s.db", "abc1", "2027-01-15", {"jobs": 2}, 900)
    data = admin._as_json(wrote)
    assert list(data) == ["file", "db", "revision", "created_at", "tables", "bytes", "rows"]
    assert (data["file"], data["db"], data["rows"]) == ("/b/x.bak.gz", "sqlite:///s.db", 2)
    loaded = RestoreSummary(
        "/b/x.bak.gz", "sqlite:///t.db", "abc1", "2027", {"a": 1, "b": 2}, 5, "z"
    )
    assert admin._as_json(loaded)["rows"] == 3 and admin._as_json(loaded)["replaced"] == 5


def test_progress_keeps_one_bar_per_table() -> None:
    with Progress(console=Console(file=io.StringIO()), disable=True) as bars:
        table_bars = admin._TableBars(bars)
        table_bars("jobs", 0, 10)
        table_bars("jobs", 10, 10)
        table_bars("nodes", 3, 4)
        assert list(table_bars.tasks) == ["jobs", "nodes"]
        done = {t.description: (t.completed, t.total) for t in bars.tasks}
    assert done == {"jobs": (10, 10), "nodes": (3, 4)}


@pytest.mark.parametrize("verb", ["backup", "restore"])
def test_ctrl_c_during_a_backup_or_restore_exits_130(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, verb: str
) -> None:
    def interrupted(*_: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(admin, verb, interrupted)
    result = bolt("admin", verb, tmp_path / "x.bak.gz", "--db", f"sqlite:///{tmp_path}/s.db")
    assert result.exit_code == 130
    assert "Traceback" not in result.output and result.stdout == ""


def test_admin_without_a_subcommand_lists_backup_and_restore() -> None:
    result = bolt("admin")
    assert "backup" in result.output and "restore" in result.output
    assert "Traceback" not in result.output


# --- bolt demo --forge, against a server ------------------------------------------------------


@pytest.fixture
def image_fleet(tmp_path: Path) -> Iterator[Fleet]:
    """A server that accepts containerized work only (``--require-image``)."""
    teams = TeamsSpec(images=ImagePolicy(require=True))
    fleet = Fleet(tmp_path / "fleet", hosts=2, teams=teams, terms=LeaseTerms(2.0, DAY, DAY))
    with fleet:
        yield fleet


def admin_client(fleet: Fleet) -> Client:
    return app_client(fleet, "adm")


def recording() -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, width=200, color_system=None), out


def test_the_plain_job_is_refused_at_submit_with_the_field(image_fleet: Fleet) -> None:
    console, out = recording()
    with admin_client(image_fleet) as client:
        forgedemo._refused(console, client)
    lines = out.getvalue().splitlines()
    assert lines[0] == "plain.yaml (no image) is refused at submit:"
    assert len(lines) > 1 and all(line.startswith("  ") for line in lines[1:])
    assert "image" in out.getvalue()
    jobs = image_fleet.http.get("/v1/jobs", headers={"Authorization": "Bearer adm"})
    assert jobs.json()["jobs"] == []


def test_a_server_that_takes_the_plain_job_fails_the_forge_demo(tmp_path: Path) -> None:
    with Fleet(tmp_path / "open", hosts=1) as fleet:
        console, _ = recording()
        with admin_client(fleet) as client, pytest.raises(DemoError, match="without an image"):
            forgedemo._refused(console, client)


def test_a_job_is_done_once_it_ended_and_brought_its_artifacts(image_fleet: Fleet) -> None:
    spec = make_spec("train", 8, image="localhost/boltforge-train:latest")
    job = image_fleet.submit(spec)
    image_fleet.start_everything()
    [(node, rep)] = [(n, r) for n in image_fleet.nodes.values() for r in n.to_run()]
    with admin_client(image_fleet) as client:
        assert not forgedemo._done(client, job), "it still runs"
        node.exit(rep, 0)
        image_fleet.settle()
        assert not forgedemo._done(client, job), "it succeeded but its artifacts are not in"
        data = b"model weights"
        url = f"/v1/agents/{node.name}/artifacts/{rep.replica}/model.bin"
        sha = hashlib.sha256(data).hexdigest()
        r = image_fleet.http.put(url, content=data, headers={**AGENT, "X-Sha256": sha})
        assert r.status_code == 201, r.text
        assert forgedemo._done(client, job)
        console, out = recording()
        assert forgedemo._where(console, client, job)
    text = out.getvalue()
    assert text.startswith(f"job {job} train: succeeded on {node.name}; ")
    assert f"  artifact 0/model.bin: {len(data)} bytes, sha256 {sha[:16]}…" in text


def test_a_failed_job_is_done_without_artifacts_but_not_a_success(image_fleet: Fleet) -> None:
    job = image_fleet.submit(make_spec("batch", 8, image="localhost/boltforge-train:latest"))
    image_fleet.start_everything()
    image_fleet.finish(job, code=3)
    with admin_client(image_fleet) as client:
        assert forgedemo._done(client, job)
        console, out = recording()
        assert not forgedemo._where(console, client, job)
    assert f"job {job} batch: failed on " in out.getvalue()

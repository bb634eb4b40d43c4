"""The read-only views of the ``bolt`` command (``queue``, ``status``, ``explain``, ``logs``,
``nodes``, ``top``, ``cost``, ``artifacts``) run as a user types them, against the real server
app in-process (see cli_app_kit): what a job's life on the fleet looks like in each view, the
documented ``--json`` keys, narrow terminals, and refusals that exit cleanly.

One fleet serves the whole module, built once: four 8-GPU hosts in two racks; ``train``
(research, 16 GPUs) runs on rack r0 and reported step 120; ``tiny`` (nlp, 8 GPUs) ran for
half an hour, printed two lines and succeeded; ``wide`` (research, 32 GPUs) waits for room.
"""

from __future__ import annotations

import csv
import io
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cli_app_kit import Connections, clean_exit, fits, serve_cli
from control_kit import Fleet, make_spec
from typer.testing import CliRunner, Result

from boltforge.cli.common import console
from boltforge.cli.cost import CSV_COLUMNS
from boltforge.cli.main import app
from boltforge.control.nodes.agents import LeaseTerms
from boltforge.wire.jobs import JobDetail, NodeList

runner = CliRunner()
DAY = 86400.0  # node leases outlast the hours the scenario skips
EXPLAIN_KEYS = {
    "id",
    "state",
    "nodes",
    "explanation",
    "reason",
    "position",
    "estimated_start",
    "waiting",
    "outlook",
}


@dataclass(frozen=True)
class World:
    """The module's fleet and what was done on it."""

    fleet: Fleet
    train: str
    tiny: str
    wide: str
    member: str  # a member token of team nlp
    viewer: str


def advance(fleet: Fleet, seconds: float) -> None:
    """Move server time on; every node heartbeats at the new time."""
    fleet.clock.advance(seconds)
    for node in fleet.nodes.values():
        assert node.heartbeat() == 200
    fleet.settle()


def token(fleet: Fleet, name: str, role: str, team: str | None = None) -> str:
    r = fleet.post("/v1/tokens", {"name": name, "role": role, "team": team})
    assert r.status_code in (200, 201), r.text
    made: str = r.json()["token"]
    return made


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    fleet = Fleet(tmp_path_factory.mktemp("views"), hosts=4, terms=LeaseTerms(2.0, DAY, DAY))
    fleet.clock.now = time.time() - 7200  # two hours of history, all of it in the past
    with fleet:
        train = fleet.submit(make_spec("train", 16))
        fleet.start_everything()
        tiny = fleet.submit(make_spec("tiny", 8, team="nlp"))
        fleet.start_everything()
        [(node, rep)] = [(n, r) for n in fleet.nodes.values() for r in n.to_run() if r.job == tiny]
        chunk = {"replica": rep.replica, "job": tiny, "epoch": rep.epoch, "seq": 0}
        node.report(logs=[{**chunk, "data": "hello\nworld\n"}])
        advance(fleet, 1800)
        node.exit(rep, 0)
        fleet.settle()
        advance(fleet, 1800)
        lead = fleet.nodes["host-0"]  # rank 0 of train, as `bolt status` shows
        [first] = [r for r in lead.to_run() if r.job == train]
        step = {"replica": first.replica, "job": train, "epoch": first.epoch, "rank": 0}
        lead.report(progress=[{**step, "step": 120, "at": fleet.clock(), "step_time_s": 0.5}])
        wide = fleet.submit(make_spec("wide", 32))
        member = token(fleet, "nia", "member", "nlp")
        viewer = token(fleet, "vic", "viewer")
        yield World(fleet, train, tiny, wide, member, viewer)


@pytest.fixture
def served(world: World, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Connections]:
    """The CLI pointed at the module's fleet with the admin token in BOLT_TOKEN, in an
    80-column terminal with no saved client config."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.delenv("BOLT_SERVER", raising=False)
    monkeypatch.delenv("BOLT_CA", raising=False)
    monkeypatch.setenv("BOLT_TOKEN", "adm")
    monkeypatch.setenv("COLUMNS", "80")
    yield serve_cli(world.fleet, monkeypatch)


def bolt(*args: str) -> Result:
    return runner.invoke(app, list(args))


def as_json(result: Result) -> Any:
    clean_exit(result, 0)
    return json.loads(result.stdout)


def narrow(monkeypatch: pytest.MonkeyPatch, width: int) -> None:
    monkeypatch.setenv("COLUMNS", str(width))
    assert console.width == width, "the console must follow COLUMNS for this test to mean much"


# --- queue ------------------------------------------------------------------------------------


def test_queue_lists_the_live_jobs_in_order_as_json(world: World, served: Connections) -> None:
    data = as_json(bolt("queue", "--json"))
    assert set(data) == {"jobs", "others"}
    assert [j["id"] for j in data["jobs"]] == [world.train, world.wide]
    by_id = {j["id"]: j for j in data["jobs"]}
    assert by_id[world.train]["state"] == "running"
    assert by_id[world.train]["nodes"] == "host-[0-1]"
    assert (by_id[world.wide]["state"], by_id[world.wide]["reason"]) == ("pending", "capacity")
    assert data["others"] == []  # the admin sees every team's jobs


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("--all",), ["train", "tiny", "wide"]),
        (("--state", "succeeded"), ["tiny"]),
        (("--state", "pending,running"), ["train", "wide"]),
        (("--team", "nlp", "--all"), ["tiny"]),
        (("--team", "vision"), []),
    ],
    ids=["all", "one state", "two states", "team and all", "a team with no jobs"],
)
def test_queue_filters_choose_the_jobs_listed(
    served: Connections, args: tuple[str, ...], expected: list[str]
) -> None:
    data = as_json(bolt("queue", "--json", *args))
    assert [j["name"] for j in data["jobs"]] == expected


def test_queue_table_shows_where_it_runs_and_why_it_waits(
    world: World, served: Connections
) -> None:
    result = bolt("queue")
    clean_exit(result, 0)
    rows = {line.split()[0]: line for line in result.stdout.splitlines()[1:]}
    assert set(rows) == {world.train, world.wide}
    assert "running" in rows[world.train] and "host-[0-1]" in rows[world.train]
    assert "pending" in rows[world.wide] and "capacity" in rows[world.wide]


@pytest.mark.parametrize("width", [72, 80])
def test_queue_fits_a_narrow_terminal_and_keeps_ids_whole(
    world: World, served: Connections, monkeypatch: pytest.MonkeyPatch, width: int
) -> None:
    narrow(monkeypatch, width)
    result = bolt("queue", "--all")
    clean_exit(result, 0)
    assert fits(result.stdout, width), result.stdout
    ids = [line.split()[0] for line in result.stdout.splitlines()[1:]]
    assert ids == [world.train, world.tiny, world.wide]


def test_a_member_sees_other_teams_only_as_totals(world: World, served: Connections) -> None:
    data = as_json(bolt("queue", "--json", "--token", world.member))
    assert data["jobs"] == []
    assert data["others"] == [{"team": "research", "pending": 1, "running": 1, "gpus": 16}]
    shown = bolt("queue", "--token", world.member)
    clean_exit(shown, 0)
    assert "no jobs" in shown.stdout
    assert "other teams: research 1 running (16 GPUs), 1 pending" in shown.stdout
    assert "train" not in shown.stdout and "wide" not in shown.stdout


# --- status, explain and logs -----------------------------------------------------------------


def test_status_json_is_the_whole_job_detail(world: World, served: Connections) -> None:
    detail = JobDetail.model_validate(as_json(bolt("status", world.train, "--json")))
    assert (detail.id, detail.state, detail.last_step) == (world.train, "running", 120)
    assert sorted(r.node for r in detail.placement) == ["host-0", "host-1"]
    assert [e.kind for e in detail.events][:2] == ["queued", "placed"]
    assert detail.gpu_hours == pytest.approx(16.0, abs=0.01)  # 16 GPUs for an hour so far


def test_status_of_a_running_job_gives_where_step_and_meter(
    world: World, served: Connections
) -> None:
    result = bolt("status", world.train)
    clean_exit(result, 0)
    lines = result.stdout.splitlines()
    assert lines[0] == f"job {world.train} train (research, normal): running on host-[0-1]"
    assert "16 GPU(s) in 2 replica(s)" in lines[1] and "step 120" in lines[1]
    assert "16.000 GPU-h" in lines[1] and "exit code" not in lines[1]
    ranks = [line.split()[:3] for line in lines if line.split()[:1] in (["0"], ["1"])]
    assert ranks == [["0", "worker", "host-0"], ["1", "worker", "host-1"]]
    assert "timeline" in lines


def test_status_of_a_finished_job_gives_its_end_and_exit_code(
    world: World, served: Connections
) -> None:
    result = bolt("status", world.tiny)
    clean_exit(result, 0)
    head, facts = result.stdout.splitlines()[:2]
    assert head == f"job {world.tiny} tiny (nlp, normal): succeeded"
    assert "ended 1.5 h ago" in facts and "exit code 0" in facts and "4.000 GPU-h" in facts
    assert "1800.0s succeeded: every replica exited 0" in result.stdout


def test_explain_a_waiting_job_says_why_and_what_is_missing(
    world: World, served: Connections
) -> None:
    result = bolt("explain", world.wide)
    clean_exit(result, 0)
    lines = result.stdout.splitlines()
    assert lines[0] == f"job {world.wide} wide (research, normal): pending"
    assert lines[1:3] == ["  waiting: capacity", "  position 1 in line; estimated start unknown"]
    assert "  role worker needs 4 replica(s) of 8 GPU(s)" in lines
    assert "  fleet: 2 of 4 replica(s) fit across the fleet" in lines


def test_explain_json_carries_exactly_the_documented_keys(
    world: World, served: Connections
) -> None:
    data = as_json(bolt("explain", world.wide, "--json"))
    assert set(data) == EXPLAIN_KEYS
    assert (data["state"], data["position"], data["reason"]) == ("pending", 0, "capacity")
    assert data["waiting"][0] == "role worker needs 4 replica(s) of 8 GPU(s)"


def test_explain_a_running_job_gives_the_placement_reasoning(
    world: World, served: Connections
) -> None:
    result = bolt("explain", world.train)
    clean_exit(result, 0)
    assert "inside rack r0 (host-[0-1])" in result.stdout.splitlines()[1]
    assert "beat rack p0/r1" in result.stdout


def test_explain_a_finished_job_gives_its_end_and_last_placement(
    world: World, served: Connections
) -> None:
    result = bolt("explain", world.tiny)
    clean_exit(result, 0)
    assert result.stdout.splitlines()[1:] == [
        "  succeeded: every replica exited 0",
        "  last placement: 8 x H100-80GB on 1 host(s) inside host host-2 (host-2)",
    ]


def test_logs_print_the_jobs_output_exactly(world: World, served: Connections) -> None:
    result = bolt("logs", world.tiny)
    clean_exit(result, 0)
    assert result.stdout == "hello\nworld\n"


def test_logs_of_a_job_that_printed_nothing_print_nothing(
    world: World, served: Connections
) -> None:
    result = bolt("logs", world.wide)
    clean_exit(result, 0)
    assert result.stdout == ""


@pytest.mark.parametrize(
    "command",
    [("status",), ("status", "--json"), ("explain",), ("logs",), ("cancel",), ("artifacts",)],
    ids=lambda c: " ".join(c),
)
def test_an_unknown_job_exits_1_with_the_servers_fix(
    served: Connections, command: tuple[str, ...]
) -> None:
    result = bolt(command[0], "404", *command[1:])
    clean_exit(result, 1)
    assert result.stdout == ""
    assert "error (404) no job 404. To fix: check the id with `bolt queue`" in result.stderr


# --- nodes and top ----------------------------------------------------------------------------


def test_nodes_json_is_every_node_with_its_place_and_jobs(
    world: World, served: Connections
) -> None:
    listing = NodeList.model_validate(as_json(bolt("nodes", "--json")))
    got = {n.name: (n.rack, n.gpus_used, n.state, n.jobs) for n in listing.nodes}
    assert got == {
        "host-0": ("r0", 8, "ready", [world.train]),
        "host-1": ("r0", 8, "ready", [world.train]),
        "host-2": ("r1", 0, "ready", []),
        "host-3": ("r1", 0, "ready", []),
    }


@pytest.mark.parametrize("args", [(), ("list",)], ids=["bolt nodes", "bolt nodes list"])
def test_nodes_table_ends_with_the_gpus_in_use(served: Connections, args: tuple[str, ...]) -> None:
    result = bolt("nodes", *args)
    clean_exit(result, 0)
    lines = result.stdout.splitlines()
    assert lines[0].split()[:4] == ["NODE", "POOL", "GPU", "USED"]
    assert [line.split()[3] for line in lines[1:5]] == ["8/8", "8/8", "0/8", "0/8"]
    assert lines[-1] == "4 node(s), 16 of 32 GPUs in use"


@pytest.mark.parametrize("width", [66, 80])
def test_nodes_table_fits_a_narrow_terminal_with_names_whole(
    served: Connections, monkeypatch: pytest.MonkeyPatch, width: int
) -> None:
    narrow(monkeypatch, width)
    result = bolt("nodes")
    clean_exit(result, 0)
    assert fits(result.stdout, width), result.stdout
    names = [line.split()[0] for line in result.stdout.splitlines()[1:5]]
    assert names == ["host-0", "host-1", "host-2", "host-3"]


def test_top_once_draws_the_fleet_racks_and_teams(served: Connections) -> None:
    result = bolt("top", "--once")
    clean_exit(result, 0)
    out = result.stdout
    assert "nodes 4/4 ready   GPUs 16/32 used (50%)   jobs 1 running, 1 pending" in out
    racks = [line.split()[0] for line in out.splitlines() if line.startswith("p0/")]
    assert racks == ["p0/r0", "p0/r1"]
    team_rows = [line.split() for line in out.splitlines() if line.startswith("research")]
    assert len(team_rows) == 1 and team_rows[0][-1] == "16"


def test_top_once_fits_a_narrow_terminal(
    served: Connections, monkeypatch: pytest.MonkeyPatch
) -> None:
    narrow(monkeypatch, 60)
    result = bolt("top", "--once")
    clean_exit(result, 0)
    table = result.stdout.split("\n\n", 1)[1]
    assert fits(table, 60), table


# --- cost -------------------------------------------------------------------------------------


def test_cost_json_by_team_counts_each_teams_gpu_hours(served: Connections) -> None:
    data = as_json(bolt("cost", "--json"))
    assert {"by", "since", "until", "rows", "others", "total", "budgets", "savings"} <= set(data)
    assert data["by"] == "team"
    hours = {r["key"]: r["gpu_hours"] for r in data["rows"]}
    assert hours == {"nlp": pytest.approx(4.0, abs=0.01), "research": pytest.approx(16.0, abs=0.01)}
    assert data["total"]["gpu_hours"] == pytest.approx(20.0, abs=0.01)
    assert data["until"] - data["since"] == pytest.approx(30 * 86400)


def test_cost_by_job_as_csv_has_one_row_per_job(world: World, served: Connections) -> None:
    result = bolt("cost", "--by", "job", "--csv")
    clean_exit(result, 0)
    rows = list(csv.reader(io.StringIO(result.stdout)))
    assert tuple(rows[0]) == CSV_COLUMNS
    by_job = {r[3]: r for r in rows[1:]}
    assert set(by_job) == {world.train, world.tiny}
    assert by_job[world.tiny][6] == "4.000000"  # gpu_hours, six places


def test_cost_table_shows_a_total_row_and_fits_80_columns(served: Connections) -> None:
    result = bolt("cost")
    clean_exit(result, 0)
    assert fits(result.stdout, 80)
    total = next(line for line in result.stdout.splitlines() if line.startswith("TOTAL"))
    assert total.split()[1:3] == ["2", "20.0"]


def test_cost_window_shorter_than_the_work_counts_only_its_part(served: Connections) -> None:
    data = as_json(bolt("cost", "--json", "--since", "30m"))
    hours = {r["key"]: r["gpu_hours"] for r in data["rows"]}
    assert hours == {"research": pytest.approx(8.0, abs=0.01)}  # tiny ended before the window


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("--since", "forever"), "since: must be a duration"),
        (("--by", "galaxy"), "'galaxy' is not one of"),
    ],
    ids=["bad since (server)", "bad by (command line)"],
)
def test_cost_bad_options_exit_2_naming_the_option(
    served: Connections, args: tuple[str, ...], says: str
) -> None:
    result = bolt("cost", *args)
    clean_exit(result, 2)
    assert says in result.stderr


# --- tokens and roles -------------------------------------------------------------------------


def test_a_viewer_reads_the_queue_but_may_not_cordon(world: World, served: Connections) -> None:
    assert len(as_json(bolt("queue", "--json", "--token", world.viewer))["jobs"]) == 2
    refused = bolt("nodes", "cordon", "host-3", "--token", world.viewer)
    clean_exit(refused, 1)
    assert "error (403)" in refused.stderr
    listing = NodeList.model_validate(as_json(bolt("nodes", "--json")))
    assert {n.name: n.state for n in listing.nodes}["host-3"] == "ready"


def test_an_unknown_token_is_refused_with_401(served: Connections) -> None:
    result = bolt("queue", "--token", "bf_not-a-real-token")
    clean_exit(result, 1)
    assert "error (401)" in result.stderr


def test_the_flag_token_wins_over_bolt_token_and_the_server_flag_is_used(
    world: World, served: Connections
) -> None:
    clean_exit(bolt("queue", "--server", "http://bolt.example:9000/", "--token", world.viewer), 0)
    assert served.made[-1] == ("http://bolt.example:9000", world.viewer)
    clean_exit(bolt("queue"), 0)
    assert served.made[-1] == ("http://127.0.0.1:8600", "adm")


# --- artifacts (listing) ----------------------------------------------------------------------


def test_artifacts_of_a_job_with_none_say_so(world: World, served: Connections) -> None:
    result = bolt("artifacts", world.tiny)
    clean_exit(result, 0)
    assert f"job {world.tiny} has no artifacts" in result.stdout
    data = as_json(bolt("artifacts", world.tiny, "--json"))
    assert data == {"job": world.tiny, "artifacts": [], "mismatched": []}

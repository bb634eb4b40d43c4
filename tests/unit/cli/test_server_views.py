"""The fleet-wide views of the ``bolt`` command (``cost``, ``top``) and the plumbing every
server command shares: where the server and token come from, connecting, turning refusals
into exit codes, spec errors, JSON output and the lazily loaded subcommands."""

from __future__ import annotations

import io
import json
import re
import sys
import time
from collections.abc import Iterator
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import pytest
import typer
from hypothesis import given
from hypothesis import strategies as st
from rich.console import Console
from rich.table import Table
from typer import _click as click
from typer.core import TyperGroup
from typer.testing import CliRunner, Result

import boltforge.cli.remote as remote
from boltforge.cli.common import EXIT_BAD_INPUT, print_json, spec_errors, timed
from boltforge.cli.lazy import Lazy, LazyGroup
from boltforge.cli.main import Bolt, app
from boltforge.cli.remote import EXIT_REFUSED, api_errors, cell, connect, fail
from boltforge.cli.top import _safe_frame, frame, teams_table
from boltforge.client import DEFAULT_SERVER, ApiFailure, config_path, resolve
from boltforge.spec.errors import SpecError, SpecProblem
from boltforge.wire.cost import BudgetOut, CostReply, CostRow, SavingsOut
from boltforge.wire.jobs import FleetOut, NodeList, NodeOut, Problem

NOW = 1_800_000_000.0  # 2027-01-15 08:00 UTC
runner = CliRunner()


# --- a stand-in for the HTTP client -----------------------------------------------------------


class FakeClient:
    """Answers ``cost``, ``fleet`` and ``nodes`` from canned wire models (an exception among
    them is raised instead) and records the calls and the server and token it was made for."""

    def __init__(self) -> None:
        self.server = ""
        self.token: str | None = None
        self.cost_reply: CostReply | Exception = cost_reply()
        self.fleet_reply: FleetOut | Exception = fleet_out()
        self.node_list: NodeList | Exception = NodeList(nodes=[])
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.closed = False

    def __call__(self, server: str, token: str | None) -> FakeClient:
        self.server, self.token = server, token
        return self

    def __enter__(self) -> FakeClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.closed = True

    def _answer(self, name: str, answer: Any, **args: Any) -> Any:
        self.calls.append((name, args))
        if isinstance(answer, BaseException):
            raise answer
        return answer

    def cost(self, by: str = "team", since: str = "30d") -> CostReply:
        return self._answer("cost", self.cost_reply, by=by, since=since)  # type: ignore[no-any-return]

    def fleet(self) -> FleetOut:
        return self._answer("fleet", self.fleet_reply)  # type: ignore[no-any-return]

    def nodes(self) -> NodeList:
        return self._answer("nodes", self.node_list)  # type: ignore[no-any-return]


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """A clean environment: no BOLT_* variables, the config directory under ``tmp_path``."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.delenv("BOLT_SERVER", raising=False)
    monkeypatch.delenv("BOLT_TOKEN", raising=False)
    monkeypatch.setenv("COLUMNS", "80")
    return tmp_path


@pytest.fixture
def fake(env: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeClient]:
    client = FakeClient()
    monkeypatch.setattr(remote, "Client", client)
    monkeypatch.setenv("BOLT_TOKEN", "tok-env")
    yield client


def bolt(*args: str) -> Result:
    return runner.invoke(app, list(args))


def clean_failure(result: Result, code: int) -> None:
    assert result.exit_code == code, result.output
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)


def save_config(data: object) -> Path:
    path = config_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    return path


# --- wire models built by hand ----------------------------------------------------------------


def row(key: str, **fields: Any) -> CostRow:
    base: dict[str, Any] = {"key": key, "team": key, "jobs": 2, "gpu_hours": 100.0}
    base |= {"dollars": 250.0, "productive_gpu_hours": 80.0, "productive_dollars": 200.0}
    return CostRow.model_validate(base | fields)


def cost_reply(by: str = "team", **fields: Any) -> CostReply:
    base: dict[str, Any] = {
        "by": by,
        "since": NOW - 30 * 86400,
        "until": NOW,
        "rows": [
            row("research"),
            row("nlp-with-a-rather-long-team-name", gpu_hours=0.0, productive_gpu_hours=0.0),
        ],
        "total": row("total", team="", jobs=4, gpu_hours=200.0, dollars=500.0),
    }
    return CostReply.model_validate(base | fields)


def fleet_out(**fields: Any) -> FleetOut:
    base: dict[str, Any] = {
        "nodes": 2,
        "nodes_ready": 2,
        "gpus": 16,
        "gpus_used": 12,
        "jobs_running": 2,
        "jobs_pending": 1,
        "fragmentation": 0.25,
        "last_cycle_ms": 1.5,
        "cycles": 40,
    }
    return FleetOut.model_validate(base | fields)


def node(name: str, **fields: Any) -> NodeOut:
    base: dict[str, Any] = {
        "name": name,
        "pool": "h100",
        "gpu": "H100-80GB",
        "gpus": 8,
        "gpus_used": 6,
        "pod": "p0",
        "rack": "r00",
        "state": "ready",
    }
    return NodeOut.model_validate(base | fields)


# --- where the server and the token come from -------------------------------------------------

SOURCES = [
    pytest.param({}, {}, None, (DEFAULT_SERVER, None), id="nothing set"),
    pytest.param(
        {},
        {},
        {"server": "http://saved:1/", "token": "tok-saved"},
        ("http://saved:1", "tok-saved"),
        id="saved by bolt up",
    ),
    pytest.param(
        {},
        {"BOLT_SERVER": "http://env:2", "BOLT_TOKEN": "tok-env"},
        {"server": "http://saved:1", "token": "tok-saved"},
        ("http://env:2", "tok-env"),
        id="env beats saved",
    ),
    pytest.param(
        {"server": "http://flag:3//", "token": "tok-flag"},
        {"BOLT_SERVER": "http://env:2", "BOLT_TOKEN": "tok-env"},
        {"server": "http://saved:1", "token": "tok-saved"},
        ("http://flag:3", "tok-flag"),
        id="flags beat everything",
    ),
    pytest.param(
        {"server": "http://flag:3"},
        {},
        {"server": "http://saved:1", "token": "tok-saved"},
        ("http://flag:3", "tok-saved"),
        id="each part on its own",
    ),
    pytest.param(
        {},
        {"BOLT_SERVER": "", "BOLT_TOKEN": ""},
        {"token": "tok-saved"},
        (DEFAULT_SERVER, "tok-saved"),
        id="empty env counts as unset",
    ),
]


@pytest.mark.parametrize(("flags", "environ", "saved", "expected"), SOURCES)
def test_server_and_token_come_from_flags_then_env_then_the_saved_file(
    env: Path,
    monkeypatch: pytest.MonkeyPatch,
    flags: dict[str, str],
    environ: dict[str, str],
    saved: dict[str, str] | None,
    expected: tuple[str, str | None],
) -> None:
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    if saved is not None:
        path = save_config(saved)
        assert path.is_relative_to(env), "the saved file lives under XDG_CONFIG_HOME"
    assert resolve(flags.get("server"), flags.get("token")) == expected


@pytest.mark.parametrize("content", ["{not json", "", "\x00\x01"])
def test_a_broken_saved_file_is_ignored(env: Path, content: str) -> None:
    path = config_path()
    path.parent.mkdir(parents=True)
    path.write_text(content)
    assert resolve(None, None) == (DEFAULT_SERVER, None)


@pytest.mark.parametrize("content", [[], "http://x", 3])
def test_a_saved_file_that_is_json_but_not_an_object_is_ignored(env: Path, content: object) -> None:
    save_config(content)
    assert resolve(None, None) == (DEFAULT_SERVER, None)


def test_connect_builds_a_client_for_the_resolved_server_and_token(fake: FakeClient) -> None:
    save_config({"server": "http://saved:9/"})
    client = connect(None, None)
    assert client is fake  # type: ignore[comparison-overlap]
    assert (fake.server, fake.token) == ("http://saved:9", "tok-env")


def test_connect_without_a_token_exits_2_saying_how_to_get_one(
    env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(typer.Exit) as e:
        connect("http://x", None)
    assert e.value.exit_code == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert "no API token" in err and "BOLT_TOKEN" in err and "bolt up" in err


def test_the_saved_token_lets_a_command_run_with_no_flags_or_env(
    env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = FakeClient()
    monkeypatch.setattr(remote, "Client", client)
    save_config({"server": "http://saved:7", "token": "tok-saved"})
    result = bolt("cost", "--json")
    assert result.exit_code == 0, result.output
    assert (client.server, client.token) == ("http://saved:7", "tok-saved")


# --- refusals become exit codes ---------------------------------------------------------------

FAILURES = [
    pytest.param(ApiFailure(404, "no such job"), EXIT_REFUSED, ["error (404) no such job"]),
    pytest.param(ApiFailure(500, "internal"), EXIT_REFUSED, ["error (500) internal"]),
    pytest.param(ApiFailure(429, "slow down"), EXIT_REFUSED, ["error (429) slow down"]),
    pytest.param(ApiFailure(0, "cannot reach x"), EXIT_REFUSED, ["error cannot reach x"]),
    pytest.param(ApiFailure(422, "bad [b]input[/b]"), EXIT_BAD_INPUT, ["bad [b]input[/b]"]),
    pytest.param(
        ApiFailure(
            400,
            "bad",
            [
                Problem(field="by", value="week", message="must be team, project or job"),
                Problem(field="since", message="must be a duration"),
            ],
        ),
        EXIT_BAD_INPUT,
        [
            "error cost: 2 problem(s)",
            "  - by: must be team, project or job (got 'week')",
            "  - since: must be a duration\n",
        ],
    ),
    pytest.param(KeyboardInterrupt(), 130, []),
]


@pytest.mark.parametrize(("failure", "code", "shown"), FAILURES)
def test_api_errors_turn_a_refusal_into_a_line_and_an_exit_code(
    capsys: pytest.CaptureFixture[str], failure: BaseException, code: int, shown: list[str]
) -> None:
    with pytest.raises(typer.Exit) as e, api_errors("cost"):
        raise failure
    assert e.value.exit_code == code
    out, err = capsys.readouterr()
    assert out == ""
    for text in shown:
        assert text in err


def test_api_errors_let_other_exceptions_through() -> None:
    with pytest.raises(ValueError, match="not mine"), api_errors():
        raise ValueError("not mine")


@pytest.mark.parametrize("code", [1, 2, 7])
def test_fail_prints_error_and_exits_with_the_code_given(
    capsys: pytest.CaptureFixture[str], code: int
) -> None:
    with pytest.raises(typer.Exit) as e:
        fail("it broke. To fix: mend it", code)
    assert e.value.exit_code == code
    assert capsys.readouterr().err.strip() == "error it broke. To fix: mend it"


@pytest.mark.parametrize(("failure", "code"), [(ApiFailure(403, "admins only"), 1)])
@pytest.mark.parametrize("command", [["cost"], ["top", "--once"]])
def test_a_refused_view_exits_non_zero_without_a_traceback(
    fake: FakeClient, failure: ApiFailure, code: int, command: list[str]
) -> None:
    fake.cost_reply = fake.fleet_reply = failure
    result = bolt(*command)
    clean_failure(result, code)
    assert "error (403) admins only" in result.stderr
    assert fake.closed, "the client is closed on the way out"


# --- spec errors, JSON and timing -------------------------------------------------------------


def test_spec_errors_list_every_problem_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    problems = [
        SpecProblem("job.gpus", 0, "is too small"),
        SpecProblem("job.topology.required", "aisle", "must be host, rack or pod [see docs]"),
    ]
    with pytest.raises(typer.Exit) as e, spec_errors():
        raise SpecError("job.yaml", problems)
    assert e.value.exit_code == EXIT_BAD_INPUT
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "error job.yaml: 2 problem(s)",
        "  - job.gpus: is too small (got 0)",
        "  - job.topology.required: must be host, rack or pod [see docs] (got 'aisle')",
    ]


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=12,
)


@given(json_values)
def test_print_json_writes_one_parseable_document_keeping_key_order(data: Any) -> None:
    buffer = io.StringIO()
    with redirect_stdout(buffer):
        print_json(data)
    text = buffer.getvalue()
    assert text.endswith("\n") and json.loads(text) == data
    if isinstance(data, dict):
        assert list(json.loads(text)) == list(data)


def test_timed_returns_the_result_and_the_milliseconds_between_clock_reads() -> None:
    reads = iter([10.0, 10.25])
    out, ms = timed(lambda: "done", lambda: next(reads))
    assert (out, ms) == ("done", 250.0)


def test_a_cell_in_a_shrinking_column_is_cut_with_an_ellipsis_not_wrapped() -> None:
    table = Table(box=None, pad_edge=False, show_header=False)
    table.add_column(no_wrap=False)
    table.add_column(no_wrap=True)
    table.add_row(cell("abcdefghijklmnopqrstuvwxyz"), "12345")
    console = Console(record=True, width=16, color_system=None)
    console.print(table)
    assert console.export_text().splitlines() == ["abcdefgh…  12345"]


# --- bolt cost --------------------------------------------------------------------------------


@pytest.mark.parametrize("by", ["team", "project", "job"])
def test_cost_asks_for_the_grouping_and_window_given(fake: FakeClient, by: str) -> None:
    fake.cost_reply = cost_reply(by)
    result = bolt("cost", "--by", by, "--since", "12h")
    assert result.exit_code == 0, result.output
    assert fake.calls == [("cost", {"by": by, "since": "12h"})]
    assert f"cost by {by}, 2026-12-16 08:00 to 2027-01-15 08:00 (UTC)" in result.stdout


def test_cost_defaults_to_teams_over_30_days(fake: FakeClient) -> None:
    assert bolt("cost").exit_code == 0
    assert fake.calls == [("cost", {"by": "team", "since": "30d"})]


def test_cost_for_people_fits_80_columns_with_savings_and_budgets(fake: FakeClient) -> None:
    fake.cost_reply = cost_reply(
        savings=SavingsOut(
            since=NOW - 86400, hours=24.0, static_dollars=900, shared_dollars=500, saved_dollars=400
        ),
        budgets=[
            BudgetOut(
                team="research", month="2027-01", monthly=1000, soft=800, spent=850, state="warn"
            )
        ],
    )
    result = bolt("cost")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    table = lines[1 : lines.index(next(x for x in lines if x.startswith("TOTAL"))) + 1]
    assert len(table) == 4 and all(len(line) <= 80 for line in table)
    text = result.stdout
    for word in ("TEAM", "GPU-H", "PROD", "research", "$250.00", "80%", "TOTAL", "$500.00"):
        assert word in text
    assert "100%" in text, "no GPU time at all counts as fully productive"
    assert "nlp-with-a-rather-long-team-name" not in text and "…" in text
    assert lines[-2].startswith("saved vs static pools: $400.00 (static $900.00")
    assert lines[-1] == (
        "budget research 2027-01: $850.00 of $1,000.00 (85%), past the soft limit of $800.00"
    )


def test_cost_of_an_empty_window_says_so(fake: FakeClient) -> None:
    fake.cost_reply = cost_reply(rows=[], total=row("total", team="", jobs=0, gpu_hours=0))
    result = bolt("cost")
    assert result.exit_code == 0
    assert "no GPU time in this window" in result.stdout and "TOTAL" not in result.stdout


def test_cost_json_carries_the_documented_keys(fake: FakeClient) -> None:
    result = bolt("cost", "--json")
    data = json.loads(result.stdout)
    assert {"by", "since", "until", "rows", "others", "total", "budgets", "savings"} == set(data)
    assert CostReply.model_validate(data) == fake.cost_reply
    assert data["rows"][0]["key"] == "research"


def test_cost_csv_has_a_header_and_one_line_per_group(fake: FakeClient) -> None:
    fake.cost_reply = cost_reply("project", others=[row("vision")])
    lines = bolt("cost", "--by", "project", "--csv").stdout.splitlines()
    assert lines[0].split(",")[:3] == ["group", "team", "project"]
    assert [line.split(",")[0] for line in lines[1:]] == [
        "research",
        "nlp-with-a-rather-long-team-name",
        "vision",
    ]


def test_an_unknown_grouping_is_a_usage_error_that_sends_nothing(fake: FakeClient) -> None:
    result = bolt("cost", "--by", "week")
    clean_failure(result, 2)
    assert "week" in result.stderr and fake.calls == []


# --- bolt top ---------------------------------------------------------------------------------


def test_top_once_prints_one_frame_that_fits_80_columns(fake: FakeClient) -> None:
    fake.fleet_reply = fleet_out(by_team={"research": 8, "nlp": 4})
    fake.node_list = NodeList(
        nodes=[
            node("h100-p0-r00-h00", jobs=[f"job-{i}" for i in range(20)]),
            node("h100-p0-r00-h01", gpus_used=6, state="cordoned"),
        ]
    )
    result = bolt("top", "--once", "--server", "http://ctl:8600")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert all(len(line) <= 80 for line in lines)
    assert re.fullmatch(r"boltforge top http://ctl:8600  \d\d:\d\d:\d\d", lines[0])
    assert lines[1].startswith("nodes 2/2 ready   GPUs 12/16 used (75%)")
    text = result.stdout
    for word in ("POD/RACK", "p0/r00", "h100-p0-r00-h01", "6/8", "cordoned", "TEAM", "research"):
        assert word in text
    assert text.index("research") < text.index("nlp"), "the busiest team first"
    assert [name for name, _ in fake.calls] == ["fleet", "nodes"]


def test_top_without_teams_shows_no_team_table(fake: FakeClient) -> None:
    result = bolt("top", "--once")
    assert result.exit_code == 0, result.output
    assert "TEAM" not in result.stdout and "nodes 2/2 ready" in result.stdout


def test_a_live_frame_that_cannot_be_fetched_shows_the_error_in_red(fake: FakeClient) -> None:
    fake.fleet_reply = ApiFailure(0, "cannot reach http://x")
    shown = _safe_frame(fake)  # type: ignore[arg-type]
    assert re.fullmatch(r"\d\d:\d\d:\d\d cannot reach http://x", str(shown))
    assert getattr(shown, "style", None) == "red"


def test_a_frames_heading_shows_the_server_address_as_plain_text(fake: FakeClient) -> None:
    fake.server = "http://[markup]"
    console = Console(record=True, width=80, color_system=None)
    console.print(frame(fake))  # type: ignore[arg-type]
    assert console.export_text().startswith("boltforge top http://[markup]")


def test_teams_are_listed_busiest_first_with_a_bar_of_the_fleet() -> None:
    console = Console(record=True, width=80, color_system=None)
    console.print(teams_table(fleet_out(gpus=64, by_team={"a": 8, "b": 32, "c": 16})))
    lines = console.export_text().splitlines()
    assert [line.split()[0] for line in lines[1:]] == ["b", "c", "a"]
    assert lines[1].count("█") == 16 and lines[1].rstrip().endswith("32")


def test_top_refuses_a_too_short_interval(fake: FakeClient) -> None:
    result = bolt("top", "--interval", "0.01")
    clean_failure(result, 2)
    assert fake.calls == []


# --- lazily loaded subcommands ----------------------------------------------------------------


@pytest.fixture
def plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A module with one command function and one group, importable but not imported."""
    name = f"bolt_plugin_{time.monotonic_ns()}"
    (tmp_path / f"{name}.py").write_text(
        "import typer\n"
        "def hello(who: str = 'world') -> None:\n"
        "    'Say hello.'\n"
        "    print(f'hello {who}')\n"
        "group = typer.Typer()\n"
        "@group.command()\n"
        "def one() -> None:\n"
        "    print('one')\n"
        "@group.command()\n"
        "def two() -> None:\n"
        "    print('two')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    sys.modules.pop(name, None)


def lazy_app(plugin: str) -> typer.Typer:
    class Plugged(LazyGroup):
        lazy = {  # noqa: RUF012
            "hello": Lazy(plugin, "hello", "Greetings"),
            "grp": Lazy(plugin, "group"),
        }

    plugged = typer.Typer(cls=Plugged)

    @plugged.callback()
    def main() -> None:
        """Plugged-in commands."""

    @plugged.command("eager")
    def eager() -> None:
        print("eager")

    return plugged


def test_a_lazy_subcommand_is_listed_without_importing_its_module(plugin: str) -> None:
    group = typer.main.get_command(lazy_app(plugin))
    assert isinstance(group, TyperGroup)
    with click.Context(group) as ctx:
        assert group.list_commands(ctx) == ["eager", "hello", "grp"]
    assert plugin not in sys.modules


def test_a_lazy_command_loads_when_it_runs(plugin: str) -> None:
    plugged = lazy_app(plugin)
    result = runner.invoke(plugged, ["hello", "--who", "bolt"])
    assert result.exit_code == 0, result.output
    assert result.stdout == "hello bolt\n"
    assert plugin in sys.modules
    assert runner.invoke(plugged, ["grp", "two"]).stdout == "two\n"


def test_a_loaded_command_carries_its_name_and_help_panel(plugin: str) -> None:
    single = Lazy(plugin, "hello", "Greetings").load("hi")
    assert single.name == "hi" and getattr(single, "rich_help_panel", None) == "Greetings"
    group = Lazy(plugin, "group", "Groups").load("g")
    assert isinstance(group, TyperGroup) and group.name == "g"
    assert sorted(group.commands) == ["one", "two"]
    assert getattr(group, "rich_help_panel", None) == "Groups"


def test_an_unknown_subcommand_is_a_usage_error(plugin: str) -> None:
    result = runner.invoke(lazy_app(plugin), ["nope"])
    clean_failure(result, 2)
    assert "No such command" in result.output


def test_every_bolt_subcommand_loads_and_has_help() -> None:
    with click.Context(typer.main.get_command(app)) as ctx:
        for name, where in Bolt.lazy.items():
            command = ctx.command.get_command(ctx, name)  # type: ignore[attr-defined]
            assert command is not None and command.name == name
            assert getattr(command, "rich_help_panel", None) == where.panel
            assert (command.help or "").strip(), f"{name} has help text"


def test_bolt_help_groups_the_commands_under_their_panels(env: Path) -> None:
    result = bolt("--help")
    assert result.exit_code == 0
    text = result.stdout
    for panel in ("Jobs", "Fleet", "Development fleet"):
        assert panel in text
    assert all(re.search(rf"│ {name} ", text) for name in Bolt.lazy)
    jobs, fleet = text.index("─ Jobs ─"), text.index("─ Fleet ─")
    assert jobs < text.index("│ submit ") < fleet < text.index("│ top ")

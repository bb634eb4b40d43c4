"""The development fleet on this machine (``bolt up``, ``bolt down``, ``bolt demo``) without
starting one: the pid file, private files, inventories and arguments the processes would get;
``up`` and ``down`` refusing and cleaning up; what ``up --detach`` prints and saves; how the
demo starts, tells and always stops a fleet. The only processes started are idle stand-ins
(``python -c 'sleep'``) whose command line marks them as ours."""

from __future__ import annotations

import io
import json
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from rich.console import Console
from typer.testing import CliRunner, Result

import boltforge.cli.demo as demo
import boltforge.cli.forgedemo as forgedemo
import boltforge.cli.localfleet as localfleet
import boltforge.cli.up as up
from boltforge.agent.inventory import load_declared
from boltforge.cli.localfleet import PID_FILE, FleetError, LocalFleet, Node
from boltforge.cli.main import app
from boltforge.cli.story import Story, Told
from boltforge.client import config_path
from boltforge.tls import Certificates
from boltforge.wire.jobs import EventOut, JobDetail, LogPage

runner = CliRunner()
MARK = "boltforge.cli.main"  # what makes a process one of ours (localfleet.ours)


def bolt(*args: str | Path) -> Result:
    return runner.invoke(app, [str(a) for a in args])


@pytest.fixture(autouse=True)
def home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Config and data under ``tmp_path``; no BOLT_* variables."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.setenv("COLUMNS", "200")
    for name in ("BOLT_SERVER", "BOLT_TOKEN", "BOLT_CA"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path


@pytest.fixture
def signals() -> Iterator[None]:
    """Put back the SIGTERM and SIGINT handlers a foreground ``bolt up`` replaces."""
    term, intr = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    yield
    signal.signal(signal.SIGTERM, term)
    signal.signal(signal.SIGINT, intr)


@pytest.fixture
def stand_in() -> Iterator[subprocess.Popen[bytes]]:
    """An idle process in its own session whose command line names ``boltforge.cli.main``,
    handed over once it runs (it says so on stdout)."""
    code = "import time; print('up', flush=True); time.sleep(60)"
    proc = subprocess.Popen(
        [sys.executable, "-c", code, MARK], stdout=subprocess.PIPE, start_new_session=True
    )
    assert proc.stdout is not None and proc.stdout.readline() == b"up\n"
    yield proc
    proc.stdout.close()
    if proc.poll() is None:
        proc.kill()
    proc.wait()


def fleet_at(root: Path, **fields: Any) -> LocalFleet:
    values: dict[str, Any] = {
        "data_dir": str(root),
        "url": "http://127.0.0.1:8611",
        "admin_token": "bf_admin",
        "agent_token": "bf_agent",
        "hosts": 2,
    }
    return LocalFleet(**(values | fields))


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


# --- the pid file and private files -----------------------------------------------------------


def test_a_fleet_saved_is_loaded_back_the_same(tmp_path: Path) -> None:
    fleet = fleet_at(tmp_path, server=41, agents=[42, 43], ca="/x/ca.pem", names=["a", "b"])
    fleet.save()
    assert mode(tmp_path / PID_FILE) == 0o600, "it holds the tokens"
    assert LocalFleet.load(tmp_path) == fleet


@pytest.mark.parametrize(
    "content",
    [None, "{not json", '{"data_dir": "/x"}', '{"surprise": 1, "data_dir": "/x"}', "[1, 2]"],
    ids=["missing", "broken json", "missing fields", "unknown field", "not an object"],
)
def test_a_pid_file_that_cannot_be_read_means_no_fleet(tmp_path: Path, content: str | None) -> None:
    if content is not None:
        (tmp_path / PID_FILE).write_text(content)
    assert LocalFleet.load(tmp_path) is None


def test_node_names_default_to_one_per_host(tmp_path: Path) -> None:
    assert fleet_at(tmp_path, hosts=3).node_names() == ["host-0", "host-1", "host-2"]
    assert fleet_at(tmp_path, names=["cpu-0", "store-0"]).node_names() == ["cpu-0", "store-0"]


def test_a_private_file_is_owner_only_even_when_it_was_not(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "client.json"
    path.parent.mkdir()
    path.write_text("old, longer content that must go\n")
    path.chmod(0o644)
    localfleet.write_private(path, "new\n")
    assert path.read_text() == "new\n" and mode(path) == 0o600
    localfleet.write_private(tmp_path / "made" / "here.json", "{}")
    assert mode(tmp_path / "made" / "here.json") == 0o600


def test_a_port_someone_listens_on_is_taken_and_a_free_one_is_not() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        assert localfleet.port_taken(s.getsockname()[1])
    assert not localfleet.port_taken(localfleet.free_port())


@pytest.mark.parametrize("i", [0, 1, 2, 5])
def test_each_host_declares_an_8_gpu_h100_two_to_a_rack(tmp_path: Path, i: int) -> None:
    path = tmp_path / "inv.yaml"
    path.write_text(localfleet.inventory(i))
    node = load_declared(path)
    assert (node.name, node.gpus, node.gpu, node.pod, node.rack) == (
        f"host-{i}",
        8,
        "H100-80GB",
        "p0",
        f"r{i // 2}",
    )


# --- the processes' arguments -----------------------------------------------------------------


def test_the_server_gets_its_store_tokens_and_demo_preemption(tmp_path: Path) -> None:
    fleet = fleet_at(tmp_path)
    args = localfleet._server_args(fleet, 8611, None)
    assert args[0] == "server"
    pairs = dict(zip(args[1::2], args[2::2], strict=False))
    assert pairs["--db"] == f"sqlite:///{tmp_path / 'server.db'}"
    assert (pairs["--port"], pairs["--admin-token-file"], pairs["--agent-token-file"]) == (
        "8611",
        str(tmp_path / "tokens" / "admin"),
        str(tmp_path / "tokens" / "agent"),
    )
    assert "bf_admin" not in args and "bf_agent" not in args  # no token on a command line
    assert (pairs["--min-runtime"], pairs["--churn"]) == ("5", "1")
    assert "--tls-cert" not in args


def test_a_tls_server_gets_its_certificate_and_key(tmp_path: Path) -> None:
    certs = Certificates(ca=tmp_path / "ca.pem", cert=tmp_path / "s.pem", key=tmp_path / "s.key")
    args = localfleet._server_args(fleet_at(tmp_path), 8611, certs)
    at = args.index("--tls-cert")
    assert args[at : at + 4] == ["--tls-cert", str(certs.cert), "--tls-key", str(certs.key)]


def test_an_agent_gets_its_inventory_file_work_dir_and_extra_args(tmp_path: Path) -> None:
    fleet = fleet_at(tmp_path, ca=str(tmp_path / "ca.pem"))
    node = Node("cpu-0", "name: cpu-0\n", ("--runtime", "podman"))
    args = localfleet._agent_args(fleet, node)
    inventory = tmp_path / "nodes" / "cpu-0.yaml"
    assert inventory.read_text() == "name: cpu-0\n"
    token = str(tmp_path / "tokens" / "agent")
    assert args == [
        *("agent", "--server", fleet.url, "--token-file", token),
        *("--inventory", str(inventory), "--work-dir", str(tmp_path / "agents" / "cpu-0")),
        *("--ca", str(tmp_path / "ca.pem"), "--runtime", "podman"),
    ]


def test_a_fleet_that_runs_every_team_as_one_user_says_so_to_its_agents(tmp_path: Path) -> None:
    fleet = fleet_at(tmp_path)
    fleet.shared = True
    assert "--allow-shared-identity" in localfleet._agent_args(fleet, Node("h", "name: h\n"))


def test_a_plain_http_agent_is_given_no_ca(tmp_path: Path) -> None:
    assert "--ca" not in localfleet._agent_args(fleet_at(tmp_path), Node("h", "name: h\n"))


def test_starting_on_a_taken_port_raises_with_the_fix_and_writes_nothing(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(FleetError, match=f"port {port} is in use. To fix: pick another"):
            localfleet.start(tmp_path / "up", 2, port)
    assert not (tmp_path / "up").exists()


# --- whose process it is, and stopping ---------------------------------------------------------


def test_only_a_live_process_of_ours_counts(stand_in: subprocess.Popen[bytes]) -> None:
    import os

    assert localfleet.ours(stand_in.pid)
    assert not localfleet.ours(os.getpid()), "a pid reused by another program is never ours"
    assert not localfleet.ours(0) and not localfleet.ours(-1)
    stand_in.kill()
    stand_in.wait()
    assert not localfleet.ours(stand_in.pid)


def test_stop_ends_the_processes_and_removes_the_pid_file(
    tmp_path: Path, stand_in: subprocess.Popen[bytes]
) -> None:
    fleet = fleet_at(tmp_path, server=0, agents=[stand_in.pid])
    fleet.save()
    localfleet.stop(fleet)
    stand_in.wait(timeout=10)  # stop reaped it already: this returns at once
    assert not Path(f"/proc/{stand_in.pid}").exists() and not localfleet.ours(stand_in.pid)
    assert not (tmp_path / PID_FILE).exists()


def test_a_process_that_exited_is_named_with_the_last_line_of_its_log(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "server.log").write_text("starting\nOSError: address in use\n\n")
    fleet = fleet_at(tmp_path, server=0)
    with pytest.raises(FleetError) as caught:
        localfleet.wait_ready(fleet, timeout_s=5)
    message = str(caught.value)
    assert message.startswith("the server process exited: OSError: address in use.")
    assert f"To fix: see {logs / 'server.log'}" in message


def test_an_agent_that_exited_is_named_by_its_node(
    tmp_path: Path, stand_in: subprocess.Popen[bytes]
) -> None:
    (tmp_path / "logs").mkdir()
    fleet = fleet_at(tmp_path, server=stand_in.pid, agents=[0], names=["gpu-9"])
    with pytest.raises(FleetError, match="the gpu-9 process exited: no log"):
        localfleet._check_processes(fleet)


@pytest.mark.parametrize(
    ("content", "tail"),
    [(None, "no log"), ("", "no output"), ("\n  \n", "no output"), ("a\n  b  \n\n", "b")],
)
def test_the_tail_of_a_log_is_its_last_non_blank_line(
    tmp_path: Path, content: str | None, tail: str
) -> None:
    path = tmp_path / "x.log"
    if content is not None:
        path.write_text(content)
    assert localfleet._tail(path) == tail


# --- bolt down --------------------------------------------------------------------------------


def test_down_with_no_fleet_exits_1_naming_the_data_dir(tmp_path: Path) -> None:
    root = tmp_path / "nothing"
    result = bolt("down", "--data-dir", root)
    assert result.exit_code == 1
    said = " ".join(result.stderr.split())
    assert f"no fleet is up in {root.resolve()}. To fix: pass the --data-dir" in said


def test_down_cleans_up_after_a_fleet_that_had_stopped(tmp_path: Path) -> None:
    root = tmp_path / "up"
    root.mkdir()
    fleet_at(root, server=0).save()
    up.save_client_config("http://127.0.0.1:8611", "bf_admin")
    result = bolt("down", "--data-dir", root)
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [
        f"the fleet in {root} had already stopped; cleaning up",
        f"stopped the fleet in {root}",
    ]
    assert not (root / PID_FILE).exists()
    assert not config_path().exists(), "the saved address pointed at the fleet that stopped"


def test_down_keeps_a_saved_config_for_another_server(tmp_path: Path) -> None:
    root = tmp_path / "up"
    root.mkdir()
    fleet_at(root, server=0).save()
    up.save_client_config("https://prod.example:8600", "bf_prod", "/etc/ca.pem")
    assert bolt("down", "--data-dir", root).exit_code == 0
    saved = json.loads(config_path().read_text())
    assert saved == {"server": "https://prod.example:8600", "token": "bf_prod", "ca": "/etc/ca.pem"}


def test_the_default_data_dir_is_under_the_users_data(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("os.geteuid", lambda: 1000)
    assert up.default_dir() == home / "data" / "boltforge" / "up"
    result = bolt("down")
    assert result.exit_code == 1 and str(home / "data" / "boltforge" / "up") in result.stderr


def test_forgetting_a_config_that_is_not_json_leaves_it(tmp_path: Path) -> None:
    path = config_path()
    path.parent.mkdir(parents=True)
    path.write_text("hand-edited, not json")
    up.forget_client_config("http://127.0.0.1:8611")
    assert path.read_text() == "hand-edited, not json"


def test_the_saved_client_config_is_private_and_names_the_ca_only_when_given() -> None:
    up.save_client_config("http://127.0.0.1:8611", "bf_admin")
    assert json.loads(config_path().read_text()) == {
        "server": "http://127.0.0.1:8611",
        "token": "bf_admin",
    }
    assert mode(config_path()) == 0o600
    up.save_client_config("https://127.0.0.1:8611", "bf_admin", "/d/tls/ca.pem")
    assert json.loads(config_path().read_text())["ca"] == "/d/tls/ca.pem"


# --- bolt up ----------------------------------------------------------------------------------


def test_up_refuses_a_port_in_use_with_exit_2(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        result = bolt("up", "--port", str(port), "--data-dir", tmp_path / "up", "--detach")
    assert result.exit_code == 2, result.output
    assert f"cannot start the fleet: port {port} is in use" in " ".join(result.stderr.split())
    assert not (tmp_path / "up" / PID_FILE).exists()


def test_up_refuses_while_a_fleet_is_up_in_the_same_dir(
    tmp_path: Path, stand_in: subprocess.Popen[bytes]
) -> None:
    root = tmp_path / "up"
    root.mkdir()
    fleet_at(root, server=stand_in.pid).save()
    result = bolt("up", "--data-dir", root, "--detach")
    assert result.exit_code == 1
    said = " ".join(result.stderr.split())
    assert f"a fleet is already up in {root} (http://127.0.0.1:8611)" in said
    assert "To fix: `bolt down` first" in said
    assert stand_in.poll() is None, "the running fleet is left alone"


@pytest.mark.parametrize("args", [("--hosts", "0"), ("--port", "0"), ("--port", "70000")], ids=str)
def test_up_options_out_of_range_are_usage_errors(args: tuple[str, ...]) -> None:
    result = bolt("up", *args)
    assert result.exit_code == 2 and args[0] in result.stderr


class Started:
    """Stands in for ``localfleet.start``/``wait_ready``/``stop``: records the calls."""

    def __init__(self, root: Path, ready_error: BaseException | None = None, ca: str = "") -> None:
        self.root, self.ready_error, self.ca = root, ready_error, ca
        self.calls: list[tuple[str, Any]] = []

    def start(self, data_dir: Path, hosts: int, port: int, tls: bool) -> LocalFleet:
        self.calls.append(("start", (data_dir, hosts, port, tls)))
        return fleet_at(data_dir, url=f"http://127.0.0.1:{port}", hosts=hosts, ca=self.ca)

    def wait_ready(self, fleet: LocalFleet) -> None:
        self.calls.append(("wait_ready", fleet.url))
        if self.ready_error is not None:
            raise self.ready_error

    def stop(self, fleet: LocalFleet) -> None:
        self.calls.append(("stop", fleet.url))


def started(monkeypatch: pytest.MonkeyPatch, root: Path, **kw: Any) -> Started:
    fake = Started(root, **kw)
    for name in ("start", "wait_ready", "stop"):
        monkeypatch.setattr(localfleet, name, getattr(fake, name))
    return fake


def test_up_detach_saves_the_address_and_prints_how_to_use_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "up"
    fake = started(monkeypatch, root)
    result = bolt("up", "--data-dir", root, "--hosts", "3", "--port", "8611", "--detach")
    assert result.exit_code == 0, result.output
    assert fake.calls[0] == ("start", (root, 3, 8611, False))
    assert [c[0] for c in fake.calls] == ["start", "wait_ready"]
    out = result.stdout
    assert f"starting a server and 3 agent(s) in {root} ..." in out
    assert "fleet: 3 host(s), 24 x H100-80GB, server http://127.0.0.1:8611" in out
    assert "console: http://127.0.0.1:8611/console/ (sign in with the admin token bf_admin)" in out
    assert f"stop it with `bolt down --data-dir {root}`" in out
    assert "tls:" not in out
    saved = json.loads(config_path().read_text())
    assert saved == {"server": "http://127.0.0.1:8611", "token": "bf_admin"}


def test_up_detach_with_tls_names_the_ca_to_trust_and_saves_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "up"
    started(monkeypatch, root, ca=str(root / "tls" / "ca.pem"))
    result = bolt("up", "--data-dir", root, "--detach", "--tls")
    assert result.exit_code == 0, result.output
    ca = str(root / "tls" / "ca.pem")
    assert f"signed by the local CA {ca}" in result.stdout and f"--ca {ca}" in result.stdout
    assert json.loads(config_path().read_text())["ca"] == ca


def test_up_in_the_default_dir_says_plain_bolt_down(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    started(monkeypatch, up.default_dir())
    result = bolt("up", "--detach")
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[-1] == "stop it with `bolt down`"


def test_a_fleet_that_never_gets_ready_is_stopped_and_exits_1(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "up"
    problem = FleetError("the host-1 process exited: boom. To fix: see its log")
    fake = started(monkeypatch, root, ready_error=problem)
    result = bolt("up", "--data-dir", root, "--detach", "--port", "8611")
    assert result.exit_code == 1
    assert "the host-1 process exited: boom. To fix: see its log" in result.stderr
    assert [c[0] for c in fake.calls] == ["start", "wait_ready", "stop"]
    assert not config_path().exists()


def test_up_in_the_foreground_stops_the_fleet_when_the_server_dies(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, signals: None
) -> None:
    root = tmp_path / "up"
    fake = started(monkeypatch, root)  # its server pid is 0: never alive
    result = bolt("up", "--data-dir", root, "--port", "8611")
    assert result.exit_code == 1
    out = result.stdout
    assert "Ctrl-C stops it" in out
    assert out.index("the server exited") < out.index("stopping the agents, then the server")
    assert out.splitlines()[-1] == "stopped"
    assert [c[0] for c in fake.calls] == ["start", "wait_ready", "stop"]
    assert not config_path().exists(), "the config saved for it is forgotten once it stops"


# --- bolt demo --------------------------------------------------------------------------------


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> tuple[Console, io.StringIO]:
    """A console to read back; temporary directories under ``tmp_path``; no real stop."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    out = io.StringIO()
    return Console(file=out, width=200, color_system=None), out


def test_a_story_that_went_as_told_exits_0_and_leaves_nothing(
    recorded: tuple[Console, io.StringIO], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    console, out = recorded
    stopped: list[LocalFleet] = []
    monkeypatch.setattr(localfleet, "stop", stopped.append)
    roots: list[Path] = []

    def start(root: Path) -> LocalFleet:
        roots.append(root)
        return fleet_at(root)

    assert demo.in_fleet(console, start, lambda fleet: True) == 0
    [root] = roots
    assert root.parent == tmp_path and root.name.startswith("bolt-demo-")
    assert not root.exists()
    assert [f.data_dir for f in stopped] == [str(root)]
    assert "the demo took" in out.getvalue() and "logs kept" not in out.getvalue()


@pytest.mark.parametrize(
    ("problem", "said"),
    [
        (demo.DemoError("gave up waiting for the resume line after 10 s"), "error gave up"),
        (KeyboardInterrupt(), "interrupted"),
        (None, "logs kept in"),
    ],
    ids=["demo error", "ctrl-c", "story not as told"],
)
def test_a_story_that_fails_keeps_the_logs_stops_the_fleet_and_exits_1(
    recorded: tuple[Console, io.StringIO],
    monkeypatch: pytest.MonkeyPatch,
    problem: BaseException | None,
    said: str,
) -> None:
    console, out = recorded
    stopped: list[LocalFleet] = []
    monkeypatch.setattr(localfleet, "stop", stopped.append)
    roots: list[Path] = []

    def tell(fleet: LocalFleet) -> bool:
        roots.append(fleet.root)
        if problem is not None:
            raise problem
        return False

    assert demo.in_fleet(console, fleet_at, tell) == 1
    assert len(stopped) == 1 and roots[0].is_dir()
    text = out.getvalue()
    assert said in text and f"logs kept in {roots[0] / 'logs'}" in text


def test_a_fleet_that_never_started_is_not_stopped(
    recorded: tuple[Console, io.StringIO], monkeypatch: pytest.MonkeyPatch
) -> None:
    console, out = recorded
    stopped: list[LocalFleet] = []
    monkeypatch.setattr(localfleet, "stop", stopped.append)

    def start(root: Path) -> LocalFleet:
        raise FleetError("port 8600 is in use. To fix: pick another with --port")

    assert demo.in_fleet(console, start, lambda f: True) == 1
    assert stopped == []
    assert "error port 8600 is in use" in out.getvalue()


class Jobs:
    """A stand-in client answering ``job`` and ``logs`` from what the test sets."""

    def __init__(self) -> None:
        self.details: dict[str, JobDetail] = {}
        self.pages: list[LogPage] = []

    def job(self, job_id: str) -> JobDetail:
        return self.details[job_id]

    def logs(self, job_id: str, after: int = 0) -> LogPage:
        empty = LogPage(job=job_id, state="running", next=after, lines=[])
        return self.pages.pop(0) if self.pages else empty


def detail(job: str, state: str, **fields: Any) -> JobDetail:
    base = {"id": job, "name": "train-low", "team": "research", "priority": 4}
    base |= {"priority_name": "low", "state": state, "gpus": 16, "replicas": 2}
    return JobDetail.model_validate(base | {"submitted_at": 1000.0} | fields)


def a_demo(client: Jobs) -> tuple[demo.Demo, io.StringIO]:
    out = io.StringIO()
    console = Console(file=out, width=200, color_system=None)
    story = Story(console, "http://x", "t", base=0.0)
    run = demo.Demo(console, client, story)  # type: ignore[arg-type]
    run.jobs["low"] = "1"
    return run, out


@pytest.mark.parametrize(
    ("fields", "warm"),
    [
        ({"state": "pending"}, False),
        ({"state": "running", "started_at": 1.0, "last_step": 3}, False),
        ({"state": "running", "started_at": None, "last_step": 50}, False),
        ({"state": "running", "started_at": 1.0, "last_step": 20}, True),
    ],
    ids=["not running", "too few steps", "no start time", "warmed up"],
)
def test_the_low_job_is_warm_once_running_past_twenty_steps(
    fields: dict[str, Any], warm: bool
) -> None:
    client = Jobs()
    client.details["1"] = detail("1", **fields)
    run, out = a_demo(client)
    assert run.low_warmed_up() is warm
    assert ("job 1 is at step 20" in out.getvalue()) is warm


def test_a_low_job_that_ended_early_stops_the_demo() -> None:
    client = Jobs()
    client.details["1"] = detail("1", "failed")
    run, _ = a_demo(client)
    with pytest.raises(demo.DemoError, match="job 1 ended early \\(failed\\); see `bolt logs 1`"):
        run.low_warmed_up()


def event(kind: str, seq: int = 1) -> EventOut:
    return EventOut(seq=seq, at=10.0, kind=kind, message=kind)


def test_the_demo_notes_the_checkpoint_step_and_then_the_resume_line() -> None:
    client = Jobs()
    client.details["1"] = detail("1", "requeued", last_step=37)
    run, out = a_demo(client)
    run._noticed(Told("1", event("checkpointed")))
    assert run.step_at_checkpoint == 37
    assert "job 1 last reported step before the stop: 37" in out.getvalue()
    run._scan_logs()
    assert run.resumed_from is None, "logs are read only once the job resumed"
    run._noticed(Told("1", event("resumed", 2)))
    client.pages = [
        LogPage(job="1", state="running", next=3, lines=["loading", "resumed from step 36"])
    ]
    run._scan_logs()
    assert run.resumed_from == 36 and run.log_after == 3
    assert "job 1 log: resumed from step 36" in out.getvalue()


def test_a_lost_job_stops_the_demo_and_an_end_is_recorded() -> None:
    run, _ = a_demo(Jobs())
    with pytest.raises(demo.DemoError, match="lost job 1: no job 1"):
        run._noticed(Told("1", None, "no job 1"))
    run.jobs["high"] = "2"
    run._ended(Told("1", None))
    assert not run.finished()
    run._ended(Told("2", None))
    assert run.finished()


def test_the_summary_holds_only_when_both_succeeded_and_the_low_one_resumed() -> None:
    client = Jobs()
    client.details["1"] = detail("1", "succeeded", exit_code=0, last_step=200, preemptions=1)
    client.details["2"] = detail("2", "succeeded", exit_code=0, last_step=100, name="train-high")
    run, out = a_demo(client)
    run.jobs["high"] = "2"
    assert not demo._summary(run.console, run), "the low job never said where it resumed"
    run.resumed_from, run.step_at_checkpoint = 150, 152
    assert demo._summary(run.console, run)
    text = out.getvalue()
    assert (
        "job 1 train-low (research, low): succeeded, exit code 0, 200 steps, 1 preemption(s)"
        in text
    )
    assert "job 1 resumed from step 150 (last step reported before the preemption: 152)" in text
    client.details["2"] = detail("2", "failed", exit_code=1)
    assert not demo._summary(run.console, run)


# --- bolt demo --forge ------------------------------------------------------------------------


def test_the_forge_fleet_has_gpu_cpu_and_storage_nodes_on_podman(tmp_path: Path) -> None:
    nodes = forgedemo.nodes()
    assert [n.name for n in nodes] == ["host-0", "host-1", "cpu-0", "store-0"]
    assert all(n.args == ("--runtime", "podman") for n in nodes)
    classes = {}
    for n in nodes:
        path = tmp_path / f"{n.name}.yaml"
        path.write_text(n.inventory)
        inv = load_declared(path)
        assert inv.name == n.name
        classes[n.name] = (inv.node_class, inv.gpus)
    assert classes["cpu-0"] == ("cpu", 0) and classes["store-0"] == ("storage", 0)
    assert classes["host-0"][1] == 8


def test_the_forge_demo_needs_podman(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shutil, "which", lambda _: None)
    assert forgedemo.engine_problem() == (
        "podman is not installed. To fix: apt-get install podman runc catatonit"
    )
    result = bolt("demo", "--forge")
    assert result.exit_code == 2
    assert "error podman is not installed" in result.stdout


def test_the_forge_demo_needs_its_image_built(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[list[str]] = []

    def run(argv: list[str], **_: Any) -> SimpleNamespace:
        asked.append(argv)
        return SimpleNamespace(returncode=1)

    monkeypatch.setattr(shutil, "which", lambda _: "/usr/bin/podman")
    monkeypatch.setattr(subprocess, "run", run)
    problem = forgedemo.engine_problem()
    assert problem is not None and "run deploy/images/build.sh podman" in problem
    assert asked == [["podman", "image", "exists", forgedemo.IMAGE]]
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: SimpleNamespace(returncode=0))
    assert forgedemo.engine_problem() is None

"""The long-running commands (``bolt server``, ``bolt agent``, ``bolt kube-scheduler``,
``bolt slurm-bridge``) as an operator starts them: each bad option exits 2 naming the option
and the fix before anything starts, and good options reach what would run. Nothing is
served: the point where each would start serving (``closing.serve``, ``agent.serve.serve``, the
scheduler's and bridge's ``run``) is replaced by a recorder."""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from s3_kit import S3
from typer.testing import CliRunner, Result

import boltforge.agent.inventory as inventory_module
import boltforge.agent.serve as agent_serve
import boltforge.control.app as control_app
import boltforge.gctune as gctune
import boltforge.kube.scheduler as kube_scheduler
import boltforge.slurm.bridge as slurm_bridge
from boltforge.cli.main import app
from boltforge.cli.server import _first_admin_token
from boltforge.control import closing
from boltforge.control.nodes.agents import LeaseTerms
from boltforge.control.runtime import ServerConfig
from boltforge.core.health import StragglerAction
from boltforge.core.policy import POLICIES
from boltforge.spec.images import ImagePolicy

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[3]
HOST0 = ROOT / "examples" / "nodes" / "host-0.yaml"
KUBECONFIG = """\
apiVersion: v1
kind: Config
clusters:
- name: lab
  cluster: {server: "https://127.0.0.1:6443"}
users:
- name: ops
  user: {token: kube-token}
contexts:
- name: lab
  context: {cluster: lab, user: ops}
current-context: lab
"""


def bolt(*args: str | Path) -> Result:
    return runner.invoke(app, [str(a) for a in args])


def refused(result: Result, *says: str) -> str:
    """Exit 2 with no traceback; the message holds each of ``says``; it is returned with
    its wrapping undone."""
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert "Traceback" not in result.output
    said = " ".join(result.stderr.split())
    for text in says:
        assert text in said, said
    return said


@pytest.fixture(autouse=True)
def quiet_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """No token, CA, kubeconfig or pod name from the environment; data under ``tmp_path``;
    the httpx logger's level put back after a command lowered it."""
    for name in ("BOLT_TOKEN", "BOLT_CA", "KUBECONFIG", "POD_NAME", "KUBERNETES_SERVICE_HOST"):
        monkeypatch.delenv(name, raising=False)
    for name in ("BOLT_ADMIN_TOKEN", "BOLT_AGENT_TOKEN", "SLURM_CONF"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.setenv("COLUMNS", "200")
    level = logging.getLogger("httpx").level
    yield
    logging.getLogger("httpx").setLevel(level)


# --- bolt server ------------------------------------------------------------------------------


@dataclass
class Served:
    """What ``bolt server`` would have served: the config and uvicorn's options."""

    configs: list[ServerConfig] = field(default_factory=list)
    runs: list[dict[str, Any]] = field(default_factory=list)
    collector_tuned: int = 0


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> Served:
    seen = Served()

    def create_app(config: ServerConfig) -> str:
        seen.configs.append(config)
        return "the app"

    def run(app_: object, **kw: Any) -> None:
        assert app_ == "the app"
        seen.runs.append(kw)

    def tune() -> None:
        seen.collector_tuned += 1

    monkeypatch.setattr(control_app, "create_app", create_app)
    monkeypatch.setattr(closing, "serve", run)
    monkeypatch.setattr(gctune, "tune", tune)
    return seen


def server(tmp_path: Path, *args: str | Path) -> Result:
    db = f"sqlite:///{tmp_path / 'store.db'}"
    return bolt("server", "--db", db, "--admin-token", "adm", *args)


def test_the_server_options_reach_its_config(served: Served, tmp_path: Path) -> None:
    result = server(
        tmp_path,
        *("--policy", "fifo", "--min-runtime", "30", "--cooldown", "90", "--churn", "0.5"),
        *("--heartbeat", "1", "--lease", "20", "--full-every", "3"),
        *("--straggler-action", "cordon", "--straggler-ratio", "2", "--straggler-samples", "5"),
        *("--progress-timeout", "0", "--recovery-hold", "2m", "--reports", tmp_path / "r"),
        *("--agent-token", "agt", "--checkpoint-root", tmp_path / "ckpt"),
        *("--host", "0.0.0.0", "--port", "9000"),
    )
    assert result.exit_code == 0, result.output
    [config] = served.configs
    assert config.db_url == f"sqlite:///{tmp_path / 'store.db'}"
    assert (config.policy, config.admin_token, config.agent_token) == ("fifo", "adm", "agt")
    assert config.checkpoint_root == str(tmp_path / "ckpt")
    rules = config.preempt
    assert (rules.min_runtime_s, rules.cooldown_s, rules.churn_fraction) == (30.0, 90.0, 0.5)
    assert config.terms == LeaseTerms(1.0, 10.0, 20.0)  # suspect after half the lease
    assert config.full_every_s == 3.0 and config.recovery_hold_s == 120.0
    health = config.health
    assert health.straggler_action is StragglerAction.CORDON
    assert (health.straggler_ratio, health.min_samples, health.window) == (2.0, 5, 20)
    assert health.progress_timeout_s is None  # 0 turns it off
    assert config.reports_dir == str(tmp_path / "r") and config.artifacts_dir is None
    [run] = served.runs
    assert (run["host"], run["port"]) == ("0.0.0.0", 9000)
    assert run["ssl_certfile"] is None and run["ssl_keyfile"] is None


def test_a_short_lease_still_gives_three_heartbeats_before_suspicion(
    served: Served, tmp_path: Path
) -> None:
    assert server(tmp_path, "--heartbeat", "2", "--lease", "8").exit_code == 0
    assert served.configs[0].terms == LeaseTerms(2.0, 6.0, 8.0)


def test_the_defaults_are_the_documented_ones(served: Served, tmp_path: Path) -> None:
    assert server(tmp_path).exit_code == 0
    [config] = served.configs
    assert config.policy == "default" and config.full_every_s == 10.0
    assert config.health.progress_timeout_s == 1800.0 and config.recovery_hold_s == 60.0
    assert config.teams is not None and not config.teams.images.active
    assert config.leader_lease.lease_s == 3.0 and config.replica == ""
    assert (served.runs[0]["host"], served.runs[0]["port"]) == ("127.0.0.1", 8600)
    assert served.runs[0]["proxy_headers"] is False  # X-Forwarded-* ignored unless trusted
    assert served.collector_tuned == 1  # boltforge.gctune's thresholds, for long passes
    data = Path(os.environ["XDG_DATA_HOME"]) / "boltforge"
    assert config.checkpoint_root == str(data / "checkpoints")


def test_image_options_make_a_server_wide_image_policy(served: Served, tmp_path: Path) -> None:
    args = ("--require-image", "--allowed-registry", "ghcr.io/acme/", "--require-digest")
    result = server(tmp_path, *args, "--allowed-registry", "registry.acme.com/")
    assert result.exit_code == 0, result.output
    teams = served.configs[0].teams
    assert teams is not None
    assert teams.images == ImagePolicy(
        require=True, registries=["ghcr.io/acme/", "registry.acme.com/"], digest=True
    )


def test_a_teams_file_gives_quotas_and_budgets(served: Served, tmp_path: Path) -> None:
    result = server(tmp_path, "--teams", ROOT / "examples" / "teams.yaml")
    assert result.exit_code == 0, result.output
    config = served.configs[0]
    assert set(config.budgets) == {"research", "nlp"}
    assert config.teams is not None and set(config.teams.teams) >= {"research", "nlp"}


def test_a_replica_advertises_its_address_and_lease(served: Served, tmp_path: Path) -> None:
    args = ("--replica", "s1", "--advertise", "https://10.0.0.5:8600", "--leader-lease", "6")
    assert server(tmp_path, *args).exit_code == 0
    config = served.configs[0]
    assert (config.replica, config.advertise_url) == ("s1", "https://10.0.0.5:8600")
    lease = config.leader_lease
    assert (lease.lease_s, lease.renew_every_s, lease.deadline_s) == (6.0, 1.0, 4.0)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("--policy", "lottery"), f"--policy 'lottery': known: {', '.join(POLICIES)}"),
        (("--progress-timeout", "a while"), "--progress-timeout 'a while'"),
        (("--recovery-hold", "later"), "--recovery-hold 'later'"),
        (("--straggler-ratio", "0.5"), "--straggler-ratio"),
        (("--straggler-samples", "1"), "--straggler-samples"),
        (("--full-every", "0.1"), "--full-every"),
        (("--straggler-action", "shout"), "--straggler-action"),
        (("--max-in-flight", "-1"), "--max-in-flight"),
        (("--port", "eighty"), "--port"),
        (("--artifacts-url", "https://b.example/x"), "--artifacts-url 'https://b.example/x': "),
    ],
    ids=lambda v: v[0] if isinstance(v, tuple) else None,
)
def test_a_bad_server_option_exits_2_naming_it_before_anything_starts(
    served: Served, tmp_path: Path, args: tuple[str, ...], says: str
) -> None:
    refused(server(tmp_path, *args), says)
    assert served.configs == [] and served.runs == []


def test_forwarded_headers_are_read_from_the_proxies_named_only(
    served: Served, tmp_path: Path
) -> None:
    assert server(tmp_path, "--forwarded-allow-ips", "10.0.0.7,10.0.0.8").exit_code == 0
    [run] = served.runs
    assert run["proxy_headers"] is True and run["forwarded_allow_ips"] == "10.0.0.7,10.0.0.8"


def test_artifacts_in_a_bucket_reach_the_config(served: Served, tmp_path: Path) -> None:
    args = ("--artifacts-url", "s3://ml-artifacts/bolt", "--artifacts-endpoint", "http://m:9000")
    assert server(tmp_path, *args).exit_code == 0
    config = served.configs[0]
    assert (config.artifacts_url, config.artifacts_endpoint) == (args[1], args[3])


def test_a_bucket_that_cannot_be_used_exits_2_saying_why(
    s3: S3, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(closing, "serve", lambda *a, **k: pytest.fail("served"))
    monkeypatch.setattr(gctune, "tune", lambda: None)  # the test process keeps its collector
    url = f"s3://{s3.bucket}-missing/bolt"
    result = server(tmp_path, "--artifacts-url", url, "--artifacts-endpoint", s3.endpoint)
    refused(result, f"--artifacts-url {url}: bucket {s3.bucket}-missing at {s3.endpoint}")


def test_durations_give_an_example_fix(served: Served, tmp_path: Path) -> None:
    refused(server(tmp_path, "--recovery-hold", "soon"), "To fix: e.g. 60s")
    refused(server(tmp_path, "--progress-timeout", "soon"), "To fix: e.g. 30m")


def test_a_bad_teams_file_exits_2_naming_the_field(served: Served, tmp_path: Path) -> None:
    teams = tmp_path / "teams.yaml"
    teams.write_text("teams:\n  nlp:\n    quota: {guaranteed: -4}\n")
    refused(
        server(tmp_path, "--teams", teams),
        f"error {teams}: 1 problem(s)",
        "teams.nlp.quota: the quota has a negative guarantee of -4",
        "To fix: use 0 or more GPUs",
    )
    assert served.configs == []


def test_a_missing_teams_file_exits_2(served: Served, tmp_path: Path) -> None:
    refused(server(tmp_path, "--teams", tmp_path / "none.yaml"), "none.yaml")


def test_the_first_start_makes_prints_and_saves_an_admin_token(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    home = tmp_path / "home"
    token = _first_admin_token(url, home)
    assert token is not None and token.startswith("bf_")
    saved = home / "admin-token"
    assert saved.read_text() == token + "\n"
    assert stat.S_IMODE(saved.stat().st_mode) == 0o600
    assert f"admin token (saved in {saved}): {token}" in " ".join(capsys.readouterr().err.split())


def test_a_store_that_has_an_admin_token_gets_no_new_one(tmp_path: Path) -> None:
    from control_kit import Fleet

    with Fleet(tmp_path / "fleet", hosts=0) as fleet:  # stores its admin token on start
        url = fleet.config.db_url
    home = tmp_path / "home"
    assert _first_admin_token(url, home) is None
    assert not (home / "admin-token").exists()


def test_a_server_without_an_admin_token_uses_the_one_it_made(
    served: Served, tmp_path: Path
) -> None:
    result = bolt("server", "--db", f"sqlite:///{tmp_path / 'store.db'}")
    assert result.exit_code == 0, result.output
    saved = Path(os.environ["XDG_DATA_HOME"]) / "boltforge" / "admin-token"
    assert served.configs[0].admin_token == saved.read_text().strip()


# --- bolt agent -------------------------------------------------------------------------------


@dataclass
class AgentRuns:
    calls: list[tuple[Any, ...]] = field(default_factory=list)
    code: int = 0


@pytest.fixture
def agent_runs(monkeypatch: pytest.MonkeyPatch) -> AgentRuns:
    seen = AgentRuns()

    def serve(*args: Any) -> int:
        seen.calls.append(args)
        return seen.code

    monkeypatch.setattr(agent_serve, "serve", serve)

    def no_nvml() -> Any:
        raise ImportError("No module named 'pynvml'")

    monkeypatch.setattr(inventory_module, "_import_pynvml", no_nvml)
    return seen


def agent(*args: str | Path) -> Result:
    return bolt("agent", "--server", "http://10.0.0.1:8600", *args)


def executable(path: Path) -> Path:
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(0o755)
    return path


def test_the_agent_serves_its_declared_inventory(agent_runs: AgentRuns, tmp_path: Path) -> None:
    prolog = executable(tmp_path / "prolog.sh")
    args = ("--token", "agt", "--inventory", HOST0, "--name", "gpu-7", "--prolog", prolog)
    result = agent(*args, "--epilog", tmp_path, "--hook-timeout", "9", "--work-dir", tmp_path / "w")
    assert result.exit_code == 0, result.output
    [(url, token, node, work, hooks, grace, engine, ca, identities)] = agent_runs.calls
    assert (url, token, node.name, node.gpus, node.rack) == (
        "http://10.0.0.1:8600",
        "agt",
        "gpu-7",
        8,
        "r0",
    )
    assert work == tmp_path / "w"
    assert (hooks.prologs, hooks.epilogs, hooks.timeout_s) == ((prolog,), (tmp_path,), 9.0)
    assert engine is None and ca is None and grace > 0
    assert not identities.allow_shared and identities.prefix == "bolt-"
    assert "puts the token on the command line" in result.stderr  # --token is deprecated


def test_the_agent_reads_its_token_from_a_file_and_passes_no_token_variable_on(
    agent_runs: AgentRuns, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    token = tmp_path / "token"
    token.write_text("agt-from-file\n")
    token.chmod(0o600)
    monkeypatch.setenv("BOLT_AGENT_TOKEN", "stray")
    result = agent("--token-file", token, "--inventory", HOST0)
    assert result.exit_code == 0, result.output
    assert agent_runs.calls[0][1] == "agt-from-file"
    assert "BOLT_AGENT_TOKEN" not in os.environ  # no child of the agent inherits it
    assert "command line" not in result.stderr


def test_the_agent_maps_teams_as_its_options_say(agent_runs: AgentRuns) -> None:
    args = ("--token", "agt", "--inventory", HOST0, "--allow-shared-identity")
    result = agent(*args, "--user-prefix", "job-", "--team-user", "nlp=nlp-runner")
    assert result.exit_code == 0, result.output
    identities = agent_runs.calls[0][8]
    assert identities.allow_shared and identities.prefix == "job-"
    assert identities.users == {"nlp": "nlp-runner"}
    assert "--allow-shared-identity" in " ".join(result.stderr.split())


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("--team-user", "nlp"), "--team-user 'nlp': expected TEAM=USER"),
        (("--team-user", "a=x", "--team-user", "a=y"), "team a is mapped twice"),
        (("--user-prefix", "../"), "--user-prefix '../'"),
    ],
)
def test_a_bad_identity_option_exits_2_naming_it(
    agent_runs: AgentRuns, args: tuple[str, ...], says: str
) -> None:
    refused(agent("--token", "agt", "--inventory", HOST0, *args), says)
    assert agent_runs.calls == []


def test_the_agent_exits_with_what_serve_returns(agent_runs: AgentRuns, monkeypatch: Any) -> None:
    agent_runs.code = 2
    monkeypatch.setenv("BOLT_TOKEN", "from-env")
    result = agent("--inventory", HOST0)
    assert result.exit_code == 2
    assert agent_runs.calls[0][1] == "from-env"


def test_the_agent_work_dir_defaults_to_one_per_node(
    agent_runs: AgentRuns, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert agent("--token", "agt", "--inventory", HOST0).exit_code == 0
    work = agent_runs.calls[0][3]
    assert work == Path(os.environ["XDG_DATA_HOME"]) / "boltforge" / "agent" / "host-0"


def test_the_agent_needs_a_token(agent_runs: AgentRuns) -> None:
    refused(agent("--inventory", HOST0), "--token-file: a token is required", "set BOLT_TOKEN")
    assert agent_runs.calls == []


def test_the_agent_needs_a_server(agent_runs: AgentRuns) -> None:
    refused(bolt("agent", "--token", "agt", "--inventory", HOST0), "--server")


@pytest.mark.parametrize("option", ["--prolog", "--epilog"])
def test_a_hook_that_does_not_exist_exits_2_naming_its_option(
    agent_runs: AgentRuns, tmp_path: Path, option: str
) -> None:
    gone = tmp_path / "gone.sh"
    refused(
        agent("--token", "agt", "--inventory", HOST0, option, gone),
        f"{option}: {gone} does not exist. To fix: pass an existing file",
    )
    assert agent_runs.calls == []


def test_a_hook_that_is_not_executable_says_how_to_fix_it(
    agent_runs: AgentRuns, tmp_path: Path
) -> None:
    script = tmp_path / "prolog.sh"
    script.write_text("#!/bin/sh\n")
    refused(
        agent("--token", "agt", "--inventory", HOST0, "--prolog", script),
        f"--prolog: {script} is not an executable file. To fix: chmod +x {script}",
    )


@pytest.mark.parametrize("runtime", ["podman", "docker"])
def test_a_container_runtime_that_is_not_installed_exits_2(
    agent_runs: AgentRuns, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, runtime: str
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    refused(
        agent("--token", "agt", "--inventory", HOST0, "--runtime", runtime),
        f"--runtime {runtime}: `{runtime}` is not on this node's PATH",
        "--runtime process",
    )
    assert agent_runs.calls == []


def test_an_installed_container_runtime_reaches_the_agent(
    agent_runs: AgentRuns, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    executable(tmp_path / "podman")
    monkeypatch.setenv("PATH", str(tmp_path))
    assert agent("--token", "agt", "--inventory", HOST0, "--runtime", "podman").exit_code == 0
    engine = agent_runs.calls[0][6]
    assert engine is not None and engine.kind == "podman"


def test_an_unknown_runtime_is_a_usage_error(agent_runs: AgentRuns) -> None:
    refused(agent("--token", "agt", "--inventory", HOST0, "--runtime", "lxc"), "--runtime")


def test_without_an_inventory_or_nvml_the_agent_says_to_declare_one(
    agent_runs: AgentRuns,
) -> None:
    refused(agent("--token", "agt"), "--inventory", "NVML is unavailable")
    assert agent_runs.calls == []


def test_a_bad_inventory_exits_2_naming_the_field(agent_runs: AgentRuns, tmp_path: Path) -> None:
    inv = tmp_path / "inv.yaml"
    inv.write_text(HOST0.read_text().replace("gpus: 8", "gpus: many"))
    refused(agent("--token", "agt", "--inventory", inv), "problem(s)", "gpus")
    assert agent_runs.calls == []


@pytest.mark.parametrize(("option", "value"), [("--hook-timeout", "0"), ("--leftover-grace", "-1")])
def test_agent_times_below_their_minimum_are_usage_errors(
    agent_runs: AgentRuns, option: str, value: str
) -> None:
    refused(agent("--token", "agt", "--inventory", HOST0, option, value), option)


# --- bolt kube-scheduler ----------------------------------------------------------------------


@dataclass
class Scheduled:
    made: list[tuple[Any, ...]] = field(default_factory=list)
    ran: int = 0


@pytest.fixture
def scheduled(monkeypatch: pytest.MonkeyPatch) -> Scheduled:
    seen = Scheduled()

    class Recorder:
        def __init__(self, *args: Any) -> None:
            seen.made.append(args)

        async def run(self) -> None:
            seen.ran += 1

        def stop(self) -> None:
            pass

    monkeypatch.setattr(kube_scheduler, "KubeScheduler", Recorder)
    return seen


@pytest.fixture
def kubeconfig(tmp_path: Path) -> Path:
    path = tmp_path / "kubeconfig"
    path.write_text(KUBECONFIG)
    return path


def kube(*args: str | Path) -> Result:
    return bolt("kube-scheduler", "--server", "http://boltforge:8080", *args)


def test_the_kube_scheduler_gets_its_labels_and_options(
    scheduled: Scheduled, kubeconfig: Path
) -> None:
    result = kube(
        *("--token", "adm", "--kubeconfig", kubeconfig, "--identity", "sched-a"),
        *("--scheduler-name", "gangs", "--node-selector", "pool=gpu", "--grace", "45"),
        *("--rack-label", "acme/rack", "--pool-label", "acme/pool"),
    )
    assert result.exit_code == 0, result.output
    assert scheduled.ran == 1
    [(_, _, _, me, options, elector)] = scheduled.made
    assert me == "sched-a"
    assert (options.scheduler_name, options.node_selector, options.grace_s) == (
        "gangs",
        "pool=gpu",
        45.0,
    )
    assert (options.labels.rack, options.labels.pool) == ("acme/rack", "acme/pool")
    assert options.labels.pod == "topology.boltforge.io/pod"
    assert elector is not None


def test_the_kube_scheduler_takes_the_taints_it_tolerates_for_every_pod(
    scheduled: Scheduled, kubeconfig: Path
) -> None:
    args = ("--kubeconfig", kubeconfig, "--tolerate-taint", "dedicated=gpu:NoSchedule")
    result = kube("--token", "adm", *args, "--tolerate-taint", "nvidia.com/gpu")
    assert result.exit_code == 0, result.output
    [(_, _, _, _, options, _)] = scheduled.made
    assert options.labels.tolerated == ("dedicated=gpu:NoSchedule", "nvidia.com/gpu")


def test_by_default_the_kube_scheduler_tolerates_the_gpu_taint(
    scheduled: Scheduled, kubeconfig: Path
) -> None:
    assert kube("--token", "adm", "--kubeconfig", kubeconfig).exit_code == 0
    [(_, _, _, _, options, _)] = scheduled.made
    assert options.labels.tolerated == ("nvidia.com/gpu",)


def test_a_tolerated_taint_that_is_not_one_exits_2_with_the_form(
    scheduled: Scheduled, kubeconfig: Path
) -> None:
    refused(
        kube("--token", "adm", "--kubeconfig", kubeconfig, "--tolerate-taint", "gpu:Never"),
        "--tolerate-taint:",
        "is not KEY[=VALUE]:EFFECT",
        "To fix: e.g. dedicated=gpu:NoSchedule",
    )
    assert scheduled.made == []


def test_without_leader_election_nothing_waits_on_a_lease(
    scheduled: Scheduled, kubeconfig: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("POD_NAME", "pod-7")
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    result = kube("--token", "adm", "--no-leader-election")
    assert result.exit_code == 0, result.output
    [(_, _, _, me, _, elector)] = scheduled.made
    assert me == "pod-7" and elector is None


def test_the_kube_scheduler_needs_a_token(scheduled: Scheduled, kubeconfig: Path) -> None:
    refused(kube("--kubeconfig", kubeconfig), "--token-file: a token is required")
    assert scheduled.made == []


def test_a_kubeconfig_that_is_not_there_exits_2_with_the_fix(
    scheduled: Scheduled, tmp_path: Path
) -> None:
    refused(
        kube("--token", "adm", "--kubeconfig", tmp_path / "nope"),
        "--kubeconfig:",
        "To fix: pass --kubeconfig PATH, set KUBECONFIG, or run in a pod",
    )
    assert scheduled.made == []


@pytest.mark.parametrize(
    "times",
    [
        ("--lease-duration", "10", "--renew-deadline", "10"),
        ("--retry-period", "5", "--renew-deadline", "4"),
        ("--lease-duration", "5", "--renew-deadline", "8", "--retry-period", "1"),
    ],
    ids=["renew equals lease", "retry above renew", "renew above lease"],
)
def test_lease_times_out_of_order_exit_2(
    scheduled: Scheduled, kubeconfig: Path, times: tuple[str, ...]
) -> None:
    refused(
        kube("--token", "adm", "--kubeconfig", kubeconfig, *times),
        "--renew-deadline: must lie between --retry-period and --lease-duration",
    )
    assert scheduled.made == []


def test_lease_times_do_not_matter_without_leader_election(
    scheduled: Scheduled, kubeconfig: Path
) -> None:
    args = ("--kubeconfig", kubeconfig, "--no-leader-election", "--renew-deadline", "99")
    assert kube("--token", "adm", *args).exit_code == 0
    assert scheduled.ran == 1


# --- bolt slurm-bridge ------------------------------------------------------------------------


@pytest.fixture
def bridged(monkeypatch: pytest.MonkeyPatch) -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
    made: list[tuple[tuple[Any, ...], dict[str, Any]]] = []

    class Recorder:
        def __init__(self, *args: Any, **kw: Any) -> None:
            made.append((args, kw))

        async def run(self) -> None:
            return None

    monkeypatch.setattr(slurm_bridge, "SlurmBridge", Recorder)
    return made


def slurm(*args: str | Path) -> Result:
    return bolt("slurm-bridge", "--server", "http://10.0.0.1:8600", *args)


def test_the_bridge_reads_the_topology_beside_slurm_conf(
    bridged: list[tuple[tuple[Any, ...], dict[str, Any]]], tmp_path: Path
) -> None:
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=lab\n")
    (tmp_path / "topology.conf").write_text(
        "SwitchName=r1 Nodes=gpu[01-02]\nSwitchName=r2 Nodes=gpu03 # spare\n"
    )
    result = slurm("--token", "adm", "--slurm-conf", conf, "--grace", "30", "--default-team", "ml")
    assert result.exit_code == 0, result.output
    [(args, kw)] = bridged
    assert args[3] == ["bolt"]  # the default partition
    assert kw["topology"] == {"gpu01": "r1", "gpu02": "r1", "gpu03": "r2"}
    assert (kw["grace_s"], kw["default_team"]) == (30.0, "ml")
    assert args[0].env["SLURM_CONF"] == str(conf)


def test_the_bridge_manages_every_partition_given(
    bridged: list[tuple[tuple[Any, ...], dict[str, Any]]], tmp_path: Path
) -> None:
    topo = tmp_path / "topo.conf"
    topo.write_text("SwitchName=leaf Nodes=n[1-3]\n")
    args = ("--partition", "gpu", "--partition", "big", "--topology", topo)
    assert slurm("--token", "adm", *args).exit_code == 0
    [(made, kw)] = bridged
    assert made[3] == ["gpu", "big"]
    assert kw["topology"] == {"n1": "leaf", "n2": "leaf", "n3": "leaf"}


def test_without_any_topology_each_node_keeps_its_rack_feature(
    bridged: list[tuple[tuple[Any, ...], dict[str, Any]]],
) -> None:
    assert slurm("--token", "adm").exit_code == 0
    assert bridged[0][1]["topology"] == {}


def test_the_bridge_needs_a_token(bridged: list[tuple[tuple[Any, ...], dict[str, Any]]]) -> None:
    refused(slurm(), "--token-file: a token is required")
    assert bridged == []


def test_a_topology_file_that_is_not_there_exits_2(
    bridged: list[tuple[tuple[Any, ...], dict[str, Any]]], tmp_path: Path
) -> None:
    refused(slurm("--token", "adm", "--topology", tmp_path / "t.conf"), "--topology: no file")
    assert bridged == []

"""What a member's job can reach on the host it runs on (issue 46, findings 1 and 2).

1. A bare-process job of one team, on a fleet started as ``bolt up`` starts it (as root),
   finds no token in any process's command line or environment, no other team's
   environment, and cannot read another team's checkpoint folder or log, the fleet's token
   files or the server's store.
2. A prolog or epilog, which runs as the agent's user (root on a node), never gets the job's
   environment: a job that sets ``BASH_ENV`` to a script it wrote, and ``LD_PRELOAD``,
   ``PYTHONPATH``, does not have it sourced or loaded by a bash epilog or prolog.
3. The agent's own credentials never reach a replica, however the agent was given them.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from boltforge.agent.outbox import Outbox
from boltforge.agent.preflight import NodeHooks, Preflight
from boltforge.agent.processes import replica_env, replica_paths
from boltforge.agent.runtime import AgentRuntime
from boltforge.cli import localfleet
from boltforge.client import Client
from boltforge.testing.processes import wait_until
from boltforge.wire.agent import Inventory, ReplicaEvent, ReplicaSpec
from boltforge.wire.jobs import TERMINAL, SubmitRequest

ROOT = Path(__file__).resolve().parents[2]
as_root = pytest.mark.skipif(
    os.geteuid() != 0,
    reason="needs root: only a root agent can run each team as a user of its own (CI runs as root)",
)
linux = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")

# Team nlp's job: its secret in its environment, a checkpoint, then it waits.
HOLDS_A_SECRET = """
import os, pathlib, time
pathlib.Path(os.environ["BOLT_CHECKPOINT_DIR"], "weights.pt").write_text("nlp weights")
print("nlp is up", flush=True)
time.sleep(120)
"""

# Team research's job: looks for everything it should not reach and prints what it found.
PROBES = """
import glob, json, os, sys
secrets, paths = json.loads(sys.argv[1]), json.loads(sys.argv[2])
found = {}
for proc in glob.glob("/proc/[0-9]*"):
    if proc == f"/proc/{os.getpid()}":
        continue  # its own command line holds what it looks for
    for part in ("cmdline", "environ"):
        try:
            data = open(f"{proc}/{part}", "rb").read()
        except OSError:
            continue
        for name, secret in secrets.items():
            if secret.encode() in data:
                found.setdefault(name, []).append(f"{proc}/{part}")
for name, path in paths.items():
    try:
        os.listdir(path) if os.path.isdir(path) else open(path, "rb").read(1)
    except OSError:
        continue
    found.setdefault(name, []).append(path)
print("FOUND " + json.dumps(found), flush=True)
"""


@pytest.fixture
def fleet_dir() -> Iterator[Path]:
    """A fleet folder outside pytest's own (which is root's alone), as ``bolt up`` uses."""
    path = Path(tempfile.mkdtemp(prefix="bolt-sec-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def job_python() -> str:
    """A Python a team's user can run (this one may live in root's home); skips without."""
    for python in (sys.executable, "/usr/bin/python3"):
        if Path(python).exists() and localfleet.blocked_for_others(Path(python)) is None:
            return python
    pytest.skip("no Python here that users other than root may run (for the jobs)")


def job_yaml(name: str, team: str, code: str, *args: str, env: dict[str, str] | None = None) -> str:
    command = [job_python(), "-c", code, *args]
    body = {"name": name, "team": team, "gpus": 1, "command": command, "env": env or {}}
    return json.dumps(body)  # JSON is YAML


def log_of(client: Client, job: str) -> str:
    return "\n".join(client.logs(job).lines)


def wait_log(client: Client, job: str, text: str) -> str:
    def check() -> str | None:
        got = log_of(client, job)
        if text in got:
            return got
        detail = client.job(job)
        assert detail.state not in TERMINAL, f"job {job} ended: {detail.reason} {got}"
        return None

    found: str = wait_until(check, 90.0, f"{text!r} in job {job}'s log")
    return found


@as_root
@linux
def test_a_members_bare_process_job_reaches_no_token_nor_another_teams_secrets(
    fleet_dir: Path,
) -> None:
    job_python()
    fleet = localfleet.start(fleet_dir, hosts=1, port=localfleet.free_port(), shared=False)
    try:
        localfleet.wait_ready(fleet)
        with Client(fleet.url, fleet.admin_token) as client:
            nlp = client.submit(
                SubmitRequest(
                    yaml=job_yaml("keeper", "nlp", HOLDS_A_SECRET, env={"API_KEY": "nlp-key-42"}),
                    workdir=str(ROOT),
                )
            ).job.id
            wait_log(client, nlp, "nlp is up")
            work = fleet.root / "agents" / "host-0"
            [nlp_log] = list((work / "logs").glob("*.log"))
            secrets = {
                "admin token": fleet.admin_token,
                "agent token": fleet.agent_token,
                "nlp's API key": "nlp-key-42",
            }
            paths = {
                "nlp's checkpoint folder": str(fleet.root / "checkpoints" / nlp),
                "nlp's checkpoint": str(fleet.root / "checkpoints" / nlp / "weights.pt"),
                "nlp's log": str(nlp_log),
                "the server's store": str(fleet.root / "server.db"),
                "the admin token file": str(fleet.root / "tokens" / "admin"),
                "the fleet's folder": str(fleet.root),
                "the fleet's record (tokens)": str(fleet.root / localfleet.PID_FILE),
            }
            probe = job_yaml("probe", "research", PROBES, json.dumps(secrets), json.dumps(paths))
            research = client.submit(SubmitRequest(yaml=probe, workdir=str(ROOT))).job.id
            line = wait_log(client, research, "FOUND ")
            found = json.loads(line.split("FOUND ", 1)[1].splitlines()[0])
            assert found == {}, f"team research's job reached: {found}"
            assert client.job(nlp).state == "running"  # its secrets were there to find
            client.cancel(nlp)
    finally:
        localfleet.stop(fleet)


# finding 2: prolog and epilog


# The job writes a script where BASH_ENV will point, and asks for it (and LD_PRELOAD).
PLANTS = """
import os, pathlib
pathlib.Path(os.environ["BOLT_CHECKPOINT_DIR"], "evil.sh").write_text(
    "touch " + os.environ["MARK"] + "\\n"
)
"""
HOOK = """#!/bin/bash
env > "{out}/$BOLT_HOOK.env"
"""


def runtime(work: Path, hooks: NodeHooks) -> AgentRuntime:
    preflight = Preflight(Inventory(name="box", gpus=8, source="declared"), hooks)
    return AgentRuntime(work, Outbox(), on_exit=lambda: None, preflight=preflight, hooks=hooks)


async def run_to_exit(rt: AgentRuntime, spec: ReplicaSpec) -> ReplicaEvent:
    await rt.start(spec)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        done = [e for e in rt.outbox.events if e.kind in ("exited", "failed")]
        if done:
            return done[-1]
        await asyncio.sleep(0.05)
    raise AssertionError("the replica did not exit")


def test_prolog_and_epilog_never_get_the_jobs_environment(tmp_path: Path) -> None:
    out, work = tmp_path / "hooks", tmp_path / "work"
    out.mkdir()
    hook = tmp_path / "hook.sh"
    hook.write_text(HOOK.format(out=out))
    hook.chmod(0o755)
    mark = tmp_path / "sourced-as-root"
    checkpoint = tmp_path / "checkpoints" / "j-1"
    env = {
        "MARK": str(mark),
        "BASH_ENV": str(checkpoint / "evil.sh"),
        "ENV": str(checkpoint / "evil.sh"),
        "LD_PRELOAD": str(checkpoint / "evil.so"),
        "PYTHONPATH": str(checkpoint),
        "RANK": "0",
    }
    spec = ReplicaSpec(
        replica="j-1/w0",
        job="j-1",
        team="nlp",
        epoch=1,
        action="run",
        command=[sys.executable, "-c", PLANTS],
        env=env,
        gpus=[2],
        checkpoint_dir=str(checkpoint),
    )
    # a prolog in a later epoch of the same job would find the planted script too
    (checkpoint).mkdir(parents=True)
    (checkpoint / "evil.sh").write_text(f"touch {mark}\n")
    hooks = NodeHooks(prologs=(hook,), epilogs=(hook,), timeout_s=20)
    event = asyncio.run(run_to_exit(runtime(work, hooks), spec))
    assert event.kind == "exited" and event.exit_code == 0, event
    assert not mark.exists(), "a hook sourced the job's BASH_ENV as the agent's user"
    for kind in ("prolog", "epilog"):
        seen = dict(
            line.split("=", 1)
            for line in (out / f"{kind}.env").read_text().splitlines()
            if "=" in line
        )
        leaked = {"MARK", "BASH_ENV", "ENV", "LD_PRELOAD", "PYTHONPATH"} & set(seen)
        assert not leaked, f"the {kind} got the job's {sorted(leaked)}"
        assert seen["PATH"] == "/usr/sbin:/usr/bin:/sbin:/bin"
        assert (seen["BOLT_JOB_ID"], seen["BOLT_TEAM"], seen["BOLT_GPUS"]) == ("j-1", "nlp", "2")
        assert seen["BOLT_HOOK"] == kind and seen["RANK"] == "0"
    assert seen["BOLT_EXIT_CODE"] == "0"


# no secret passed on


def test_the_agents_credentials_never_reach_a_replica(tmp_path: Path) -> None:
    agents_env = {
        "PATH": "/usr/bin:/bin",
        "BOLT_TOKEN": "agt-1",
        "BOLT_AGENT_TOKEN": "agt-2",
        "BOLT_ADMIN_TOKEN": "adm-3",
        "BOLT_TOKEN_FILE": "/etc/bolt/token",
        "BOLT_ADMIN_TOKEN_FILE": "/etc/bolt/admin",
    }
    spec = ReplicaSpec(
        replica="j-1/w0",
        job="j-1",
        epoch=1,
        action="run",
        command=["true"],
        env={"BOLT_AGENT_TOKEN": "asked-for"},
    )
    env = replica_env(spec, replica_paths(tmp_path, spec), agents_env)
    carried: dict[str, Any] = {k: v for k, v in env.items() if "TOKEN" in k}
    assert carried == {}

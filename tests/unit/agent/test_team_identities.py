"""Bare-process replicas as their team's Unix user (``agent/identity.py``): how teams map to
users, when the agent refuses, and, as root, that everything the agent does to a replica
still works when it runs as another user: its files, signals and the checkpoint grace,
cleanup of its leftover processes and /dev/shm files, its progress, its artifacts (its own
files only), and the record a restarted agent ends it by."""

from __future__ import annotations

import asyncio
import json
import os
import pwd
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from boltforge.agent.artifacts import SPOOL
from boltforge.agent.hooks import CLEAN_PATH
from boltforge.agent.identity import (
    COMMENT,
    Identities,
    Identity,
    IdentityRefused,
    parse_team_users,
    user_for,
)
from boltforge.agent.leftovers import LaunchRecord
from boltforge.agent.outbox import Outbox
from boltforge.agent.processes import hook_env, replica_env, replica_paths
from boltforge.agent.runtime import AgentRuntime
from boltforge.cli.localfleet import blocked_for_others
from boltforge.wire.agent import ReplicaEvent, ReplicaSpec

as_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="needs root: only root can run a replica as another user"
)
PREFIX = "bolt-t-"  # the users these tests make


# --- mapping teams to users -------------------------------------------------------------------


def test_a_team_maps_to_the_prefix_and_its_name_when_that_is_a_user_name() -> None:
    assert user_for("nlp") == "bolt-nlp"
    assert user_for("vision_2", "job-") == "job-vision_2"


def test_teams_that_are_no_user_name_get_distinct_short_names() -> None:
    dotted, underscored = user_for("a.b"), user_for("a_b")
    long = user_for("x" * 60)
    assert dotted != underscored and dotted.startswith("bolt-a_b-")
    assert len(long) <= 32 and long != user_for("x" * 59)


def test_team_users_are_parsed_and_checked() -> None:
    assert parse_team_users(["nlp=nlp-runner", "cv=cv"]) == {"nlp": "nlp-runner", "cv": "cv"}
    with pytest.raises(IdentityRefused, match="expected TEAM=USER"):
        parse_team_users(["nlp"])
    with pytest.raises(IdentityRefused, match="mapped twice"):
        parse_team_users(["a=x", "a=y"])


def test_an_agent_that_cannot_switch_users_refuses_naming_the_flag() -> None:
    identities = Identities(can_switch=False)
    with pytest.raises(IdentityRefused) as refused:
        identities.for_team("nlp")
    said = str(refused.value)
    assert "not root" in said and "--allow-shared-identity" in said and "nlp" in said


def test_with_the_opt_in_every_team_runs_as_the_agent() -> None:
    assert Identities(can_switch=False, allow_shared=True).for_team("nlp") is None
    assert Identities(can_switch=True, allow_shared=True).for_team("nlp") is None
    assert not Identities(can_switch=True, allow_shared=True).isolates


def test_a_replica_without_a_team_is_refused_where_teams_are_isolated() -> None:
    with pytest.raises(IdentityRefused, match="did not say which team"):
        Identities(can_switch=True).for_team("")


def test_hooks_get_a_fixed_path_and_the_replicas_values_only(tmp_path: Path) -> None:
    spec = ReplicaSpec(
        replica="j/w0",
        job="j",
        team="nlp",
        epoch=3,
        action="run",
        gpus=[1, 4],
        env={"RANK": "1", "LD_PRELOAD": "/tmp/x.so", "BASH_ENV": "/tmp/x.sh"},
    )
    user = Identity("bolt-nlp", 1234, 1234)
    env = hook_env(spec, replica_paths(tmp_path, spec), "epilog", user, exit_code=3)
    assert env["PATH"] == CLEAN_PATH and env["LANG"] == "C.UTF-8"
    assert (env["BOLT_JOB_ID"], env["BOLT_TEAM"], env["BOLT_EPOCH"]) == ("j", "nlp", "3")
    assert (env["BOLT_GPUS"], env["BOLT_EXIT_CODE"], env["BOLT_USER"]) == ("1,4", "3", "bolt-nlp")
    assert env["RANK"] == "1" and "LD_PRELOAD" not in env and "BASH_ENV" not in env


def test_a_replica_run_as_its_user_has_its_scratch_folder_as_home(tmp_path: Path) -> None:
    spec = ReplicaSpec(replica="j/w0", job="j", team="nlp", epoch=1, action="run")
    paths = replica_paths(tmp_path, spec)
    env = replica_env(spec, paths, {"HOME": "/root", "USER": "root"}, Identity("u", 5, 5))
    assert (env["HOME"], env["USER"], env["LOGNAME"]) == (str(paths.scratch), "u", "u")


# --- as root: real users ----------------------------------------------------------------------


def _userdel(name: str) -> None:
    subprocess.run(["userdel", name], capture_output=True, check=False)


@pytest.fixture
def users() -> Iterator[list[str]]:
    """Names of users a test made, deleted afterwards."""
    made: list[str] = []
    yield made
    for name in made:
        _userdel(name)


@as_root
def test_a_teams_user_is_made_once_unprivileged_and_marked_as_the_teams(
    users: list[str],
) -> None:
    identities = Identities(prefix=PREFIX)
    users.append(PREFIX + "nlp")
    _userdel(PREFIX + "nlp")
    first = identities.for_team("nlp")
    assert first is not None and first == identities.for_team("nlp")
    entry = pwd.getpwnam(PREFIX + "nlp")
    assert (entry.pw_uid, entry.pw_gid) == (first.uid, first.gid) and first.uid != 0
    assert entry.pw_gecos == COMMENT + "nlp" and entry.pw_shell == "/usr/sbin/nologin"
    users.append(PREFIX + "cv")
    other = Identities(prefix=PREFIX).for_team("cv")
    assert other is not None and other.uid != first.uid


@as_root
def test_a_user_made_for_another_team_is_never_used(users: list[str]) -> None:
    name = PREFIX + "t1"
    users.append(name)
    _userdel(name)
    subprocess.run(["useradd", "--system", "--comment", COMMENT + "t2", name], check=True)
    with pytest.raises(IdentityRefused, match="made for team t2, not t1"):
        Identities(prefix=PREFIX).for_team("t1")


@as_root
def test_a_team_mapped_to_root_or_to_no_user_is_refused() -> None:
    with pytest.raises(IdentityRefused, match="root"):
        Identities(users={"nlp": "root"}).for_team("nlp")
    with pytest.raises(IdentityRefused, match="does not exist on this node"):
        Identities(users={"nlp": "no-such-user-here"}).for_team("nlp")


# --- as root: what the agent does to a replica run as its team's user --------------------------

# Reports who it is, writes a checkpoint and a progress line as the SDK does, leaves a child
# and a /dev/shm file, writes a declared output, then waits for the checkpoint signal.
BEHAVES = """
import json, os, signal, subprocess, sys, time
def bye(*_):
    print("checkpoint on SIGTERM", flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, bye)
ck = os.environ["BOLT_CHECKPOINT_DIR"]
open(os.path.join(ck, "step-5.pt"), "w").write("weights")
with open(os.environ["BOLT_PROGRESS_FILE"], "a") as f:
    f.write(json.dumps({"step": 5, "at": time.time(), "checkpoint": True}) + "\\n")
open("/dev/shm/" + os.environ["BOLT_SHM_PREFIX"] + "seg", "w").write("x")
open("out.txt", "w").write("mine")
ready = os.path.join(os.environ["HOME"], "child-ready")
stays = "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
stays += "open(sys.argv[1], 'w'); time.sleep(60)"
child = subprocess.Popen([sys.executable, "-c", stays, ready])
while not os.path.exists(ready):
    time.sleep(0.01)
print(json.dumps({"uid": os.getuid(), "groups": os.getgroups(), "home": os.environ["HOME"],
                  "umask": os.umask(0), "token": os.environ.get("BOLT_TOKEN")}), flush=True)
time.sleep(60)
"""


def job_python() -> str:
    """A Python a team's user can run (this one may live in root's home); skips without."""
    for python in (sys.executable, "/usr/bin/python3"):
        if Path(python).exists() and blocked_for_others(Path(python)) is None:
            return python
    pytest.skip("no Python here that users other than root may run")


def open_dir(tmp_path: Path) -> Path:
    """A folder under ``tmp_path`` that other users may reach (pytest's is root's alone)."""
    for folder in [tmp_path, *tmp_path.parents]:
        if folder == Path("/"):
            break
        folder.chmod(folder.stat().st_mode | 0o711)
    return tmp_path


async def until(check: Callable[[], Any], timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (got := check()):
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)
    return got


@as_root
def test_a_replica_runs_as_its_teams_user_and_the_agent_still_stops_and_cleans_it(
    tmp_path: Path, users: list[str]
) -> None:
    python = job_python()
    base = open_dir(tmp_path)
    users.append(PREFIX + "nlp")
    cwd = base / "cwd"
    cwd.mkdir()
    secret = base / "root-only.txt"
    secret.write_text("root's")
    spec = ReplicaSpec(
        replica="j/w0",
        job="j",
        team="nlp",
        epoch=1,
        action="run",
        command=[python, "-c", BEHAVES],
        cwd=str(cwd),
        grace_s=20,
        outputs=["out.txt", str(secret)],
    )
    rt = AgentRuntime(
        base / "work",
        Outbox(),
        on_exit=lambda: None,
        env={"PATH": os.environ["PATH"], "BOLT_TOKEN": "agent-secret"},
        identities=Identities(prefix=PREFIX),
    )
    cwd.chmod(0o777)  # the job writes its output here

    async def go() -> ReplicaEvent:
        await rt.start(spec)
        replica = rt.live["j/w0"]
        await until(lambda: "uid" in replica.paths.log.read_text())
        rt.stop("j/w0")
        found: list[ReplicaEvent] = await until(
            lambda: [e for e in rt.outbox.events if e.kind == "exited"]
        )
        rt.collect()
        return found[0]

    event = asyncio.run(asyncio.wait_for(go(), 60))
    user = pwd.getpwnam(PREFIX + "nlp")
    paths = replica_paths(rt.work_dir, spec)
    said = json.loads(next(x for x in paths.log.read_text().splitlines() if x.startswith("{")))
    assert said["uid"] == user.pw_uid and said["groups"] in ([], [user.pw_gid])
    assert said["umask"] == 0o077 and said["token"] is None
    assert said["home"] == str(paths.scratch)
    assert "checkpoint on SIGTERM" in paths.log.read_text()
    assert event.exit_code == 0 and event.checkpoint_s is not None
    assert "ended 1 leftover process(es)" in event.cleanup and "/dev/shm" in event.cleanup
    for private in (paths.checkpoint, paths.log, paths.progress):
        st = private.stat()
        assert st.st_uid == user.pw_uid and st.st_mode & 0o077 == 0, private
    assert (paths.checkpoint / "step-5.pt").read_text() == "weights"
    assert [p.step for p in rt.outbox.progress] == [5]
    spooled = {p.name for p in (rt.work_dir / SPOOL).rglob("*") if p.is_file()}
    assert spooled == {"out.txt"}  # root's file, though declared, is not the job's
    assert "root-only.txt was not found" in event.cleanup
    assert not paths.scratch.exists()
    assert LaunchRecord(rt.work_dir / "replicas.json").read().replicas == []


def test_the_launch_record_keeps_the_user_a_leftover_ran_as(tmp_path: Path) -> None:
    spec = ReplicaSpec(replica="j/w0", job="j", team="nlp", epoch=1, action="run")
    record = LaunchRecord(tmp_path / "replicas.json")
    record.add(spec, os.getpid(), Identity("bolt-nlp", 4321, 4322))
    [entry] = record.read().replicas
    assert (entry.user, entry.uid, entry.gid) == ("bolt-nlp", 4321, 4322)


RESUMES = """
import os, sys
path = os.path.join(os.environ["BOLT_CHECKPOINT_DIR"], "step")
step = int(open(path).read()) if os.path.exists(path) else 0
print("resumed from", step, flush=True)
open(path, "w").write(str(step + 10))
"""


def runtime_as_teams(base: Path) -> AgentRuntime:
    return AgentRuntime(
        base / "work",
        Outbox(),
        on_exit=lambda: None,
        env={"PATH": os.environ["PATH"]},
        identities=Identities(prefix=PREFIX),
    )


async def run_epoch(rt: AgentRuntime, spec: ReplicaSpec) -> ReplicaEvent:
    await rt.start(spec)
    found: list[ReplicaEvent] = await until(
        lambda: [
            e for e in rt.outbox.events if e.kind in ("exited", "failed") and e.epoch == spec.epoch
        ]
    )
    return found[0]


@as_root
def test_a_later_epoch_resumes_from_the_checkpoint_its_team_user_wrote(
    tmp_path: Path, users: list[str]
) -> None:
    python = job_python()
    base = open_dir(tmp_path)
    users.append(PREFIX + "nlp")
    rt = runtime_as_teams(base)
    fields: dict[str, Any] = {"replica": "j/w0", "job": "j", "team": "nlp", "action": "run"}
    fields["command"] = [python, "-c", RESUMES]
    fields["cwd"] = str(base)

    async def go() -> list[ReplicaEvent]:
        return [await run_epoch(rt, ReplicaSpec(epoch=e, **fields)) for e in (1, 2)]

    first, second = asyncio.run(asyncio.wait_for(go(), 60))
    assert (first.exit_code, second.exit_code) == (0, 0), (first, second)
    spec = ReplicaSpec(epoch=2, **fields)
    assert "resumed from 10" in replica_paths(rt.work_dir, spec).log.read_text()


@as_root
def test_a_command_its_team_user_may_not_run_fails_naming_the_user_and_the_fix(
    tmp_path: Path, users: list[str]
) -> None:
    base = open_dir(tmp_path)
    users.append(PREFIX + "nlp")
    private = base / "private"
    private.mkdir(mode=0o700)
    tool = private / "tool.sh"
    tool.write_text("#!/bin/sh\necho hi\n")
    tool.chmod(0o755)
    spec = ReplicaSpec(
        replica="j/w0", job="j", team="nlp", epoch=1, action="run", command=[str(tool)]
    )
    event = asyncio.run(asyncio.wait_for(run_epoch(runtime_as_teams(base), spec), 60))
    assert event.kind == "failed"
    assert "Permission denied" in event.detail and f"runs as user {PREFIX}nlp" in event.detail
    assert "To fix:" in event.detail

"""The node agent's replicas as real processes: environment and process group, output in the
log, stopping (checkpoint signal, grace, kill), exit reports, prologs and epilogs around each
replica, and what a finished replica leaves in its process group."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from boltforge.agent.cleanup import group_members
from boltforge.agent.outbox import Outbox
from boltforge.agent.preflight import NodeHooks, Preflight
from boltforge.agent.processes import (
    exit_fields,
    launch,
    prepare,
    replica_env,
    replica_paths,
    safe_name,
    signal_group,
)
from boltforge.agent.runtime import AgentRuntime
from boltforge.wire.agent import Inventory, ReplicaEvent, ReplicaSpec

linux = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")

REPORTS_ITSELF = """
import json, os, sys
print(json.dumps({
    "pid": os.getpid(), "pgid": os.getpgid(0), "sid": os.getsid(0),
    "env": {k: os.environ.get(k) for k in sys.argv[1:]},
}), flush=True)
"""

CHECKPOINTS_ON_TERM = """
import signal, sys, time
def on_term(signum, frame):
    print("checkpoint saved", flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
print("ready", flush=True)
time.sleep(60)
"""

IGNORES_TERM = """
import signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("ready", flush=True)
time.sleep(60)
"""

LEAVES_A_CHILD = """
import subprocess, sys
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
print("child", child.pid, flush=True)
"""


def make_spec(code: str, *args: str, **fields: Any) -> ReplicaSpec:
    base: dict[str, Any] = {"replica": "j-7/w0", "job": "j-7", "epoch": 2, "action": "run"}
    base.update(gpus=[3, 5], command=[sys.executable, "-c", code, *args])
    return ReplicaSpec(**{**base, **fields})


def script(path: Path, body: str) -> Path:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return path


def base_env(**extra: str) -> dict[str, str]:
    return {"PATH": os.environ["PATH"], **extra}


def runtime(tmp_path: Path, **kw: Any) -> AgentRuntime:
    kw.setdefault("env", base_env())
    return AgentRuntime(tmp_path / "work", Outbox(), on_exit=lambda: None, **kw)


def events(rt: AgentRuntime, kind: str | None = None) -> list[ReplicaEvent]:
    return [e for e in rt.outbox.events if kind is None or e.kind == kind]


async def until(check: Callable[[], Any], timeout: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (got := check()):
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.02)
    return got


async def exited(rt: AgentRuntime, timeout: float = 10.0) -> ReplicaEvent:
    found: list[ReplicaEvent] = await until(lambda: events(rt, "exited"), timeout)
    [event] = found
    return event


def log_text(rt: AgentRuntime, spec: ReplicaSpec) -> str:
    path = replica_paths(rt.work_dir, spec).log
    return path.read_text() if path.exists() else ""


def run(make: Callable[[], Awaitable[Any]]) -> Any:
    return asyncio.run(asyncio.wait_for(make(), 30))


# environment, process group and output


def test_a_replica_gets_its_gpus_its_ranks_and_its_own_process_group(tmp_path: Path) -> None:
    names = ["CUDA_VISIBLE_DEVICES", "RANK", "WORLD_SIZE", "BOLT_JOB_ID", "BOLT_REPLICA"]
    names += ["BOLT_EPOCH", "BOLT_TOKEN", "PYTHONUNBUFFERED", "FROM_AGENT"]
    spec = make_spec(REPORTS_ITSELF, *names, env={"RANK": "1", "WORLD_SIZE": "2"})
    rt = runtime(tmp_path, env=base_env(BOLT_TOKEN="secret", FROM_AGENT="yes"))

    async def go() -> ReplicaEvent:
        await rt.start(spec)
        return await exited(rt)

    event = run(go)
    [started] = events(rt, "started")
    seen = json.loads(log_text(rt, spec))
    assert seen["pid"] == started.pid == event.pid
    assert seen["pgid"] == seen["pid"] == seen["sid"]  # a new session: group id is its pid
    assert seen["pgid"] != os.getpgid(0)
    assert seen["env"] == {
        "CUDA_VISIBLE_DEVICES": "3,5",
        "RANK": "1",
        "WORLD_SIZE": "2",
        "BOLT_JOB_ID": "j-7",
        "BOLT_REPLICA": "j-7/w0",
        "BOLT_EPOCH": "2",
        "BOLT_TOKEN": None,  # the agent's credentials stay out of the replica
        "PYTHONUNBUFFERED": "1",
        "FROM_AGENT": "yes",
    }
    assert event.exit_code == 0 and event.signal is None and not event.by_node


def test_the_agent_owns_its_variables_even_if_the_spec_sets_them() -> None:
    spec = make_spec("pass", env={"CUDA_VISIBLE_DEVICES": "0,1,2,3", "BOLT_EPOCH": "99"})
    paths = replica_paths(Path("/w"), spec)
    env = replica_env(spec, paths, {"PYTHONUNBUFFERED": "0", "HOME": "/root"})
    assert env["CUDA_VISIBLE_DEVICES"] == "3,5" and env["BOLT_EPOCH"] == "2"
    assert env["PYTHONUNBUFFERED"] == "1" and env["HOME"] == "/root"
    assert env["BOLT_CHECKPOINT_DIR"] == "/w/checkpoints/j-7"
    assert env["BOLT_SHM_PREFIX"] == "bolt-j-7-j-7_w0-e2-"
    assert replica_env(make_spec("pass", gpus=[]), paths, {})["CUDA_VISIBLE_DEVICES"] == ""


def test_replica_files_are_single_safe_names_per_epoch(tmp_path: Path) -> None:
    paths = replica_paths(tmp_path, make_spec("pass", replica="../evil/w0", job="../j"))
    assert paths.log.parent == tmp_path / "logs"
    assert paths.log.name == "_evil_w0.e2.log"
    assert paths.checkpoint == tmp_path / "checkpoints" / "_j"
    assert safe_name("...") == "_" and safe_name("a b/c") == "a_b_c"
    own = replica_paths(tmp_path, make_spec("pass", checkpoint_dir=str(tmp_path / "ck")))
    assert own.checkpoint == tmp_path / "ck"
    prepare(own)
    assert own.checkpoint.is_dir() and own.log.parent.is_dir() and own.progress.parent.is_dir()


def test_stdout_and_stderr_land_in_the_log_and_reach_the_outbox_in_order(tmp_path: Path) -> None:
    code = "import sys; print('out one'); print('err two', file=sys.stderr); print('out three')"
    spec = make_spec(code)
    rt = runtime(tmp_path)

    async def go() -> None:
        await rt.start(spec)
        await exited(rt)
        rt.collect()

    run(go)
    assert log_text(rt, spec) == "out one\nerr two\nout three\n"
    assert "".join(c.data for c in rt.outbox.logs) == "out one\nerr two\nout three\n"
    assert [c.seq for c in rt.outbox.logs] == list(range(len(rt.outbox.logs)))
    assert {(c.job, c.epoch) for c in rt.outbox.logs} == {("j-7", 2)}
    assert rt.live == {} and ("j-7/w0", 2) in rt.finished


def test_a_rerun_of_the_same_epoch_appends_to_its_log(tmp_path: Path) -> None:
    spec = make_spec("print('again')")
    paths = replica_paths(tmp_path, spec)
    prepare(paths)

    async def twice() -> list[int]:
        codes = []
        for _ in range(2):
            proc = await launch(spec, paths, base_env())
            codes.append(await proc.wait())
        return codes

    assert run(twice) == [0, 0]
    assert paths.log.read_text() == "again\nagain\n"


# exit codes and signals


@pytest.mark.parametrize(
    ("code", "exit_code", "sig"),
    [
        ("import sys; sys.exit(0)", 0, None),
        ("import sys; sys.exit(3)", 3, None),
        ("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", None, signal.SIGKILL),
        ("import os, signal; os.kill(os.getpid(), signal.SIGSEGV)", None, signal.SIGSEGV),
    ],
)
def test_the_exit_code_or_the_killing_signal_is_reported(
    tmp_path: Path, code: str, exit_code: int | None, sig: int | None
) -> None:
    rt = runtime(tmp_path)

    async def go() -> ReplicaEvent:
        await rt.start(make_spec(code))
        return await exited(rt)

    event = run(go)
    assert (event.exit_code, event.signal) == (exit_code, sig)
    assert event.checkpoint_s is None  # never asked to stop
    assert rt.statuses() == []


def test_return_codes_map_to_exit_code_or_signal() -> None:
    assert exit_fields(0) == (0, None)
    assert exit_fields(137) == (137, None)
    assert exit_fields(-9) == (None, 9)


@pytest.mark.parametrize(
    ("fields", "detail"),
    [
        ({"command": []}, "could not start: the replica has no command"),
        ({"command": ["/nonexistent/bin/train"]}, "could not start: "),
        ({"image": "nvcr.io/pytorch:24"}, "runs replicas as processes, not containers"),
    ],
)
def test_a_replica_that_cannot_start_is_reported_failed_once(
    tmp_path: Path, fields: dict[str, Any], detail: str
) -> None:
    spec = make_spec("pass", **fields)
    rt = runtime(tmp_path)

    async def go() -> None:
        await rt.start(spec)

    run(go)
    [failed] = events(rt)
    assert failed.kind == "failed" and detail in failed.detail and not failed.preflight
    assert rt.live == {} and ("j-7/w0", 2) in rt.finished


def test_a_bad_working_directory_fails_the_start(tmp_path: Path) -> None:
    rt = runtime(tmp_path)

    async def go() -> None:
        await rt.start(make_spec("pass", cwd=str(tmp_path / "missing")))

    run(go)
    [failed] = events(rt)
    assert failed.kind == "failed" and "could not start" in failed.detail
    assert "missing" in failed.detail


# stopping: checkpoint signal, grace, kill


def test_the_checkpoint_signal_lets_a_replica_save_and_exit_cleanly(tmp_path: Path) -> None:
    spec = make_spec(CHECKPOINTS_ON_TERM, grace_s=10.0)
    rt = runtime(tmp_path)

    async def go() -> ReplicaEvent:
        await rt.start(spec)
        await until(lambda: "ready" in log_text(rt, spec))
        assert rt.statuses()[0].state == "running"
        rt.stop("j-7/w0")
        assert rt.statuses()[0].state == "stopping"
        return await exited(rt)

    event = run(go)
    assert event.exit_code == 0 and event.signal is None
    assert event.checkpoint_s is not None and 0 <= event.checkpoint_s < 5
    assert not event.by_node
    assert "checkpoint saved" in log_text(rt, spec)


def test_a_replica_that_ignores_the_checkpoint_signal_is_killed_after_the_grace(
    tmp_path: Path,
) -> None:
    spec = make_spec(IGNORES_TERM, grace_s=30.0)
    rt = runtime(tmp_path)

    async def go() -> tuple[ReplicaEvent, float]:
        await rt.start(spec)
        await until(lambda: "ready" in log_text(rt, spec))
        began = time.monotonic()
        rt.stop("j-7/w0", grace_s=0.3)  # the desired state's grace overrides the spec's
        rt.stop("j-7/w0", grace_s=0.3)  # already stopping: nothing more
        event = await exited(rt)
        return event, time.monotonic() - began

    event, took = run(go)
    assert event.signal == signal.SIGKILL and event.exit_code is None
    assert event.checkpoint_s is not None and 0.25 <= event.checkpoint_s < 5
    assert 0.25 <= took < 5


def test_a_grace_of_zero_kills_at_once_even_while_stopping(tmp_path: Path) -> None:
    spec = make_spec(IGNORES_TERM, grace_s=30.0)
    rt = runtime(tmp_path)

    async def go() -> ReplicaEvent:
        await rt.start(spec)
        await until(lambda: "ready" in log_text(rt, spec))
        rt.stop("j-7/w0")  # 30 s grace
        rt.stop("j-7/w0", grace_s=0)
        return await exited(rt, timeout=5)

    event = run(go)
    assert event.signal == signal.SIGKILL


def test_stop_all_marks_replicas_stopped_by_the_node(tmp_path: Path) -> None:
    specs = [make_spec(CHECKPOINTS_ON_TERM, replica=f"j-7/w{i}", gpus=[i]) for i in range(2)]
    rt = runtime(tmp_path)

    async def go() -> list[ReplicaEvent]:
        for spec in specs:
            await rt.start(spec)
        await until(lambda: all("ready" in log_text(rt, s) for s in specs))
        assert rt.busy_gpus() == {0, 1}
        rt.stop_all(grace_s=5.0)
        await rt.wait_all(10.0)
        await until(lambda: len(events(rt, "exited")) == 2)
        return events(rt, "exited")

    ended = run(go)
    assert {e.replica for e in ended} == {"j-7/w0", "j-7/w1"}
    assert all(e.by_node and e.exit_code == 0 for e in ended)
    assert rt.busy_gpus() == set()


def test_stopping_an_unknown_replica_does_nothing(tmp_path: Path) -> None:
    rt = runtime(tmp_path)
    rt.stop("nobody")
    rt.stop("nobody", grace_s=0)
    assert len(rt.outbox) == 0


def test_signal_group_reports_a_group_that_is_gone(tmp_path: Path) -> None:
    spec = make_spec("pass")
    paths = replica_paths(tmp_path, spec)
    prepare(paths)

    async def go() -> int:
        proc = await launch(spec, paths, base_env())
        await proc.wait()
        return proc.pid

    pid = run(go)
    assert signal_group(pid, 0) is False


def test_a_skipped_stop_is_reported_exited_without_running(tmp_path: Path) -> None:
    rt = runtime(tmp_path)
    rt.skip(make_spec("pass", action="stop"))
    [event] = events(rt)
    assert event.kind == "exited" and event.detail == "stopped before it started"
    assert event.pid is None and ("j-7/w0", 2) in rt.finished


# prologs and epilogs around a replica


def declared_preflight(hooks: NodeHooks) -> Preflight:
    return Preflight(Inventory(name="box", gpus=8, source="declared"), hooks)


def test_prologs_run_in_order_with_the_replicas_environment_before_it_starts(
    tmp_path: Path,
) -> None:
    trail = tmp_path / "trail"
    first = script(tmp_path / "a.sh", f'echo "a $BOLT_HOOK $CUDA_VISIBLE_DEVICES" >> {trail}\n')
    second = script(tmp_path / "b.sh", f'echo "b $BOLT_REPLICA $RANK" >> {trail}\n')
    hooks = NodeHooks(prologs=(first, second), timeout_s=10)
    spec = make_spec(f"open({str(trail)!r}, 'a').write('replica\\n')", env={"RANK": "4"})
    rt = runtime(tmp_path, preflight=declared_preflight(hooks), hooks=hooks)

    async def go() -> None:
        await rt.start(spec)
        await exited(rt)

    run(go)
    assert trail.read_text() == "a prolog 3,5\nb j-7/w0 4\nreplica\n"
    assert [e.kind for e in events(rt)] == ["started", "exited"]


def test_a_prolog_past_its_timeout_refuses_the_replica(tmp_path: Path) -> None:
    slow = script(tmp_path / "slow.sh", "echo probing; sleep 30\n")
    hooks = NodeHooks(prologs=(slow,), timeout_s=0.3)
    marker = tmp_path / "ran"
    spec = make_spec(f"open({str(marker)!r}, 'w')")
    rt = runtime(tmp_path, preflight=declared_preflight(hooks), hooks=hooks)

    async def go() -> float:
        began = time.monotonic()
        await rt.start(spec)
        return time.monotonic() - began

    took = run(go)
    assert took < 10
    [failed] = events(rt)
    assert failed.kind == "failed" and failed.preflight
    assert "timed out after 0.3 s" in failed.detail and "probing" in failed.detail
    assert not marker.exists() and rt.live == {}
    assert ("j-7/w0", 2) in rt.finished  # that epoch is not tried again here


def test_a_failing_epilog_is_named_in_the_exit_report_with_the_exit_code(
    tmp_path: Path,
) -> None:
    trail = tmp_path / "trail"
    ok = script(tmp_path / "1-ok.sh", f'echo "$BOLT_HOOK $BOLT_EXIT_CODE" >> {trail}\n')
    bad = script(tmp_path / "2-bad.sh", "echo cannot reset GPU; exit 4\n")
    never = script(tmp_path / "3-never.sh", f"echo never >> {trail}\n")
    hooks = NodeHooks(epilogs=(ok, bad, never), timeout_s=10)
    rt = runtime(tmp_path, hooks=hooks)

    async def go() -> ReplicaEvent:
        await rt.start(make_spec("import sys; sys.exit(7)"))
        return await exited(rt)

    event = run(go)
    assert trail.read_text() == "epilog 7\n"
    assert event.exit_code == 7
    assert f"epilog {bad} exited with code 4; output: cannot reset GPU" in event.cleanup


# leftovers of a finished replica


@linux
def test_what_a_finished_replica_left_in_its_group_is_ended_before_the_exit_report(
    tmp_path: Path,
) -> None:
    spec = make_spec(LEAVES_A_CHILD)
    rt = runtime(tmp_path)

    async def go() -> tuple[ReplicaEvent, int]:
        await rt.start(spec)
        event = await exited(rt)
        return event, int(log_text(rt, spec).split()[1])

    event, child = run(go)
    assert group_members(event.pid or -1) == []
    stat = Path(f"/proc/{child}/stat")
    assert not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    assert event.exit_code == 0
    assert "ended 1 leftover process(es) (SIGTERM)" in event.cleanup


@linux
def test_a_replica_that_leaves_nothing_reports_no_cleanup(tmp_path: Path) -> None:
    rt = runtime(tmp_path)

    async def go() -> ReplicaEvent:
        await rt.start(make_spec("print('tidy')"))
        return await exited(rt)

    assert run(go).cleanup == ""

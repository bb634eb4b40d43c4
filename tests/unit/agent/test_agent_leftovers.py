"""Replicas left running by an agent killed with SIGKILL: the launch record the agent keeps,
and what a restarted agent does with what it finds (ends it, then registers), first on its
own and then with a real server, a real agent and a real replica process."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from boltforge.agent.cleanup import group_members
from boltforge.agent.leftovers import (
    Found,
    LaunchRecord,
    Saved,
    boot_id,
    find,
    grace_for,
    process_start,
)
from boltforge.agent.outbox import Outbox
from boltforge.agent.processes import prepare, replica_env, replica_paths
from boltforge.agent.runtime import AgentRuntime
from boltforge.control.store.db import Database
from boltforge.control.store.invariants import double_allocations
from boltforge.testing.processes import LocalCluster, wait_until
from boltforge.wire.agent import ReplicaSpec
from boltforge.wire.jobs import SubmitRequest

pytestmark = pytest.mark.skipif(
    not Path("/proc/self/stat").exists(), reason="leftovers are found through Linux /proc"
)

SLEEPS = "import time; time.sleep(120)"

CHECKPOINTS_ON_SIGTERM = """
import os, signal, sys, time
out = os.environ["BOLT_CHECKPOINT_DIR"]
def bye(*_):
    open(os.path.join(out, "checkpoint"), "w").write("x")
    sys.exit(0)
signal.signal(signal.SIGTERM, bye)
open(os.path.join(out, "ready"), "w").write("x")
while True:
    time.sleep(0.05)
"""

LEAVES_A_CHILD = """
import subprocess, sys
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
"""


def spec(name: str = "j/w0", epoch: int = 1, **fields: Any) -> ReplicaSpec:
    return ReplicaSpec(replica=name, job="j", epoch=epoch, action="run", **fields)


def gone(pid: int) -> bool:
    """True when ``pid`` has exited (a zombie waiting for its reaper counts as gone)."""
    return process_start(pid) is None


def run_like_a_replica(
    work: Path, one: ReplicaSpec, code: str, marked: bool = True
) -> subprocess.Popen[bytes]:
    """Start ``code`` as the agent starts a replica: its own session, the replica's
    environment (without the ``BOLT_*`` variables unless ``marked``)."""
    paths = replica_paths(work, one)
    prepare(paths)
    env = replica_env(one, paths, os.environ) if marked else dict(os.environ)
    command = [sys.executable, "-c", code]
    return subprocess.Popen(command, env=env, start_new_session=True)


def restarted(work: Path) -> AgentRuntime:
    """The runtime of an agent started again on ``work``."""
    return AgentRuntime(work, Outbox(), on_exit=lambda: None)


def end_leftovers(runtime: AgentRuntime, max_grace_s: float = 30.0) -> int:
    return asyncio.run(runtime.end_leftovers(max_grace_s))


def left_checkpointing(
    tmp_path: Path, work: Path, procs: list[subprocess.Popen[bytes]], lease_left_s: float
) -> subprocess.Popen[bytes]:
    """A replica (``j/w0``, grace 10 s) that checkpoints on SIGTERM, running and recorded
    by an agent whose lease had ``lease_left_s`` left when it was killed; once it is ready."""
    one = spec(grace_s=10.0, checkpoint_dir=str(tmp_path / "ckpt"))
    record = restarted(work).record
    record.renewed(time.time() + lease_left_s)
    proc = run_like_a_replica(work, one, CHECKPOINTS_ON_SIGTERM)
    procs.append(proc)
    record.add(one, proc.pid)
    wait_until(lambda: (tmp_path / "ckpt" / "ready").exists(), 30, "the replica to be ready")
    return proc


def save(work: Path, saved: Saved) -> None:
    (work / "replicas.json").write_text(saved.model_dump_json())


@pytest.fixture
def procs() -> Any:
    """Processes a test started, with what they left in their groups: killed at its end,
    whatever happened."""
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


# the record


def test_the_record_round_trips_every_launch_and_forgets_exits(tmp_path: Path) -> None:
    path = tmp_path / "replicas.json"
    record = LaunchRecord(path)
    record.renewed(1000.0)
    assert not path.exists()  # nothing launched: nothing to write
    me = os.getpid()
    first = record.add(spec("j/w0", grace_s=12.0, gpus=[0, 1], env={"RANK": "0"}), me)
    record.add(spec("j/w1", epoch=3), me)
    record.renewed(2000.0)

    saved = LaunchRecord(path).read()
    assert saved.lease_until == 2000.0
    assert [(e.spec.replica, e.spec.epoch) for e in saved.replicas] == [("j/w0", 1), ("j/w1", 3)]
    assert saved.replicas[0] == first
    assert (first.pid, first.pgid) == (me, os.getpgid(me))
    assert first.start == process_start(me) and first.start is not None
    assert first.boot == boot_id() != ""
    assert first.spec.gpus == [0, 1] and first.spec.env == {"RANK": "0"}
    assert find(first) is Found.RUNNING

    record.remove("j/w0", 1)
    record.remove("j/w0", 1)  # twice: no harm
    assert [e.spec.replica for e in LaunchRecord(path).read().replicas] == ["j/w1"]
    assert oct(path.stat().st_mode & 0o777) == oct(0o600)


def test_a_missing_or_unreadable_record_reads_as_empty(tmp_path: Path) -> None:
    path = tmp_path / "replicas.json"
    assert LaunchRecord(path).read() == Saved()
    path.write_text('{"replicas": [{"pid": ')
    assert LaunchRecord(path).read() == Saved()


def test_the_record_is_replaced_whole_never_written_in_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "replicas.json"
    record = LaunchRecord(path)
    record.add(spec("j/w0"), os.getpid())
    replaced: list[tuple[Path, Path]] = []
    real_replace = os.replace

    def spy(src: Any, dst: Any) -> None:
        replaced.append((Path(src), Path(dst)))
        assert Path(src).read_text() != path.read_text()  # the old record stands until now
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", spy)
    record.add(spec("j/w1"), os.getpid())
    [(src, dst)] = replaced
    assert dst == path and src.parent == path.parent and src != path
    whole = path.read_text()
    assert len(LaunchRecord(path).read().replicas) == 2

    def fails(src: Any, dst: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", fails)
    record.remove("j/w0", 1)  # cannot be written: logged, the old record is intact
    assert path.read_text() == whole
    assert [p.name for p in tmp_path.iterdir()] == ["replicas.json"]  # no temporary left


def test_the_grace_is_the_spec_s_within_the_cap_and_what_the_lease_had_left() -> None:
    saved = Saved.model_validate(
        {"replicas": [{"spec": spec(grace_s=50.0).model_dump(), "pid": 1, "pgid": 1}]}
    )
    one = saved.replicas[0]
    assert grace_for(one, lease_until=1100.0, max_grace_s=30.0, now=1000.0) == 30.0
    assert grace_for(one, lease_until=1012.5, max_grace_s=30.0, now=1000.0) == 12.5
    assert grace_for(one, lease_until=990.0, max_grace_s=30.0, now=1000.0) == 0.0
    assert grace_for(one, lease_until=None, max_grace_s=30.0, now=1000.0) == 0.0


# a restarted agent


def test_a_leftover_gets_the_checkpoint_signal_is_reported_and_forgotten(
    tmp_path: Path, procs: list[subprocess.Popen[bytes]]
) -> None:
    work = tmp_path / "work"
    proc = left_checkpointing(tmp_path, work, procs, lease_left_s=60)

    runtime = restarted(work)
    assert end_leftovers(runtime) == 1
    assert proc.wait(10) == 0  # it checkpointed and exited
    assert (tmp_path / "ckpt" / "checkpoint").exists()
    [event] = runtime.outbox.events
    assert (event.replica, event.epoch, event.kind, event.by_node) == ("j/w0", 1, "exited", True)
    assert event.pid == proc.pid and event.exit_code is None and event.signal is None
    assert event.checkpoint_s is not None
    assert "ended 1 process(es) left running when the agent was killed (SIGTERM)" in event.cleanup
    assert runtime.finished == {("j/w0", 1)}
    assert [s.state for s in runtime.outbox.unreported_exits()] == ["exited"]
    assert LaunchRecord(work / "replicas.json").read().replicas == []


def test_past_the_lease_a_leftover_is_killed_without_a_checkpoint(
    tmp_path: Path, procs: list[subprocess.Popen[bytes]]
) -> None:
    work = tmp_path / "work"
    # the lease ran out while the agent was away
    proc = left_checkpointing(tmp_path, work, procs, lease_left_s=-1)

    runtime = restarted(work)
    assert end_leftovers(runtime) == 1
    assert proc.wait(10) == -signal.SIGKILL
    assert not (tmp_path / "ckpt" / "checkpoint").exists()
    [event] = runtime.outbox.events
    assert event.checkpoint_s is None and "(SIGKILL)" in event.cleanup


def test_an_entry_whose_pid_now_runs_another_process_is_not_touched(
    tmp_path: Path, procs: list[subprocess.Popen[bytes]]
) -> None:
    work = tmp_path / "work"
    one = spec()
    proc = run_like_a_replica(work, one, SLEEPS)  # even with the replica's environment
    procs.append(proc)
    entry = LaunchRecord(work / "replicas.json").add(one, proc.pid)
    assert entry.start is not None
    reused = entry.model_copy(update={"start": entry.start + 1})
    save(work, Saved(lease_until=time.time() + 60, replicas=[reused]))
    assert find(reused) is Found.REUSED

    runtime = restarted(work)
    assert end_leftovers(runtime) == 0
    time.sleep(0.2)
    assert proc.poll() is None and not gone(proc.pid)
    assert len(runtime.outbox) == 0 and runtime.finished == set()
    assert LaunchRecord(work / "replicas.json").read().replicas == []


def test_an_entry_of_another_boot_is_not_touched(
    tmp_path: Path, procs: list[subprocess.Popen[bytes]]
) -> None:
    work = tmp_path / "work"
    proc = run_like_a_replica(work, spec(), SLEEPS)
    procs.append(proc)
    entry = LaunchRecord(work / "replicas.json").add(spec(), proc.pid)
    other = entry.model_copy(update={"boot": "another-boot"})
    save(work, Saved(lease_until=time.time() + 60, replicas=[other]))
    assert find(other) is Found.UNKNOWN
    assert end_leftovers(restarted(work)) == 0
    assert proc.poll() is None


def test_what_an_exited_replica_left_in_its_group_is_ended_if_it_names_the_replica(
    tmp_path: Path, procs: list[subprocess.Popen[bytes]]
) -> None:
    work = tmp_path / "work"
    ours, theirs = spec("j/w0"), spec("j/w1")
    record = LaunchRecord(work / "replicas.json")
    record.renewed(time.time() + 60)
    leaders = {}
    for one, marked in ((ours, True), (theirs, False)):
        leader = run_like_a_replica(work, one, LEAVES_A_CHILD, marked=marked)
        procs.append(leader)
        record.add(one, leader.pid)
        leader.wait(10)
        leaders[one.replica] = leader.pid
    ours_left = wait_until(lambda: group_members(leaders["j/w0"]), 10, "its child")
    theirs_left = wait_until(lambda: group_members(leaders["j/w1"]), 10, "the other child")

    runtime = restarted(work)
    assert end_leftovers(runtime, max_grace_s=5.0) == 1
    assert all(gone(pid) for pid in ours_left)
    assert not any(gone(pid) for pid in theirs_left)  # no BOLT_* variables: not the replica's
    [event] = runtime.outbox.events
    assert event.replica == "j/w0" and event.by_node


# with a real server and a real agent

PID_FILE_AND_SLEEP = """
import os, pathlib, time
out = pathlib.Path({out!r})
(out / ("epoch-" + os.environ["BOLT_EPOCH"])).write_text(str(os.getpid()))
time.sleep(600)
"""


def test_an_agent_restarted_after_sigkill_ends_what_it_left_and_the_job_runs_again(
    tmp_path: Path,
) -> None:
    out = tmp_path / "pids"
    out.mkdir()
    command = [sys.executable, "-c", PID_FILE_AND_SLEEP.format(out=str(out))]
    job_spec = {"name": "sleeper", "team": "research", "gpus": 8, "command": command}
    cluster = LocalCluster(tmp_path / "fleet", hosts=1)
    with cluster, cluster.client() as api, _killed_after(out):
        job = api.submit(SubmitRequest(spec=job_spec)).job.id
        first = wait_until(lambda: _pid(out, 1), 60, "the replica to start")
        wait_until(lambda: api.job(job).state == "running", 60, "the job to run")

        agent = cluster.agents["host-0"]
        os.kill(agent.popen.pid, signal.SIGKILL)
        agent.popen.wait(10)
        time.sleep(0.5)
        assert not gone(first), "the replica outlives its killed agent"

        cluster.start_agent("host-0")
        wait_until(lambda: gone(first), 60, "the restarted agent to end the leftover")
        second = wait_until(lambda: _pid(out, 2), 60, "the job to start again")
        detail = wait_until(lambda: _running_at(api, job, 2), 60, "the job to run again")
        assert second != first and not gone(second)
        assert detail.restarts == 1
        notes = [e.message for e in detail.events if e.kind == "cleanup"]
        assert any("left running when the agent was killed (SIGTERM)" in n for n in notes)

        log = (cluster.data / "host-0.log").read_text()
        again = log.rsplit("agent for host-0", 1)[1]
        ended = again.index("was left running when the agent was killed: ending it")
        assert ended < again.index("registered as node host-0")

        db = Database(f"sqlite:///{cluster.data / 'store.db'}")
        try:
            with db.session() as s:
                assert double_allocations(s) == []
        finally:
            db.close()


@contextlib.contextmanager
def _killed_after(out: Path) -> Iterator[None]:
    """On a failure, the replicas that wrote pid files in ``out`` and still run are killed
    (a process is known by its command line, which names ``out``)."""
    try:
        yield
    except BaseException:
        for path in out.glob("epoch-*"):
            pid = int(path.read_text() or 0)
            with contextlib.suppress(OSError):
                if str(out).encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                    os.kill(pid, signal.SIGKILL)
        raise


def _pid(out: Path, epoch: int) -> int | None:
    """The pid the job's replica at ``epoch`` wrote, once written."""
    path = out / f"epoch-{epoch}"
    text = path.read_text() if path.exists() else ""
    return int(text) if text else None


def _running_at(api: Any, job: str, epoch: int) -> Any:
    detail = api.job(job)
    return detail if detail.state == "running" and detail.epoch >= epoch else None

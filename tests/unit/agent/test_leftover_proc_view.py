"""How a restarted agent tells its leftovers from other processes, read from a ``/proc`` laid
out by the test: a recorded replica is still running only with the same boot and the same
start time; once its leader is gone, only while a process of its group carries its job,
replica and epoch; a zombie is gone; anything of another boot is left alone."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from boltforge.agent.leftovers import (
    Found,
    Launched,
    LaunchRecord,
    boot_id,
    carries,
    find,
    process_start,
)
from boltforge.wire.agent import ReplicaSpec

BOOT = "6c1f0a8e-boot"
SPEC = ReplicaSpec(replica="j-1.2.0", job="j-1", epoch=2, action="run")
MARKS = ["BOLT_JOB_ID=j-1", "BOLT_REPLICA=j-1.2.0", "BOLT_EPOCH=2"]


class Proc:
    """A fake ``/proc``: this boot's id and processes with their stat line and environment."""

    def __init__(self, root: Path, boot: str | None = BOOT) -> None:
        self.root = root
        if boot is not None:
            (root / "sys" / "kernel" / "random").mkdir(parents=True)
            (root / "sys" / "kernel" / "random" / "boot_id").write_text(boot + "\n")

    def process(
        self,
        pid: int,
        start: int | str = 1000,
        pgid: int | None = None,
        state: str = "S",
        comm: str = "python",
        env: list[str] | None = None,
    ) -> None:
        folder = self.root / str(pid)
        folder.mkdir()
        # fields 3.. of /proc/<pid>/stat: state ppid pgrp session ... starttime is field 22
        rest = [state, "1", str(pgid or pid), str(pgid or pid)] + ["0"] * 15 + [str(start)]
        (folder / "stat").write_text(f"{pid} ({comm}) {' '.join(rest)} 0 0\n")
        (folder / "environ").write_bytes(b"\0".join(e.encode() for e in (env or [])) + b"\0")


def entry(pid: int = 100, pgid: int = 100, start: int | None = 1000, boot: str = BOOT) -> Launched:
    return Launched(spec=SPEC, pid=pid, pgid=pgid, start=start, boot=boot)


@pytest.fixture
def proc(tmp_path: Path) -> Proc:
    return Proc(tmp_path / "proc")


# --- reading /proc ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("comm", "state", "start", "expected"),
    [
        pytest.param("python", "S", 1000, 1000, id="a sleeping process"),
        pytest.param("python", "R", 1000, 1000, id="a running process"),
        pytest.param("my (odd) name", "S", 77, 77, id="a name with brackets and spaces"),
        pytest.param("a) S 1 2 3", "S", 55, 55, id="a name that looks like fields"),
        pytest.param("python", "Z", 1000, None, id="a zombie has exited"),
        pytest.param("python", "X", 1000, None, id="a dead process has exited"),
        pytest.param("python", "S", "?", None, id="a start time that is not a number"),
    ],
)
def test_a_process_start_time_is_read_after_its_name(
    proc: Proc, comm: str, state: str, start: int | str, expected: int | None
) -> None:
    proc.process(100, start=start, comm=comm, state=state)
    assert process_start(100, proc.root) == expected


def test_a_process_that_is_not_there_or_has_a_short_stat_has_no_start(proc: Proc) -> None:
    assert process_start(4242, proc.root) is None
    (proc.root / "7").mkdir()
    (proc.root / "7" / "stat").write_text("7 (x) S 1 7 7\n")
    assert process_start(7, proc.root) is None


def test_the_boot_is_read_and_a_proc_without_it_has_none(tmp_path: Path) -> None:
    assert boot_id(Proc(tmp_path / "a").root) == BOOT
    assert boot_id(Proc(tmp_path / "b", boot=None).root) == ""


def test_the_real_proc_knows_this_process() -> None:
    if not Path("/proc/self/stat").exists():
        pytest.skip("needs Linux /proc")
    assert process_start(os.getpid()) is not None
    assert len(boot_id()) >= 32


@pytest.mark.parametrize(
    ("env", "carried"),
    [
        pytest.param(MARKS, True, id="all three marks"),
        pytest.param([*MARKS, "HOME=/root"], True, id="among others"),
        pytest.param(MARKS[:2], False, id="no epoch"),
        pytest.param(
            ["BOLT_JOB_ID=j-1", "BOLT_REPLICA=j-1.2.0", "BOLT_EPOCH=3"], False, id="epoch"
        ),
        pytest.param(["BOLT_JOB_ID=j-10", *MARKS[1:]], False, id="a job whose name starts alike"),
        pytest.param([], False, id="nothing"),
    ],
)
def test_a_process_carries_a_replica_only_with_all_three_marks_exactly(
    proc: Proc, env: list[str], carried: bool
) -> None:
    proc.process(100, env=env)
    assert carries(100, SPEC, proc.root) is carried


def test_a_process_whose_environment_cannot_be_read_carries_nothing(proc: Proc) -> None:
    assert not carries(999, SPEC, proc.root)


# --- what became of a recorded replica ------------------------------------------------------


def test_the_same_process_still_running_is_a_leftover(proc: Proc) -> None:
    proc.process(100, start=1000)
    found = find(entry(), proc.root)
    assert found is Found.RUNNING and found.leftover


def test_a_reused_pid_is_left_alone(proc: Proc) -> None:
    proc.process(100, start=2000, env=MARKS)
    found = find(entry(start=1000), proc.root)
    assert found is Found.REUSED and not found.leftover


def test_a_group_member_carrying_the_replica_outlives_its_leader(proc: Proc) -> None:
    proc.process(101, pgid=100, env=MARKS)
    found = find(entry(), proc.root)
    assert found is Found.GROUP and found.leftover


def test_a_group_member_of_another_replica_is_not_this_ones(proc: Proc) -> None:
    proc.process(101, pgid=100, env=["BOLT_JOB_ID=j-2", "BOLT_REPLICA=j-2.1.0", "BOLT_EPOCH=1"])
    assert find(entry(), proc.root) is Found.GONE


def test_a_zombie_leader_with_no_group_is_gone(proc: Proc) -> None:
    proc.process(100, start=1000, state="Z")
    proc.process(102, pgid=100, state="Z", env=MARKS)  # zombies are not group members
    assert find(entry(), proc.root) is Found.GONE


@pytest.mark.parametrize(
    "recorded",
    [
        pytest.param(entry(boot="an-earlier-boot"), id="another boot"),
        pytest.param(entry(start=None), id="start time unknown when recorded"),
    ],
)
def test_what_cannot_be_told_apart_is_unknown_and_never_a_leftover(
    proc: Proc, recorded: Launched
) -> None:
    proc.process(100, start=1000, env=MARKS)
    found = find(recorded, proc.root)
    assert found is Found.UNKNOWN and not found.leftover


def test_every_outcome_reads_as_words_for_the_log() -> None:
    assert {f.value for f in Found} == {
        "still running",
        "exited, but processes of its group still run",
        "no longer running",
        "no longer running (its pid is another process now, left alone)",
        "of a previous boot or an unknown start time, left alone",
    }
    assert {f for f in Found if f.leftover} == {Found.RUNNING, Found.GROUP}


# --- the record as it is kept -----------------------------------------------------------------


def test_a_launch_is_recorded_with_its_start_and_boot(proc: Proc, tmp_path: Path) -> None:
    proc.process(os.getpid(), start=31337)
    record = LaunchRecord(tmp_path / "replicas.json", proc=proc.root)
    saved = record.add(SPEC, os.getpid())
    assert (saved.start, saved.boot) == (31337, BOOT)
    assert find(saved, proc.root) is Found.RUNNING


def test_a_launch_whose_process_already_went_is_its_own_group(proc: Proc, tmp_path: Path) -> None:
    record = LaunchRecord(tmp_path / "replicas.json", proc=proc.root)
    gone_pid = 2**22 + 12345  # beyond any pid the kernel hands out by default
    saved = record.add(SPEC, gone_pid)
    assert (saved.pgid, saved.start) == (gone_pid, None)
    assert find(saved, proc.root) is Found.UNKNOWN  # never mistaken for anything later


def test_the_lease_alone_writes_nothing_and_is_saved_with_the_next_launch(
    proc: Proc, tmp_path: Path
) -> None:
    path = tmp_path / "replicas.json"
    record = LaunchRecord(path, proc=proc.root)
    record.renewed(1234.5)
    assert not path.exists()
    proc.process(100)
    record.add(SPEC, 100)
    assert LaunchRecord(path).read().lease_until == 1234.5
    record.renewed(2000.0)
    assert LaunchRecord(path).read().lease_until == 2000.0
    record.remove("j-1.2.0", 2)
    record.renewed(3000.0)  # nothing runs: the file keeps what it had
    assert LaunchRecord(path).read().lease_until == 2000.0
    assert LaunchRecord(path).read().replicas == []


def test_a_record_with_fields_it_does_not_know_is_ignored_whole(tmp_path: Path) -> None:
    path = tmp_path / "replicas.json"
    path.write_text('{"lease_until": 5.0, "replicas": [], "written_by": "a newer agent"}')
    saved = LaunchRecord(path).read()
    assert saved.lease_until is None and saved.replicas == []

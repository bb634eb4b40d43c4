"""The node agent's parts that decide without a server: the outbox, the lease clock, file
tails, the declared inventory, convergence plans, hook paths and cleanup reports."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from boltforge.agent import outbox as outbox_module
from boltforge.agent.cleanup import Cleanup, group_members, held_shm, remove_shm
from boltforge.agent.hooks import BadHook, check_paths, expand
from boltforge.agent.inventory import gpu_model, load_declared
from boltforge.agent.lease import LeaseClock, Session
from boltforge.agent.outbox import Outbox
from boltforge.agent.processes import ReplicaPaths
from boltforge.agent.replica import Replica
from boltforge.agent.tails import FileTail, LogTail, ProgressTail
from boltforge.node.converge import plan
from boltforge.spec.errors import SpecError
from boltforge.wire.agent import Lease, LogChunk, Progress, ReplicaEvent, ReplicaSpec

# --- builders ---------------------------------------------------------------------------------


def event(kind: str = "started", replica: str = "r", epoch: int = 1) -> ReplicaEvent:
    return ReplicaEvent.model_validate(
        {"replica": replica, "job": "j", "epoch": epoch, "kind": kind, "at": 0.0}
    )


def chunk(seq: int, data: str = "x") -> LogChunk:
    return LogChunk(replica="r", job="j", epoch=1, seq=seq, data=data)


def progress(step: int) -> Progress:
    return Progress(replica="r", job="j", epoch=1, rank=0, step=step, at=float(step))


def spec(
    name: str, epoch: int = 1, action: str = "run", gpus: tuple[int, ...] = (), **fields: Any
) -> ReplicaSpec:
    return ReplicaSpec.model_validate(
        {"replica": name, "job": "j", "epoch": epoch, "action": action, "gpus": list(gpus)} | fields
    )


def lease(lease_s: float = 30.0) -> Lease:
    return Lease(node="n0", session="s1", lease_s=lease_s, heartbeat_s=5.0)


# --- outbox -----------------------------------------------------------------------------------


def test_a_failed_send_leaves_the_batch_in_place_for_the_retry() -> None:
    box = Outbox()
    box.add_event(event("started"))
    box.add_log(chunk(0, "hello"))
    box.add_progress(progress(1))
    first = box.batch("s1")
    retry = box.batch("s1")
    assert first is not None and retry is not None
    assert retry.report == first.report, "nothing is lost or reordered before a commit"
    assert (first.events, first.logs, first.progress) == (1, 1, 1)
    assert first.report.session == "s1" and len(box) == 3


def test_log_chunks_are_batched_up_to_the_byte_limit_but_never_zero() -> None:
    box = Outbox(max_log_bytes=10 << 20)
    big = "y" * (outbox_module.BATCH_LOG_BYTES + 10)
    box.add_log(chunk(0, big))
    box.add_log(chunk(1, "small"))
    first = box.batch("s")
    assert first is not None and [c.seq for c in first.report.logs] == [0]
    box.commit(first)
    second = box.batch("s")
    assert second is not None and [c.seq for c in second.report.logs] == [1]


def test_a_batch_takes_at_most_its_item_count_of_each_kind() -> None:
    box = Outbox()
    n = outbox_module.BATCH_ITEMS + 7
    for i in range(n):
        box.add_event(event())
        box.add_progress(progress(i))
    first = box.batch("s")
    assert first is not None
    assert (first.events, first.progress) == (outbox_module.BATCH_ITEMS,) * 2
    box.commit(first)
    rest = box.batch("s")
    assert rest is not None and [p.step for p in rest.report.progress] == list(range(n - 7, n))


def test_the_outbox_reports_no_room_rather_than_dropping() -> None:
    box = Outbox(max_log_bytes=4, max_progress=2)
    box.add_log(chunk(0, "abcdef"))
    box.add_progress(progress(0))
    box.add_progress(progress(1))
    box.add_progress(progress(2))
    assert box.log_room() == 0 and box.progress_room() == 0
    assert len(box) == 4, "items past the bound are kept, the bound holds by back-pressure"


def test_only_exits_and_failures_count_as_unreported_exits() -> None:
    box = Outbox()
    for kind, name in (("started", "a"), ("exited", "b"), ("failed", "c")):
        box.add_event(event(kind, replica=name, epoch=2))
    assert [(s.replica, s.epoch, s.state) for s in box.unreported_exits()] == [
        ("b", 2, "exited"),
        ("c", 2, "exited"),
    ]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.tuples(st.just("event"), st.sampled_from(["started", "exited"])),
            st.tuples(st.just("log"), st.text(min_size=1, max_size=5)),
            st.tuples(st.just("progress"), st.integers(0, 1000)),
            st.tuples(st.just("send"), st.booleans()),
        ),
        max_size=60,
    )
)
def test_whatever_fails_the_server_gets_each_item_once_in_order(ops: list[tuple[str, Any]]) -> None:
    box = Outbox(max_log_bytes=64)
    added: dict[str, list[Any]] = {"events": [], "logs": [], "progress": []}
    got: dict[str, list[Any]] = {"events": [], "logs": [], "progress": []}
    seq = 0

    def send(ok: bool) -> None:
        batch = box.batch("s")
        if batch is None or not ok:
            return
        for kind in got:
            got[kind] += getattr(batch.report, kind)
        box.commit(batch)

    for op, value in ops:
        if op == "event":
            added["events"].append(event(value))
            box.add_event(added["events"][-1])
        elif op == "log":
            added["logs"].append(chunk(seq, value))
            box.add_log(added["logs"][-1])
            seq += 1
        elif op == "progress":
            added["progress"].append(progress(value))
            box.add_progress(added["progress"][-1])
        else:
            send(value)
    while len(box):
        send(True)
    assert got == added
    assert box.log_bytes == 0 and box.log_room() == 64


# --- lease clock ------------------------------------------------------------------------------


def test_a_lease_never_expires_before_its_first_renewal() -> None:
    clock = LeaseClock()
    assert not clock.expired(1e9) and clock.overdue(1e9) == 0.0


@pytest.mark.parametrize(
    ("now", "expired", "overdue"),
    [(100.0, False, 0.0), (130.0, False, 0.0), (130.5, True, 0.5), (200.0, True, 70.0)],
)
def test_a_lease_runs_out_lease_s_after_the_renewal_was_sent(
    now: float, expired: bool, overdue: float
) -> None:
    clock = LeaseClock()
    clock.renew(lease(30.0), sent_at=100.0)
    assert clock.expired(now) is expired
    assert clock.overdue(now) == pytest.approx(overdue)


def test_a_late_answer_to_an_older_request_never_moves_the_lease_back() -> None:
    clock = LeaseClock()
    clock.renew(lease(30.0), sent_at=100.0)
    clock.renew(lease(10.0), sent_at=90.0)
    assert clock.renewed_at == 100.0 and clock.lease_s == 10.0
    assert clock.expired(111.0) and not clock.expired(109.0)


def test_a_session_carries_the_leases_node_id_and_timing() -> None:
    assert Session.of(lease(45.0)) == Session("n0", "s1", 5.0, 45.0)


# --- tails ------------------------------------------------------------------------------------


def test_a_file_tail_starts_at_the_end_and_reads_only_whats_appended(tmp_path: Path) -> None:
    path = tmp_path / "out.log"
    path.write_bytes(b"old\n")
    tail = FileTail(path)
    assert tail.read(100) == b""
    with path.open("ab") as f:
        f.write(b"new output")
    assert tail.read(3) == b"new"
    assert tail.read(0) == b""
    assert tail.read(100) == b" output"
    assert tail.read(100) == b""


def test_a_missing_file_reads_as_empty_until_it_appears(tmp_path: Path) -> None:
    path = tmp_path / "later.log"
    tail = FileTail(path)
    assert tail.read(10) == b""
    path.write_bytes(b"first")
    assert tail.read(10) == b"first"
    assert FileTail(path, offset=2).read(10) == b"rst"


@settings(max_examples=50, deadline=None)
@given(st.text(max_size=40), st.integers(1, 7))
def test_log_output_reads_back_whole_in_any_read_size(text: str, size: int) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "out.log"
        path.touch()
        tail = LogTail(path)
        path.write_bytes(text.encode())
        data = text.encode()
        parts = [tail.read(size) for _ in range(len(data) // size + 1)]
        assert "".join(parts) == text
        assert all("\ufffd" not in part for part in parts if "\ufffd" not in text)


def test_progress_lines_that_are_not_json_objects_are_skipped(tmp_path: Path) -> None:
    path = tmp_path / "progress.jsonl"
    path.touch()
    tail = ProgressTail(path)
    path.write_text('[1, 2]\n"text"\n{"step": 3}\n\n{broken\n{"step": 4}\n')
    assert tail.read(1 << 16) == [{"step": 3}, {"step": 4}]


def replica_files(tmp: Path) -> ReplicaPaths:
    return ReplicaPaths(tmp / "r.log", tmp / "r.jsonl", tmp / "ckpt", tmp / "s", tmp / "r.env")


def test_a_replica_moves_its_output_and_valid_progress_into_the_outbox(tmp_path: Path) -> None:
    paths = replica_files(tmp_path)
    replica = Replica(spec("w0", epoch=3), paths)
    paths.log.write_text("hello\n")
    lines = [
        {"step": 1, "at": 1.0, "step_time_s": 0.5, "checkpoint": True, "metrics": {"loss": 2.0}},
        {"step": -1, "at": 2.0},
        {"at": 3.0},
    ]
    paths.progress.write_text("".join(json.dumps(x) + "\n" for x in lines))
    box = Outbox()
    assert replica.collect(box) is True
    assert [(c.seq, c.data, c.epoch) for c in box.logs] == [(0, "hello\n", 3)]
    assert [(p.step, p.checkpoint, p.metrics) for p in box.progress] == [(1, True, {"loss": 2.0})]
    assert replica.collect(box) is False
    assert replica.status().state == "running"


def test_a_full_outbox_leaves_the_output_on_disk_until_there_is_room(tmp_path: Path) -> None:
    paths = replica_files(tmp_path)
    replica = Replica(spec("w0"), paths)
    paths.log.write_text("0123456789")
    box = Outbox(max_log_bytes=4)
    replica.collect(box)
    assert "".join(c.data for c in box.logs) == "0123"
    batch = box.batch("s")
    assert batch is not None
    box.commit(batch)
    replica.collect(box)
    assert "".join(c.data for c in box.logs) == "4567"
    assert [c.seq for c in box.logs] == [1]


# --- inventory --------------------------------------------------------------------------------


def test_a_declared_inventory_is_read_with_defaults_and_the_name_override(tmp_path: Path) -> None:
    path = tmp_path / "host.yaml"
    path.write_text(
        "name: gpu-07\ngpu: H100-80GB\ngpu_memory_gb: 80\ngpus: 8\nsource: nvml\nrack: r3\n"
    )
    inv = load_declared(path)
    assert (inv.name, inv.gpus, inv.rack, inv.pod, inv.source) == (
        "gpu-07",
        8,
        "r3",
        "pod0",
        "declared",
    )
    assert load_declared(path, name="other").name == "other"


def test_an_empty_inventory_file_needs_only_a_name(tmp_path: Path) -> None:
    path = tmp_path / "empty.yaml"
    path.write_text("")
    assert load_declared(path, name="cpu-box").gpus == 0
    with pytest.raises(SpecError) as caught:
        load_declared(path)
    assert any(p.field.endswith("name") for p in caught.value.problems)


@pytest.mark.parametrize(
    ("content", "field"),
    [
        ("name: n\ngpus: 65\n", "gpus"),
        ("name: n\ngpus: -1\n", "gpus"),
        ("name: 'bad name'\n", "name"),
        ("name: n\ntier: cheap\n", "tier"),
        ("name: n\nmemory_gb: 0\n", "memory_gb"),
        ("name: n\ncolour: blue\n", "colour"),
        ("- name: n\n", "inventory"),
    ],
)
def test_a_bad_inventory_names_the_field_and_the_fix(
    tmp_path: Path, content: str, field: str
) -> None:
    path = tmp_path / "inv.yaml"
    path.write_text(content)
    with pytest.raises(SpecError) as caught:
        load_declared(path)
    problems = caught.value.problems
    assert caught.value.source == str(path)
    assert any(field in p.field for p in problems), [p.render() for p in problems]
    assert all("To fix" in p.message for p in problems)


@pytest.mark.parametrize(
    ("name", "total", "expected"),
    [
        ("NVIDIA H100 80GB HBM3", 85_000_000_000, ("H100-80GB", 80.0)),
        ("NVIDIA A100-SXM4-40GB", 42_000_000_000, ("A100-40GB", 40.0)),
        ("Tesla V100-SXM2-16GB", 16_900_000_000, ("V100-16GB", 16.0)),
        ("NVIDIA L4", 23_800_000_000, ("L4-24GB", 24.0)),
        ("NVIDIA GeForce RTX 4090", 25_400_000_000, ("RTX-25GB", 25.0)),
        ("", 0, ("gpu-0GB", 0.0)),
    ],
)
def test_nvml_device_names_map_to_fleet_gpu_names(
    name: str, total: int, expected: tuple[str, float]
) -> None:
    assert gpu_model(name, total) == expected


# --- convergence ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("desired", "live", "finished", "busy", "start", "stop", "skip"),
    [
        pytest.param([spec("a")], {}, set(), set(), ["a"], {}, [], id="new replica starts"),
        pytest.param([spec("a")], {"a": 1}, set(), set(), [], {}, [], id="running: nothing"),
        pytest.param(
            [spec("a", epoch=2)],
            {"a": 1},
            set(),
            set(),
            [],
            {"a": None},
            [],
            id="new epoch stops the old first",
        ),
        pytest.param(
            [spec("a")],
            {},
            {("a", 1)},
            set(),
            [],
            {},
            [],
            id="an epoch runs once",
        ),
        pytest.param(
            [spec("a", epoch=2)],
            {},
            {("a", 1)},
            set(),
            ["a"],
            {},
            [],
            id="a finished older epoch does not block a new one",
        ),
        pytest.param(
            [spec("a", action="stop", grace_s=7)],
            {"a": 1},
            set(),
            set(),
            [],
            {"a": 7},
            [],
            id="stop uses the desired grace",
        ),
        pytest.param(
            [spec("a", epoch=1, action="stop")],
            {"a": 2},
            set(),
            set(),
            [],
            {},
            [],
            id="a stop of an older epoch spares the newer run",
        ),
        pytest.param(
            [spec("a", epoch=3, action="stop")],
            {"a": 2},
            set(),
            set(),
            [],
            {"a": 30.0},
            [],
            id="a stop of a newer epoch stops the live one",
        ),
        pytest.param(
            [spec("a", action="stop")],
            {},
            set(),
            set(),
            [],
            {},
            ["a"],
            id="a stop before it ever ran is skipped",
        ),
        pytest.param(
            [],
            {"x": 1, "y": 2},
            set(),
            set(),
            [],
            {"x": None, "y": None},
            [],
            id="unlisted live replicas stop",
        ),
        pytest.param(
            [spec("a", gpus=(0, 1)), spec("b", gpus=(2,))],
            {},
            set(),
            {1},
            ["b"],
            {},
            [],
            id="a replica waits for a busy gpu",
        ),
    ],
)
def test_the_plan_turns_what_runs_into_what_is_desired(
    desired: list[ReplicaSpec],
    live: dict[str, int],
    finished: set[tuple[str, int]],
    busy: set[int],
    start: list[str],
    stop: dict[str, float | None],
    skip: list[str],
) -> None:
    out = plan(desired, live, finished, busy)
    assert [s.replica for s in out.start] == start
    assert out.stop == stop
    assert [s.replica for s in out.skip] == skip


replica_names = st.sampled_from(["a", "b", "c", "d"])


@given(
    st.lists(
        st.builds(
            lambda n, e, stop: spec(n, epoch=e, action="stop" if stop else "run"),
            replica_names,
            st.integers(1, 3),
            st.booleans(),
        ),
        max_size=6,
    ),
    st.dictionaries(replica_names, st.integers(1, 3), max_size=4),
    st.sets(st.tuples(replica_names, st.integers(1, 3)), max_size=4),
)
def test_a_plan_is_idempotent_and_never_both_starts_and_stops_a_replica(
    desired: list[ReplicaSpec], live: dict[str, int], finished: set[tuple[str, int]]
) -> None:
    first = plan(desired, live, finished)
    assert plan(desired, live, finished) == first
    started = [s.replica for s in first.start]
    assert len(started) == len(set(started)), "a replica starts once per plan"
    assert not set(started) & set(live), "nothing starts over a live process"
    assert not set(started) & set(first.stop)
    assert set(first.stop) <= set(live), "only live replicas are stopped"
    assert all((s.replica, s.epoch) not in finished and s.action == "run" for s in first.start)


# --- hooks ------------------------------------------------------------------------------------


def test_hook_paths_must_exist_and_be_executable(tmp_path: Path) -> None:
    good = tmp_path / "ok.sh"
    good.write_text("#!/bin/sh\n")
    good.chmod(0o755)
    plain = tmp_path / "plain.sh"
    plain.write_text("#!/bin/sh\n")
    plain.chmod(0o644)
    assert check_paths("--prolog", [good, tmp_path]) == (good, tmp_path)
    with pytest.raises(BadHook, match=r"--epilog: .*nope does not exist\. To fix"):
        check_paths("--epilog", [tmp_path / "nope"])
    with pytest.raises(BadHook, match=r"--prolog: .*plain.sh is not an executable.*chmod \+x"):
        check_paths("--prolog", [plain])


def test_a_hook_directory_runs_its_executables_sorted_by_name(tmp_path: Path) -> None:
    hooks = tmp_path / "prolog.d"
    hooks.mkdir()
    for name, mode in (("20-b", 0o755), ("10-a", 0o755), ("15-notes", 0o644)):
        (hooks / name).write_text("#!/bin/sh\n")
        (hooks / name).chmod(mode)
    (hooks / "05-dir").mkdir()
    single = tmp_path / "first"
    assert [p.name for p in expand([single, hooks])] == ["first", "10-a", "20-b"]


# --- cleanup ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cleanup", "text"),
    [
        (Cleanup(), ""),
        (
            Cleanup(orphans=[11, 12], killed=True, seconds=2.5),
            "cleanup in 2.50 s: ended 2 leftover process(es) (SIGKILL)",
        ),
        (
            Cleanup(shm=["bolt-j-a", "nccl-1"], epilog="exited with code 3", seconds=0.1),
            "cleanup in 0.10 s: removed 2 /dev/shm file(s): bolt-j-a, nccl-1; "
            "epilog exited with code 3",
        ),
        (
            Cleanup(orphans=[5], what="leftover replica(s)"),
            "cleanup in 0.00 s: ended 1 leftover replica(s) (SIGTERM)",
        ),
    ],
)
def test_cleanup_says_what_it_did_in_one_line(cleanup: Cleanup, text: str) -> None:
    assert cleanup.describe() == text


def fake_proc(
    root: Path, pid: int, stat: str, fds: dict[str, str] | None = None, maps: str = ""
) -> None:
    base = root / str(pid)
    (base / "fd").mkdir(parents=True)
    (base / "stat").write_text(stat)
    (base / "maps").write_text(maps)
    for fd, target in (fds or {}).items():
        (base / "fd" / fd).symlink_to(target)


def test_group_members_are_the_live_processes_of_that_group(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    fake_proc(proc, 10, "10 (python) S 1 77 77 0")
    fake_proc(proc, 11, "11 (odd) name) R 10 77 77 0")
    fake_proc(proc, 12, "12 (zombie) Z 10 77 77 0")
    fake_proc(proc, 13, "13 (other) S 1 88 88 0")
    (proc / "self").mkdir()
    assert sorted(group_members(77, proc)) == [10, 11]
    assert group_members(99, proc) == []


def test_shm_files_held_open_or_mapped_are_found(tmp_path: Path) -> None:
    shm, proc = tmp_path / "shm", tmp_path / "proc"
    shm.mkdir()
    fake_proc(
        proc,
        20,
        "20 (w) S 1 20 20 0",
        fds={"3": str(shm / "open-seg"), "4": str(tmp_path / "elsewhere")},
        maps=f"7f00-7f10 rw-s 0 00:1 5 {shm}/mapped-seg (deleted)\n"
        "7f20-7f30 r-xp 0 0 0 /lib/x.so\n",
    )
    assert held_shm([20, 404], shm, proc) == {shm / "open-seg", shm / "mapped-seg"}


def test_only_the_replicas_own_shm_files_are_removed(tmp_path: Path) -> None:
    shm = tmp_path / "shm"
    shm.mkdir()
    for name in ("bolt-j-w0-e1-a", "bolt-j-w0-e1-b", "bolt-j-w1-e1-a", "held-by-leftover"):
        (shm / name).write_text("x")
    (shm / "bolt-j-w0-e1-dir").mkdir()
    removed = remove_shm("bolt-j-w0-e1-", set(), shm)
    assert removed == ["bolt-j-w0-e1-a", "bolt-j-w0-e1-b"]
    assert sorted(p.name for p in shm.iterdir()) == [
        "bolt-j-w0-e1-dir",
        "bolt-j-w1-e1-a",
        "held-by-leftover",
    ]
    assert remove_shm("x-", set(), tmp_path / "no-shm") == []


def test_a_file_a_leftover_held_is_removed_when_no_one_else_holds_it(tmp_path: Path) -> None:
    shm = tmp_path / "shm"
    shm.mkdir()
    (shm / "nccl-seg").write_text("x")
    assert os.stat(shm / "nccl-seg").st_uid == os.getuid()
    assert remove_shm("bolt-none-", {shm / "nccl-seg"}, shm) == ["nccl-seg"]

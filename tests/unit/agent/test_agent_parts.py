"""The agent's pieces on their own: inventory, convergence plans, the outbox, file tails."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from boltforge.agent.inventory import detect, gpu_model, load_declared
from boltforge.agent.outbox import Outbox
from boltforge.agent.tails import LogTail, ProgressTail
from boltforge.node.converge import plan
from boltforge.spec.errors import SpecError
from boltforge.wire.agent import LogChunk, ReplicaEvent, ReplicaSpec

ROOT = Path(__file__).resolve().parents[3]
NODES = ROOT / "examples" / "nodes"


class NVMLError(Exception):
    pass


def fake_nvml(names: list[str], total: int, fail: bool = False) -> Any:
    """An object with the few pynvml functions the inventory calls."""

    def init() -> None:
        if fail:
            raise NVMLError("NVML Shared Library Not Found")

    return SimpleNamespace(
        NVMLError=NVMLError,
        nvmlInit=init,
        nvmlShutdown=lambda: None,
        nvmlDeviceGetCount=lambda: len(names),
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetName=lambda h: names[h],
        nvmlDeviceGetMemoryInfo=lambda h: SimpleNamespace(total=total),
    )


def test_a_declared_inventory_stands_in_for_an_8_gpu_host() -> None:
    inv = load_declared(NODES / "host-2.yaml")
    assert (inv.name, inv.gpu, inv.gpus, inv.nvlink_island) == ("host-2", "H100-80GB", 8, 8)
    assert (inv.pod, inv.rack, inv.source) == ("p0", "r1", "declared")
    assert load_declared(NODES / "host-2.yaml", name="spare").name == "spare"


def test_gpus_come_from_nvml_when_it_is_there() -> None:
    nvml = fake_nvml(["NVIDIA H100 80GB HBM3"] * 8, 85_520_809_984)
    inv = detect(None, name="gpu-box", nvml=nvml)
    assert (inv.name, inv.gpu, inv.gpu_memory_gb, inv.gpus) == ("gpu-box", "H100-80GB", 80, 8)
    assert inv.source == "nvml"


@pytest.mark.parametrize(
    ("name", "total", "expected"),
    [
        ("NVIDIA A100-SXM4-40GB", 42_949_672_960, ("A100-40GB", 40.0)),
        ("NVIDIA L4", 24_152_899_584, ("L4-24GB", 24.0)),
        (b"Tesla V100-SXM2-32GB", 34_359_738_368, ("V100-32GB", 32.0)),
    ],
)
def test_nvml_names_map_to_fleet_gpu_names(name: Any, total: int, expected: Any) -> None:
    nvml = fake_nvml([name], total)
    inv = detect(None, nvml=nvml)
    assert (inv.gpu, inv.gpu_memory_gb) == expected
    assert gpu_model(name.decode() if isinstance(name, bytes) else name, total) == expected


def test_without_nvml_the_error_says_to_declare_the_node() -> None:
    with pytest.raises(SpecError) as caught:
        detect(None, nvml=fake_nvml([], 0, fail=True))
    assert "--inventory" in caught.value.render() and "To fix" in caught.value.render()
    with pytest.raises(SpecError, match="no GPUs"):
        detect(None, nvml=fake_nvml([], 0))


def test_a_bad_inventory_file_names_each_field_and_its_fix(tmp_path: Path) -> None:
    bad = tmp_path / "node.yaml"
    bad.write_text("name: h0\ngpus: lots\ntier: cheap\ncolour: red\n")
    with pytest.raises(SpecError) as caught:
        load_declared(bad)
    fields = [p.field for p in caught.value.problems]
    assert fields == ["inventory.gpus", "inventory.tier", "inventory.colour"]
    assert all("To fix" in p.message for p in caught.value.problems)
    (tmp_path / "list.yaml").write_text("- 1\n")
    with pytest.raises(SpecError, match="mapping"):
        load_declared(tmp_path / "list.yaml")


def test_bolt_agent_with_a_bad_inventory_exits_2_without_a_traceback(tmp_path: Path) -> None:
    bad = tmp_path / "node.yaml"
    bad.write_text("name: h0\ngpus: -1\n")
    args = ["agent", "--server", "http://127.0.0.1:9", "--token", "t", "--inventory", str(bad)]
    run = subprocess.run(
        [sys.executable, "-m", "boltforge.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert run.returncode == 2
    assert "inventory.gpus" in run.stderr and "Traceback" not in run.stderr


def spec(name: str, epoch: int = 1, action: str = "run", grace_s: float = 30.0) -> ReplicaSpec:
    return ReplicaSpec.model_validate(
        {"replica": name, "job": "j", "epoch": epoch, "action": action, "grace_s": grace_s}
    )


def test_plan_starts_the_new_stops_the_absent_and_never_reruns_an_epoch() -> None:
    desired = [spec("a"), spec("b"), spec("c", epoch=2), spec("d", action="stop", grace_s=5)]
    todo = plan(desired, live={"b": 1, "c": 1, "d": 1, "x": 4}, finished={("e", 1)})
    assert [s.replica for s in todo.start] == ["a"]
    assert todo.stop == {"c": None, "d": 5, "x": None}
    assert plan([spec("e")], live={}, finished={("e", 1)}).start == []
    assert plan([spec("a", action="stop")], live={"a": 3}, finished=set()).stop == {}
    assert [s.replica for s in plan([spec("a"), spec("a")], {}, set()).start] == ["a"]


def test_a_replica_waits_for_its_gpus_while_a_local_process_still_holds_them() -> None:
    new = ReplicaSpec.model_validate(
        {"replica": "new", "job": "k", "epoch": 1, "action": "run", "gpus": [2, 3]}
    )
    assert plan([new], live={"old": 1}, finished=set(), busy={3, 4}).start == []
    assert [s.replica for s in plan([new], live={}, finished=set(), busy={4}).start] == ["new"]


def test_a_stop_for_a_replica_never_run_here_is_skipped_once() -> None:
    stop = spec("late", action="stop")
    assert [s.replica for s in plan([stop], live={}, finished=set()).skip] == ["late"]
    assert plan([stop], live={}, finished={("late", 1)}).skip == []
    assert plan([stop], live={"late": 1}, finished=set()).skip == []


def event(kind: str = "exited") -> ReplicaEvent:
    return ReplicaEvent.model_validate(
        {"replica": "r", "job": "j", "epoch": 1, "kind": kind, "at": 0.0}
    )


def test_outbox_keeps_order_until_committed_and_reports_its_room() -> None:
    box = Outbox(max_log_bytes=10)
    box.add_event(event("started"))
    for seq in range(3):
        box.add_log(LogChunk(replica="r", job="j", epoch=1, seq=seq, data="abc"))
    assert box.log_room() == 1
    first = box.batch("s")
    assert first is not None
    assert [c.seq for c in first.report.logs] == [0, 1, 2]
    box.add_event(event("exited"))
    assert [s.state for s in box.unreported_exits()] == ["exited"]
    box.commit(first)
    assert list(box.events) == [event("exited")] and box.log_room() == 10
    second = box.batch("s")
    assert second is not None and second.report.events == [event("exited")]
    box.commit(second)
    assert box.batch("s") is None


def test_tails_wait_for_whole_lines_and_whole_characters(tmp_path: Path) -> None:
    log, progress = tmp_path / "out.log", tmp_path / "progress.jsonl"
    log.write_bytes(b"before launch\n")
    tail = LogTail(log)
    lines = ProgressTail(progress)
    with log.open("ab") as f:
        f.write("step é".encode()[:-1])
    assert tail.read(100) == "step "
    with log.open("ab") as f:
        f.write("é".encode()[-1:] + b"\n")
    assert tail.read(100) == "é\n"
    progress.write_text('{"step": 1}\nnot json\n{"step": 2')
    assert lines.read(1000) == [{"step": 1}]
    with progress.open("a") as f:
        f.write("}\n")
    assert lines.read(1000) == [{"step": 2}]

"""Preflight and cleanup: the node's checks before a replica starts (NVML, prolog scripts),
what it cleans up after one ends (leftover processes, /dev/shm files, epilogs), and what the
server does when a node's preflight fails (drain it, audited, and place the job elsewhere
free of its restart budget)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from agent_fake_server import AgentThread, FakeServer
from control_kit import ADMIN, Fleet, make_spec

from boltforge.agent.cleanup import Cleanup, end_group, group_members, held_shm, remove_shm
from boltforge.agent.hooks import BadHook, check_paths, run_scripts
from boltforge.agent.preflight import NodeHooks, Preflight, gpu_problems
from boltforge.wire.agent import Inventory, ReplicaSpec

SHM = Path("/dev/shm")
linux = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")


def script(path: Path, body: str) -> Path:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return path


def run(coro: Any) -> Any:
    return asyncio.run(coro)


# prolog and epilog scripts


def test_a_hook_path_that_does_not_exist_or_cannot_run_is_refused_naming_the_option(
    tmp_path: Path,
) -> None:
    with pytest.raises(BadHook, match=r"^--prolog: .*missing does not exist"):
        check_paths("--prolog", [tmp_path / "missing"])
    plain = tmp_path / "plain.sh"
    plain.write_text("exit 0\n")
    with pytest.raises(BadHook, match=r"^--epilog: .*plain.sh is not an executable.*chmod \+x"):
        check_paths("--epilog", [plain])
    good = script(tmp_path / "ok.sh", "exit 0\n")
    assert check_paths("--prolog", [good, tmp_path]) == (good, tmp_path)


def test_bolt_agent_names_the_bad_option_and_exits_2_without_a_traceback(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "boltforge.cli.main", "agent", "--server", "http://x"]
    cmd += ["--token", "t", "--prolog", str(tmp_path / "nope.sh")]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2
    assert "--prolog" in done.stderr and "nope.sh does not exist" in done.stderr
    assert "Traceback" not in done.stderr


def test_scripts_run_in_order_with_the_environment_and_stop_at_the_first_failure(
    tmp_path: Path,
) -> None:
    hooks = tmp_path / "prolog.d"
    hooks.mkdir()
    script(hooks / "10-env", 'echo "$BOLT_JOB_ID $CUDA_VISIBLE_DEVICES" > "$OUT/10"\n')
    script(hooks / "20-bad", 'echo "GPU 3 is sick"; exit 3\n')
    script(hooks / "30-never", 'touch "$OUT/30"\n')
    (hooks / "notes.txt").write_text("not executable: skipped\n")
    env = {"PATH": os.environ["PATH"], "OUT": str(tmp_path), "BOLT_JOB_ID": "j-1"}
    env["CUDA_VISIBLE_DEVICES"] = "2,3"
    results = run(run_scripts([hooks], env, 10.0))
    assert [(r.path.name, r.ok) for r in results] == [("10-env", True), ("20-bad", False)]
    assert (tmp_path / "10").read_text() == "j-1 2,3\n"
    assert not (tmp_path / "30").exists()
    assert results[1].evidence.endswith("20-bad exited with code 3; output: GPU 3 is sick")


def test_a_script_past_its_timeout_is_killed_and_fails(tmp_path: Path) -> None:
    slow = script(tmp_path / "slow.sh", "echo checking; sleep 30\n")
    began = time.monotonic()
    [result] = run(run_scripts([slow], {"PATH": os.environ["PATH"]}, 0.5))
    assert time.monotonic() - began < 10
    assert not result.ok
    assert "timed out after 0.5 s" in result.evidence and "checking" in result.evidence


# NVML checks


class NVMLError(Exception):
    pass


def fake_nvml(count: int = 8, ecc: dict[int, int] | None = None, down: Any = ()) -> Any:
    """The pynvml functions the preflight calls: ``ecc`` errors per GPU (a GPU not listed has
    no ECC support), NVLink links 0-3 on every GPU, ``down`` the (gpu, link) pairs down."""

    def ecc_errors(handle: int, kind: int, counter: int) -> int:
        assert (kind, counter) == (1, 0)  # uncorrected, volatile
        if ecc is None or handle not in ecc:
            raise NVMLError("Not Supported")
        return ecc[handle]

    def link_state(handle: int, link: int) -> int:
        if link > 3:
            raise NVMLError("Invalid Argument")
        return 0 if (handle, link) in down else 1

    return SimpleNamespace(
        NVMLError=NVMLError,
        nvmlInit=lambda: None,
        nvmlShutdown=lambda: None,
        nvmlDeviceGetCount=lambda: count,
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetTotalEccErrors=ecc_errors,
        nvmlDeviceGetNvLinkState=link_state,
    )


def test_a_healthy_gpu_host_passes() -> None:
    assert gpu_problems(fake_nvml(ecc={0: 0, 1: 0}), 8, [0, 1]) == []


def test_nvml_finds_a_missing_gpu_ecc_errors_and_links_down_on_the_replicas_gpus() -> None:
    assert gpu_problems(fake_nvml(count=7), 8, [0]) == ["NVML sees 7 GPU(s); the inventory has 8"]
    sick = fake_nvml(ecc={2: 4, 5: 1}, down={(2, 1), (2, 3), (6, 0)})
    assert gpu_problems(sick, 8, [2, 3]) == [
        "GPU 2 has 4 uncorrected ECC error(s)",
        "GPU 2 NVLink link(s) 1, 3 down",
    ]
    assert gpu_problems(sick, 8, [0, 1]) == []  # the sick GPUs are not this replica's


def test_nvml_that_does_not_start_is_a_problem() -> None:
    def broken() -> None:
        raise NVMLError("Driver Not Loaded")

    nvml = fake_nvml()
    nvml.nvmlInit = broken
    assert gpu_problems(nvml, 8, [0]) == ["NVML did not start: Driver Not Loaded"]


def inventory(source: str = "nvml") -> Inventory:
    return Inventory(name="gpu-box", gpus=8, source=source)  # type: ignore[arg-type]


def test_the_gpu_checks_run_only_on_an_nvml_inventory_with_nvml_there() -> None:
    sick = fake_nvml(ecc={0: 9})
    verdict = run(Preflight(inventory(), NodeHooks(), load=lambda: sick).run([0], {}))
    assert not verdict.ok and verdict.evidence == "NVML: GPU 0 has 9 uncorrected ECC error(s)"
    absent = Preflight(inventory(), NodeHooks(), load=lambda: None)
    assert absent.skipped == ("GPU checks skipped: NVML (nvidia-ml-py) is not installed",)
    assert run(absent.run([0], {})).ok
    declared = Preflight(inventory("declared"), NodeHooks(), load=lambda: sick)
    assert declared.nvml is None and "declared" in declared.skipped[0]
    assert run(declared.run([0], {})).ok


def test_a_preflight_with_nothing_to_check_passes_at_once() -> None:
    check = Preflight(inventory("declared"), NodeHooks())
    coro = check.run([0], {})
    with pytest.raises(StopIteration) as done:  # never suspends: no task, no thread
        coro.send(None)
    assert done.value.value.ok


def test_a_failing_prolog_fails_the_preflight_with_its_output(tmp_path: Path) -> None:
    bad = script(tmp_path / "ib.sh", "echo 'mlx5_0 port 1 down' >&2; exit 1\n")
    check = Preflight(inventory("declared"), NodeHooks(prologs=(bad,)))
    verdict = run(check.run([0], {"PATH": os.environ["PATH"]}))
    assert not verdict.ok
    assert verdict.evidence == f"prolog {bad} exited with code 1; output: mlx5_0 port 1 down"


# cleanup


def spawn_group(code: str) -> subprocess.Popen[bytes]:
    """A process group leader running ``code``, which starts children in its group."""
    return subprocess.Popen([sys.executable, "-c", code], start_new_session=True)


LEAVES_TWO = """
import signal, subprocess, sys, time
subprocess.Popen(["sleep", "60"])
subprocess.Popen([sys.executable, "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"])
time.sleep(0.5)
"""


@linux
def test_leftover_processes_get_sigterm_then_sigkill() -> None:
    leader = spawn_group(LEAVES_TWO)
    leader.wait(10)
    left = group_members(leader.pid)
    assert len(left) == 2
    orphans, killed = run(end_group(leader.pid, grace_s=0.3))
    assert sorted(orphans) == sorted(left) and killed
    assert group_members(leader.pid) == []
    assert run(end_group(leader.pid)) == ([], False)


@linux
def test_shm_files_named_with_the_prefix_or_held_by_leftovers_are_removed(tmp_path: Path) -> None:
    shm = tmp_path / "shm"
    shm.mkdir()
    own = shm / "bolt-j-j_w0-e1-seg"
    held = shm / "torch_1234"
    shared = shm / "nccl-shared"
    other = shm / "bolt-k-k_w0-e1-seg"
    for path in (own, held, shared, other):
        path.write_bytes(b"x")
    with held.open("rb") as _, shared.open("rb") as __:
        seen = held_shm([os.getpid()], shm)
        assert {held, shared} <= seen
    leftover_saw = {held, shared}
    with shared.open("rb"):  # still open by a process outside the replica's group
        removed = remove_shm("bolt-j-j_w0-e1-", leftover_saw, shm)
    assert removed == ["bolt-j-j_w0-e1-seg", "torch_1234"]
    assert sorted(p.name for p in shm.iterdir()) == ["bolt-k-k_w0-e1-seg", "nccl-shared"]


def test_cleanup_says_what_it_did_and_nothing_when_there_was_nothing() -> None:
    assert Cleanup(seconds=0.01).describe() == ""
    done = Cleanup(orphans=[11, 12], killed=True, shm=["a"], epilog="x exited with code 1")
    done.seconds = 0.25
    assert done.describe() == (
        "cleanup in 0.25 s: ended 2 leftover process(es) (SIGKILL); "
        "removed 1 /dev/shm file(s): a; epilog x exited with code 1"
    )


# the agent: preflight before the start, cleanup before the exit is reported

STARTS = "import pathlib, sys; pathlib.Path(sys.argv[1]).write_text('ran')"

LEAKS = """
import os, subprocess, sys
prefix = os.environ["BOLT_SHM_PREFIX"]
open(f"/dev/shm/{prefix}seg", "w").write("x")
child = subprocess.Popen(["sleep", "60"], stdout=open(f"/dev/shm/{sys.argv[1]}", "w"))
print("child", child.pid, flush=True)
"""


def spec(code: str, *args: str, **fields: Any) -> ReplicaSpec:
    base: dict[str, Any] = {"job": "j", "epoch": 1, "action": "run", "gpus": [0, 1]}
    base["command"] = [sys.executable, "-c", code, *args]
    return ReplicaSpec(replica="j/w0", **{**base, **fields})


def test_a_replica_whose_prolog_fails_is_never_started(tmp_path: Path) -> None:
    bad = script(
        tmp_path / "prolog.sh", 'echo "no GPU $CUDA_VISIBLE_DEVICES for $BOLT_JOB_ID"; exit 2\n'
    )
    marker = tmp_path / "ran"
    with FakeServer() as fake, AgentThread(fake, tmp_path / "w", hooks=NodeHooks((bad,))):
        fake.set_desired(spec(STARTS, str(marker)))
        [failed] = fake.wait_for(lambda: fake.events_of("j/w0", "failed"))
        version = fake.set_desired(spec(STARTS, str(marker)))
        fake.wait_for(lambda: max(fake.polls) >= version)
        time.sleep(0.3)
        assert [e.kind for e in fake.events_of("j/w0")] == ["failed"]
    assert failed.preflight
    assert (
        failed.detail
        == f"preflight failed: prolog {bad} exited with code 2; output: no GPU 0,1 for j"
    )
    assert not marker.exists()


@linux
def test_leftovers_and_shm_files_are_gone_before_the_exit_is_reported(tmp_path: Path) -> None:
    loose = f"bolt-test-{uuid.uuid4().hex}"
    epilog = script(
        tmp_path / "epilog.sh", 'echo "$BOLT_HOOK $BOLT_EXIT_CODE" > "$BOLT_CHECKPOINT_DIR/epi"\n'
    )
    hooks = NodeHooks(epilogs=(epilog,))
    try:
        with FakeServer() as fake, AgentThread(fake, tmp_path / "w", hooks=hooks):
            fake.set_desired(spec(LEAKS, loose))
            [exited] = fake.wait_for(lambda: fake.events_of("j/w0", "exited"))
            child = int(fake.wait_log("j/w0", "child").split()[1])
            assert gone(child)
            assert not list(SHM.glob("bolt-j-j_w0-e1-*")) and not (SHM / loose).exists()
    finally:
        (SHM / loose).unlink(missing_ok=True)
    assert exited.exit_code == 0
    assert "ended 1 leftover process(es) (SIGTERM)" in exited.cleanup
    assert f"removed 2 /dev/shm file(s): bolt-j-j_w0-e1-seg, {loose}" in exited.cleanup
    assert (tmp_path / "w" / "checkpoints" / "j" / "epi").read_text() == "epilog 0\n"


def gone(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


# the server: drain the node, place the job elsewhere, charge nothing


def test_a_failed_preflight_drains_the_node_and_the_job_runs_elsewhere(tmp_path: Path) -> None:
    with Fleet(tmp_path, hosts=2) as fleet:
        neighbour = fleet.submit(make_spec("neighbour", 4))
        fleet.start_everything()
        job = fleet.submit(make_spec("train", 4, max_restarts=0))
        [(first, rep)] = [
            (n, r) for n, node in fleet.nodes.items() for r in node.to_run() if r.job == job
        ]
        assert {p.node for p in fleet.job(neighbour).placement} == {first}  # packed together
        evidence = "preflight failed: NVML: GPU 3 has 2 uncorrected ECC error(s)"
        ev = {"replica": rep.replica, "job": job, "epoch": rep.epoch, "kind": "failed"}
        fleet.nodes[first].report(
            events=[{**ev, "at": fleet.clock(), "detail": evidence, "preflight": True}]
        )
        fleet.settle()
        fleet.start_everything()
        moved = fleet.job(job)
        assert (moved.state, moved.restarts, moved.epoch) == ("running", 0, 2)
        assert {p.node for p in moved.placement if p.state != "exited"} == {"host-1"}
        [event] = [e for e in moved.events if e.kind == "preflight_failed"]
        assert event.data["node"] == first == "host-0" and event.data["evidence"] == evidence
        assert fleet.job(neighbour).state == "preempting"  # moves off at its checkpoint
        nodes = {n["name"]: n for n in fleet.http.get("/v1/nodes", headers=ADMIN).json()["nodes"]}
        assert (nodes[first]["state"], nodes["host-1"]["state"]) == ("draining", "ready")
        audit = fleet.http.get("/v1/audit", headers=ADMIN).json()
        [entry] = [e for e in audit if e["action"] == "drain" and e["target"] == first]
        assert entry["who"] == "system" and entry["detail"]["evidence"] == evidence
        fleet.finish(job)
        assert fleet.job(job).state == "succeeded"

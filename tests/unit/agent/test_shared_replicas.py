"""A replica holding part of a GPU runs on that GPU alone, told its share: a MIG instance by
profile and slice, a fraction with MPS limits, as a process or inside a container; and a
whole-GPU replica waits while a share of one of its GPUs is still stopping."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

from boltforge.agent.containers import container_env
from boltforge.agent.outbox import Outbox
from boltforge.agent.processes import replica_env, replica_paths
from boltforge.agent.runtime import AgentRuntime
from boltforge.agent.sharing import gpus_used
from boltforge.node.converge import plan
from boltforge.wire.agent import GpuShare, ReplicaSpec

PRINTS_ENV = "import json, os, sys; print(json.dumps({k: os.environ.get(k) for k in sys.argv[1:]}))"
NAMES = [
    "CUDA_VISIBLE_DEVICES",
    "BOLT_GPU_SHARE",
    "BOLT_GPU_MEMORY_GB",
    "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
    "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
]
QUARTER = GpuShare(gpu=5, fraction=0.25, memory_gb=16.0, weight=0.25)
INSTANCE = GpuShare(gpu=2, profile="3g.40gb", start=4, memory_gb=40.0, weight=3 / 7)


def spec(share: GpuShare | None, gpus: list[int] | None = None, name: str = "nb") -> ReplicaSpec:
    command = [sys.executable, "-c", PRINTS_ENV, *NAMES]
    return ReplicaSpec(
        replica=f"{name}/w0",
        job=name,
        epoch=1,
        action="run",
        command=command,
        gpus=gpus or [],
        share=share,
    )


def test_a_fractional_replica_runs_on_its_gpu_under_mps_limits(tmp_path: Path) -> None:
    rt = AgentRuntime(tmp_path / "work", Outbox(), on_exit=lambda: None, env={})
    replica = spec(QUARTER)

    async def go() -> None:
        await rt.start(replica)
        deadline = asyncio.get_running_loop().time() + 10
        while not any(e.kind == "exited" for e in rt.outbox.events):
            assert asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0.02)

    asyncio.run(go())
    seen = json.loads(replica_paths(rt.work_dir, replica).log.read_text())
    assert seen == {
        "CUDA_VISIBLE_DEVICES": "5",
        "BOLT_GPU_SHARE": "fraction:0.25",
        "BOLT_GPU_MEMORY_GB": "16",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=16384M",
    }


def test_a_mig_replica_is_told_its_instance_and_no_mps_limits() -> None:
    env = replica_env(spec(INSTANCE), replica_paths(Path("/w"), spec(INSTANCE)), {})
    assert env["CUDA_VISIBLE_DEVICES"] == "2" and env["BOLT_GPU_SHARE"] == "mig:3g.40gb@4"
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in env


def test_a_container_sees_its_shared_gpu_as_device_zero_with_the_same_limits() -> None:
    replica = spec(QUARTER)
    base = replica_env(replica, replica_paths(Path("/w"), replica), {})
    env = container_env(replica, base, devices=["/dev/nvidia5"])
    assert env["CUDA_VISIBLE_DEVICES"] == "0"
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=16384M"


def test_a_whole_gpu_replica_waits_while_a_share_of_its_gpu_is_live(tmp_path: Path) -> None:
    rt = AgentRuntime(tmp_path / "work", Outbox(), on_exit=lambda: None, env={})
    sleeper = spec(QUARTER).model_copy(
        update={"command": [sys.executable, "-c", "import time; time.sleep(30)"]}
    )
    whole = spec(None, gpus=[4, 5], name="train")

    async def go() -> set[int]:
        await rt.start(sleeper)
        busy = rt.busy_gpus()
        rt.stop(sleeper.replica, 0.0)
        await rt.wait_all(10.0)
        return busy

    busy = asyncio.run(go())
    assert busy == {5} and gpus_used(whole) == [4, 5]
    assert plan([whole], live={}, finished=set(), busy=busy).start == []


class NVMLError(Exception):
    pass


def mig_nvml(instances: dict[int, tuple[int, str]]) -> Any:
    """pynvml's MIG-device calls for GPU 2, whose MIG slots hold ``instances``
    (slot -> (start slice, device UUID)); the other slots are empty."""

    def child(parent: int, index: int) -> int:
        if index not in instances:
            raise NVMLError("Not Found")
        return index

    return SimpleNamespace(
        NVMLError=NVMLError,
        nvmlInit=lambda: None,
        nvmlShutdown=lambda: None,
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetMaxMigDeviceCount=lambda h: 7,
        nvmlDeviceGetMigDeviceHandleByIndex=child,
        nvmlDeviceGetGpuInstanceId=lambda c: 10 + c,
        nvmlDeviceGetGpuInstanceById=lambda h, gi: gi - 10,
        nvmlGpuInstanceGetInfo=lambda gi: SimpleNamespace(
            placement=SimpleNamespace(start=instances[gi][0])
        ),
        nvmlDeviceGetUUID=lambda c: instances[c][1].encode(),
    )


class NodeChecks:
    """The node's preflight as the runtime sees it: NVML, and checks that pass."""

    def __init__(self, nvml: Any) -> None:
        self.nvml = nvml

    async def run(self, gpus: list[int], env: dict[str, str]) -> Any:
        return SimpleNamespace(ok=True, evidence="")


def run_on(tmp_path: Path, nvml: Any, replica: ReplicaSpec) -> AgentRuntime:
    preflight = cast(Any, NodeChecks(nvml))
    rt = AgentRuntime(
        tmp_path / "work", Outbox(), on_exit=lambda: None, env={}, preflight=preflight
    )

    async def go() -> None:
        await rt.start(replica)
        deadline = asyncio.get_running_loop().time() + 10
        while not any(e.kind in ("exited", "failed") for e in rt.outbox.events):
            assert asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0.02)

    asyncio.run(go())
    return rt


def test_with_nvml_a_mig_replica_sees_its_own_mig_device(tmp_path: Path) -> None:
    nvml = mig_nvml({0: (0, "MIG-aaaa"), 3: (4, "MIG-bbbb")})
    replica = spec(INSTANCE)  # 3g.40gb at slice 4 of GPU 2
    rt = run_on(tmp_path, nvml, replica)
    seen = json.loads(replica_paths(rt.work_dir, replica).log.read_text())
    assert seen["CUDA_VISIBLE_DEVICES"] == "MIG-bbbb"
    assert seen["BOLT_GPU_SHARE"] == "mig:3g.40gb@4"


def test_a_mig_instance_the_gpu_lacks_fails_the_replica_with_the_fix(tmp_path: Path) -> None:
    rt = run_on(tmp_path, mig_nvml({0: (0, "MIG-aaaa")}), spec(INSTANCE))
    [failed] = [e for e in rt.outbox.events if e.kind == "failed"]
    assert "no MIG instance at slice 4" in (failed.detail or "")
    assert "To fix" in (failed.detail or "")

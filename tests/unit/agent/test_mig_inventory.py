"""A node's MIG geometry: read through NVML's MIG calls where a GPU has MIG on, declared in
an inventory file otherwise, and checked like a fleet spec's pool. NVML is a stand-in here
(no GPU on the test machine) with pynvml's functions, constants and ctypes conventions."""

from __future__ import annotations

import ctypes
from types import SimpleNamespace
from typing import Any

import pytest

from boltforge.agent.inventory import detect, mig_layout
from boltforge.control.scheduling.fleet import build_fleet, check_inventory
from boltforge.spec.errors import SpecError
from boltforge.wire.agent import Inventory

H100 = "NVIDIA H100 80GB HBM3"
BYTES_80GB = 85_520_809_984
# (profile id, compute slices, placement size): NVIDIA's ids for 1g, 2g and 3g instances.
PROFILES = {0: (1, 1), 1: (2, 2), 2: (3, 4)}


class NVMLError(Exception):
    pass


def fake_nvml(mode: int, instances: dict[int, list[int]]) -> Any:
    """pynvml for 8 H100s, GPU 0 with MIG ``mode`` and ``instances`` (profile id -> starts)."""

    def profile_info(handle: int, profile: int) -> Any:
        if profile not in PROFILES:
            raise NVMLError("Not Supported")
        slices, _ = PROFILES[profile]
        return SimpleNamespace(id=profile, sliceCount=slices, instanceCount=7)

    def gpu_instances(handle: int, profile: int, array: Any, count: Any) -> int:
        starts = instances.get(profile, [])
        for i, start in enumerate(starts):
            array[i] = (profile << 8) | start  # a handle that carries its placement
        count._obj.value = len(starts)
        return 0

    def instance_info(instance: int) -> Any:
        profile, start = instance >> 8, instance & 0xFF
        return SimpleNamespace(placement=SimpleNamespace(start=start, size=PROFILES[profile][1]))

    return SimpleNamespace(
        NVMLError=NVMLError,
        NVML_DEVICE_MIG_ENABLE=1,
        NVML_GPU_INSTANCE_PROFILE_COUNT=14,
        c_nvmlGpuInstance_t=ctypes.c_uint64,
        nvmlInit=lambda: None,
        nvmlShutdown=lambda: None,
        nvmlDeviceGetCount=lambda: 8,
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetName=lambda h: H100,
        nvmlDeviceGetMemoryInfo=lambda h: SimpleNamespace(total=BYTES_80GB),
        nvmlDeviceGetMigMode=lambda h: (mode, mode),
        nvmlDeviceGetGpuInstanceProfileInfo=profile_info,
        nvmlDeviceGetGpuInstances=gpu_instances,
        nvmlGpuInstanceGetInfo=instance_info,
    )


def test_a_gpu_cut_into_instances_is_read_as_its_layout() -> None:
    nvml = fake_nvml(1, {1: [0], 0: [2, 3], 2: [4]})
    inv = detect(None, name="mig-box", nvml=nvml)
    assert inv.mig and inv.mig_layout == ["2g.20gb", "1g.10gb", "1g.10gb", "3g.40gb"]
    pool = build_fleet("lab", [inv]).tree.pools[0]
    assert pool.mig and pool.mig_layout == ("2g.20gb", "1g.10gb", "1g.10gb", "3g.40gb")


def test_mig_off_or_unsupported_leaves_whole_gpus() -> None:
    assert not detect(None, nvml=fake_nvml(0, {})).mig
    plain = fake_nvml(0, {})
    del plain.nvmlDeviceGetMigMode  # an older driver's pynvml
    assert mig_layout(plain, 0, "H100-80GB") is None
    assert mig_layout(fake_nvml(1, {0: [0]}), 0, None) is None  # a GPU without a MIG table


def inventory(**fields: Any) -> Inventory:
    base = {"name": "n0", "pool": "a100", "gpu": "A100-80GB", "gpu_memory_gb": 80, "gpus": 8}
    return Inventory.model_validate({**base, **fields})


def test_a_declared_mig_layout_is_checked_like_a_pools() -> None:
    check_inventory(inventory(mig=True, mig_layout=["3g.40gb", "4g.40gb"]), None)
    with pytest.raises(SpecError) as caught:
        check_inventory(inventory(mig=True, mig_layout=["4g.40gb", "4g.40gb"]), None)
    [problem] = caught.value.problems
    assert problem.field == "inventory.mig" and "does not fit" in problem.message
    with pytest.raises(SpecError, match=r"inventory\.mig_layout"):
        peer = inventory(name="n1", mig=True, mig_layout=["7g.80gb"])
        check_inventory(inventory(mig=True, mig_layout=["3g.40gb"]), peer)

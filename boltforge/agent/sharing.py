"""How a replica that holds part of a GPU sees it: the device it may use and the limits.

A MIG instance is named to CUDA by its MIG device UUID where NVML shows it (``mig_device``),
else by the GPU index (declared inventory), and ``BOLT_GPU_SHARE`` says which instance it
is; a fractional share runs under MPS limits (``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``,
``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``), which an MPS server on the node enforces and plain
time-slicing ignores, so ``BOLT_GPU_MEMORY_GB`` also tells the framework its cap (e.g.
``torch.cuda.set_per_process_memory_fraction``).
"""

from __future__ import annotations

from typing import Any

from boltforge.wire.agent import ReplicaSpec


def gpus_used(spec: ReplicaSpec) -> list[int]:
    """The node's GPU indices ``spec`` runs on: its whole GPUs, or the one it holds part of."""
    if spec.gpus or spec.share is None:
        return list(spec.gpus)
    return [spec.share.gpu]


def share_env(spec: ReplicaSpec) -> dict[str, str]:
    """The variables that state a shared replica's part of its GPU (empty for whole GPUs).
    Device numbers in the limits count from 0 in ``CUDA_VISIBLE_DEVICES``."""
    share = spec.share
    if share is None:
        return {}
    if share.profile:
        return {
            "BOLT_GPU_SHARE": f"mig:{share.profile}@{share.start}",
            "BOLT_GPU_MEMORY_GB": f"{share.memory_gb:g}",
        }
    return {
        "BOLT_GPU_SHARE": f"fraction:{share.fraction:g}",
        "BOLT_GPU_MEMORY_GB": f"{share.memory_gb:g}",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(max(1, round(share.fraction * 100))),
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"0={max(1, int(share.memory_gb * 1024))}M",
    }


def mig_device(nvml: Any, gpu: int, start: int) -> str | None:
    """The UUID (``MIG-...``) of the MIG device whose GPU instance starts at memory slice
    ``start`` on GPU ``gpu``, through NVML (``pynvml``'s calls); None when there is none.
    NVML's errors propagate, but a MIG slot with no device in it is skipped."""
    error = getattr(nvml, "NVMLError", Exception)
    nvml.nvmlInit()
    try:
        parent = nvml.nvmlDeviceGetHandleByIndex(gpu)
        for index in range(int(nvml.nvmlDeviceGetMaxMigDeviceCount(parent))):
            try:
                child = nvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, index)
            except error:
                continue  # an empty slot
            instance_id = int(nvml.nvmlDeviceGetGpuInstanceId(child))
            instance = nvml.nvmlDeviceGetGpuInstanceById(parent, instance_id)
            if int(nvml.nvmlGpuInstanceGetInfo(instance).placement.start) == start:
                uuid = nvml.nvmlDeviceGetUUID(child)
                return uuid.decode() if isinstance(uuid, bytes) else str(uuid)
        return None
    finally:
        nvml.nvmlShutdown()

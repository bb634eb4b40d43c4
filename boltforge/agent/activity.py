"""What each GPU is doing, as NVML sees it: compute utilization and memory in use, sampled for
every heartbeat where NVML is present. The server judges hung jobs by it: a job whose GPUs
hold memory but compute nothing, and which reports no progress, is a zombie."""

from __future__ import annotations

import contextlib
from typing import Any

from boltforge.wire.agent import GpuActivity

MIB = 1024 * 1024


def sample_gpus(nvml: Any, count: int) -> list[GpuActivity]:
    """One sample of GPUs ``0..count-1`` through the ``pynvml`` module ``nvml``; empty when
    NVML fails (a heartbeat must never fail for want of it). A GPU whose queries fail is left
    out."""
    error = getattr(nvml, "NVMLError", Exception)
    try:
        nvml.nvmlInit()
    except error:
        return []
    try:
        return [a for a in (_one(nvml, error, i) for i in range(count)) if a is not None]
    finally:
        with contextlib.suppress(error):
            nvml.nvmlShutdown()


def _one(nvml: Any, error: type[BaseException], index: int) -> GpuActivity | None:
    try:
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        util = float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
        used = float(nvml.nvmlDeviceGetMemoryInfo(handle).used) / MIB
    except error:
        return None
    return GpuActivity(index=index, util_pct=min(max(util, 0.0), 100.0), memory_used_mib=used)

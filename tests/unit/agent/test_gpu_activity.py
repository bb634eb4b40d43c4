"""GPU activity: what the agent samples through NVML for each heartbeat, and how the server
keeps when each GPU began to sit idle with memory held."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from boltforge.agent.activity import MIB, sample_gpus
from boltforge.control.nodes.activity import merge
from boltforge.wire.agent import GpuActivity


class NVMLError(Exception):
    pass


def fake_nvml(util: dict[int, int], used_mib: dict[int, int], broken: int | None = None) -> Any:
    """pynvml's sampling calls over GPUs ``util``'s keys; GPU ``broken`` fails its queries."""

    def rates(handle: int) -> Any:
        if handle == broken:
            raise NVMLError("GPU is lost")
        return SimpleNamespace(gpu=util[handle], memory=0)

    return SimpleNamespace(
        NVMLError=NVMLError,
        nvmlInit=lambda: None,
        nvmlShutdown=lambda: None,
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetUtilizationRates=rates,
        nvmlDeviceGetMemoryInfo=lambda h: SimpleNamespace(used=used_mib[h] * MIB),
    )


def test_the_agent_samples_each_gpus_utilization_and_memory() -> None:
    nvml = fake_nvml({0: 97, 1: 0}, {0: 30_000, 1: 512})
    assert sample_gpus(nvml, 2) == [
        GpuActivity(index=0, util_pct=97.0, memory_used_mib=30_000.0),
        GpuActivity(index=1, util_pct=0.0, memory_used_mib=512.0),
    ]


def test_a_gpu_whose_queries_fail_is_left_out_and_nvml_failing_gives_nothing() -> None:
    nvml = fake_nvml({0: 50, 1: 50}, {0: 1, 1: 1}, broken=1)
    assert [a.index for a in sample_gpus(nvml, 2)] == [0]

    def refuse() -> None:
        raise NVMLError("Driver Not Loaded")

    down = SimpleNamespace(NVMLError=NVMLError, nvmlInit=refuse)
    assert sample_gpus(down, 8) == []


def sample(index: int, util: float, memory: float) -> GpuActivity:
    return GpuActivity(index=index, util_pct=util, memory_used_mib=memory)


@pytest.mark.parametrize(
    ("util", "memory", "idle"),
    [
        pytest.param(0.0, 30_000.0, True, id="memory held, no compute"),
        pytest.param(5.0, 256.0, True, id="at both thresholds"),
        pytest.param(6.0, 30_000.0, False, id="computing"),
        pytest.param(0.0, 100.0, False, id="no memory held"),
    ],
)
def test_when_a_gpu_counts_as_idle(util: float, memory: float, idle: bool) -> None:
    [record] = merge(None, [sample(0, util, memory)], 50.0).values()
    assert record["idle_since"] == (50.0 if idle else None)


def test_idle_since_holds_while_idle_and_resets_once_the_gpu_computes() -> None:
    first = merge(None, [sample(3, 0.0, 9_000.0)], 10.0)
    still = merge(first, [sample(3, 1.0, 9_000.0)], 20.0)
    busy = merge(still, [sample(3, 80.0, 9_000.0)], 30.0)
    again = merge(busy, [sample(3, 0.0, 9_000.0)], 40.0)
    assert [r["3"]["idle_since"] for r in (first, still, busy, again)] == [10.0, 10.0, None, 40.0]
    assert still["3"]["at"] == 20.0 and still["3"]["util_pct"] == 1.0

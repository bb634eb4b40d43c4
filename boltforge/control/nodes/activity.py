"""GPU activity the agents sample through NVML, kept on each node's health record.

For every GPU a heartbeat reports, the node's ``health["gpus"]`` keeps the latest sample and
``idle_since``: when the GPU began to hold memory while computing nothing (at most
``IDLE_UTIL_PCT`` utilization with at least ``HELD_MEMORY_MIB`` in use), None while it
computes or holds no memory. The health check judges hung jobs by it
(``boltforge.core.health.confirm``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from boltforge.control.store.models import NodeRow
from boltforge.wire.agent import GpuActivity

IDLE_UTIL_PCT = 5.0
HELD_MEMORY_MIB = 256.0


def merge(
    previous: Mapping[str, Any] | None, samples: Iterable[GpuActivity], now: float
) -> dict[str, Any]:
    """The node's GPU records after ``samples`` arrived at ``now`` (``previous``: the records
    before, by GPU index as a string). A GPU not sampled this time keeps no record."""
    before = previous or {}
    out: dict[str, Any] = {}
    for a in samples:
        idle = a.util_pct <= IDLE_UTIL_PCT and a.memory_used_mib >= HELD_MEMORY_MIB
        since = (before.get(str(a.index)) or {}).get("idle_since")
        out[str(a.index)] = {
            "util_pct": a.util_pct,
            "memory_used_mib": a.memory_used_mib,
            "at": now,
            "idle_since": (since if since is not None else now) if idle else None,
        }
    return out


def idle_since(node: NodeRow | None, gpus: Iterable[int]) -> list[float | None] | None:
    """When each of ``gpus`` on ``node`` began to sit idle with memory held (None: busy), or
    None when NVML does not sample every one of them."""
    records = ((node.health or {}).get("gpus") or {}) if node is not None else {}
    out = []
    for gpu in gpus:
        record = records.get(str(gpu))
        if record is None:
            return None
        out.append(record.get("idle_since"))
    return out

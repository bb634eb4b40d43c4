"""Preflight: the checks a node runs before it starts a replica. NVML's view of the GPUs (the
count the inventory declares, no uncorrected ECC errors on the replica's GPUs, NVLink links
up) where NVML is present, then the ``--prolog`` scripts. A replica whose preflight fails is
never started on this node: the agent reports it, and the server drains the node and places
the job elsewhere."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from boltforge.agent.hooks import DEFAULT_TIMEOUT_S, run_scripts
from boltforge.wire.agent import Inventory

NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_VOLATILE_ECC = 0
NVML_NVLINK_MAX_LINKS = 18
NVML_FEATURE_DISABLED = 0


@dataclass(frozen=True, slots=True)
class PreflightVerdict:
    """A preflight's outcome: ``ok``, else ``evidence`` says which check failed and why.
    ``notes`` say what was skipped (no NVML, a declared inventory)."""

    ok: bool
    evidence: str = ""
    notes: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class NodeHooks:
    """What the agent runs around each replica: ``prologs`` before it starts (a failure keeps
    it from starting), ``epilogs`` after it ended, each with ``timeout_s``."""

    prologs: tuple[Path, ...] = ()
    epilogs: tuple[Path, ...] = ()
    timeout_s: float = DEFAULT_TIMEOUT_S


def load_nvml() -> Any | None:
    """``pynvml`` (nvidia-ml-py) if it is installed, else None."""
    try:
        return importlib.import_module("pynvml")
    except ImportError:
        return None


class Preflight:
    """The node's preflight. NVML checks run only when the inventory came from NVML (a
    declared inventory stands in for a GPU host, so its GPUs are not NVML's) and ``nvml``
    (the module, found once by ``load``) is there. With nothing to check, ``run`` returns at
    once without leaving the event loop."""

    def __init__(
        self,
        inventory: Inventory,
        hooks: NodeHooks,
        load: Callable[[], Any | None] = load_nvml,
    ) -> None:
        self.inventory, self.hooks = inventory, hooks
        self.nvml = load() if inventory.source == "nvml" else None
        self.skipped = _skipped(inventory, self.nvml)

    async def run(self, gpus: list[int], env: Mapping[str, str]) -> PreflightVerdict:
        """Check the node before a replica on ``gpus`` starts with ``env``."""
        if self.nvml is not None:
            problems = await asyncio.to_thread(gpu_problems, self.nvml, self.inventory.gpus, gpus)
            if problems:
                return PreflightVerdict(False, "NVML: " + "; ".join(problems))
        if self.hooks.prologs:
            results = await run_scripts(self.hooks.prologs, env, self.hooks.timeout_s)
            failed = [r for r in results if not r.ok]
            if failed:
                return PreflightVerdict(False, f"prolog {failed[0].evidence}", self.skipped)
        return PreflightVerdict(True, notes=self.skipped)


def _skipped(inventory: Inventory, nvml: Any | None) -> tuple[str, ...]:
    if inventory.source != "nvml":
        return ("GPU checks skipped: the inventory is declared, not read from NVML",)
    if nvml is None:
        return ("GPU checks skipped: NVML (nvidia-ml-py) is not installed",)
    return ()


def gpu_problems(nvml: Any, expected: int, gpus: list[int]) -> list[str]:
    """What NVML says is wrong: a GPU count other than ``expected``, uncorrected volatile ECC
    errors or NVLink links down on any of ``gpus``. A query the GPU does not support is
    skipped. NVML failing to start is itself a problem."""
    error = getattr(nvml, "NVMLError", Exception)
    try:
        nvml.nvmlInit()
    except error as e:
        return [f"NVML did not start: {e}"]
    try:
        count = int(nvml.nvmlDeviceGetCount())
        if count != expected:
            return [f"NVML sees {count} GPU(s); the inventory has {expected}"]
        problems = []
        for index in gpus:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            problems += _ecc(nvml, error, index, handle) + _nvlink(nvml, error, index, handle)
        return problems
    except error as e:
        return [f"NVML query failed: {e}"]
    finally:
        with contextlib.suppress(error):
            nvml.nvmlShutdown()


def _ecc(nvml: Any, error: type[BaseException], index: int, handle: Any) -> list[str]:
    try:
        count = int(
            nvml.nvmlDeviceGetTotalEccErrors(
                handle, NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_VOLATILE_ECC
            )
        )
    except error:
        return []  # no ECC on this GPU
    return [f"GPU {index} has {count} uncorrected ECC error(s)"] if count else []


def _nvlink(nvml: Any, error: type[BaseException], index: int, handle: Any) -> list[str]:
    down = []
    for link in range(NVML_NVLINK_MAX_LINKS):
        try:
            state = nvml.nvmlDeviceGetNvLinkState(handle, link)
        except error:
            continue  # the GPU has no such link
        if state == NVML_FEATURE_DISABLED:
            down.append(link)
    if not down:
        return []
    return [f"GPU {index} NVLink link(s) {', '.join(map(str, down))} down"]

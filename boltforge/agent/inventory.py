"""The node's inventory: GPUs through NVML where present, else a declared inventory file."""

from __future__ import annotations

import ctypes
import importlib
import os
import re
import socket
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from boltforge.core.sharing import mig
from boltforge.spec.errors import _MISSING, SpecError, SpecProblem, from_validation
from boltforge.spec.loader import read_yaml
from boltforge.wire.agent import NAME, Inventory

EXAMPLE = "examples/nodes/host-0.yaml"
NO_NVML_FIX = f"To fix: pass --inventory FILE declaring the node's GPUs and place (see {EXAMPLE})"
_VENDOR_WORDS = {"nvidia", "tesla", "geforce", "quadro"}


def load_declared(path: str | Path, name: str | None = None) -> Inventory:
    """Read a declared inventory file (YAML with ``Inventory``'s fields); ``name`` overrides
    the file's name. Raises ``SpecError`` naming each bad field and its fix."""
    source = str(path)
    data = read_yaml(path)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        message = f"must be a mapping of inventory fields. To fix: start from {EXAMPLE}"
        raise SpecError(source, [SpecProblem("inventory", type(data).__name__, message)])
    data = {k: v for k, v in data.items() if k != "source"}
    if name is not None:
        data["name"] = name
    try:
        return Inventory.model_validate({**data, "source": "declared"})
    except ValidationError as e:
        raise _with_fixes(from_validation(source, "inventory", e)) from None


def _with_fixes(error: SpecError) -> SpecError:
    problems = [
        p
        if "To fix" in p.message
        else SpecProblem(p.field, p.value, f"{p.message}. To fix: correct {p.field}")
        for p in error.problems
    ]
    return SpecError(error.source, problems)


def from_nvml(nvml: Any, name: str | None = None) -> Inventory:
    """Count the GPUs through an NVML module (``pynvml`` or a stand-in with its functions).
    The model and memory come from GPU 0 (memory: the smallest GPU's). NVML's errors
    propagate; the caller turns them into advice."""
    nvml.nvmlInit()
    try:
        count = int(nvml.nvmlDeviceGetCount())
        handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        model = _text(nvml.nvmlDeviceGetName(handles[0])) if handles else ""
        total = min((int(nvml.nvmlDeviceGetMemoryInfo(h).total) for h in handles), default=0)
        gpu, memory_gb = gpu_model(model, total) if count else ("none", 0.0)
        cut = mig_layout(nvml, handles[0], mig.model_of(gpu, memory_gb)) if handles else None
    finally:
        nvml.nvmlShutdown()
    return Inventory(
        name=name or host_name(),
        gpu=gpu,
        gpu_memory_gb=memory_gb,
        gpus=count,
        cpus=os.cpu_count() or 1,
        memory_gb=host_memory_gb(),
        address=host_address(),
        mig=cut is not None,
        mig_layout=list(cut or ()),
        source="nvml",
    )


def mig_layout(nvml: Any, handle: Any, model: str | None) -> tuple[str, ...] | None:
    """How GPU ``handle`` is cut into MIG instances (profile names by start slice), or None
    when MIG is off, unsupported, or the GPU has no MIG table here (``core/sharing/mig.py``).
    Each instance's profile is named from NVML's compute slices and placement size."""
    error = getattr(nvml, "NVMLError", Exception)
    try:
        current, _pending = nvml.nvmlDeviceGetMigMode(handle)
    except (error, AttributeError):
        return None
    if model is None or current != getattr(nvml, "NVML_DEVICE_MIG_ENABLE", 1):
        return None
    by_shape = {(p.compute, p.size): p.name for p in mig.MODELS[model].values()}
    found: list[tuple[int, str]] = []
    for profile_id in range(int(getattr(nvml, "NVML_GPU_INSTANCE_PROFILE_COUNT", 0))):
        try:
            info = nvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, profile_id)
            instances = _gpu_instances(nvml, handle, info)
        except error:
            continue  # a profile this GPU does not offer
        for instance in instances:
            placement = nvml.nvmlGpuInstanceGetInfo(instance).placement
            name = by_shape.get((int(info.sliceCount), int(placement.size)))
            if name is not None:
                found.append((int(placement.start), name))
    return tuple(name for _, name in sorted(found))


def _gpu_instances(nvml: Any, handle: Any, info: Any) -> list[Any]:
    """The GPU instances of profile ``info`` on ``handle`` (pynvml fills a ctypes array)."""
    room = max(int(info.instanceCount), 1)
    array = (nvml.c_nvmlGpuInstance_t * room)()
    count = ctypes.c_uint(0)
    nvml.nvmlDeviceGetGpuInstances(handle, info.id, array, ctypes.byref(count))
    return [array[i] for i in range(count.value)]


def gpu_model(nvml_name: str, total_bytes: int) -> tuple[str, float]:
    """The fleet's GPU name and nominal memory for an NVML device name and its total memory:
    ``NVIDIA H100 80GB HBM3`` -> ``H100-80GB``, 80; ``NVIDIA L4`` with 24 GB -> ``L4-24GB``."""
    words = [w for w in re.split(r"[\s]+", nvml_name.strip()) if w.lower() not in _VENDOR_WORDS]
    model = (words[0].split("-")[0] if words else "gpu") or "gpu"
    stated = re.search(r"(\d+)\s*GB", nvml_name, re.IGNORECASE)
    memory = int(stated.group(1)) if stated else round(total_bytes / 1e9)
    return f"{model}-{memory}GB", float(memory)


def detect(path: str | Path | None, name: str | None = None, nvml: Any = None) -> Inventory:
    """The inventory the agent registers: the declared file when ``path`` is given, else NVML
    (``nvml``, or ``pynvml`` imported on first use). Raises ``SpecError`` with the fix when
    neither works."""
    if path is not None:
        return load_declared(path, name)
    try:
        module = nvml if nvml is not None else _import_pynvml()
        inventory = from_nvml(module, name)
    except Exception as e:  # NVML's errors are module-specific classes; all mean "no NVML"
        raise SpecError("inventory", [_no_nvml(e)]) from None
    if inventory.gpus == 0:
        raise SpecError("inventory", [_no_nvml("NVML found no GPUs")])
    return inventory


def _no_nvml(cause: object) -> SpecProblem:
    return SpecProblem(
        "--inventory", _MISSING, f"is needed: NVML is unavailable ({cause}). {NO_NVML_FIX}"
    )


def _import_pynvml() -> Any:
    return importlib.import_module("pynvml")  # nvidia-ml-py, only on the NVML path


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def host_name() -> str:
    """This machine's host name, trimmed to a valid node name."""
    name = re.sub(r"[^A-Za-z0-9_.-]", "-", socket.gethostname()).strip("-.")[:63]
    return name if re.match(NAME, name) else "node"


def host_address() -> str:
    """An address peers can reach this host at (``MASTER_ADDR``), loopback when unknown."""
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def host_memory_gb() -> float:
    """Physical memory in GB (1 when the platform does not say)."""
    try:
        return round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9, 1) or 1.0
    except (ValueError, OSError, AttributeError):
        return 1.0

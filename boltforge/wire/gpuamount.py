"""How many GPUs a job asks for or holds, in words: the one formatter for whole GPUs and
for parts of one (a fraction, or a MIG instance), used by the server's timelines, the
``bolt`` commands and, through ``JobSummary.gpu_part``, the console."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def gpu_part(spec: Mapping[str, Any]) -> str:
    """Each replica's part of one GPU as a stored job spec (its JSON form) asks for it: the
    fraction (``"0.25"``) or the MIG profile (``"1g.10gb"``), from the job's ``gpu`` or else
    its first role's that asks for one; empty when it asks for whole GPUs or none."""
    needs = [spec.get("gpu"), *(role.get("gpu") for role in spec.get("roles") or [])]
    for need in needs:
        if isinstance(need, Mapping) and need.get("fraction") is not None:
            return f"{float(need['fraction']):g}"
        if isinstance(need, Mapping) and need.get("mig"):
            return str(need["mig"])
    return ""


def gpu_amount(gpus: int, part: str = "", replicas: int = 1, unit: bool = True) -> str:
    """``gpus`` whole GPUs, or (``gpus`` 0 and a ``part``, see ``gpu_part``) ``replicas``
    parts of one, in words: ``8 GPU(s)``, ``0.25 GPU``, ``4 x 0.25 GPU``, ``MIG 1g.10gb``,
    ``2 x MIG 1g.10gb``. Without ``unit``, for a table's GPU column: ``8``, ``0.25``,
    ``4x0.25``, ``1g.10gb``, ``2x1g.10gb``."""
    if gpus or not part:
        return f"{gpus} GPU(s)" if unit else str(gpus)
    mig = "g" in part  # a MIG profile, COMPUTEg.MEMORYgb; a fraction is a number
    each = (f"MIG {part}" if mig else f"{part} GPU") if unit else part
    if replicas <= 1:
        return each
    return f"{replicas} x {each}" if unit else f"{replicas}x{each}"

"""Taints and tolerations, as the kubelet and the default scheduler read them.

A node's ``NoSchedule`` and ``NoExecute`` taints keep off every pod that does not tolerate
them (``PreferNoSchedule`` is a preference: it keeps nothing off). A toleration matches a
taint when its key is the taint's (an empty key with ``Exists`` matches every key), its
operator is ``Exists`` or its value is the taint's (``Equal``, the default), and its effect is
the taint's or empty (every effect). ``bolt kube-scheduler --tolerate-taint`` adds
tolerations on behalf of every pod (``parse``), as the ExtendedResourceToleration admission
plugin adds ``nvidia.com/gpu`` to pods that ask for GPUs. Pure functions."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

BLOCKING = ("NoSchedule", "NoExecute")
EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")


@dataclass(frozen=True)
class Taint:
    key: str
    effect: str
    value: str = ""

    def __str__(self) -> str:
        return f"{self.key}{'=' + self.value if self.value else ''}:{self.effect}"


@dataclass(frozen=True)
class Toleration:
    key: str = ""
    operator: str = "Equal"  # or Exists
    value: str = ""
    effect: str = ""  # empty: every effect

    def matches(self, taint: Taint) -> bool:
        if self.effect and self.effect != taint.effect:
            return False
        if not self.key:
            return self.operator == "Exists"
        if self.key != taint.key:
            return False
        return self.operator == "Exists" or self.value == taint.value


def taint(obj: Mapping[str, Any]) -> Taint:
    return Taint(obj.get("key", ""), obj.get("effect", ""), str(obj.get("value") or ""))


def toleration(obj: Mapping[str, Any]) -> Toleration:
    return Toleration(
        obj.get("key") or "",
        obj.get("operator") or "Equal",
        str(obj.get("value") or ""),
        obj.get("effect") or "",
    )


def parse(text: str) -> Toleration:
    """``KEY[=VALUE][:EFFECT]`` (a ``--tolerate-taint``) as a toleration: without a value it
    tolerates every value, without an effect every effect. Raises ``ValueError`` naming the
    fix."""
    rest, _, effect = text.partition(":")
    key, eq, value = rest.partition("=")
    if not key.strip() or (effect and effect not in EFFECTS):
        raise ValueError(
            f"{text!r} is not KEY[=VALUE]:EFFECT with EFFECT one of {', '.join(EFFECTS)}. "
            "To fix: e.g. dedicated=gpu:NoSchedule or nvidia.com/gpu:NoSchedule"
        )
    return Toleration(key.strip(), "Equal" if eq else "Exists", value, effect)


def blocking(taints: Iterable[Taint], tolerations: Iterable[Toleration]) -> list[Taint]:
    """The taints that keep off a pod with ``tolerations``."""
    tols = tuple(tolerations)
    return [t for t in taints if t.effect in BLOCKING and not any(tol.matches(t) for tol in tols)]

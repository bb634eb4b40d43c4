"""Small helpers on objects as JSON dicts: timestamps (RFC 3339, seconds, ``Z``), uids,
``generateName`` suffixes, status conditions, and the shape every stored object has."""

from __future__ import annotations

import random
import time
import uuid
from datetime import UTC, datetime
from typing import Any

JSON = dict[str, Any]
NAME_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"


def timestamp(at: float | None = None) -> str:
    """``at`` (default now) as kube-apiserver writes a metav1.Time: ``2024-05-01T12:00:00Z``."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() if at is None else at))


def parse_time(text: str | None) -> float | None:
    """Seconds since the epoch of an RFC 3339 time (None when absent or unreadable)."""
    if not text:
        return None
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.timestamp()


def new_uid() -> str:
    return str(uuid.uuid4())


def generated_name(prefix: str) -> str:
    """``prefix`` and five random characters, as ``metadata.generateName`` asks."""
    return prefix + "".join(random.choices(NAME_ALPHABET, k=5))


def meta(obj: JSON) -> JSON:
    """``obj``'s metadata (created empty when missing)."""
    found = obj.get("metadata")
    if not isinstance(found, dict):
        found = obj["metadata"] = {}
    return found


def section(obj: JSON, key: str) -> JSON:
    """``obj[key]`` as a dict, created empty when missing (``spec``, ``status``)."""
    found = obj.get(key)
    if not isinstance(found, dict):
        found = obj[key] = {}
    return found


def set_condition(
    status: JSON,
    kind: str,
    value: str,
    reason: str | None = None,
    message: str | None = None,
    probe: bool = True,
) -> None:
    """Add or update condition ``kind`` in ``status.conditions``; ``lastTransitionTime`` moves
    only when the value does. ``probe``: a pod condition, which has a ``lastProbeTime``."""
    conditions = status.setdefault("conditions", [])
    found = next((c for c in conditions if c.get("type") == kind), None)
    if found is None:
        found = {"type": kind}
        conditions.append(found)
    if found.get("status") != value:
        found["lastTransitionTime"] = timestamp()
    found["status"] = value
    if probe:
        found["lastProbeTime"] = None
    for key, text in (("reason", reason), ("message", message)):
        if text is None:
            found.pop(key, None)
        else:
            found[key] = text


def deleting(obj: JSON) -> bool:
    """Whether ``obj`` carries a ``deletionTimestamp``."""
    return bool(meta(obj).get("deletionTimestamp"))

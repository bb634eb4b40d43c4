"""What a PodDisruptionBudget allows, as kube-apiserver's disruption controller computes it.

Of the pods a budget selects (``spec.selector`` over its namespace; an empty selector
selects them all), the *expected* ones are those not finished (phase neither Succeeded nor
Failed) and the *healthy* ones those in phase Running and not being deleted;
``minAvailable`` or ``maxUnavailable`` (an integer, or a percentage of the expected pods
rounded up) gives the healthy pods desired, and ``disruptionsAllowed`` is healthy minus
desired, never below 0. An evicted pod is deleted gracefully at once and, until it is gone,
stays expected but not healthy: an eviction in progress counts against the budget (as
kube-apiserver's ``disruptedPods`` make it), and ``maxUnavailable: 1`` lets pods go one at
a time. (kube-apiserver counts expected pods from their controller's scale; pods here need
no controller.)"""

from __future__ import annotations

import math
from typing import Any

from boltforge.testing.kubeapi.deletion import TERMINAL
from boltforge.testing.kubeapi.errors import ApiError
from boltforge.testing.kubeapi.objects import JSON, deleting, meta, section, set_condition
from boltforge.testing.kubeapi.selectors import from_spec

REFUSED = "Cannot evict pod as it would violate the pod's disruption budget."


def selects(pdb: JSON, pod: JSON) -> bool:
    selector = from_spec(section(pdb, "spec").get("selector"))
    return selector is not None and selector.matches_object(pod)


def _healthy(pod: JSON) -> bool:
    return section(pod, "status").get("phase") == "Running" and not deleting(pod)


def status(pdb: JSON, pods: list[JSON]) -> JSON:
    """``pdb``'s status, given the pods it selects."""
    live = [p for p in pods if section(p, "status").get("phase") not in TERMINAL]
    healthy = sum(1 for p in live if _healthy(p))
    desired = desired_healthy(section(pdb, "spec"), len(live))
    allowed = max(0, healthy - desired)
    current: JSON = {**(pdb.get("status") or {})}
    current.update(
        currentHealthy=healthy,
        desiredHealthy=desired,
        disruptionsAllowed=allowed,
        expectedPods=len(live),
        observedGeneration=meta(pdb).get("generation", 1),
    )
    current.setdefault("disruptedPods", {})
    current["conditions"] = [dict(c) for c in current.get("conditions") or []]
    reason = "SufficientPods" if allowed else "InsufficientPods"
    value = "True" if allowed else "False"
    set_condition(current, "DisruptionAllowed", value, reason, "", probe=False)
    return current


def desired_healthy(spec: JSON, expected: int) -> int:
    if spec.get("minAvailable") is not None:
        return _scaled(spec["minAvailable"], expected)
    if spec.get("maxUnavailable") is not None:
        return max(0, expected - _scaled(spec["maxUnavailable"], expected))
    return 0


def _scaled(value: Any, total: int) -> int:
    """An IntOrString against ``total``: ``"50%"`` rounds up."""
    if isinstance(value, str) and value.endswith("%"):
        return math.ceil(int(value[:-1]) * total / 100)
    return int(value)


def check(pdb: JSON, now: JSON) -> None:
    """Raise 429, naming ``pdb``, when its status ``now`` allows no disruption."""
    if now["disruptionsAllowed"] > 0:
        return
    cause = (
        f"The disruption budget {meta(pdb)['name']} needs {now['desiredHealthy']} healthy "
        f"pods and has {now['currentHealthy']} currently"
    )
    details = {"causes": [{"reason": "DisruptionBudget", "message": cause}]}
    raise ApiError(429, REFUSED, "TooManyRequests", details)


def comparable(st: JSON) -> JSON:
    """A status without its condition times, to tell whether it changed."""
    conditions = [
        {k: v for k, v in c.items() if k != "lastTransitionTime"}
        for c in st.get("conditions") or []
    ]
    return {**st, "conditions": conditions}

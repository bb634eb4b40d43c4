"""PodDisruptionBudgets: which gangs they protect, and which evictions they would refuse.

A gang is submitted preemptible only when no budget would refuse part of it (evicting a gang
is all or nothing): no pod of it is under two budgets (the Eviction API answers 500 for such
a pod, whatever the budgets allow), and every budget allows, with all its pods healthy, at
least as many disruptions as it covers of the gang's pods (``Budget.allowed``: from the
disruption controller's status, else from the spec).

An eviction is not asked for while its budget refuses it now (``blocked``: the pod is under
two budgets, or a budget's ``status.disruptionsAllowed`` is below what is to be evicted of
it); it is asked again when the budgets change. Pure functions."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from boltforge.kube.model import Budget, KubePod, selects


def covering(pod: KubePod, budgets: Iterable[Budget]) -> list[Budget]:
    """The budgets that select ``pod`` (in its namespace)."""
    return [b for b in budgets if b.namespace == pod.namespace and selects(b.selector, pod.labels)]


def protection(
    pods: Sequence[KubePod], budgets: Iterable[Budget], everyone: Iterable[KubePod]
) -> str:
    """Why the gang of ``pods`` may not be bumped ("" when it may); ``everyone``: all the
    scheduler's pods, which the budgets' spec counts are of."""
    mine = list(budgets)
    for pod in pods:
        over = covering(pod, mine)
        if len(over) > 1:
            names = ", ".join(b.path for b in over)
            return (
                f"pod {pod.name} is under {len(over)} PodDisruptionBudgets ({names}); the "
                "Eviction API refuses to evict such a pod"
            )
    alive = [p for p in everyone if not p.deleting]
    for b in mine:
        covered = sum(
            1 for p in pods if b.namespace == p.namespace and selects(b.selector, p.labels)
        )
        if not covered:
            continue
        expected = sum(
            1 for p in alive if p.namespace == b.namespace and selects(b.selector, p.labels)
        )
        allowed = b.allowed(expected)
        if allowed < covered:
            return (
                f"PodDisruptionBudget {b.path} allows {allowed} disruptions of its pods and "
                f"the gang has {covered} under it"
            )
    return ""


def blocked(pods: Sequence[KubePod], budgets: Iterable[Budget]) -> str:
    """Why evicting ``pods`` (one gang's, together) would be refused now ("" when it would
    not): a pod under two budgets, or a budget whose status allows fewer disruptions than
    the pods of it to evict."""
    mine = list(budgets)
    taking: dict[str, int] = {}
    by_path = {b.path: b for b in mine}
    for pod in pods:
        over = covering(pod, mine)
        if len(over) > 1:
            names = ", ".join(b.path for b in over)
            return f"pod {pod.name} is under {len(over)} PodDisruptionBudgets ({names})"
        for b in over:
            taking[b.path] = taking.get(b.path, 0) + 1
    for path, count in sorted(taking.items()):
        allowed = by_path[path].disruptions_allowed
        if allowed is not None and allowed < count:
            return f"PodDisruptionBudget {path} allows {allowed} disruptions now ({count} asked)"
    return ""
